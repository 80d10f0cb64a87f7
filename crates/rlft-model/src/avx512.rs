//! AVX-512 twins of the decoding kernels: [`crate::kernels`]' streaming `x @ W^T` over f32
//! weight rows and [`crate::quant_dot`]'s product read from Q4_1 / Q8_0 blocks.
//!
//! A decode step at batch 8 is bound by its FMAs more than by reading the weights (each weight
//! feeds 8 of them), so on a CPU with AVX-512 the 16-lane FMAs do the same work in about half
//! the instructions. Same register tiles and loop order as the AVX2 kernels, 16 lanes instead
//! of 8: each dot product is summed in 16 partial sums (a different rounding, ~1e-7 relative).
//! Used when the CPU has AVX-512F and `RLFT_AVX512` is not `0` ([`enabled`]).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::kernels::{for_tiles, TILE_COLS};
use crate::quant::BLOCK;
use crate::quant_dot::{for_groups, Group, Layout, Q4_1, Q8_0};

/// 0 = not decided yet, 1 = off, 2 = on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Whether the AVX-512 kernels run: the CPU has AVX-512F (with AVX2 and FMA) and the
/// environment does not say `RLFT_AVX512=0` (read once; for A/B runs against the AVX2 path).
pub(crate) fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::env::var("RLFT_AVX512").map_or(true, |v| v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Rows of `x` per register tile of [`dot_block`] (by `kernels::TILE_COLS` weight rows): 24
/// of the 32 zmm registers accumulate, so a decode step's 8 rows share each weight load.
const TILE_ROWS: usize = 8;

/// For each weight row `j` in `w [cols, k]`: `out[j * m + i] = dot(x_i, w_j)`; the AVX-512
/// twin of `kernels::avx2::dot_block`, on the same tile loop (`kernels::for_tiles`) with tiles
/// of up to 8 rows of `x` by 3 weight rows, 24 zmm accumulators.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA ([`enabled`]); `out` as in
/// `kernels::dot_block_into` (element `(i, j)` at `i * rs + j * cs`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn dot_block(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    out: (*mut f32, usize, usize),
) {
    for_tiles(x, m, k, w, out, TILE_ROWS, |nr, nc, t| {
        let (xp, wp, pf, len) = (t.xp, t.wp, t.pf, t.len);
        let o = (t.op, t.rs, t.cs);
        macro_rules! dispatch {
            ($($r:literal),*) => {
                match (nr, nc) {
                    $(
                        ($r, 3) => tile::<$r, 3>(xp, wp, k, len, o, pf),
                        ($r, 2) => tile::<$r, 2>(xp, wp, k, len, o, pf),
                        ($r, _) => tile::<$r, 1>(xp, wp, k, len, o, pf),
                    )*
                    _ => unreachable!("row groups hold 1-{TILE_ROWS} rows"),
                }
            };
        }
        dispatch!(1, 2, 3, 4, 5, 6, 7, 8)
    })
}

/// `out[r * rs + c * cs] = dot(x_r, w_c)` over the first `len` columns for `R` rows of `x`
/// and `C` weight rows (both of row stride `k`), given `(out, rs, cs)`: 16 lanes over
/// `len / 16 * 16` columns, then the tail in order. (Accumulating spans are added by
/// `for_tiles`: an `out +=` here made LLVM spill the accumulators in the FMA loop; so did a
/// second store path for contiguous columns. One plain store per result keeps them in
/// registers.)
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    xp: *const f32,
    wp: *const f32,
    k: usize,
    len: usize,
    (out, rs, cs): (*mut f32, usize, usize),
    prefetch: *const f32,
) {
    let k16 = len / 16 * 16;
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let mut kk = 0;
    while kk < k16 {
        if !prefetch.is_null() {
            for c in 0..TILE_COLS {
                let p = prefetch.wrapping_add(c * k + kk);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
        let mut wv = [_mm512_setzero_ps(); C];
        for (c, v) in wv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(wp.add(c * k + kk));
        }
        for (r, row) in acc.iter_mut().enumerate() {
            let xv = _mm512_loadu_ps(xp.add(r * k + kk));
            for (a, wc) in row.iter_mut().zip(&wv) {
                *a = _mm512_fmadd_ps(xv, *wc, *a);
            }
        }
        kk += 16;
    }
    if R == 8 && k16 == len {
        // Reduce a column's 8 registers together.
        #[allow(clippy::needless_range_loop)] // `c` indexes the inner arrays of `acc`
        for c in 0..C {
            let col: [__m512; 8] = std::array::from_fn(|r| acc[r][c]);
            let mut v = [0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), hsum8(&col));
            for (r, v) in v.into_iter().enumerate() {
                *out.add(r * rs + c * cs) = v;
            }
        }
        return;
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, a) in row.iter().enumerate() {
            let mut s = hsum(*a);
            for t in k16..len {
                s += *xp.add(r * k + t) * *wp.add(c * k + t);
            }
            *out.add(r * rs + c * cs) = s;
        }
    }
}

