//! Building blocks shared by every family: linear layers, RMSNorm, RoPE, attention.
//!
//! On CPU f32/f64 the ops take [`rlft_kernels::fused`]'s kernels (one graph node each, with backward)
//! for training and for inference over more rows than a decoding step ([`use_fused`]).
//! Otherwise `grad = false` uses candle's fused CPU/CUDA kernels, which are fast but have no
//! backward (candle 0.11 drops their gradient silently), and `grad = true` uses composites of
//! differentiable ops. Tests check the paths agree.
//!
//! Constants under a graph (frozen weights, rotary tables, masks) go through ops whose only graph
//! input is the variable operand ([`frozen_linear`], [`mul_const`], [`add_const`]): candle's own
//! backward computes a gradient for every operand of a tracked op, trainable or not, which for a
//! frozen weight is a full `[out, in]` gemm per call.

pub use crate::config::inv_freq;
use std::sync::Arc;

use candle_core::{DType, Tensor, D};
pub use rlft_kernels::fused::attention::causal_bias;
pub use rlft_kernels::fused::constant::{
    add_const, frozen_linear, frozen_ops_enabled, mul_const, set_frozen_ops,
};
use rlft_kernels::fused::quant_linear::FrozenBase;
use rlft_kernels::quant::QuantWeight;

use crate::adapter::LoraAdapter;
use crate::error::Result;
use crate::weight::Weight;

/// A dense layer in HF layout: `weight [out, in]`, optional `bias [out]`, optional LoRA adapter.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`: a tensor, or a frozen base in GGUF blocks ([`Weight`]).
    pub weight: Weight,
    /// `[out]`.
    pub bias: Option<Tensor>,
    /// A LoRA adapter added to the output when enabled (see [`crate::lora`]).
    pub lora: Option<LoraAdapter>,
    /// The GGUF blocks `weight` was dequantised from, read by the decode path while they
    /// still mirror `weight` (see [`rlft_kernels::quant`]).
    pub quant: Option<std::sync::Arc<rlft_kernels::quant::QuantWeight>>,
}

impl Linear {
    /// A layer without adapter.
    pub fn new(weight: impl Into<Weight>, bias: Option<Tensor>) -> Self {
        Linear {
            weight: weight.into(),
            bias,
            lora: None,
            quant: None,
        }
    }

    /// The attached adapter if it is enabled.
    pub fn active_lora(&self) -> Option<&LoraAdapter> {
        self.lora.as_ref().filter(|l| l.enabled)
    }

