//! Rotary embedding (HF "rotate half") with backward, reading a strided `[b, h, t, d]` view.
//!
//! `y1 = x1 * cos - x2 * sin`, `y2 = x2 * cos + x1 * sin` for the halves `x1 = x[.., :d/2]`,
//! `x2 = x[.., d/2:]`. The backward is the rotation by `-angle`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{dispatch, tensor, with_slice};
use crate::math::Real;

/// Applies rotary embeddings: `x [b, h, t, d]` (any strides with a unit last stride, e.g. the
/// transposed view of a projection's `[b, t, h, d]` output), `cos`, `sin` `[b, t, d/2]` (the
/// dtype of `x`, constants) -> contiguous `[b, h, t, d]`. One graph node with input `x` only.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let (b, h, t, d) = x.dims4()?;
    check(b, t, d, cos, sin)?;
    let x = if x.stride()[3] == 1 {
        x.clone()
    } else {
        x.contiguous()?
    };
    x.apply_op1(Rope {
        cos: cos.detach().contiguous()?,
        sin: sin.detach().contiguous()?,
        rows_in: None,
        dims: [b, h, t, d],
    })
}

/// [`rope`] straight from a projection's output `x [b, t, heads * d]` (contiguous): the
/// result is `[b, heads, t, d]` and the backward writes `dx` back as `[b, t, heads * d]`, so
/// no reshape or transpose node sits between the projection and the rotation.
pub fn rope_rows(
    x: &Tensor,
    heads: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> candle_core::Result<Tensor> {
    let (b, t, hd) = x.dims3()?;
    if heads == 0 || hd % heads != 0 {
        candle_core::bail!("rope_rows: {hd} features do not split into {heads} heads");
    }
    let d = hd / heads;
    check(b, t, d, cos, sin)?;
    x.contiguous()?.apply_op1(Rope {
        cos: cos.detach().contiguous()?,
        sin: sin.detach().contiguous()?,
        rows_in: Some(heads),
        dims: [b, heads, t, d],
    })
}

fn check(b: usize, t: usize, d: usize, cos: &Tensor, sin: &Tensor) -> candle_core::Result<()> {
    if d & 1 != 0 || cos.dims() != [b, t, d / 2] || sin.dims() != cos.dims() {
        candle_core::bail!(
            "rope: a head dim of {d} over [{b}, {t}] positions needs cos/sin [{b}, {t}, {}], \
             got {:?} / {:?}",
            d / 2,
            cos.dims(),
            sin.dims()
        );
    }
    Ok(())
}

struct Rope {
    cos: Tensor,
    sin: Tensor,
    /// `Some(heads)`: the input is `[b, t, heads * d]` rows (see [`rope_rows`]).
    rows_in: Option<usize>,
    /// `[b, h, t, d]` of the output.
    dims: [usize; 4],
}

/// Where rows live: element `(bi, hi, ti, j)` at `off + bi*s0 + hi*s1 + ti*s2 + j`.
#[derive(Clone, Copy)]
struct Strided {
    off: usize,
    st: [usize; 3],
}

impl Strided {
    fn at(&self, bi: usize, hi: usize, ti: usize) -> usize {
        self.off + bi * self.st[0] + hi * self.st[1] + ti * self.st[2]
    }
}

/// Rotates one `[d]` row (`backwards`: by `-angle`).
fn rotate_row<T: Real>(x: &[T], c: &[T], s: &[T], backwards: bool, y: &mut [T]) {
    let half = c.len();
    for j in 0..half {
        let (x1, x2) = (x[j], x[j + half]);
        let sn = if backwards { -s[j] } else { s[j] };
        y[j] = x1 * c[j] - x2 * sn;
        y[j + half] = x2 * c[j] + x1 * sn;
    }
}

/// Rotates every `[d]` row of `x` (read through `src`) into a new contiguous buffer laid out
/// `[b, h, t, d]`, or `[b, t, h, d]` when `out_rows`.
#[allow(clippy::too_many_arguments)]
fn rotate<T: Real>(
    x: &[T],
    src: Strided,
    dims: [usize; 4],
    cos: &[T],
    sin: &[T],
    backwards: bool,
    out_rows: bool,
) -> Vec<T> {
    let [b, h, t, d] = dims;
    let half = d / 2;
    let mut y = vec![T::from_f64(0.0); b * h * t * d];
    let one = |bi: usize, hi: usize, ti: usize, yr: &mut [T]| {
        let i = src.at(bi, hi, ti);
        let tab = (bi * t + ti) * half;
        rotate_row(
            &x[i..i + d],
            &cos[tab..tab + half],
            &sin[tab..tab + half],
            backwards,
            yr,
        );
    };
    if out_rows {
        y.par_chunks_mut(h * d).enumerate().for_each(|(bt, yc)| {
            let (bi, ti) = (bt / t, bt % t);
            for (hi, yr) in yc.chunks_mut(d).enumerate() {
                one(bi, hi, ti, yr);
            }
        });
    } else {
        y.par_chunks_mut(t * d).enumerate().for_each(|(bh, yc)| {
            let (bi, hi) = (bh / h, bh % h);
            for (ti, yr) in yc.chunks_mut(d).enumerate() {
                one(bi, hi, ti, yr);
            }
        });
    }
    y
}

impl CustomOp1 for Rope {
    fn name(&self) -> &'static str {
        "fused-rope"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("rope fwd");
        let [b, h, t, d] = self.dims;
        let src = match self.rows_in {
            Some(_) => {
                if !xl.is_contiguous() {
                    candle_core::bail!("rope_rows: the input must be contiguous");
                }
                Strided {
                    off: xl.start_offset(),
                    st: [t * h * d, d, h * d],
                }
            }
            None => {
                let st = xl.stride();
                if st[3] != 1 {
                    candle_core::bail!("rope: the last dim of x must be contiguous");
                }
                Strided {
                    off: xl.start_offset(),
                    st: [st[0], st[1], st[2]],
                }
            }
        };
        dispatch!(xs.dtype(), T => {
            let x = xs.as_slice::<T>()?;
            let y = with_slice::<T, _>(&self.cos, |c| {
                with_slice::<T, _>(&self.sin, |s| Ok(rotate(x, src, self.dims, c, s, false, false)))
            })?;
            Ok((T::to_cpu_storage_owned(y), Shape::from((b, h, t, d))))
        })
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _t = crate::op_time::span("rope bwd");
        let [_b, h, t, d] = self.dims;
        let dy = dy.contiguous()?;
        let src = Strided {
            off: 0,
            st: [h * t * d, t * d, d],
        };
        let out_rows = self.rows_in.is_some();
        dispatch!(x.dtype(), T => {
            let dx = with_slice::<T, _>(&dy, |g| {
                with_slice::<T, _>(&self.cos, |c| {
                    with_slice::<T, _>(&self.sin, |s| {
                        Ok(rotate(g, src, self.dims, c, s, true, out_rows))
                    })
                })
            })?;
            Ok(Some(tensor(dx, x.dims())?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
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
            let g1 = grads_of(&got, &coef);
            let g2 = grads_of(&want, &coef);
            let (d1, d2) = (
                g1.get(base.as_tensor()).unwrap(),
                g2.get(base.as_tensor()).unwrap(),
            );
            assert!(rel_diff(d1, d2) < tol, "{dtype:?}");
            // The same rotation straight from the projection rows.
            let rows = base.as_tensor().reshape((b, t, h * d)).unwrap();
            let got = rope_rows(&rows, h, &cos, &sin).unwrap();
            assert!(rel_diff(&got, &want) < tol);
            let g3 = grads_of(&got, &coef);
            assert!(rel_diff(g3.get(base.as_tensor()).unwrap(), d2) < tol);
        }
    }
}