/// The sum of a vector's 16 lanes, added in the order [`hsum8`] adds each of its vectors (so
/// a row's result does not depend on whether its tile was full): `h = lo + hi` over the 8-lane
/// halves, then `((h0 + h1) + (h2 + h3)) + ((h4 + h5) + (h6 + h7))`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn hsum(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    let s = _mm256_hadd_ps(h, h);
    let t = _mm256_hadd_ps(s, s);
    _mm_cvtss_f32(_mm_add_ss(
        _mm256_castps256_ps128(t),
        _mm256_extractf128_ps::<1>(t),
    ))
}

/// The lane sums of 8 vectors as one 8-lane vector (element `i` = sum of `v[i]`'s 16 lanes):
/// the halves added, then a transposing tree of horizontal adds, far fewer instructions than
/// eight separate reductions.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn hsum8(v: &[__m512; 8]) -> __m256 {
    let h: [__m256; 8] = std::array::from_fn(|i| {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v[i])));
        _mm256_add_ps(_mm512_castps512_ps256(v[i]), hi)
    });
    let s01 = _mm256_hadd_ps(h[0], h[1]);
    let s23 = _mm256_hadd_ps(h[2], h[3]);
    let s45 = _mm256_hadd_ps(h[4], h[5]);
    let s67 = _mm256_hadd_ps(h[6], h[7]);
    let t0 = _mm256_hadd_ps(s01, s23);
    let t1 = _mm256_hadd_ps(s45, s67);
    let lo = _mm256_permute2f128_ps(t0, t1, 0x20);
    let hi = _mm256_permute2f128_ps(t0, t1, 0x31);
    _mm256_add_ps(lo, hi)
}

/// The AVX-512 twin of `quant_dot::matmul_blocks`, on the same loop (`quant_dot::for_groups`):
/// `out[r * ld + c] = dot(x_r, w_c)` for the weight rows in `w`, each block unpacked into two
/// 16-lane registers (same formulas, so the weights are bit-identical to the f32 tensor) used
/// against up to 8 rows of `x`.
///
/// # Safety
/// As `quant_dot::matmul_blocks`, and the CPU must have AVX-512F ([`enabled`]).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn matmul_blocks(
    x: &[f32],
    m: usize,
    k: usize,
    w: Layout,
    out: *mut f32,
    ld: usize,
) {
    for_groups(x, m, k, w, out, ld, |g, r| match w {
        Layout::Q4_1 { d, m: mins, qs } => run_rows(g, r, Q4_1 { d, m: mins, qs }),
        Layout::Q8_0 { d, qs } => run_rows(g, r, Q8_0 { d, qs }),
    });
}

/// Unpacks a block's 32 weights into two 16-lane vectors (elements 0-15, 16-31).
trait Dequant: Copy {
    unsafe fn block(self, b: usize, out: &mut [__m512; 2]);
}

