//! CPU building blocks of the fused kernels: typed views of candle's CPU storage, in-place access
//! through candle's `InplaceOp1` (no copies), and the element loops.
//!
//! Every loop is a plain indexed loop over equal-length slices that LLVM vectorises; each is
//! compiled twice, for the baseline target and with AVX2+FMA (picked at run time by
//! [`rlft_kernels::simd`]), because the default x86-64 target only has SSE2. Callers split tensors into [`CHUNK`]-element pieces and run
//! them on rayon's pool.

use std::cell::RefCell;

use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Storage, Tensor};
use half::{bf16, f16};
use rlft_kernels::simd_fn;

use crate::adamw::precision::{join, round_bf16, split};

/// Elements per parallel task: 64 KiB of f32 per stream, large enough to amortise scheduling,
/// small enough to balance 8k tasks over the cores for a 135M-parameter model.
pub(crate) const CHUNK: usize = 16 * 1024;

/// A float element type the fused kernels read and write (maths is always in f32).
pub(crate) trait Elem: Copy + Send + Sync {
    /// Widens to f32 (exact for every implementor).
    fn to_f32(self) -> f32;
    /// Rounds an f32 to this type (round-to-nearest-even).
    fn from_f32(x: f32) -> Self;
    /// Rounds an f32 master weight to this type: as `from_f32`, but half away from zero for
    /// bf16 (`adamw::precision`: what lets the split master reproduce the f32 one).
    #[inline(always)]
    fn from_master(x: f32) -> Self {
        Self::from_f32(x)
    }
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn from_master(x: f32) -> Self {
        round_bf16(x)
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// A read-only typed view of the elements of a contiguous f32/bf16/f16 CPU tensor.
pub(crate) enum FloatSlice<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
}

impl FloatSlice<'_> {
    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            FloatSlice::F32(s) => s.len(),
            FloatSlice::BF16(s) => s.len(),
            FloatSlice::F16(s) => s.len(),
        }
    }
}

/// A mutable typed view of the elements of a contiguous f32/bf16/f16 CPU tensor.
pub(crate) enum FloatSliceMut<'a> {
    F32(&'a mut [f32]),
    BF16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

/// The elements `layout` covers in `storage`, or `None` if it is not contiguous or not
/// f32/bf16/f16.
pub(crate) fn float_slice<'a>(storage: &'a CpuStorage, layout: &Layout) -> Option<FloatSlice<'a>> {
    let (a, b) = layout.contiguous_offsets()?;
    Some(match storage {
        CpuStorage::F32(v) => FloatSlice::F32(&v[a..b]),
        CpuStorage::BF16(v) => FloatSlice::BF16(&v[a..b]),
        CpuStorage::F16(v) => FloatSlice::F16(&v[a..b]),
        _ => return None,
    })
}

/// Mutable twin of [`float_slice`].
pub(crate) fn float_slice_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> Option<FloatSliceMut<'a>> {
    let (a, b) = layout.contiguous_offsets()?;
    Some(match storage {
        CpuStorage::F32(v) => FloatSliceMut::F32(&mut v[a..b]),
        CpuStorage::BF16(v) => FloatSliceMut::BF16(&mut v[a..b]),
        CpuStorage::F16(v) => FloatSliceMut::F16(&mut v[a..b]),
        _ => return None,
    })
}

/// The f32 elements `layout` covers in `storage` (the optimizer's own state tensors).
pub(crate) fn f32_slice_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
) -> candle_core::Result<&'a mut [f32]> {
    match float_slice_mut(storage, layout) {
        Some(FloatSliceMut::F32(s)) => Ok(s),
        _ => candle_core::bail!("rlft-train: optimizer state must be contiguous f32 on the CPU"),
    }
}

/// Whether `t` takes the in-place CPU paths: on the CPU, with the fused kernels on. Switched
/// off (`rlft_kernels::fused::set_enabled(false)`, tests only), CPU tensors take the tensor-op
/// path every other device takes, so that path can be tested without a GPU.
pub(crate) fn on_cpu_path(t: &Tensor) -> bool {
    t.device().is_cpu() && rlft_kernels::fused::enabled()
}

/// Whether the fused kernels can read or write `t` directly: CPU path, contiguous, f32/bf16/f16.
pub(crate) fn is_fusable(t: &Tensor) -> bool {
    on_cpu_path(t)
        && t.is_contiguous()
        && matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
}

