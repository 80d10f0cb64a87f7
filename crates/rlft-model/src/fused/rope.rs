//! Rotary embedding (HF "rotate half") with backward, reading a strided `[b, h, t, d]` view.
//!
//! `y1 = x1 * cos - x2 * sin`, `y2 = x2 * cos + x1 * sin` for the halves `x1 = x[.., :d/2]`,
//! `x2 = x[.., d/2:]`. The backward is the rotation by `-angle`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{dispatch, tensor, with_slice, Real};

/// Applies rotary embeddings: `x [b, h, t, d]` (any strides with a unit last stride, e.g. the
/// transposed view of a projection's `[b, t, h, d]` output), `cos`, `sin` `[b, t, d/2]` (the
/// dtype of `x`, constants) -> contiguous `[b, h, t, d]`. One graph node with input `x` only.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let (b, _h, t, d) = x.dims4()?;
    if d % 2 != 0 || cos.dims() != [b, t, d / 2] || sin.dims() != cos.dims() {
        candle_core::bail!(
            "rope: x {:?} needs cos/sin [{b}, {t}, {}], got {:?} / {:?}",
            x.dims(),
            d / 2,
            cos.dims(),
            sin.dims()
        );
    }
    let x = if x.stride()[3] == 1 {
        x.clone()
    } else {
        x.contiguous()?
    };
    x.apply_op1(Rope {
        cos: cos.detach().contiguous()?,
        sin: sin.detach().contiguous()?,
    })
}

struct Rope {
    cos: Tensor,
    sin: Tensor,
}

/// Rotates every `[d]` row of `x` (element `(bi, hi, ti, j)` at `off + bi*s0 + hi*s1 + ti*s2 +
/// j`) into contiguous `[b, h, t, d]`; `sign = -1` rotates backwards.
#[allow(clippy::too_many_arguments)]
fn rotate<T: Real>(
    x: &[T],
    off: usize,
    strides: [usize; 3],
    dims: [usize; 4],
    cos: &[T],
    sin: &[T],
    backwards: bool,
) -> Vec<T> {
    let [b, h, t, d] = dims;
    let half = d / 2;
    let mut y = vec![T::from_f64(0.0); b * h * t * d];
    y.par_chunks_mut(t * d).enumerate().for_each(|(bh, yc)| {
        let (bi, hi) = (bh / h, bh % h);
        for ti in 0..t {
            let src = off + bi * strides[0] + hi * strides[1] + ti * strides[2];
            let xr = &x[src..src + d];
            let tab = (bi * t + ti) * half;
            let (c, s) = (&cos[tab..tab + half], &sin[tab..tab + half]);
            let yr = &mut yc[ti * d..(ti + 1) * d];
            for j in 0..half {
                let (x1, x2) = (xr[j], xr[j + half]);
                let sn = if backwards { -s[j] } else { s[j] };
                yr[j] = x1 * c[j] - x2 * sn;
                yr[j + half] = x2 * c[j] + x1 * sn;
            }
        }
    });
    y
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "fused-rope"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, h, t, d) = xl.shape().dims4()?;
        let st = xl.stride();
        if st[3] != 1 {
            candle_core::bail!("rope: the last dim of x must be contiguous");
        }
        dispatch!(xs.dtype(), T => {
            let x = xs.as_slice::<T>()?;
            let y = with_slice::<T, _>(&self.cos, |c| {
                with_slice::<T, _>(&self.sin, |s| {
                    Ok(rotate(x, xl.start_offset(), [st[0], st[1], st[2]], [b, h, t, d], c, s, false))
                })
            })?;
            Ok((T::to_cpu_storage_owned(y), Shape::from((b, h, t, d))))
        })
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let (b, h, t, d) = dy.dims4()?;
        let dy = dy.contiguous()?;
        let st = [h * t * d, t * d, d];
        dispatch!(x.dtype(), T => {
            let dx = with_slice::<T, _>(&dy, |g| {
                with_slice::<T, _>(&self.cos, |c| {
                    with_slice::<T, _>(&self.sin, |s| Ok(rotate(g, 0, st, [b, h, t, d], c, s, true)))
                })
            })?;
            Ok(Some(tensor(dx, &[b, h, t, d])?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{rand, rel_diff};
    use super::*;
    use candle_core::{DType, Var, D};

    fn composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let d = x.dim(D::Minus1).unwrap();
        let x1 = x.narrow(D::Minus1, 0, d / 2).unwrap();
        let x2 = x.narrow(D::Minus1, d / 2, d / 2).unwrap();
        let c = Tensor::cat(&[cos, cos], D::Minus1)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let s = Tensor::cat(&[sin, sin], D::Minus1)
            .unwrap()
            .unsqueeze(1)
            .unwrap();
        let rot = Tensor::cat(&[&x2.neg().unwrap(), &x1], D::Minus1).unwrap();
        (x.broadcast_mul(&c).unwrap() + rot.broadcast_mul(&s).unwrap()).unwrap()
    }

    #[test]
    fn matches_composite_on_a_transposed_view() {
        let (b, h, t, d) = (2, 3, 5, 8);
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            // The layout the decoder produces: [b, t, h, d] transposed to [b, h, t, d].
            let base = Var::from_tensor(&rand(&[b, t, h, d], 1, dtype)).unwrap();
            let x = base.as_tensor().transpose(1, 2).unwrap();
            let ang = (rand(&[b, t, d / 2], 2, dtype) * 3.0).unwrap();
            let (cos, sin) = (ang.cos().unwrap(), ang.sin().unwrap());
            let coef = rand(&[b, h, t, d], 3, dtype);
            let got = rope(&x, &cos, &sin).unwrap();
            let want = composite(&x, &cos, &sin);
            assert!(rel_diff(&got, &want) < tol);
            let g1 = (got * &coef)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let g2 = (want * &coef)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let (d1, d2) = (
                g1.get(base.as_tensor()).unwrap(),
                g2.get(base.as_tensor()).unwrap(),
            );
            assert!(rel_diff(d1, d2) < tol, "{dtype:?}");
        }
    }
}
