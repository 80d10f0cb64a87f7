//! The rank-`r` expansion of a LoRA layer, `[m, r] @ [r, n]`: the adapter's contribution to the
//! output in the forward, and to `dx` in the backward.
//!
//! gemm would pack the long operand and read the output back. Here each output element is
//! written once, summed over `r` in registers; the f32 path on AVX2 + FMA keeps a tile of
//! 4 x 24 outputs (12 accumulators) and uses FMA, where the portable loop (other types and
//! CPUs, f64 in the tests) compiles to separate multiplies and adds, at a fraction of the
//! speed (`RLFT_OP_TIMES` over a LoRA step; docs/kernels.md).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::math::Real;
use candle_core::DType;

/// Output rows per parallel task of [`expand`].
const ROWS_PER_TASK: usize = 16;
/// Output columns the portable loop keeps in registers at a time.
const PORTABLE_COLS: usize = 64;

/// `out [m, n] = h [m, r] @ bt [r, n] (+ bias [n])` into a new buffer, for a small `r` (LoRA's
/// rank): each output element is written once, summed over `r` in registers. The layers use it
/// to seed an output that the base product then accumulates onto.
pub(super) fn expand<T: Real>(
    h: &[T],
    bt: &[T],
    bias: Option<&[T]>,
    m: usize,
    r: usize,
    n: usize,
) -> Vec<T> {
    assert!(h.len() >= m * r && bt.len() >= r * n && bias.is_none_or(|b| b.len() == n));
    let mut out: Vec<T> = Vec::with_capacity(m * n);
    if n > 0 {
        out.spare_capacity_mut()[..m * n]
            .par_chunks_mut(n * ROWS_PER_TASK)
            .enumerate()
            .for_each(|(task, rows)| {
                let h = &h[task * ROWS_PER_TASK * r..][..rows.len() / n * r];
                expand_rows(h, bt, bias, r, n, rows);
            });
    }
    // SAFETY: expand_rows wrote every one of the m * n elements.
    unsafe { out.set_len(m * n) };
    out
}

/// One task of [`expand`]: `out [rows, n]` for `h [rows, r]`, every element written once.
fn expand_rows<T: Real>(
    h: &[T],
    bt: &[T],
    bias: Option<&[T]>,
    r: usize,
    n: usize,
    out: &mut [MaybeUninit<T>],
) {
    #[cfg(target_arch = "x86_64")]
    if T::DTYPE == DType::F32 && crate::simd::avx2_fma() {
        // SAFETY: T is f32 (checked), so the slices are reinterpreted as their own type
        // (MaybeUninit<f32> has f32's layout); the CPU has AVX2 and FMA (checked).
        unsafe {
            avx2::expand_rows(
                std::slice::from_raw_parts(h.as_ptr() as *const f32, h.len()),
                std::slice::from_raw_parts(bt.as_ptr() as *const f32, bt.len()),
                bias.map(|b| std::slice::from_raw_parts(b.as_ptr() as *const f32, b.len())),
                r,
                n,
                std::slice::from_raw_parts_mut(
                    out.as_mut_ptr() as *mut MaybeUninit<f32>,
                    out.len(),
                ),
            );
        }
        return;
    }
    crate::simd!(expand_portable(h, bt, bias, r, n, out))
}

