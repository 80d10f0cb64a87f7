//! `x @ W^T` read straight from GGUF blocks, for decoding (AVX2 + FMA; the AVX-512 twin in
//! [`super::avx512`] runs instead where [`crate::simd::avx512`] says so).
//!
//! A decode step multiplies a handful of rows of `x` (one per sequence) by every weight. The
//! kernel here dequantises 8 weights at a time into a register (the loader's formulas: `q * d +
//! m` for Q4_1, `q * d` for Q8_0, multiply then add, so the weights are bit-identical to the
//! f32 tensor) and uses that register against up to 8 rows of `x` before the next 8: no
//! scratch tile in memory, each weight is unpacked once per call and feeds 8 FMAs. The rows of
//! `x` are read in chunks of `k` small enough to stay in L1 for every weight row of the task
//! ([`for_groups`]). Per `(x row, weight row)` the products are summed in 8 lanes per chunk,
//! reduced, and the chunk sums added in order: the same value as the f32 kernel up to
//! summation order.

use std::arch::x86_64::*;

use super::groups::{for_groups, Group, Layout, BLOCK, Q4_1, Q8_0};
use crate::hsum::{hsum8_avx2, hsum_avx2};

/// `out[r * ld + c] = dot(x_r, w_c)` for the `cols = d.len() / (k / 32)` weight rows in `w`,
/// `x` packed by [`super::groups::pack_rows`]: each task writes its columns of the row-major
/// output in place (no scratch to allocate and copy back).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`crate::simd::avx2_fma`]); `x` holds `m * k` values,
/// `w`'s slices whole blocks of `cols` rows, `out[r * ld + c]` is writable for `r < m`,
/// `c < cols`, and no other thread touches those elements meanwhile.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn matmul_blocks(
    x: &[f32],
    m: usize,
    k: usize,
    w: Layout,
    out: *mut f32,
    ld: usize,
) {
    // SAFETY: each group `for_groups` hands over addresses `r` packed rows of `x` over its
    // chunk's blocks and their output elements of one weight row, inside the operands this
    // function's contract describes; the CPU has AVX2 and FMA.
    for_groups(x, m, k, w, out, ld, |g, r| unsafe {
        match w {
            Layout::Q4_1 { d, m: mins, qs } => run_rows(g, r, Q4_1 { d, m: mins, qs }),
            Layout::Q8_0 { d, qs } => run_rows(g, r, Q8_0 { d, qs }),
        }
    });
}

/// Unpacks the 4 vectors of 8 weights of a block.
trait Dequant: Copy {
    /// The weights of block `b` into `out[0..4]` (elements 0-7, 8-15, 16-23, 24-31).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and `b` is a block of the weight (below its number of
    /// scales); called from a function compiled for AVX2, into which it is inlined.
    unsafe fn block(self, b: usize, out: &mut [__m256; 4]);
}

impl Dequant for Q4_1<'_> {
    /// # Safety
    /// As [`Dequant::block`].
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m256; 4]) {
        // SAFETY: block `b` exists (this function's contract), so scale, min and its 16 bytes
        // of nibbles do; the CPU has AVX2.
        unsafe {
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
}

/// `q * d + m` for the 8 low bytes of `bytes`, multiply then add as the loader does (no FMA):
/// bit-identical weights.
///
/// # Safety
/// The CPU has AVX2 (inlined into the AVX2 kernel).
#[inline(always)]
unsafe fn q4(bytes: __m128i, d: __m256, m: __m256) -> __m256 {
    // SAFETY: the CPU has AVX2 (this function's contract).
    unsafe {
        let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
        _mm256_add_ps(_mm256_mul_ps(q, d), m)
    }
}

impl Dequant for Q8_0<'_> {
    /// # Safety
    /// As [`Dequant::block`].
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m256; 4]) {
        // SAFETY: block `b` exists (this function's contract), so its scale and 32 bytes do;
        // the CPU has AVX2.
        unsafe {
            let dv = _mm256_set1_ps(*self.d.get_unchecked(b));
            let p = self.qs.as_ptr().add(b * BLOCK);
            for (v, o) in out.iter_mut().enumerate() {
                let bytes = _mm_loadl_epi64(p.add(v * 8) as *const __m128i);
                *o = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), dv);
            }
        }
    }
}

/// [`run`] for `rows` (1-8) rows of `x`, with the accumulator split that suits them.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn run_rows(g: &Group, rows: usize, w: impl Dequant) {
    // SAFETY: this function's contract, passed on.
    unsafe {
        match rows {
            8 => run::<8, 1>(g, w),
            7 => run::<7, 1>(g, w),
            6 => run::<6, 1>(g, w),
            5 => run::<5, 1>(g, w),
            4 => run::<4, 2>(g, w),
            3 => run::<3, 2>(g, w),
            2 => run::<2, 4>(g, w),
            _ => run::<1, 4>(g, w),
        }
    }
}

/// `R` rows of `x`, `S` accumulators per row (weight vector `v` of a block goes to
/// accumulator `v % S`): `R * S` independent FMA chains hide the FMA latency when `R` is
/// small.
///
/// # Safety
/// The CPU has AVX2 and FMA; `g` addresses `R` packed rows of `x` over its `blocks` blocks
/// (from `g.first` of `w`) and their output elements ([`for_groups`]).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn run<const R: usize, const S: usize>(g: &Group, w: impl Dequant) {
    let mut acc = [[_mm256_setzero_ps(); S]; R];
    let mut wv = [_mm256_setzero_ps(); 4];
    for blk in 0..g.blocks {
        // SAFETY: block `g.first + blk` and the group's packed `[R, 32]` values of it exist
        // (this function's contract).
        unsafe {
            w.block(g.first + blk, &mut wv);
            let xb = g.x.add(blk * R * BLOCK);
            for (v, wvec) in wv.iter().enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(xb.add(r * BLOCK + v * 8));
                    a[v % S] = _mm256_fmadd_ps(xv, *wvec, a[v % S]);
                }
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
    // SAFETY: `v` holds the 8 f32 stored; the group's `R` output elements are writable (this
    // function's contract).
    unsafe {
        if R == 8 {
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), hsum8_avx2(&sums));
            for (r, v) in v.into_iter().enumerate() {
                g.store(r, v);
            }
        } else {
            for (r, s) in sums.iter().enumerate() {
                g.store(r, hsum_avx2(*s));
            }
        }
    }
}