/// An address identifying the storage (allocation) behind `t`: equal for tensors that share it.
pub(crate) fn storage_id(t: &Tensor) -> usize {
    let (s, _) = t.storage_and_layout();
    std::ptr::from_ref::<Storage>(&s) as usize
}

/// `InplaceOp1` running a closure once on the CPU storage of the tensor it is applied to.
struct WithCpuMut<F>(RefCell<Option<F>>);

impl<F> InplaceOp1 for WithCpuMut<F>
where
    F: FnOnce(&mut CpuStorage, &Layout) -> candle_core::Result<()>,
{
    fn name(&self) -> &'static str {
        "rlft-train-inplace"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        match self.0.borrow_mut().take() {
            Some(f) => f(storage, layout),
            None => candle_core::bail!("rlft-train: in-place closure ran twice"),
        }
    }
}

/// Runs `f` with write access to the CPU storage of `t` and its layout, in place (candle locks
/// the storage for the duration). Calls nest to hold several tensors at once. Errors on
/// non-CPU tensors (candle has no CUDA body for it): callers check the device first.
pub(crate) fn with_cpu_mut<F>(t: &Tensor, f: F) -> candle_core::Result<()>
where
    F: FnOnce(&mut CpuStorage, &Layout) -> candle_core::Result<()>,
{
    t.inplace_op1(&WithCpuMut(RefCell::new(Some(f))))
}

/// Per-step scalars of one AdamW update, in f32 (PyTorch's `_fused_adamw` also rounds them to
/// the parameter's opmath type, f32).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamWCoefs {
    /// `1 - lr * weight_decay` (decoupled weight decay, applied first).
    pub decay: f32,
    /// `1 - beta1`: `m += (1 - beta1) * (g - m)` (PyTorch's `lerp`).
    pub one_minus_beta1: f32,
    /// `beta2`.
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `lr / (1 - beta1^t)`.
    pub step_size: f32,
    /// `1 / sqrt(1 - beta2^t)`.
    pub inv_bc2_sqrt: f32,
    /// `eps`, added after the bias correction of `sqrt(v)`.
    pub eps: f32,
}

/// Elements of a stream the AdamW loop asks for ahead of the one it updates (4 KiB of f32).
const PREFETCH_AHEAD: usize = 1024;

