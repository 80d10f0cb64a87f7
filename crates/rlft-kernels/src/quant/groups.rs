//! The loop and operand layouts the GGUF block kernels share ([`super::avx2`] and its
//! AVX-512 twin): `x` packed for them ([`pack_rows`]), a weight's blocks ([`Layout`]), and
//! the chunks of `k` and groups of rows of `x` each kernel call covers ([`for_groups`]).
//!
//! Shapes: `x [m, k]` packed by [`pack_rows`], the blocks of `cols` weight rows of `k` columns
//! (`k / 32` blocks per row, scales `d` and mins per block), `out [m, cols]` inside a row-major
//! output of row stride `ld` (a task's columns of the whole product).

/// Weights per block (Q4_1 and Q8_0).
pub const BLOCK: usize = 32;

/// Most blocks of 32 columns per chunk of `k`: 8 rows of `x` over 20 blocks are 20 KiB of the
/// 32 KiB L1. `k` is cut into equal chunks (576 columns: one chunk of 18 blocks; 1536: three
/// of 16), so no chunk is a short tail that pays a row's reduction for little work.
const KC_BLOCKS: usize = 20;

/// Rows of `x` per register group.
const ROWS: usize = 8;

/// `x [m, k]` (row-major, `k` a multiple of 32) laid out as the block kernels read it: rows in
/// groups of [`ROWS`] (the last may be shorter), and in a group of `r` rows, block `b`'s 32
/// columns of every row side by side (`[r, 32]` per block). Group `g` starts at `g * 8 * k`,
/// its block `b` at `g * 8 * k + b * r * 32`.
///
/// Why: every operand of a block is at a fixed offset from one pointer (with row-major rows,
/// the inner loop computed 8 row addresses per block in a chain of dependent `lea`s and
/// reloaded spilled registers), and the buffer starts on a cache line, so no 16-lane load
/// straddles two lines. Each value of `x` is loaded once per weight row; a vector split over
/// two lines costs two loads, and the AVX-512 kernel loads 16 of them per block
/// (`matmul_bench kernel` shows the difference). Packing costs one copy of `x` per product,
/// shared by all its tasks.
pub(crate) fn pack_rows(x: &[f32], m: usize, k: usize) -> PackedRows {
    assert!(x.len() >= m * k && k.is_multiple_of(BLOCK));
    let mut lines = vec![Line([0.0; 16]); (m * k).div_ceil(16)];
    // SAFETY: `Line` is 16 plain f32 (`repr(C)`), so the lines are `16 * len` initialised f32.
    let out = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), m * k) };
    let mut at = 0;
    for g0 in (0..m).step_by(ROWS) {
        let r = (m - g0).min(ROWS);
        for b in (0..k).step_by(BLOCK) {
            for i in g0..g0 + r {
                out[at..at + BLOCK].copy_from_slice(&x[i * k + b..i * k + b + BLOCK]);
                at += BLOCK;
            }
        }
    }
    PackedRows { lines, len: m * k }
}

/// One cache line of f32: the unit [`PackedRows`] allocates in, so it starts 64-byte aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([f32; 16]);

/// Rows of `x` packed by [`pack_rows`], on 64-byte aligned storage.
pub(crate) struct PackedRows {
    lines: Vec<Line>,
    len: usize,
}

impl PackedRows {
    /// The packed values (`m * k` of them).
    pub(crate) fn as_slice(&self) -> &[f32] {
        // SAFETY: `lines` holds at least `len` initialised f32 (`repr(C)` lines of 16).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

/// The block layout of one weight matrix (or a run of its rows).
#[derive(Clone, Copy)]
pub(crate) enum Layout<'a> {
    /// 16 bytes of nibbles per block (byte `j`: element `j` low, `j + 16` high), scale, min.
    Q4_1 {
        d: &'a [f32],
        m: &'a [f32],
        qs: &'a [u8],
    },
    /// 32 signed bytes per block and a scale.
    Q8_0 { d: &'a [f32], qs: &'a [i8] },
}

/// The loop of the block kernels: `k` cut into
/// chunks of at most [`KC_BLOCKS`] blocks, then per weight row the rows of `x` in groups of
/// at most [`ROWS`]: `run(group, rows in the group)`.
#[inline(always)]
pub(crate) fn for_groups(
    x: &[f32],
    m: usize,
    k: usize,
    w: Layout,
    out: *mut f32,
    ld: usize,
    mut run: impl FnMut(&Group, usize),
) {
    let nb = k / BLOCK;
    let cols = match w {
        Layout::Q4_1 { d, .. } | Layout::Q8_0 { d, .. } => d.len() / nb,
    };
    assert!(x.len() >= m * k && k.is_multiple_of(BLOCK));
    let per_chunk = nb.div_ceil(nb.div_ceil(KC_BLOCKS).max(1));
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + per_chunk).min(nb);
        for c in 0..cols {
            let mut i = 0;
            while i < m {
                let r = (m - i).min(ROWS);
                let g = Group {
                    x: x[i * k + b0 * r * BLOCK..].as_ptr(),
                    first: c * nb + b0,
                    blocks: b1 - b0,
                    // Inside the caller's output (`matmul_blocks`' contract).
                    out: out.wrapping_add(i * ld + c),
                    ld,
                    accumulate: b0 > 0,
                };
                run(&g, r);
                i += r;
            }
        }
        b0 = b1;
    }
}

/// A Q4_1 weight's blocks as the kernels read them.
#[derive(Clone, Copy)]
pub(crate) struct Q4_1<'a> {
    pub(crate) d: &'a [f32],
    pub(crate) m: &'a [f32],
    pub(crate) qs: &'a [u8],
}

/// A Q8_0 weight's blocks as the kernels read them.
#[derive(Clone, Copy)]
pub(crate) struct Q8_0<'a> {
    pub(crate) d: &'a [f32],
    pub(crate) qs: &'a [i8],
}

/// One weight row's chunk of blocks against up to 8 rows of `x`.
pub(crate) struct Group {
    /// The group's packed rows ([`pack_rows`]) at the chunk's first block: block `b` of the
    /// chunk at `b * rows * 32`, row `r` of a block at `r * 32`.
    pub(crate) x: *const f32,
    /// Index of the chunk's first block in the weight's block arrays.
    pub(crate) first: usize,
    pub(crate) blocks: usize,
    /// `out[r * ld]` receives row `r`'s dot product.
    pub(crate) out: *mut f32,
    /// Row stride of `out`.
    pub(crate) ld: usize,
    /// Add to `out` (a later chunk) instead of storing.
    pub(crate) accumulate: bool,
}

impl Group {
    /// Row `r`'s dot product into the output (added to it for a later chunk of `k`).
    ///
    /// # Safety
    /// `r` is below the group's row count and [`Self::out`] is inside the caller's output
    /// (the kernels' contract), written by this thread alone.
    #[inline(always)]
    pub(crate) unsafe fn store(&self, r: usize, v: f32) {
        // SAFETY: row `r`'s element of this weight row is inside the output (this function's
        // contract).
        unsafe {
            let o = self.out.add(r * self.ld);
            *o = if self.accumulate { *o + v } else { v };
        }
    }
}
