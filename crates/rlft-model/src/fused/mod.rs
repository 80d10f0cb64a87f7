//! Fused CPU kernels with backward for the training path.
//!
//! candle's differentiable composites record one graph node per elementary op, and its backward
//! allocates a zeroed gradient plus an add for every node: RMSNorm alone is eight nodes. Each op
//! here is one node whose forward and backward are single multi-threaded passes over the data
//! (rayon over rows), for f32 and f64 on CPU. Other devices and dtypes keep the composites
//! ([`enabled_for`] decides); tests check every kernel against the composite, values and
//! gradients.
//!
//! - [`norm::rms_norm`]: RMSNorm, gradient for the input and (when trainable) the weight.
//! - [`act::swiglu`]: `silu(gate) * up`.
//! - [`rope::rope`]: rotary embedding (HF "rotate half"), reading a strided `[b, h, t, d]` view.
//! - [`attention::attention`]: grouped-query attention, probabilities recomputed in backward.
//! - [`linear`]: `x @ W^T + b`, and the LoRA layer over a frozen base, one node each.
//! - [`head`]: LM head + log-softmax + gather over vocabulary blocks, never `[rows, vocab]`.

pub mod act;
pub mod attention;
pub mod head;
pub mod linear;
mod low_rank;
pub mod norm;
pub mod rope;

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{CpuStorage, DType, Device, Layout, Storage, Tensor, WithDType};

static FUSED: AtomicBool = AtomicBool::new(true);

/// Turns the fused training kernels on or off for the whole process (on by default). Off, the
/// model uses candle's composites: for A/B measurements and equivalence tests only.
pub fn set_enabled(on: bool) {
    FUSED.store(on, Ordering::Relaxed);
}

/// Whether [`set_enabled`] left the fused kernels on.
pub fn enabled() -> bool {
    FUSED.load(Ordering::Relaxed)
}

/// Whether the fused kernels handle tensors like `x`: switched on, CPU, f32 or f64.
pub fn enabled_for(x: &Tensor) -> bool {
    enabled() && matches!(x.device(), Device::Cpu) && matches!(x.dtype(), DType::F32 | DType::F64)
}

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

/// The contiguous elements of a CPU storage under `layout`; errors when the layout is strided.
pub(crate) fn contiguous_slice<'a, T: Real>(
    s: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("fused kernel: input is not contiguous"),
    }
}

/// Runs `f` on the contiguous elements of a CPU tensor (made contiguous first if needed).
pub(crate) fn with_slice<T: Real, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(s) => f(contiguous_slice::<T>(s, l)?),
        _ => candle_core::bail!("fused kernel: tensor is not on the CPU"),
    }
}

/// Whether this CPU has AVX2 and FMA (x86-64, checked once and cached by std).
#[inline(always)]
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Runs `f` inside a function compiled for AVX2 + FMA when the CPU has them (runtime check),
/// else as it is. The binary stays baseline x86-64; the kernels' loops, written as
/// `#[inline(always)]` functions called from `f`, are inlined into the AVX2 function and
/// vectorised 8 f32 wide there (4 wide with SSE2 otherwise).
///
/// Call it through [`simd!`], which passes the code as an `#[inline(always)]` closure. A
/// closure that LLVM chooses not to inline (it is called from both branches below) is compiled
/// once, for baseline x86-64, and the AVX2 function only jumps to it: RMSNorm's and the
/// attention backward's closures ran that way, seen in the disassembly (no `ymm` register in
/// them).
#[inline(always)]
pub(crate) fn run_simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { with_avx2_fma(f) };
        }
    }
    f()
}

/// `simd!(expr)` evaluates `expr` inside [`run_simd`]: compiled for AVX2 + FMA where the CPU
/// has them. The expression becomes an `#[inline(always)]` closure, so its code (and the
/// `#[inline(always)]` kernels it calls) lands in the AVX2 function.
macro_rules! simd {
    ($body:expr) => {
        $crate::fused::run_simd(
            #[inline(always)]
            || $body,
        )
    };
}
pub(crate) use simd;

/// Independent partial sums in the reductions below: one 8-lane f32 vector (the order of
/// additions differs from a left-to-right sum only in rounding).
pub(crate) const LANES: usize = 8;