    /// `x [.., in] -> [.., out]`, as one gemm over all leading dims, plus the enabled adapter's
    /// `scaling * dropout(x) @ A^T @ B^T`. Same as [`Self::forward_t`] with `grad = true`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, true)
    }

    /// `x [.., in] -> [.., out]`. `grad = false` (inference) uses the adapter's tensors detached,
    /// so adapters held as `Var`s record no graph and the streaming decode kernel stays usable
    /// for the base weight; `grad = true` (training) applies dropout when the adapter has a
    /// dropout seed ([`crate::lora::set_dropout_seed`]).
    ///
    /// Where [`use_fused`] holds, the product (base and adapter) is one [`rlft_kernels::fused::linear`]
    /// op. Otherwise the base product picks its kernel by what needs a gradient: a frozen weight
    /// with an input that tracks a graph goes through [`frozen_linear`] (backward computes `dx`
    /// only); nothing tracked and few rows take the streaming kernel; otherwise candle's matmul.
    pub fn forward_t(&self, x: &Tensor, grad: bool) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let in_dim = *dims.last().expect("rank >= 1");
        let rows: usize = dims[..dims.len() - 1].iter().product();
        if let Some(y) = self.fused_forward(x, grad)? {
            return Ok(y);
        }
        let x2 = x.contiguous()?.reshape((rows, in_dim))?;
        let mut y = self.base_forward(&x2)?;
        if let Some(lora) = self.active_lora() {
            y = lora.add_delta(&y, &x2, grad)?;
        }
        let mut out_dims = dims;
        *out_dims.last_mut().expect("rank >= 1") = self.weight.dims2()?.0;
        Ok(y.reshape(out_dims)?)
    }

    /// The training path through [`rlft_kernels::fused::linear`] (one graph node for the base product
    /// plus the adapter, no reshapes) when the kernels handle `x2 [.., in]`; `None` leaves it to
    /// candle's ops (other devices and dtypes, a trainable bias on a frozen weight, adapters
    /// in another dtype, or a trainable base weight under an adapter).
    fn fused_forward(&self, x2: &Tensor, grad: bool) -> Result<Option<Tensor>> {
        let w = match &self.weight {
            Weight::Dense(w) => w,
            Weight::Quant(q) => return self.quant_forward(x2, q, grad).map(Some),
        };
        // Decoding steps (few rows, no grad) keep the streaming kernel, which reads the weight
        // once for all rows.
        if !use_fused(x2, grad) || w.dtype() != x2.dtype() {
            return Ok(None);
        }
        if !grad {
            // Inference records no graph: every operand detached, as constants.
            let w = w.detach();
            let bias = self.bias.as_ref().map(Tensor::detach);
            return Ok(Some(match self.active_lora() {
                None => rlft_kernels::fused::linear::linear(x2, &w, bias.as_ref())?,
                Some(l) if l.a.dtype() == x2.dtype() => rlft_kernels::fused::linear::lora_linear(
                    x2,
                    &w,
                    bias.as_ref(),
                    &l.a.detach(),
                    &l.b.detach(),
                    l.scaling,
                    None,
                )?,
                Some(_) => return Ok(None),
            }));
        }
        let trainable_bias = self.bias.as_ref().is_some_and(Tensor::track_op);
        match self.active_lora() {
            None => {
                let frozen_bias = self.bias.as_ref().filter(|b| !b.track_op());
                let y = rlft_kernels::fused::linear::linear(x2, w, frozen_bias)?;
                Ok(Some(match &self.bias {
                    Some(b) if trainable_bias => y.broadcast_add(b)?,
                    _ => y,
                }))
            }
            Some(l) if !w.track_op() && !trainable_bias && l.a.dtype() == x2.dtype() => {
                let mask = l.dropout_mask(x2.dims(), grad, x2.device())?;
                let y = rlft_kernels::fused::linear::lora_linear(
                    x2,
                    w,
                    self.bias.as_ref(),
                    &l.a,
                    &l.b,
                    l.scaling,
                    mask.as_ref(),
                )?;
                Ok(Some(y))
            }
            Some(_) => Ok(None),
        }
    }

    /// The product over a base kept in GGUF blocks (any number of rows; f32 CPU
    /// activations): the layer plus its enabled adapter, gradients to `x` and the adapter.
    fn quant_forward(&self, x2: &Tensor, q: &Arc<QuantWeight>, grad: bool) -> Result<Tensor> {
        let x2 = if grad { x2.clone() } else { x2.detach() };
        let trainable_bias = self.bias.as_ref().is_some_and(Tensor::track_op);
        let frozen_bias = self.bias.as_ref().filter(|b| !b.track_op());
        let y = match self.active_lora() {
            Some(l) if l.a.dtype() == x2.dtype() => {
                let (a, b) = if grad {
                    (l.a.clone(), l.b.clone())
                } else {
                    (l.a.detach(), l.b.detach())
                };
                let mask = l.dropout_mask(x2.dims(), grad, x2.device())?;
                rlft_kernels::fused::linear::lora_linear_over(
                    &x2,
                    FrozenBase::Quant(q.clone()),
                    frozen_bias,
                    &a,
                    &b,
                    l.scaling,
                    mask.as_ref(),
                )?
            }
            Some(_) => {
                return Err(crate::error::ModelError::Invalid(
                    "a LoRA adapter over a quantised base must be f32".into(),
                ))
            }
            None => rlft_kernels::fused::quant_linear::quant_linear(&x2, q, frozen_bias)?,
        };
        Ok(match &self.bias {
            Some(b) if trainable_bias => y.broadcast_add(b)?,
            _ => y,
        })
    }

    /// `x [rows, in] @ W^T (+ b)` without the adapter.
    fn base_forward(&self, x2: &Tensor) -> Result<Tensor> {
        let Weight::Dense(weight) = &self.weight else {
            unreachable!("fused_forward takes every quantised base")
        };
        if x2.track_op() && !weight.track_op() && frozen_ops_enabled() {
            let frozen_bias = self.bias.as_ref().filter(|b| !b.track_op());
            let y = frozen_linear(x2, weight, frozen_bias)?;
            return match &self.bias {
                Some(b) if b.track_op() => Ok(y.broadcast_add(b)?),
                _ => Ok(y),
            };
        }
        if let Some(y) = inference_small_matmul(x2, weight, self.bias.as_ref())? {
            return Ok(y);
        }
        let mut y = x2.matmul(&weight.t()?)?;
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        Ok(y)
    }
}

/// `x [m, k] @ w^T` through the streaming kernel when nothing needs a gradient and `m` is small
/// (decoding); `None` means use gemm.
pub fn inference_small_matmul(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    if x.track_op() || w.track_op() || bias.is_some_and(Tensor::track_op) {
        return Ok(None);
    }
    Ok(rlft_kernels::stream::matmul_wt_small(x, w, bias)?)
}

