//! The linear layer over a frozen base kept in GGUF blocks ([`QuantWeight`]): `x @ W^T (+ b)`
//! with backward to `x` only, one graph node. LoRA over such a base goes through
//! [`super::linear::lora_linear_over`] with [`FrozenBase::Quant`].
//!
//! Both passes dequantise the weight a chunk of rows at a time ([`crate::quant`]'s `xwt` and
//! `gw`), so no f32 copy of `W` lives beyond one 8 MiB scratch; against the dense layer on the
//! dequantised weight the results differ by a few ulps of `sum |x * w|` (gemm splits).

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::linear::rows_in;
use super::{contiguous_slice, tensor, with_slice};
use crate::gemm::gemm;
use crate::math::{as_f32, as_f32_mut, Real};
use crate::quant::QuantWeight;

/// The frozen base product of a linear layer: an f32/f64 tensor, or GGUF blocks (f32 only).
#[derive(Debug, Clone)]
pub enum FrozenBase {
    /// `[out, in]`, a constant.
    Dense(Tensor),
    /// `[out, in]` blocks, dequantised chunk by chunk.
    Quant(Arc<QuantWeight>),
}

impl FrozenBase {
    /// `(out, in)`.
    pub fn dims2(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            FrozenBase::Dense(w) => w.dims2(),
            FrozenBase::Quant(q) => Ok(q.dims()),
        }
    }

    /// `y [m, n] += x [m, k] @ W^T`.
    pub(crate) fn add_xwt<T: Real>(
        &self,
        m: usize,
        x: &[T],
        y: &mut [T],
    ) -> candle_core::Result<()> {
        let (n, k) = self.dims2()?;
        match self {
            FrozenBase::Dense(w) => with_slice::<T, _>(w, |w| {
                gemm(m, n, k, y, x, false, w, true, true);
                Ok(())
            }),
            FrozenBase::Quant(q) => {
                let (x, y) = (
                    f32_only::<T, _>(as_f32(x))?,
                    f32_only::<T, _>(as_f32_mut(y))?,
                );
                q.xwt(x, m, y, true);
                Ok(())
            }
        }
    }

    /// `dx [m, k] += g [m, n] @ W`.
    pub(crate) fn add_gw<T: Real>(
        &self,
        m: usize,
        g: &[T],
        dx: &mut [T],
    ) -> candle_core::Result<()> {
        let (n, k) = self.dims2()?;
        match self {
            FrozenBase::Dense(w) => with_slice::<T, _>(w, |w| {
                gemm(m, k, n, dx, g, false, w, false, true);
                Ok(())
            }),
            FrozenBase::Quant(q) => {
                let (g, dx) = (
                    f32_only::<T, _>(as_f32(g))?,
                    f32_only::<T, _>(as_f32_mut(dx))?,
                );
                q.gw(g, m, dx, true);
                Ok(())
            }
        }
    }
}

/// A quantised weight multiplies f32 activations only (`T` is the activations' type).
fn f32_only<T: Real, S>(x: Option<S>) -> candle_core::Result<S> {
    x.ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "a quantised weight needs f32 activations, got {:?}",
            T::DTYPE
        ))
    })
}

/// `x [.., k] @ W^T (+ bias [n]) -> [.., n]` for blocks `W [n, k]` and a constant `bias`
/// (CPU f32). The gradient goes to `x` when it tracks a graph.
pub fn quant_linear(
    x: &Tensor,
    w: &Arc<QuantWeight>,
    bias: Option<&Tensor>,
) -> candle_core::Result<Tensor> {
    let (n, k) = w.dims();
    let kx = x.dims().last().copied().unwrap_or(0);
    if kx != k || bias.is_some_and(|b| b.dims() != [n]) {
        candle_core::bail!(
            "quant_linear: x {:?} with blocks [{n}, {k}] and bias {:?}",
            x.dims(),
            bias.map(|b| b.dims().to_vec())
        );
    }
    if x.dtype() != DType::F32 || !x.device().is_cpu() {
        candle_core::bail!(
            "quant_linear: x must be an f32 CPU tensor, got {:?}",
            x.dtype()
        );
    }
    x.contiguous()?.apply_op1(QuantLinear {
        w: w.clone(),
        bias: bias.map(|b| b.detach().to_dtype(DType::F32)).transpose()?,
    })
}

