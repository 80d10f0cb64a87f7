//! The tile loop of the x86 streaming kernels ([`for_tiles`]), shared by the AVX2 and AVX-512
//! register tiles: which weight rows meet which rows of `x`, in what order, and where each
//! result goes.

/// Weight rows (output columns) per register tile, in both x86 kernels.
pub(crate) const TILE_COLS: usize = 3;

/// How many tiles ahead the weight rows are prefetched: memory works on the next tiles while
/// the FMAs run on this one (without it, a decode step costs the time to read the weights plus
/// the time to compute on them).
const PREFETCH_TILES: usize = 2;

/// Most bytes of a group of rows of `x` for [`for_tiles`] to keep it in L1 across weight
/// tiles (half of a 48 KiB L1: the weight tiles and the output share it).
const X_GROUP_BYTES: usize = 24 * 1024;

/// One register tile's operands for the x86 streaming kernels ([`for_tiles`]).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    /// The tile's first row of `x`, at the span's first column (row stride `k`).
    pub(crate) xp: *const f32,
    /// The tile's first weight row, at the span's first column (row stride `k`).
    pub(crate) wp: *const f32,
    /// The output element of the tile's first row of `x` and first weight row, which the
    /// tile overwrites with the others at strides [`Self::rs`] (rows of `x`) and
    /// [`Self::cs`] (weight rows).
    pub(crate) op: *mut f32,
    /// Output stride between rows of `x`.
    pub(crate) rs: usize,
    /// Output stride between weight rows.
    pub(crate) cs: usize,
    /// An address to prefetch at the same column (maybe past the end), or null.
    pub(crate) pf: *const f32,
    /// Columns of the span (`<= k`, the row stride of `x` and `w`): the dot products run
    /// over these.
    pub(crate) len: usize,
}

/// The tile loop of the x86 streaming kernels: the weight rows of `w [cols, k]` in tiles of
/// [`TILE_COLS`], the rows of `x [m, k]` in groups of `tile_rows`, each tile of weight rows
/// used against every row group while it is in L1, so weights are read from memory once.
/// Calls `tile(nr, nc, t)` for `nr` rows of `x` and `nc` weight rows ([`Tile`]); the first row
/// group of a tile gets a prefetch address, the weight rows [`PREFETCH_TILES`] tiles ahead,
/// the others null.
///
/// When a group of rows of `x` is wider than [`X_GROUP_BYTES`] (AVX-512's 8 rows of a
/// 1536-wide `x`), `k` is cut into spans that fit, each span's dot products added to the
/// last: a row group then stays in L1 across weight tiles instead of streaming from L2 for
/// each of them. The spans depend on `k` only, so a row's result does not depend on how many
/// rows came with it.
///
/// # Safety
/// `out[i * rs + j * cs]` is writable for every row `i < m` of `x` and weight row `j` of `w`,
/// and no other thread touches those elements meanwhile.
#[inline(always)]
pub(crate) unsafe fn for_tiles(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    (out, rs, cs): (*mut f32, usize, usize),
    tile_rows: usize,
    mut tile: impl FnMut(usize, usize, &Tile),
) {
    let cols = w.len() / k;
    assert!(x.len() >= m * k);
    let spans = (tile_rows * k * 4).div_ceil(X_GROUP_BYTES).max(1);
    let span = k.div_ceil(spans).div_ceil(16) * 16;
    // A group of rows fits in L1 over any span (X_GROUP_BYTES / (4 * tile_rows) is a
    // multiple of 16 for the kernels' 4 and 8 rows).
    debug_assert!(tile_rows * span * 4 <= X_GROUP_BYTES);
    // Spans after the first write here (`[m, cols]` row-major), then add into `out` (an
    // `out += ` inside the kernels made LLVM spill their accumulators to the stack).
    let mut part = if span < k {
        vec![0f32; cols * m]
    } else {
        Vec::new()
    };
    let mut k0 = 0;
    while k0 < k {
        let len = span.min(k - k0);
        let (dst, drs, dcs) = if k0 == 0 {
            (out, rs, cs)
        } else {
            (part.as_mut_ptr(), cols, 1)
        };
        // One tile at row `i`, weight row `j`; returns its (rows, weight rows).
        let mut run = |i: usize, j: usize| {
            let (nr, nc) = ((m - i).min(tile_rows), (cols - j).min(TILE_COLS));
            // SAFETY: i < m, j < cols and k0 < k, so the offsets are inside x, w and `dst`
            // (`out`, by this function's contract, or `part`, `cols * m` values).
            let (xp, wp, op) = unsafe {
                (
                    x.as_ptr().add(i * k + k0),
                    w.as_ptr().add(j * k + k0),
                    dst.add(i * drs + j * dcs),
                )
            };
            let pf = if i == 0 {
                wp.wrapping_add(PREFETCH_TILES * TILE_COLS * k)
            } else {
                std::ptr::null()
            };
            let t = Tile {
                xp,
                wp,
                op,
                rs: drs,
                cs: dcs,
                pf,
                len,
            };
            tile(nr, nc, &t);
            (nr, nc)
        };
        if m > tile_rows {
            // Many rows: each group of rows of `x` (over one span) stays in L1 while it meets
            // every weight row of this call (from L2 after the first group), rather than every
            // row of `x` streaming from L2 for each tile of 3 weight rows (more bytes a cycle
            // than L2 delivers).
            for i in (0..m).step_by(tile_rows) {
                let mut j = 0;
                while j < cols {
                    j += run(i, j).1;
                }
            }
        } else {
            let mut j = 0;
            while j < cols {
                let mut i = 0;
                let mut nc = 0;
                while i < m {
                    let (nr, c) = run(i, j);
                    (i, nc) = (i + nr, c);
                }
                j += nc;
            }
        }
        if k0 > 0 {
            for (i, row) in part.chunks_exact(cols).enumerate() {
                for (j, p) in row.iter().enumerate() {
                    // SAFETY: row `i < m`, weight row `j < cols`: writable (this function's
                    // contract).
                    unsafe { *out.add(i * rs + j * cs) += p };
                }
            }
        }
        k0 += len;
    }
}