impl Dequant for Q4_1<'_> {
    /// Byte `j` of a block holds element `j` in its low nibble and `j + 16` in its high one.
    /// The block's 16 possible weights `q * d + m` (multiply then add as the loader does, no
    /// FMA: bit-identical weights) make a table in one register; each byte widened to a 32-bit
    /// lane is its own index (a permute reads only an index's low 4 bits), and the same lanes
    /// shifted right by 4 index the high nibbles: 6 vector instructions a block instead of 11
    /// (mask, shift, widen, convert, scale, offset).
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m512; 2]) {
        let (dv, mv) = (
            _mm512_set1_ps(*self.d.get_unchecked(b)),
            _mm512_set1_ps(*self.m.get_unchecked(b)),
        );
        let iota = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        let table = _mm512_add_ps(_mm512_mul_ps(iota, dv), mv);
        let raw = _mm_loadu_si128(self.qs.as_ptr().add(b * 16) as *const __m128i);
        let lanes = _mm512_cvtepu8_epi32(raw);
        out[0] = _mm512_permutexvar_ps(lanes, table);
        out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(lanes), table);
    }
}

impl Dequant for Q8_0<'_> {
    #[inline(always)]
    unsafe fn block(self, b: usize, out: &mut [__m512; 2]) {
        let dv = _mm512_set1_ps(*self.d.get_unchecked(b));
        let p = self.qs.as_ptr().add(b * BLOCK);
        for (v, o) in out.iter_mut().enumerate() {
            let bytes = _mm_loadu_si128(p.add(v * 16) as *const __m128i);
            *o = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), dv);
        }
    }
}

/// [`run`] for `rows` (1-8) rows of a group, with enough accumulators to hide FMA latency.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn run_rows(g: &Group, rows: usize, w: impl Dequant) {
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

/// `R` rows of `x`, `S` accumulators per row (vector `v` of a block goes to `v % S`).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn run<const R: usize, const S: usize>(g: &Group, w: impl Dequant) {
    let mut acc = [[_mm512_setzero_ps(); S]; R];
    let mut wv = [_mm512_setzero_ps(); 2];
    for blk in 0..g.blocks {
        w.block(g.first + blk, &mut wv);
        let xb = g.x.add(blk * R * BLOCK);
        for (v, wvec) in wv.iter().enumerate() {
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(xb.add(r * BLOCK + v * 16));
                a[v % S] = _mm512_fmadd_ps(xv, *wvec, a[v % S]);
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
    if R == 8 {
        let mut v = [0f32; 8];
        _mm256_storeu_ps(v.as_mut_ptr(), hsum8(&std::array::from_fn(|r| sums[r])));
        for (r, v) in v.into_iter().enumerate() {
            g.store(r, v);
        }
        return;
    }
    for (r, s) in sums.iter().enumerate() {
        g.store(r, hsum(*s));
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
    fn dot_block_matches_a_plain_product() {
        if !enabled() {
            eprintln!("no AVX-512 here: skipped");
            return;
        }
        for (m, k, cols) in [
            (8usize, 576usize, 7usize),
            (5, 40, 4),
            (1, 16, 1),
            (13, 1536, 3),
            (8, 40, 2),
            // k cut into spans (8 rows of x over 24 KiB), the last with a tail.
            (9, 1000, 5),
            (16, 3000, 4),
        ] {
            let (x, w) = (data(m * k, 7), data(cols * k, 11));
            let mut out = vec![f32::NAN; cols * m];
            // SAFETY: enabled() checked the CPU; the slices have the sizes asked for.
            unsafe { dot_block(&x, m, k, &w, (out.as_mut_ptr(), 1, m)) };
            for j in 0..cols {
                for i in 0..m {
                    let want: f64 = (0..k)
                        .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                        .sum();
                    let got = out[j * m + i] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{m}x{k}x{cols}"
                    );
                }
            }
        }
    }

    /// The block kernel against the same product on the dequantised weights, Q4_1 and Q8_0,
    /// for 1-9 rows of `x` and a `k` cut into several chunks.
    #[test]
    fn blocks_match_the_dequantised_product() {
        if !enabled() {
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
                let xp = crate::quant_dot::pack_rows(&x, m, k);
                // SAFETY: enabled() checked the CPU; whole blocks of `cols` rows.
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