/// The dtype norms, softmax and logits are computed in: f32 as transformers does, except that f64
/// models stay in f64 (so finite-difference gradient checks are exact to ~1e-10).
pub fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// RMSNorm over the last dim, statistics in f32 (as transformers; f64 for f64 models):
/// `x [.., h] -> weight * (x / sqrt(mean(x^2) + eps))`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, grad: bool) -> Result<Tensor> {
    let dtype = x.dtype();
    if use_fused(x, grad) && weight.dtype() == dtype {
        let weight = if grad {
            weight.clone()
        } else {
            weight.detach()
        };
        return Ok(rlft_kernels::fused::norm::rms_norm(x, &weight, eps)?);
    }
    // candle's one-kernel RMSNorm for inference (f32 statistics, one rounding at the end; on a
    // GPU one launch instead of the composite's eight). transformers rounds the normalised
    // input to the dtype before the weight multiplies it: in bf16 the two differ by at most
    // one rounding.
    if !grad && matches!(dtype, DType::F32 | DType::BF16 | DType::F16) && weight.dtype() == dtype {
        return Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            weight,
            eps as f32,
        )?);
    }
    let xf = x.to_dtype(compute_dtype(dtype))?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = xf.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dtype)?;
    Ok(mul_const(&normed, weight)?)
}

/// Rotary tables for given positions: `positions [b, t] (u32) -> (cos, sin)`, each
/// `[b, t, head_dim / 2]` f32. Angles are `position * inv_freq` in f32, as transformers does.
pub fn rope_tables(inv_freq: &Tensor, positions: &Tensor) -> Result<(Tensor, Tensor)> {
    let pos = positions.to_dtype(DType::F32)?.unsqueeze(D::Minus1)?;
    let angles = pos.broadcast_mul(&inv_freq.reshape((1, 1, ()))?)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// Whether an op on `x [.., d]` takes the fused kernel ([`rlft_kernels::fused`]): when they handle
/// `x`, for training, and for inference over more rows than a decoding step has (a prefill, a
/// reference pass); decoding steps keep candle's kernels, cheaper on a few rows.
pub fn use_fused(x: &Tensor, grad: bool) -> bool {
    rlft_kernels::fused::enabled_for(x)
        && (grad
            || x.elem_count() / x.dims().last().copied().unwrap_or(1).max(1)
                > rlft_kernels::stream::SMALL_M)
}

/// Applies rotary embeddings (HF "rotate half" convention): `x [b, h, t, d]`,
/// `cos/sin [b, t, d/2]` -> `[b, h, t, d]`.
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor, grad: bool) -> Result<Tensor> {
    let dtype = x.dtype();
    let (cos, sin) = (cos.to_dtype(dtype)?, sin.to_dtype(dtype)?);
    if !grad {
        return Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, &cos, &sin)?);
    }
    if rlft_kernels::fused::enabled_for(x) {
        return Ok(rlft_kernels::fused::rope::rope(x, &cos, &sin)?);
    }
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let cos = Tensor::cat(&[&cos, &cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[&sin, &sin], D::Minus1)?.unsqueeze(1)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((mul_const(x, &cos)? + mul_const(&rotated, &sin)?)?)
}

/// Softmax over the last dim.
pub fn softmax(x: &Tensor, grad: bool) -> Result<Tensor> {
    if grad {
        Ok(candle_nn::ops::softmax(x, D::Minus1)?)
    } else {
        Ok(candle_nn::ops::softmax_last_dim(&x.contiguous()?)?)
    }
}

/// Grouped-query attention without copying K/V per query head.
///
/// `q [b, h, t, d]`, `k/v [b, kvh, T, d]` (T = past + t), `bias [b, 1, t, T]` additive mask
/// (0 or -inf) -> `[b, h, t, d]`. Query heads `g*groups .. (g+1)*groups` share kv head `g`,
/// as in transformers' `repeat_kv`. candle's ops (the path for other devices and dtypes, and
/// the reference the fused kernel is tested against); the model calls [`attention_rows`],
/// which takes [`rlft_kernels::fused::attention`] where it applies.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, grad: bool) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let kvh = k.dim(1)?;
    let big_t = k.dim(2)?;
    let groups = h / kvh;
    let scale = 1.0 / (d as f64).sqrt();
    let dtype = q.dtype();
    let cdt = compute_dtype(dtype);
    // [b, kvh, groups * t, d]: rows are (group, position) pairs.
    let qg = q.contiguous()?.reshape((b, kvh, groups * t, d))?;
    let scores = (qg.matmul(&k.t()?)? * scale)?;
    let scores = scores.to_dtype(cdt)?.reshape((b, kvh, groups, t, big_t))?;
    let scores = add_const(&scores, &bias.to_dtype(cdt)?.unsqueeze(1)?)?.reshape((
        b,
        kvh,
        groups * t,
        big_t,
    ))?;
    let probs = softmax(&scores, grad)?.to_dtype(dtype)?;
    let out = probs.matmul(&v.contiguous()?)?;
    Ok(out.reshape((b, h, t, d))?)
}

