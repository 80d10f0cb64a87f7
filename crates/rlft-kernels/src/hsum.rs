//! Horizontal sums of AVX2 and AVX-512 vectors, shared by the streaming (`stream`) and GGUF
//! block (`quant`) kernels. Each adds its lanes in one fixed order, so a row's value does not
//! depend on which kernel or tile shape reduced it.
//!
//! They are safe functions compiled for their instruction set: a kernel compiled for the same
//! features calls them (inlined) without `unsafe`; anything else would have to promise the CPU
//! has the features.

use std::arch::x86_64::*;

/// The sum of an 8-lane vector's lanes: the 128-bit halves added, then lanes `(0 + 2, 1 + 3)`,
/// then those two.
///
/// # Safety
/// The CPU has AVX2 and FMA (callers compiled for them need no `unsafe`).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn hsum_avx2(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The lane sums of 8 vectors as one vector (element `i` = the sum of `v[i]`'s lanes): a
/// transposing tree of horizontal adds, far fewer instructions than eight [`hsum_avx2`]s.
///
/// # Safety
/// The CPU has AVX2 and FMA (callers compiled for them need no `unsafe`).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn hsum8_avx2(v: &[__m256]) -> __m256 {
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

/// The sum of a 16-lane vector's lanes, added in the order [`hsum8_avx512`] adds each of its
/// vectors (so a row's result does not depend on whether its tile was full): `h = lo + hi`
/// over the 8-lane halves, then `((h0 + h1) + (h2 + h3)) + ((h4 + h5) + (h6 + h7))`.
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA (callers compiled for them need no `unsafe`).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) fn hsum_avx512(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    let s = _mm256_hadd_ps(h, h);
    let t = _mm256_hadd_ps(s, s);
    _mm_cvtss_f32(_mm_add_ss(
        _mm256_castps256_ps128(t),
        _mm256_extractf128_ps::<1>(t),
    ))
}

/// The lane sums of 8 16-lane vectors as one 8-lane vector (element `i` = the sum of `v[i]`'s
/// lanes): the halves added, then the transposing tree of [`hsum8_avx2`].
///
/// # Safety
/// The CPU has AVX-512F, AVX2 and FMA (callers compiled for them need no `unsafe`).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) fn hsum8_avx512(v: &[__m512; 8]) -> __m256 {
    let h: [__m256; 8] = std::array::from_fn(|i| {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v[i])));
        _mm256_add_ps(_mm512_castps512_ps256(v[i]), hi)
    });
    hsum8_avx2(&h)
}