/// The portable loop of [`expand`]: each row in blocks of [`PORTABLE_COLS`] columns.
#[inline(always)]
fn expand_portable<T: Real>(
    h: &[T],
    bt: &[T],
    bias: Option<&[T]>,
    r: usize,
    n: usize,
    out: &mut [MaybeUninit<T>],
) {
    let zero = T::from_f64(0.0);
    for (i, row) in out.chunks_mut(n).enumerate() {
        let hi = &h[i * r..][..r];
        let mut j0 = 0;
        while j0 < n {
            let w = PORTABLE_COLS.min(n - j0);
            let mut acc = [zero; PORTABLE_COLS];
            let acc = &mut acc[..w];
            if let Some(b) = bias {
                acc.copy_from_slice(&b[j0..j0 + w]);
            }
            for (rr, &hv) in hi.iter().enumerate() {
                for (o, &bv) in acc.iter_mut().zip(&bt[rr * n + j0..][..w]) {
                    *o += hv * bv;
                }
            }
            for (o, &v) in row[j0..j0 + w].iter_mut().zip(acc.iter()) {
                o.write(v);
            }
            j0 += w;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Register tile of the AVX2 kernels: rows by columns (3 vectors of 8).
    const TILE_R: usize = 4;
    const TILE_C: usize = 24;

    /// [`super::expand_rows`] for f32: whole `TILE_R x TILE_C` tiles in registers, the edges
    /// (rows past the last whole group, columns past the last whole tile) one by one.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA. (The slices' lengths are as [`super::expand`] asserts:
    /// `h [rows, r]`, `bt [r, n]`, `bias [n]`, `out [rows, n]`.)
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expand_rows(
        h: &[f32],
        bt: &[f32],
        bias: Option<&[f32]>,
        r: usize,
        n: usize,
        out: &mut [MaybeUninit<f32>],
    ) {
        let rows = out.len() / n;
        let (hp, bp) = (h.as_ptr(), bt.as_ptr());
        let op = out.as_mut_ptr() as *mut f32;
        let full_c = n / TILE_C * TILE_C;
        let full_r = rows / TILE_R * TILE_R;
        // SAFETY: whole tiles only: columns `j0 + 24 <= full_c <= n` of `bias` and of the
        // rows `rr < r` of `bt`, elements `i0 + i < full_r <= rows` of `h`'s column `rr`, and
        // outputs inside `out`'s `[rows, n]`.
        for j0 in (0..full_c).step_by(TILE_C) {
            unsafe {
                let init = |c: usize| match bias {
                    Some(b) => _mm256_loadu_ps(b.as_ptr().add(j0 + 8 * c)),
                    None => _mm256_setzero_ps(),
                };
                let (b0, b1, b2) = (init(0), init(1), init(2));
                for i0 in (0..full_r).step_by(TILE_R) {
                    let mut acc = [[b0, b1, b2]; TILE_R];
                    for rr in 0..r {
                        let br = bp.add(rr * n + j0);
                        let v = [
                            _mm256_loadu_ps(br),
                            _mm256_loadu_ps(br.add(8)),
                            _mm256_loadu_ps(br.add(16)),
                        ];
                        for (i, a) in acc.iter_mut().enumerate() {
                            let hv = _mm256_broadcast_ss(&*hp.add((i0 + i) * r + rr));
                            for c in 0..3 {
                                a[c] = _mm256_fmadd_ps(hv, v[c], a[c]);
                            }
                        }
                    }
                    for (i, a) in acc.iter().enumerate() {
                        let o = op.add((i0 + i) * n + j0);
                        for (c, v) in a.iter().enumerate() {
                            _mm256_storeu_ps(o.add(8 * c), *v);
                        }
                    }
                }
            }
        }
        // Edges: the last rows (all columns), then the last columns of the other rows.
        let one = |i: usize, j: usize| {
            let mut s = bias.map_or(0.0, |b| b[j]);
            for rr in 0..r {
                s += h[i * r + rr] * bt[rr * n + j];
            }
            s
        };
        for i in 0..rows {
            let from = if i < full_r { full_c } else { 0 };
            for j in from..n {
                out[i * n + j].write(one(i, j));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data<T: Real>(len: usize, mul: usize, div: f64) -> Vec<T> {
        (0..len)
            .map(|i| T::from_f64(((i * mul) % 23) as f64 / div - 1.5))
            .collect()
    }

    /// The expansion against a plain triple loop in f64: shapes with whole tiles, ragged rows,
    /// ragged columns, ranks below one row group, with and without bias; f32 (the AVX2 path
    /// where the CPU has it) to f32 rounding.
    #[test]
    fn expand_matches_a_plain_product() {
        for (m, n) in [
            (37usize, 150usize),
            (16, 48),
            (1, 3),
            (0, 5),
            (40, 576),
            (301, 50),
        ] {
            for r in [1usize, 3, 4, 16] {
                let h64: Vec<f64> = data(m * r, 7, 5.0);
                let bt64: Vec<f64> = data(r * n, 5, 3.0);
                let bias64: Vec<f64> = (0..n).map(|j| j as f64 * 0.25 - 1.0).collect();
                for with_bias in [false, true] {
                    let want = |i: usize, j: usize| {
                        let mut s = if with_bias { bias64[j] } else { 0.0 };
                        for q in 0..r {
                            s += h64[i * r + q] * bt64[q * n + j];
                        }
                        s
                    };
                    let got = expand(&h64, &bt64, with_bias.then_some(&bias64[..]), m, r, n);
                    let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
                    let (h32, bt32, bias32) = (f(&h64), f(&bt64), f(&bias64));
                    let got32 = expand(&h32, &bt32, with_bias.then_some(&bias32[..]), m, r, n);
                    assert_eq!((got.len(), got32.len()), (m * n, m * n));
                    for i in 0..m {
                        for j in 0..n {
                            let w = want(i, j);
                            assert!((got[i * n + j] - w).abs() < 1e-12, "{m}x{n} r {r}");
                            let d = (got32[i * n + j] as f64 - w).abs();
                            assert!(d < 1e-4 * (1.0 + w.abs()), "{m}x{n} r {r} f32 {d}");
                        }
                    }
                }
            }
        }
    }
}