struct QuantLinear {
    w: Arc<QuantWeight>,
    bias: Option<Tensor>,
}

impl CustomOp1 for QuantLinear {
    fn name(&self) -> &'static str {
        "quant-linear"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("quant-linear fwd");
        let (m, k) = rows_in(xl.dims());
        let (n, _) = self.w.dims();
        let x = contiguous_slice::<f32>(xs, xl)?;
        let mut y = vec![0f32; m * n];
        self.w.xwt(&x[..m * k], m, &mut y, false);
        if let Some(b) = &self.bias {
            with_slice::<f32, _>(b, |b| {
                y.par_chunks_mut(n)
                    .for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
                Ok(())
            })?;
        }
        let mut dims = xl.dims().to_vec();
        if let Some(l) = dims.last_mut() {
            *l = n;
        }
        Ok((f32::to_cpu_storage_owned(y), Shape::from(dims)))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        if !x.track_op() {
            return Ok(None);
        }
        let _t = crate::op_time::span("quant-linear bwd");
        let (m, k) = rows_in(x.dims());
        let dx = with_slice::<f32, _>(dy, |g| {
            let mut dx = vec![0f32; m * k];
            self.w.gw(g, m, &mut dx, false);
            Ok(dx)
        })?;
        Ok(Some(tensor(dx, x.dims())?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
    use super::*;
    use crate::quant::test_blocks::{random_blocks, reference};
    use candle_core::{Device, Var};
    use rlft_gguf::GgmlType;

    #[test]
    fn quantised_linear_matches_the_dense_layer_with_its_gradient() {
        let (m, k, n) = (13, 64, 21);
        let data = random_blocks(GgmlType::Q8_0, n, k, 3);
        let q = Arc::new(QuantWeight::from_gguf(GgmlType::Q8_0, n, k, &data).unwrap());
        let w =
            Tensor::from_vec(reference(GgmlType::Q8_0, n, k, &data), (n, k), &Device::Cpu).unwrap();
        let x = Var::from_tensor(&rand(&[1, m, k], 1, DType::F32)).unwrap();
        let bias = rand(&[n], 2, DType::F32);
        let coef = rand(&[1, m, n], 3, DType::F32);
        let got = quant_linear(x.as_tensor(), &q, Some(&bias)).unwrap();
        let want = super::super::linear::linear(x.as_tensor(), &w, Some(&bias)).unwrap();
        assert!(rel_diff(&got, &want) < 1e-5);
        let g1 = grads_of(&got, &coef);
        let g2 = grads_of(&want, &coef);
        let d = rel_diff(
            g1.get(x.as_tensor()).unwrap(),
            g2.get(x.as_tensor()).unwrap(),
        );
        assert!(d < 1e-5, "{d}");
        // LoRA over the blocks equals LoRA over the dequantised tensor.
        let a = Var::from_tensor(&rand(&[4, k], 5, DType::F32)).unwrap();
        let b = Var::from_tensor(&rand(&[n, 4], 6, DType::F32)).unwrap();
        let lora = |base: FrozenBase| {
            super::super::linear::lora_linear_over(
                x.as_tensor(),
                base,
                Some(&bias),
                a.as_tensor(),
                b.as_tensor(),
                0.5,
                None,
            )
            .unwrap()
        };
        let got = lora(FrozenBase::Quant(q.clone()));
        let want = lora(FrozenBase::Dense(w.clone()));
        assert!(rel_diff(&got, &want) < 1e-5);
        let g1 = grads_of(&got, &coef);
        let g2 = grads_of(&want, &coef);
        for v in [&x, &a, &b] {
            let d = rel_diff(
                g1.get(v.as_tensor()).unwrap(),
                g2.get(v.as_tensor()).unwrap(),
            );
            assert!(d < 1e-5, "lora: {d}");
        }
        assert!(quant_linear(&rand(&[2, 32], 1, DType::F32), &q, None).is_err());
        assert!(quant_linear(&rand(&[2, k], 1, DType::F64), &q, None).is_err());
    }
}
