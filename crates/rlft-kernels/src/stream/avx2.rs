//! The AVX2 + FMA register tile of the streaming kernel: `TILE_ROWS` rows of `x` by
//! [`TILE_COLS`] weight rows, on the shared tile loop ([`for_tiles`]).

use std::arch::x86_64::*;

use super::tiles::{for_tiles, Tile, TILE_COLS};
use crate::hsum::hsum_avx2;

/// Rows of `x` per register tile.
pub(crate) const TILE_ROWS: usize = 4;

/// Register tiles of `TILE_ROWS` rows of `x` by `TILE_COLS` weight rows ([`for_tiles`]):
/// each step loads `TILE_COLS` weight vectors and `TILE_ROWS` x vectors for
/// `TILE_ROWS * TILE_COLS` FMAs (12 accumulators, 16 registers in all).
///
/// # Safety
/// As [`super::dot_block_into`], and the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
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
    // the CPU has AVX2 and FMA (this function's contract).
    unsafe {
        for_tiles(x, m, k, w, out, TILE_ROWS, |nr, nc, t| {
            let Tile {
                xp,
                wp,
                op,
                rs,
                cs,
                pf,
                len,
            } = *t;
            let o = (op, rs, cs);
            match (nr, nc) {
                (4, 3) => tile::<4, 3>(xp, wp, k, len, o, pf),
                (4, 2) => tile::<4, 2>(xp, wp, k, len, o, pf),
                (4, 1) => tile::<4, 1>(xp, wp, k, len, o, pf),
                (3, 3) => tile::<3, 3>(xp, wp, k, len, o, pf),
                (3, 2) => tile::<3, 2>(xp, wp, k, len, o, pf),
                (3, 1) => tile::<3, 1>(xp, wp, k, len, o, pf),
                (2, 3) => tile::<2, 3>(xp, wp, k, len, o, pf),
                (2, 2) => tile::<2, 2>(xp, wp, k, len, o, pf),
                (2, 1) => tile::<2, 1>(xp, wp, k, len, o, pf),
                (1, 3) => tile::<1, 3>(xp, wp, k, len, o, pf),
                (1, 2) => tile::<1, 2>(xp, wp, k, len, o, pf),
                _ => tile::<1, 1>(xp, wp, k, len, o, pf),
            }
        })
    }
}

/// `out[r * rs + c * cs] = dot(x_r, w_c)` over the first `len` columns for `R` rows of `x`
/// and `C` weight rows (both of row stride `k`), given `(out, rs, cs)`; each dot sums 8
/// lanes, then the `len % 8` tail in order.
///
/// # Safety
/// The CPU has AVX2 and FMA; `xp` and `wp` each point at `R` and `C` rows (stride `k`) of
/// `len` readable values; `out[r * rs + c * cs]` is writable for `r < R`, `c < C` and no other
/// thread touches it meanwhile. `prefetch` may point anywhere (or be null).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    xp: *const f32,
    wp: *const f32,
    k: usize,
    len: usize,
    (out, rs, cs): (*mut f32, usize, usize),
    prefetch: *const f32,
) {
    let k8 = len / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut kk = 0;
    while kk < k8 {
        if !prefetch.is_null() && kk % 16 == 0 {
            for c in 0..TILE_COLS {
                let p = prefetch.wrapping_add(c * k + kk);
                _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            }
        }
        let mut wv = [_mm256_setzero_ps(); C];
        for (c, v) in wv.iter_mut().enumerate() {
            // SAFETY: `kk + 8 <= len`: inside weight row `c` (this function's contract).
            *v = unsafe { _mm256_loadu_ps(wp.add(c * k + kk)) };
        }
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: as above, inside row `r` of `x`.
            let xv = unsafe { _mm256_loadu_ps(xp.add(r * k + kk)) };
            for (a, wc) in row.iter_mut().zip(&wv) {
                *a = _mm256_fmadd_ps(xv, *wc, *a);
            }
        }
        kk += 8;
    }
    for (r, row) in acc.iter().enumerate() {
        for (c, a) in row.iter().enumerate() {
            let mut s = hsum_avx2(*a);
            // SAFETY: `t < len` inside both rows; the output element is writable (this
            // function's contract).
            unsafe {
                for t in k8..len {
                    s += *xp.add(r * k + t) * *wp.add(c * k + t);
                }
                *out.add(r * rs + c * cs) = s;
            }
        }
    }
}