/// Asks the CPU to bring element `i` of `s` into cache, if `s` has it (a hint: no effect on
/// results).
#[inline(always)]
fn prefetch<T>(s: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < s.len() {
        // SAFETY: a prefetch reads nothing architecturally; the address is inside `s`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                s.as_ptr().add(i).cast::<i8>(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, i);
}

/// One element of the AdamW update: returns the new `(p, m, v)`.
#[inline(always)]
fn adamw_one(p: f32, m: f32, v: f32, g: f32, k: &AdamWCoefs) -> (f32, f32, f32) {
    let mi = m + k.one_minus_beta1 * (g - m);
    let vi = k.beta2 * v + k.one_minus_beta2 * g * g;
    let denom = vi.sqrt() * k.inv_bc2_sqrt + k.eps;
    (p * k.decay - k.step_size * (mi / denom), mi, vi)
}

simd_fn! {
    /// One AdamW update of f32 parameters `p` with moments `m`, `v` and gradient `g` (all `[n]`).
    ///
    /// A cache line (16 elements) of each stream at a time, with the four streams' lines
    /// [`PREFETCH_AHEAD`] elements on requested first: the update is bound by memory (four
    /// streams read, three written), and this guest's hardware prefetcher keeps few streams
    /// ahead. (`adamw_master_chunk` repeats this loop: the two sharing one helper that takes
    /// the body as a closure over a range stopped LLVM vectorising it, 80 -> 124-133 ms.)
    pub(crate) fn adamw_chunk<G: Elem>(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[G], k: &AdamWCoefs) {
        let n = p.len();
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        let mut i0 = 0;
        while i0 + 16 <= n {
            let ahead = i0 + PREFETCH_AHEAD;
            prefetch(p, ahead);
            prefetch(m, ahead);
            prefetch(v, ahead);
            prefetch(g, ahead);
            for i in i0..i0 + 16 {
                (p[i], m[i], v[i]) = adamw_one(p[i], m[i], v[i], g[i].to_f32(), k);
            }
            i0 += 16;
        }
        for i in i0..n {
            (p[i], m[i], v[i]) = adamw_one(p[i], m[i], v[i], g[i].to_f32(), k);
        }
    }
}

simd_fn! {
    /// [`adamw_chunk`] on the f32 master copy `w` of low-precision parameters `p` (all `[n]`);
    /// `p` receives the rounded result.
    pub(crate) fn adamw_master_chunk<P: Elem, G: Elem>(
        w: &mut [f32],
        p: &mut [P],
        m: &mut [f32],
        v: &mut [f32],
        g: &[G],
        k: &AdamWCoefs,
    ) {
        let n = w.len();
        let (p, m, v, g) = (&mut p[..n], &mut m[..n], &mut v[..n], &g[..n]);
        macro_rules! one {
            ($i:expr) => {{
                let i = $i;
                let wi;
                (wi, m[i], v[i]) = adamw_one(w[i], m[i], v[i], g[i].to_f32(), k);
                w[i] = wi;
                p[i] = P::from_master(wi);
            }};
        }
        // As `adamw_chunk`: a line of each stream at a time, the next ones requested ahead.
        let mut i0 = 0;
        while i0 + 16 <= n {
            let ahead = i0 + PREFETCH_AHEAD;
            prefetch(w, ahead);
            prefetch(m, ahead);
            prefetch(v, ahead);
            prefetch(g, ahead);
            for i in i0..i0 + 16 {
                one!(i);
            }
            i0 += 16;
        }
        for i in i0..n {
            one!(i);
        }
    }
}

simd_fn! {
    /// [`adamw_master_chunk`] with the master kept as the bf16 parameters `p` plus their low
    /// halves `lo` (`adamw::precision::split`): the same `p`, `m`, `v` bit for bit.
    pub(crate) fn adamw_split_chunk<G: Elem>(
        p: &mut [bf16],
        lo: &mut [bf16],
        m: &mut [f32],
        v: &mut [f32],
        g: &[G],
        k: &AdamWCoefs,
    ) {
        let n = p.len();
        let (lo, m, v, g) = (&mut lo[..n], &mut m[..n], &mut v[..n], &g[..n]);
        for i in 0..n {
            let wi;
            (wi, m[i], v[i]) = adamw_one(join(p[i], lo[i]), m[i], v[i], g[i].to_f32(), k);
            (p[i], lo[i]) = split(wi);
        }
    }
}

simd_fn! {
    /// AdamW on low-precision parameters `p` with moments `m`, `v` of the same type and no
    /// master (PyTorch's fused kernel: each element in f32, the results rounded to nearest even).
    pub(crate) fn adamw_lowp_chunk<P: Elem, G: Elem>(
        p: &mut [P],
        m: &mut [P],
        v: &mut [P],
        g: &[G],
        k: &AdamWCoefs,
    ) {
        let n = p.len();
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        for i in 0..n {
            let (pi, mi, vi) = adamw_one(p[i].to_f32(), m[i].to_f32(), v[i].to_f32(), g[i].to_f32(), k);
            (p[i], m[i], v[i]) = (P::from_f32(pi), P::from_f32(mi), P::from_f32(vi));
        }
    }
}

simd_fn! {
    /// Sum of squares of `x`, accumulated in f64 (8 lanes, fixed order: deterministic).
    pub(crate) fn sum_sq<G: Elem>(x: &[G]) -> f64 {
        let mut acc = [0f64; 8];
        let blocks = x.chunks_exact(8);
        let tail = blocks.remainder();
        for b in blocks {
            for j in 0..8 {
                let v = b[j].to_f32() as f64;
                acc[j] += v * v;
            }
        }
        let mut s = 0f64;
        for a in acc {
            s += a;
        }
        for &t in tail {
            let v = t.to_f32() as f64;
            s += v * v;
        }
        s
    }
}

simd_fn! {
    /// `x *= a` in place (computed in f32, rounded back to the element type).
    pub(crate) fn scale_in_place<G: Elem>(x: &mut [G], a: f32) {
        for xi in x.iter_mut() {
            *xi = G::from_f32(xi.to_f32() * a);
        }
    }
}

simd_fn! {
    /// `acc += a * x` (f32 accumulator, `x` of any float type; both `[n]`).
    pub(crate) fn axpy<G: Elem>(acc: &mut [f32], x: &[G], a: f32) {
        let n = acc.len();
        let x = &x[..n];
        for i in 0..n {
            acc[i] += a * x[i].to_f32();
        }
    }
}

simd_fn! {
    /// `out = a * x` into a fresh f32 buffer (both `[n]`).
    pub(crate) fn scaled_copy<G: Elem>(out: &mut [f32], x: &[G], a: f32) {
        let n = out.len();
        let x = &x[..n];
        for i in 0..n {
            out[i] = a * x[i].to_f32();
        }
    }
}