/// [`attention`] with the output laid out `[b, t, h * d]` (the output projection's input); the
/// fused kernel writes that layout directly.
pub fn attention_rows(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    grad: bool,
) -> Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let big_t = k.dim(2)?;
    if rlft_kernels::fused::enabled_for(q) && bias.dims4()? == (b, 1, t, big_t) {
        let scale = 1.0 / (d as f64).sqrt();
        let bias = bias.to_dtype(q.dtype())?;
        return Ok(rlft_kernels::fused::attention::attention_rows(
            q, k, v, &bias, scale,
        )?);
    }
    let out = attention(q, k, v, bias, grad)?;
    Ok(out.transpose(1, 2)?.reshape((b, t, h * d))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RopeConfig, RopeScaling};
    use candle_core::Device;

    fn rand(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn fused_and_composite_paths_agree() {
        let x = rand(&[2, 3, 5, 8], 1);
        let w = rand(&[8], 2);
        let a = rms_norm(&x, &w, 1e-5, false).unwrap();
        let b = rms_norm(&x, &w, 1e-5, true).unwrap();
        assert!(max_diff(&a, &b) < 1e-5);
        let pos = Tensor::new(&[[0u32, 1, 2, 3, 4], [7, 8, 9, 10, 11]], &Device::Cpu).unwrap();
        let rope = RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::Default,
        };
        let f = Tensor::new(inv_freq(&rope, 8), &Device::Cpu).unwrap();
        let (c, s) = rope_tables(&f, &pos).unwrap();
        let a = apply_rope(&x, &c, &s, false).unwrap();
        let b = apply_rope(&x, &c, &s, true).unwrap();
        assert!(max_diff(&a, &b) < 1e-5);
        let a = softmax(&x, false).unwrap();
        let b = softmax(&x, true).unwrap();
        assert!(max_diff(&a, &b) < 1e-6);
    }

    /// bf16 inference takes candle's one-kernel RMSNorm; the composite (transformers' order:
    /// the normalised input rounded to bf16, then the weight) differs by at most one rounding.
    #[test]
    fn bf16_rms_norm_kernel_matches_the_composite() {
        let x = rand(&[2, 3, 5, 64], 3).to_dtype(DType::BF16).unwrap();
        let w = rand(&[64], 4).to_dtype(DType::BF16).unwrap();
        let kernel = rms_norm(&x, &w, 1e-6, false).unwrap();
        let composite = rms_norm(&x, &w, 1e-6, true).unwrap();
        assert_eq!(kernel.dtype(), DType::BF16);
        let f = |t: &Tensor| {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        for (a, b) in f(&kernel).iter().zip(f(&composite)) {
            // Two bf16 roundings apart at most: 2^-7 of the value each.
            assert!(
                (a - b).abs() <= a.abs().max(b.abs()) / 64.0 + 1e-6,
                "{a} vs {b}"
            );
        }
    }

    #[test]
    fn gqa_attention_matches_repeated_heads() {
        let (b, h, kvh, t, d) = (2, 4, 2, 3, 8);
        let q = rand(&[b, h, t, d], 3);
        let k = rand(&[b, kvh, t, d], 4);
        let v = rand(&[b, kvh, t, d], 5);
        let bias = causal_bias(&[0, 1], 0, t, &Device::Cpu).unwrap();
        let got = attention(&q, &k, &v, &bias, false).unwrap();
        // Reference: repeat kv heads, plain attention.
        let rep = |x: &Tensor| {
            x.unsqueeze(2)
                .unwrap()
                .expand((b, kvh, h / kvh, t, d))
                .unwrap()
                .reshape((b, h, t, d))
                .unwrap()
        };
        let (k2, v2) = (rep(&k), rep(&v));
        let s = (q.matmul(&k2.t().unwrap()).unwrap() / (d as f64).sqrt()).unwrap();
        let s = s.broadcast_add(&bias).unwrap();
        let p = candle_nn::ops::softmax(&s, D::Minus1).unwrap();
        let want = p.matmul(&v2).unwrap();
        assert!(max_diff(&got, &want) < 1e-5);
    }

    #[test]
    fn llama3_scaling_leaves_high_frequencies() {
        let rope = RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            },
        };
        let plain = inv_freq(
            &RopeConfig {
                theta: 500000.0,
                scaling: RopeScaling::Default,
            },
            128,
        );
        let scaled = inv_freq(&rope, 128);
        assert_eq!(plain[0], scaled[0]);
        assert!((scaled[63] - plain[63] / 8.0).abs() < 1e-12);
    }
}
