//! `x @ W^T` read straight from GGUF blocks, for decoding (AVX2 + FMA; the AVX-512 twin in
//! `crate::avx512` runs instead where the CPU has it).
//!
//! A decode step multiplies a handful of rows of `x` (one per sequence) by every weight. The
//! kernel here dequantises 8 weights at a time into a register (the loader's formulas: `q * d +
//! m` for Q4_1, `q * d` for Q8_0, multiply then add, so the weights are bit-identical to the
//! f32 tensor) and uses that register against up to 8 rows of `x` before the next 8: no
//! scratch tile in memory, each weight is unpacked once per call and feeds 8 FMAs. The rows of
//! `x` are read in chunks of at most [`KC_BLOCKS`] blocks so they stay in L1 for every weight
//! row of the task (8 rows x 1536 columns would not). Per `(x row, weight row)` the products are summed in
//! 8 lanes per chunk, reduced, and the chunk sums added in order: the same value as the f32
//! kernel up to summation order.
//!
//! Shapes: `x [m, k]` packed by [`pack_rows`], the blocks of `cols` weight rows of `k` columns
//! (`k / 32` blocks per row, scales `d` and mins per block), `out [m, cols]` inside a row-major
//! output of row stride `ld` (a task's columns of the whole product).

use std::arch::x86_64::*;

use crate::quant::BLOCK;

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
/// two lines costs two loads, and with 16 of them per block the AVX-512 Q4_1 kernel ran at
/// 62-65 GFLOP/s per core (`matmul_bench kernel`, 8 x 576 x 1536) where aligned operands run
/// at 100. Packing costs one copy of `x` per product, shared by all its tasks.
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

/// Whether the CPU runs [`matmul_blocks`].
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// `out[r * ld + c] = dot(x_r, w_c)` for the `cols = d.len() / (k / 32)` weight rows in `w`,
/// `x` packed by [`pack_rows`]: each task writes its columns of the row-major output in place
/// (no scratch to allocate and copy back).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]); `x` holds `m * k` values, `w`'s slices
/// whole blocks of `cols` rows, `out[r * ld + c]` is writable for `r < m`, `c < cols`, and no
/// other thread touches those elements meanwhile.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn matmul_blocks(
    x: &[f32],
    m: usize,
    k: usize,
    w: Layout,
    out: *mut f32,
    ld: usize,
) {
    if crate::avx512::enabled() {
        // SAFETY: the CPU has AVX-512F (checked by `enabled`); the rest is this function's
        // own contract.
        return crate::avx512::matmul_blocks(x, m, k, w, out, ld);
    }
    for_groups(x, m, k, w, out, ld, |g, r| match w {
        Layout::Q4_1 { d, m: mins, qs } => g.run_rows(r, Q4_1 { d, m: mins, qs }),
        Layout::Q8_0 { d, qs } => g.run_rows(r, Q8_0 { d, qs }),
    });
}

/// The loop of the block kernels (AVX2 here, AVX-512 in `crate::avx512`): `k` cut into
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

/// Unpacks the 4 vectors of 8 weights of a block.
trait Dequant: Copy {
    /// The weights of block `b` into `out[0..4]` (elements 0-7, 8-15, 16-23, 24-31).
    unsafe fn block(self, b: usize, out: &mut [__m256; 4]);
}

/// A Q4_1 weight's blocks as the kernels read them (this AVX2 module's and `crate::avx512`'s
/// `Dequant` implementations).
#[derive(Clone, Copy)]
pub(crate) struct Q4_1<'a> {
    pub(crate) d: &'a [f32],
    pub(crate) m: &'a [f32],
    pub(crate) qs: &'a [u8],
}

impl Dequant for Q4_1<'_> {
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m256; 4]) {
        let (dv, mv) = (
            _mm256_set1_ps(*self.d.get_unchecked(b)),
            _mm256_set1_ps(*self.m.get_unchecked(b)),
        );
        let raw = _mm_loadu_si128(self.qs.as_ptr().add(b * 16) as *const __m128i);
        let low = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, low);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
        out[0] = q4(lo, dv, mv);
        out[1] = q4(_mm_srli_si128(lo, 8), dv, mv);
        out[2] = q4(hi, dv, mv);
        out[3] = q4(_mm_srli_si128(hi, 8), dv, mv);
    }
}

