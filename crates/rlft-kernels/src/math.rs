//! The float types the kernels are written for ([`Real`]: f32 and f64), a vectorisable f32
//! `exp` ([`exp_f32`]), and reductions that keep [`LANES`] partial results so their loops
//! vectorise ([`sum`], [`dot`], [`max`]).

use candle_core::WithDType;

/// The float types the kernels are written for (f32, f64).
pub trait Real:
    WithDType
    + Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::iter::Sum
{
    /// `e^x`.
    fn exp(self) -> Self;
    /// `ln x`.
    fn ln(self) -> Self;
    /// `sqrt x`.
    fn sqrt(self) -> Self;
    /// The larger of two values.
    fn maxv(self, other: Self) -> Self;
    /// `-inf`.
    const NEG_INF: Self;
}

/// `x` as f32 values when `T` is f32, else `None`: the one place a generic kernel reaches an
/// f32-only path (a SIMD loop, a quantised weight) with its own slice.
pub(crate) fn as_f32<T: Real>(x: &[T]) -> Option<&[f32]> {
    // SAFETY: T is f32 (checked), so the slice is reinterpreted as its own type.
    (T::DTYPE == candle_core::DType::F32)
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
}

/// [`as_f32`] for a mutable slice.
pub(crate) fn as_f32_mut<T: Real>(x: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: as in `as_f32`.
    (T::DTYPE == candle_core::DType::F32)
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut f32, x.len()) })
}

/// `e^x` for f32 without a libm call, so loops over it vectorise: `2^n * e^r` with
/// `n = round(x / ln 2)` and a degree-6 polynomial (Cephes `expf`) for `e^r`, `|r| <= ln 2 / 2`.
/// Relative error below 2e-7 (libm's is about 1e-7); `x < -87` (including `-inf`) gives exactly
/// 0, NaN stays NaN, and `x` above 88 is clamped (softmax and sigmoid inputs never get there).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer in plain SSE2.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    // `t` holds `n = round(x / ln 2)` in its low mantissa bits: `n` is read from the bits (an
    // integer subtraction that vectorises, unlike a float-to-int cast, which saturates).
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let ni = t.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(ni.wrapping_add(127) << 23);
    if x < -87.0 {
        0.0
    } else {
        y * scale
    }
}

macro_rules! real {
    ($t:ty, $exp:expr) => {
        impl Real for $t {
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn maxv(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            const NEG_INF: Self = <$t>::NEG_INFINITY;
        }
    };
}
real!(f32, exp_f32);
real!(f64, f64::exp);

/// Independent partial sums in the reductions below: one 8-lane f32 vector (the order of
/// additions differs from a left-to-right sum only in rounding).
pub const LANES: usize = 8;

/// `sum(x)` with [`LANES`] partial sums, so the loop vectorises.
#[inline(always)]
pub fn sum<T: Real>(x: &[T]) -> T {
    let zero = T::from_f64(0.0);
    let mut acc = [zero; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for l in 0..LANES {
            acc[l] += c[l];
        }
    }
    let mut s = zero;
    for &v in it.remainder() {
        s += v;
    }
    acc.iter().fold(s, |a, &b| a + b)
}

/// `sum(a * b)` over the common length, with [`LANES`] partial sums.
#[inline(always)]
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let zero = T::from_f64(0.0);
    let mut acc = [zero; LANES];
    let (mut ia, mut ib) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ia).zip(&mut ib) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    // The lanes first, then the tail: the order `kernels::dot` (decoding) has always summed in.
    let mut s = acc.iter().fold(zero, |a, &b| a + b);
    for (&x, &y) in ia.remainder().iter().zip(ib.remainder()) {
        s += x * y;
    }
    s
}

/// The largest element (`-inf` for an empty slice; NaNs are skipped as `f32::max` does), with
/// [`LANES`] partial maxima.
#[inline(always)]
pub fn max<T: Real>(x: &[T]) -> T {
    let mut acc = [T::NEG_INF; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for l in 0..LANES {
            acc[l] = acc[l].maxv(c[l]);
        }
    }
    let m = it.remainder().iter().fold(T::NEG_INF, |m, &v| m.maxv(v));
    acc.iter().fold(m, |a, &b| a.maxv(b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn lane_reductions_match_plain_ones() {
        for n in [0usize, 1, 7, 8, 9, 63, 1000] {
            let x: Vec<f64> = (0..n)
                .map(|i| ((i * 37) % 101) as f64 / 7.0 - 5.0)
                .collect();
            let y: Vec<f64> = (0..n).map(|i| ((i * 11) % 13) as f64 - 6.0).collect();
            let want_sum: f64 = x.iter().sum();
            let want_dot: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
            let want_max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            assert!((super::sum(&x) - want_sum).abs() < 1e-9, "sum, n = {n}");
            assert!((super::dot(&x, &y) - want_dot).abs() < 1e-9, "dot, n = {n}");
            assert_eq!(super::max(&x), want_max, "max, n = {n}");
            assert_eq!(crate::simd!(super::max(&x)), want_max);
        }
        assert_eq!(super::dot(&[1.0f32, 2.0, 3.0], &[1.0, 1.0]), 3.0);
    }

    #[test]
    fn fast_exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = super::exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2e-7, "worst relative error {worst}");
        assert_eq!(super::exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::exp_f32(-100.0), 0.0);
        assert_eq!(super::exp_f32(0.0), 1.0);
        assert!(super::exp_f32(f32::NAN).is_nan());
    }
}
