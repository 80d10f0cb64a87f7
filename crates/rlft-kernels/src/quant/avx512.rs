//! The AVX-512 twin of the GGUF block kernel ([`super::avx2`]): each block unpacked into two
//! 16-lane registers and used against up to 8 rows of `x`, on the same loop ([`for_groups`]).
//! Runs where [`crate::simd::avx512`] says so.

use std::arch::x86_64::*;

use super::groups::{for_groups, Group, Layout, BLOCK, Q4_1, Q8_0};
use crate::hsum::{hsum8_avx512, hsum_avx512};

/// The AVX-512 twin of [`super::avx2::matmul_blocks`], on the same loop ([`for_groups`]):
/// `out[r * ld + c] = dot(x_r, w_c)` for the weight rows in `w`, each block unpacked into two
/// 16-lane registers (same formulas, so the weights are bit-identical to the f32 tensor) used
/// against up to 8 rows of `x`.
///
/// # Safety
/// As [`super::avx2::matmul_blocks`], and the CPU must have AVX-512F
/// ([`crate::simd::avx512`]).
#[target_feature(enable = "avx512f,avx2,fma")]
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
    // function's contract describes; the CPU has AVX-512F, AVX2 and FMA.
    for_groups(x, m, k, w, out, ld, |g, r| unsafe {
        match w {
            Layout::Q4_1 { d, m: mins, qs } => run_rows(g, r, Q4_1 { d, m: mins, qs }),
            Layout::Q8_0 { d, qs } => run_rows(g, r, Q8_0 { d, qs }),
        }
    });
}

/// Unpacks a block's 32 weights into two 16-lane vectors (elements 0-15, 16-31).
trait Dequant: Copy {
    /// The weights of block `b` into `out`.
    ///
    /// # Safety
    /// The CPU has AVX-512F, and `b` is a block of the weight (below its number of scales);
    /// called from a function compiled for AVX-512, into which it is inlined.
    unsafe fn block(self, b: usize, out: &mut [__m512; 2]);
}

impl Dequant for Q4_1<'_> {
    /// Byte `j` of a block holds element `j` in its low nibble and `j + 16` in its high one.
    /// The block's 16 possible weights `q * d + m` (multiply then add as the loader does, no
    /// FMA: bit-identical weights) make a table in one register; each byte widened to a 32-bit
    /// lane is its own index (a permute reads only an index's low 4 bits), and the same lanes
    /// shifted right by 4 index the high nibbles: 6 vector instructions a block instead of 11
    /// (mask, shift, widen, convert, scale, offset).
    ///
    /// # Safety
    /// As [`Dequant::block`].
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m512; 2]) {
        // SAFETY: block `b` exists (this function's contract), so scale, min and its 16 bytes
        // of nibbles do; the CPU has AVX-512F.
        unsafe {
            let (dv, mv) = (
                _mm512_set1_ps(*self.d.get_unchecked(b)),
                _mm512_set1_ps(*self.m.get_unchecked(b)),
            );
            let iota = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            );
            let table = _mm512_add_ps(_mm512_mul_ps(iota, dv), mv);
            let raw = _mm_loadu_si128(self.qs.as_ptr().add(b * 16) as *const __m128i);
            let lanes = _mm512_cvtepu8_epi32(raw);
            out[0] = _mm512_permutexvar_ps(lanes, table);
            out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(lanes), table);
        }
    }
}

impl Dequant for Q8_0<'_> {
    /// # Safety
    /// As [`Dequant::block`].
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m512; 2]) {
        // SAFETY: block `b` exists (this function's contract), so its scale and 32 bytes do;
        // the CPU has AVX-512F.
        unsafe {
            let dv = _mm512_set1_ps(*self.d.get_unchecked(b));
            let p = self.qs.as_ptr().add(b * BLOCK);
            for (v, o) in out.iter_mut().enumerate() {
                let bytes = _mm_loadu_si128(p.add(v * 16) as *const __m128i);
                *o = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), dv);
            }
        }
    }
}

/// [`run`] for `rows` (1-8) rows of a group, with enough accumulators to hide FMA latency.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx512f,avx2,fma")]
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
            2 => run::<2, 2>(g, w),
            _ => run::<1, 2>(g, w),
        }
    }
}