/// `q * d + m` for the 8 low bytes of `bytes`, multiply then add as the loader does (no FMA):
/// bit-identical weights.
#[inline(always)]
unsafe fn q4(bytes: __m128i, d: __m256, m: __m256) -> __m256 {
    let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    _mm256_add_ps(_mm256_mul_ps(q, d), m)
}

/// A Q8_0 weight's blocks as the kernels read them.
#[derive(Clone, Copy)]
pub(crate) struct Q8_0<'a> {
    pub(crate) d: &'a [f32],
    pub(crate) qs: &'a [i8],
}

impl Dequant for Q8_0<'_> {
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m256; 4]) {
        let dv = _mm256_set1_ps(*self.d.get_unchecked(b));
        let p = self.qs.as_ptr().add(b * BLOCK);
        for (v, o) in out.iter_mut().enumerate() {
            let bytes = _mm_loadl_epi64(p.add(v * 8) as *const __m128i);
            *o = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), dv);
        }
    }
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
    /// [`Self::run`] for `rows` (1-8) rows of `x`, with the accumulator split that suits them.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn run_rows(&self, rows: usize, w: impl Dequant) {
        match rows {
            8 => self.run::<8, 1>(w),
            7 => self.run::<7, 1>(w),
            6 => self.run::<6, 1>(w),
            5 => self.run::<5, 1>(w),
            4 => self.run::<4, 2>(w),
            3 => self.run::<3, 2>(w),
            2 => self.run::<2, 4>(w),
            _ => self.run::<1, 4>(w),
        }
    }

    /// `R` rows of `x`, `S` accumulators per row (weight vector `v` of a block goes to
    /// accumulator `v % S`): `R * S` independent FMA chains hide the FMA latency when `R` is
    /// small.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn run<const R: usize, const S: usize>(&self, w: impl Dequant) {
        let mut acc = [[_mm256_setzero_ps(); S]; R];
        let mut wv = [_mm256_setzero_ps(); 4];
        for blk in 0..self.blocks {
            w.block(self.first + blk, &mut wv);
            let xb = self.x.add(blk * R * BLOCK);
            for (v, wvec) in wv.iter().enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(xb.add(r * BLOCK + v * 8));
                    a[v % S] = _mm256_fmadd_ps(xv, *wvec, a[v % S]);
                }
            }
        }
        let mut sums = [_mm256_setzero_ps(); R];
        for (s, a) in sums.iter_mut().zip(&acc) {
            *s = a[0];
            for part in &a[1..] {
                *s = _mm256_add_ps(*s, *part);
            }
        }
        if R == 8 {
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), hsum8(&sums));
            for (r, v) in v.into_iter().enumerate() {
                self.store(r, v);
            }
        } else {
            for (r, s) in sums.iter().enumerate() {
                self.store(r, hsum(*s));
            }
        }
    }

    /// Row `r`'s dot product into the output (added to it for a later chunk of `k`).
    #[inline(always)]
    pub(crate) unsafe fn store(&self, r: usize, v: f32) {
        let o = self.out.add(r * self.ld);
        *o = if self.accumulate { *o + v } else { v };
    }
}

/// The lane sums of 8 vectors as one vector: element `i` = sum of `v[i]`'s lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum8(v: &[__m256]) -> __m256 {
    let s01 = _mm256_hadd_ps(v[0], v[1]);
    let s23 = _mm256_hadd_ps(v[2], v[3]);
    let s45 = _mm256_hadd_ps(v[4], v[5]);
    let s67 = _mm256_hadd_ps(v[6], v[7]);
    // Per 128-bit half: [v0, v1, v2, v3] partial sums (low lanes 0-3, high lanes 4-7).
    let t0 = _mm256_hadd_ps(s01, s23);
    let t1 = _mm256_hadd_ps(s45, s67);
    let lo = _mm256_permute2f128_ps(t0, t1, 0x20);
    let hi = _mm256_permute2f128_ps(t0, t1, 0x31);
    _mm256_add_ps(lo, hi)
}

/// The sum of a vector's 8 lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