/// `sum(x)` with [`LANES`] partial sums, so the loop vectorises.
#[inline(always)]
pub(crate) fn sum<T: Real>(x: &[T]) -> T {
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
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
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
pub(crate) fn max<T: Real>(x: &[T]) -> T {
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

/// A CPU tensor of `shape` from a vector.
pub(crate) fn tensor<T: Real>(v: Vec<T>, shape: &[usize]) -> candle_core::Result<Tensor> {
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// Dispatches on the dtype of a CPU storage: `$body` runs with `$t` bound to f32 or f64.
macro_rules! dispatch {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $t = f64;
                $body
            }
            other => candle_core::bail!("fused kernel: dtype {other:?} is not supported"),
        }
    };
}
pub(crate) use dispatch;

/// The gemm parallelism for the current rayon pool.
fn parallelism() -> gemm::Parallelism {
    let threads = rayon::current_num_threads();
    if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

/// Row-major `dst [m, n] (+)= a [m, k] @ b [k, n]`, where `a` and `b` may each be read
/// transposed: `a_t` means `a` is stored `[k, m]`, `b_t` means `b` is stored `[n, k]`.
/// `accumulate` adds to `dst` instead of overwriting it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
) {
    gemm_with(m, n, k, dst, a, a_t, b, b_t, accumulate, parallelism());
}

/// [`gemm`] on the calling thread only (for many small products inside a rayon task).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_seq<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
) {
    gemm_with(
        m,
        n,
        k,
        dst,
        a,
        a_t,
        b,
        b_t,
        accumulate,
        gemm::Parallelism::None,
    );
}

/// `a @ b` (transpositions as in [`gemm`]) into a new row-major `[m, n]` buffer that gemm
/// writes without reading it first, so the buffer is not zero-filled before the product (a
/// memset of the whole output on the calling thread, the other core waiting).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_new<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
) -> Vec<T> {
    if m == 0 || n == 0 || k == 0 {
        return vec![T::from_f64(0.0); m * n];
    }
    let mut dst: Vec<T> = Vec::with_capacity(m * n);
    // SAFETY: the capacity holds m * n elements. Without `accumulate` gemm computes
    // `dst = a @ b` with alpha zero, and its kernels then store every element of the `[m, n]`
    // output without loading it (gemm-common: `read_dst == false` sets alpha to zero, alpha
    // status 0 stores only), so all m * n elements are initialised before `set_len`.
    unsafe {
        gemm_raw(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            m * n,
            a,
            a_t,
            b,
            b_t,
            false,
            parallelism(),
        );
        dst.set_len(m * n);
    }
    dst
}

#[allow(clippy::too_many_arguments)]
fn gemm_with<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    // SAFETY: `dst` is an initialised slice of its own length.
    unsafe {
        gemm_raw(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst.len(),
            a,
            a_t,
            b,
            b_t,
            accumulate,
            par,
        )
    }
}

/// [`gemm_with`] into `dst_len` elements at `dst`.
///
/// # Safety
/// `dst` is valid for writes of `dst_len` elements (and for reads of them when `accumulate`)
/// and no other reference to them is used during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_len: usize,
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    assert!(dst_len >= m * n && a.len() >= m * k && b.len() >= k * n);
    if m == 0 || n == 0 {
        return;
    }
    // (column stride, row stride) of each operand.
    let (a_cs, a_rs) = if a_t {
        (m as isize, 1)
    } else {
        (1, k as isize)
    };
    let (b_cs, b_rs) = if b_t {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    let one = T::from_f64(1.0);
    // One product `dst[i0.., j0..] (+)= a[i0..i0 + mi, ..] @ b[.., j0..j0 + nj]` on `par`.
    // Pointers travel as addresses so the closure can be sent to another thread.
    let (d, ap, bp) = (dst as usize, a.as_ptr() as usize, b.as_ptr() as usize);
    let block = |i0: usize, mi: usize, j0: usize, nj: usize, par: gemm::Parallelism| {
        // SAFETY: the asserts above bound every index the strides reach: a is m*k, b is k*n
        // and dst is m*n elements, each addressed row-major (or transposed) within those
        // sizes; blocks run at the same time write disjoint parts of dst.
        unsafe {
            gemm::gemm(
                mi,
                nj,
                k,
                (d as *mut T).add(i0 * n + j0),
                1,
                n as isize,
                accumulate,
                (ap as *const T).offset(i0 as isize * a_rs),
                a_cs,
                a_rs,
                (bp as *const T).offset(j0 as isize * b_cs),
                b_cs,
                b_rs,
                one,
                one,
                false,
                false,
                false,
                par,
            );
        }
    };
    match par {
        // Two threads: each computes half of the output on its own (measured 3-8% above gemm's
        // own two-thread split on the model's shapes, `examples/matmul_bench.rs`), splitting
        // the longer side.
        gemm::Parallelism::Rayon(2)
            if m.max(n) >= SPLIT_MIN_SIDE && m * n * k >= SPLIT_MIN_MACS =>
        {
            if n >= m {
                let h = (n / 2).next_multiple_of(16).min(n);
                rayon::join(
                    || block(0, m, 0, h, gemm::Parallelism::None),
                    || block(0, m, h, n - h, gemm::Parallelism::None),
                );
            } else {
                let h = (m / 2).next_multiple_of(16).min(m);
                rayon::join(
                    || block(0, h, 0, n, gemm::Parallelism::None),
                    || block(h, m - h, 0, n, gemm::Parallelism::None),
                );
            }
        }
        par => block(0, m, 0, n, par),
    }
}