/// `R` rows of `x`, `S` accumulators per row (vector `v` of a block goes to `v % S`).
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA; `g` addresses `R` packed rows of `x` over its `blocks`
/// blocks (from `g.first` of `w`) and their output elements ([`for_groups`]).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn run<const R: usize, const S: usize>(g: &Group, w: impl Dequant) {
    let mut acc = [[_mm512_setzero_ps(); S]; R];
    let mut wv = [_mm512_setzero_ps(); 2];
    for blk in 0..g.blocks {
        // SAFETY: block `g.first + blk` and the group's packed `[R, 32]` values of it exist
        // (this function's contract).
        unsafe {
            w.block(g.first + blk, &mut wv);
            let xb = g.x.add(blk * R * BLOCK);
            for (v, wvec) in wv.iter().enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    let xv = _mm512_loadu_ps(xb.add(r * BLOCK + v * 16));
                    a[v % S] = _mm512_fmadd_ps(xv, *wvec, a[v % S]);
                }
            }
        }
    }
    let mut sums = [_mm512_setzero_ps(); R];
    for (s, a) in sums.iter_mut().zip(&acc) {
        *s = a[0];
        for part in &a[1..] {
            *s = _mm512_add_ps(*s, *part);
        }
    }
    // SAFETY: `v` holds the 8 f32 stored; the group's `R` output elements are writable (this
    // function's contract).
    unsafe {
        if R == 8 {
            let mut v = [0f32; 8];
            _mm256_storeu_ps(
                v.as_mut_ptr(),
                hsum8_avx512(&std::array::from_fn(|r| sums[r])),
            );
            for (r, v) in v.into_iter().enumerate() {
                g.store(r, v);
            }
            return;
        }
        for (r, s) in sums.iter().enumerate() {
            g.store(r, hsum_avx512(*s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, mul: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * mul) % 29) as f32 / 7.0 - 2.0)
            .collect()
    }

    /// The f32 tile kernel against a plain f64 product: row counts across tile edges, weight
    /// rows across column tiles, a `k` with a tail after the 16-lane part.

    #[test]
    fn blocks_match_the_dequantised_product() {
        if !crate::simd::avx512() {
            eprintln!("no AVX-512 here: skipped");
            return;
        }
        let (k, cols) = (32 * 45, 3usize);
        let nb = k / BLOCK;
        let d: Vec<f32> = (0..cols * nb)
            .map(|b| 0.01 + (b % 7) as f32 * 0.003)
            .collect();
        let mins: Vec<f32> = (0..cols * nb)
            .map(|b| -0.05 + (b % 5) as f32 * 0.01)
            .collect();
        let q4: Vec<u8> = (0..cols * nb * 16).map(|i| (i * 37 % 256) as u8).collect();
        let q8: Vec<i8> = (0..cols * nb * BLOCK)
            .map(|i| (i * 53 % 256) as u8 as i8)
            .collect();
        let weight = |c: usize, t: usize, q4_1: bool| -> f32 {
            let b = c * nb + t / BLOCK;
            let e = t % BLOCK;
            if q4_1 {
                let byte = q4[b * 16 + e % 16];
                let q = if e < 16 { byte & 0x0F } else { byte >> 4 } as f32;
                q * d[b] + mins[b]
            } else {
                q8[b * BLOCK + e] as f32 * d[b]
            }
        };
        for q4_1 in [true, false] {
            let layout = if q4_1 {
                Layout::Q4_1 {
                    d: &d,
                    m: &mins,
                    qs: &q4,
                }
            } else {
                Layout::Q8_0 { d: &d, qs: &q8 }
            };
            for m in 1..=9usize {
                let x = data(m * k, 5);
                let mut out = vec![f32::NAN; cols * m];
                let xp = super::super::groups::pack_rows(&x, m, k);
                // SAFETY: simd::avx512() checked the CPU; whole blocks of `cols` rows.
                unsafe { matmul_blocks(xp.as_slice(), m, k, layout, out.as_mut_ptr(), cols) };
                for c in 0..cols {
                    for i in 0..m {
                        let want: f64 = (0..k)
                            .map(|t| x[i * k + t] as f64 * weight(c, t, q4_1) as f64)
                            .sum();
                        let got = out[i * cols + c] as f64;
                        let tol = 1e-4 * (1.0 + want.abs());
                        assert!((got - want).abs() < tol, "q4_1 {q4_1} m {m} c {c}");
                    }
                }
            }
        }
    }
}
