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
//! - [`quant_linear`]: the linear layer over a frozen base kept in GGUF blocks (LoRA over a
//!   GGUF file), dequantised chunk by chunk.
//! - [`head`]: LM head + log-softmax + gather over vocabulary blocks, never `[rows, vocab]`.
//! - [`quant_head`]: the same over a frozen head kept in GGUF blocks, dequantised once per
//!   forward a vocabulary chunk at a time (online softmax across the chunks), never whole.
//! - [`constant`]: products and element-wise ops with a constant operand (frozen weights,
//!   rotary tables, masks) that keep it out of the graph, on any device.
//!
//! Their building blocks live beside them: [`crate::math`] (the float types, `exp`,
//! reductions), [`crate::gemm`] (matrix products), [`crate::simd`](mod@crate::simd) (AVX2 dispatch).

pub mod act;
pub mod attention;
pub mod constant;
pub mod head;
pub mod linear;
mod low_rank;
pub mod norm;
pub mod quant_head;
pub mod quant_linear;
pub mod rope;

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{CpuStorage, DType, Device, Layout, Storage, Tensor};

use crate::math::Real;

static FUSED: AtomicBool = AtomicBool::new(true);

/// Turns the fused training kernels on or off for the whole process (on by default). Off, the
/// model uses candle's composites, and rlft-train's optimizer, accumulation and clipping their
/// tensor-op paths: what a non-CPU device runs, on the CPU. For A/B measurements and tests only.
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

#[cfg(test)]
pub(crate) mod test_util {
    use candle_core::backprop::GradStore;
    use candle_core::{DType, Device, Tensor};

    /// The gradients of `sum(out * coef)`: a fused op and its composite are compared through
    /// the same random linear function of their outputs.
    pub fn grads_of(out: &Tensor, coef: &Tensor) -> GradStore {
        (out * coef).unwrap().sum_all().unwrap().backward().unwrap()
    }

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