/// Products below this many multiply-adds keep gemm's own threading.
const SPLIT_MIN_MACS: usize = 1 << 22;
/// The side split in two must have at least this many rows or columns.
const SPLIT_MIN_SIDE: usize = 64;

#[cfg(test)]
mod tests {
    /// The two-thread split (rows or columns, every transposition, accumulate) equals one
    /// single-threaded gemm.
    #[test]
    fn split_gemm_equals_one_gemm() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (m, n, k) in [(130usize, 250usize, 170usize), (301, 97, 150)] {
            assert!(m * n * k >= super::SPLIT_MIN_MACS);
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 23) as f32 - 11.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 19) as f32 - 9.0).collect();
            for (a_t, b_t, acc) in [
                (false, false, false),
                (true, false, false),
                (false, true, true),
                (true, true, true),
            ] {
                let init: Vec<f32> = (0..m * n).map(|i| (i % 5) as f32).collect();
                let mut want = init.clone();
                super::gemm_seq(m, n, k, &mut want, &a, a_t, &b, b_t, acc);
                let mut got = init;
                pool.install(|| super::gemm(m, n, k, &mut got, &a, a_t, &b, b_t, acc));
                assert_eq!(got, want, "{m}x{n}x{k} a_t {a_t} b_t {b_t} acc {acc}");
            }
        }
    }

    /// `gemm_new` (an output gemm writes without reading) equals `gemm` into a zeroed buffer,
    /// for every transposition, on one thread and split over two, and for an empty `k`.
    #[test]
    fn gemm_into_a_new_buffer_equals_gemm_into_zeros() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (m, n, k) in [(130usize, 250usize, 170usize), (7, 5, 3), (4, 6, 0)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 23) as f32 - 11.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 19) as f32 - 9.0).collect();
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                let mut want = vec![0f32; m * n];
                super::gemm_seq(m, n, k, &mut want, &a, a_t, &b, b_t, false);
                let got = pool.install(|| super::gemm_new(m, n, k, &a, a_t, &b, b_t));
                assert_eq!(got, want, "{m}x{n}x{k} a_t {a_t} b_t {b_t}");
            }
        }
    }

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
            assert_eq!(super::simd!(super::max(&x)), want_max);
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

#[cfg(test)]
pub(crate) mod test_util {
    use candle_core::{DType, Device, Tensor};

    /// Deterministic values in [-1, 1).
    pub fn rand(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f64> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }

    /// Largest absolute difference, relative to the largest magnitude of `want` (at least 1).
    pub fn rel_diff(got: &Tensor, want: &Tensor) -> f64 {
        let g = got.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let w = want.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let g: Vec<f64> = g.to_vec1().unwrap();
        let w: Vec<f64> = w.to_vec1().unwrap();
        assert_eq!(g.len(), w.len());
        let scale = w.iter().fold(1f64, |m, x| m.max(x.abs()));
        g.iter()
            .zip(&w)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()))
            / scale
    }
}
