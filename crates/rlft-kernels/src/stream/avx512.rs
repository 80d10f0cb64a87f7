//! The AVX-512 twin of the streaming kernel's register tile: up to 8 rows of `x` by
//! [`TILE_COLS`] weight rows, 16 lanes, on the shared tile loop ([`for_tiles`]).
//!
//! A decode step at batch 8 is bound by its FMAs more than by reading the weights (each weight
//! feeds 8 of them), so on a CPU with AVX-512 the 16-lane FMAs do the same work in about half
//! the instructions. Same loop order as the AVX2 tile: each dot product is summed in 16
//! partial sums (a different rounding, ~1e-7 relative). Runs where [`crate::simd::avx512`]
//! says so.

use std::arch::x86_64::*;

use super::tiles::{for_tiles, TILE_COLS};
use crate::hsum::{hsum8_avx512, hsum_avx512};

/// Rows of `x` per register tile of [`dot_block`] (by [`TILE_COLS`] weight rows): 24 of the
/// 32 zmm registers accumulate, so a decode step's 8 rows share each weight load.
const TILE_ROWS: usize = 8;

/// For each weight row `j` in `w [cols, k]`: `out[j * m + i] = dot(x_i, w_j)`; the AVX-512
/// twin of the AVX2 tile, on the same tile loop ([`for_tiles`]) with tiles of up to 8 rows of
/// `x` by 3 weight rows, 24 zmm accumulators.
///
/// # Safety
/// The CPU must have AVX-512F, AVX2 and FMA ([`crate::simd::avx512`]); `out` as in
/// [`super::dot_block_into`] (element `(i, j)` at `i * rs + j * cs`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn dot_block(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    out: (*mut f32, usize, usize),
) {
    // SAFETY: `out` is as `for_tiles` asks (this function's contract); each tile's pointers
    // address `nr` rows of `x` and `nc` weight rows with `len` columns from the span's start
    // and the output elements of those rows and weight rows (`for_tiles` builds them so), and
    // the CPU has AVX-512F, AVX2 and FMA (this function's contract).
    unsafe {
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
}

/// `out[r * rs + c * cs] = dot(x_r, w_c)` over the first `len` columns for `R` rows of `x`
/// and `C` weight rows (both of row stride `k`), given `(out, rs, cs)`: 16 lanes over
/// `len / 16 * 16` columns, then the tail in order. (Accumulating spans are added by
/// `for_tiles`: an `out +=` here made LLVM spill the accumulators in the FMA loop; so did a
/// second store path for contiguous columns. One plain store per result keeps them in
/// registers.)
#[target_feature(enable = "avx512f,avx2,fma")]
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA; `xp` and `wp` each point at `R` and `C` rows (stride
/// `k`) of `len` readable values; `out[r * rs + c * cs]` is writable for `r < R`, `c < C` and
/// no other thread touches it meanwhile. `prefetch` may point anywhere (or be null).
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
            // SAFETY: `kk + 16 <= len`: inside weight row `c` (this function's contract).
            *v = unsafe { _mm512_loadu_ps(wp.add(c * k + kk)) };
        }
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: as above, inside row `r` of `x`.
            let xv = unsafe { _mm512_loadu_ps(xp.add(r * k + kk)) };
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
            // SAFETY: `v` holds the 8 f32 stored; `R == 8` output rows are writable (this
            // function's contract).
            unsafe {
                _mm256_storeu_ps(v.as_mut_ptr(), hsum8_avx512(&col));
                for (r, v) in v.into_iter().enumerate() {
                    *out.add(r * rs + c * cs) = v;
                }
            }
        }
        return;
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, a) in row.iter().enumerate() {
            let mut s = hsum_avx512(*a);
            // SAFETY: `t < len` inside both rows; the output element is writable (this
            // function's contract).
            unsafe {
                for t in k16..len {
                    s += *xp.add(r * k + t) * *wp.add(c * k + t);
                }
                *out.add(r * rs + c * cs) = s;
            }
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
    fn dot_block_matches_a_plain_product() {
        if !crate::simd::avx512() {
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
            // SAFETY: simd::avx512() checked the CPU; the slices have the sizes asked for.
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
}
