//! Grouped-query attention with backward, one graph node, probabilities never stored.
//!
//! Work is split by (batch row, kv head): each task gathers its query heads' rows `[g*t, d]`
//! and the shared `K`, `V` `[T, d]`, then runs small single-threaded gemms, so two cores do
//! not synchronise on every tiny product as a batched matmul would. The backward recomputes
//! the probabilities tile by tile (as flash attention does), so memory holds `q`, `k`, `v` and
//! the output only, whatever the sequence length.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Storage, Tensor, WithDType};
use rayon::prelude::*;

use super::{dispatch, tensor, with_slice};
use crate::gemm::gemm_seq;
use crate::math::{dot, max, sum, Real};
use crate::simd;

/// `softmax(q k^T * scale + bias) v` with grouped kv heads: `q [b, h, t, d]`,
/// `k, v [b, kvh, T, d]` (any strides with a unit last stride), `bias [b, 1, t, T]` an additive
/// constant mask (0 or -inf, every row with a finite entry) -> contiguous `[b, h, t, d]`.
/// Query heads `g*groups .. (g+1)*groups` share kv head `g`, as transformers' `repeat_kv`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    apply(q, k, v, bias, scale, false)
}

fn apply(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
    rows_out: bool,
) -> candle_core::Result<Tensor> {
    let (b, h, t, d) = q.dims4()?;
    let (kb, kvh, big_t, kd) = k.dims4()?;
    if kb != b
        || kd != d
        || v.dims() != k.dims()
        || kvh == 0
        || h % kvh != 0
        || bias.dims() != [b, 1, t, big_t]
    {
        candle_core::bail!(
            "attention: q {:?}, k {:?}, v {:?}, mask {:?} do not fit \
             ([b, h, t, d], [b, kvh, T, d] twice, [b, 1, t, T])",
            q.dims(),
            k.dims(),
            v.dims(),
            bias.dims()
        );
    }
    let unit = |x: &Tensor| -> candle_core::Result<Tensor> {
        if x.stride()[3] == 1 {
            Ok(x.clone())
        } else {
            x.contiguous()
        }
    };
    unit(q)?.apply_op3(
        &unit(k)?,
        &unit(v)?,
        Attention {
            bias: bias.detach().contiguous()?,
            scale,
            rows_out,
        },
    )
}

/// [`attention`] with the output laid out `[b, t, h * d]`, the input of the output projection:
/// no transpose and copy node between the two.
pub fn attention_rows(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    apply(q, k, v, bias, scale, true)
}

struct Attention {
    bias: Tensor,
    scale: f64,
    /// Output `[b, t, h * d]` instead of `[b, h, t, d]`.
    rows_out: bool,
}

/// A strided `[b, heads, rows, d]` view with a unit last stride.
#[derive(Clone, Copy)]
struct View<'a, T> {
    data: &'a [T],
    off: usize,
    st: [usize; 3],
    d: usize,
}

impl<'a, T: Real> View<'a, T> {
    fn new(data: &'a [T], l: &Layout) -> candle_core::Result<Self> {
        let st = l.stride();
        if st.len() != 4 || st[3] != 1 {
            candle_core::bail!("attention: inputs need a unit last stride");
        }
        Ok(View {
            data,
            off: l.start_offset(),
            st: [st[0], st[1], st[2]],
            d: l.dims()[3],
        })
    }

    fn row(&self, bi: usize, hi: usize, ti: usize) -> &'a [T] {
        let s = self.off + bi * self.st[0] + hi * self.st[1] + ti * self.st[2];
        &self.data[s..s + self.d]
    }

    /// Rows `0..n` of heads `h0..h0 + heads` of batch row `bi`, packed `[heads * n, d]`.
    fn gather(&self, bi: usize, h0: usize, heads: usize, n: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(heads * n * self.d);
        for hi in h0..h0 + heads {
            for ti in 0..n {
                out.extend_from_slice(self.row(bi, hi, ti));
            }
        }
        out
    }
}

/// Shapes of one call.
#[derive(Clone, Copy)]
struct Dims {
    h: usize,
    t: usize,
    d: usize,
    kvh: usize,
    big_t: usize,
}

impl Dims {
    fn groups(&self) -> usize {
        self.h / self.kvh
    }
}

/// Query positions per block: each block computes scores only over the keys its rows can see.
const QUERY_BLOCK: usize = 32;

/// A block of query rows of one task and the keys they see: rows `r0..r0 + n` of the task's
/// packed `[g * t, d]` queries (one head, consecutive positions) and keys `k0..k1`, the union of
/// the rows' unmasked key ranges (a causal mask skips about half the scores).
#[derive(Clone, Copy)]
struct Block {
    r0: usize,
    n: usize,
    /// First query position of the block.
    t0: usize,
    k0: usize,
    k1: usize,
}

impl Block {
    fn keys(&self) -> usize {
        self.k1 - self.k0
    }
}

/// The blocks of a task of batch row `bi`: for each head of the group, positions in chunks of
/// [`QUERY_BLOCK`], each with the key range outside which the bias row is `-inf` for all its
/// positions.
fn blocks<T: Real>(bias: &[T], bi: usize, dm: Dims) -> Vec<Block> {
    // Unmasked key range [lo, hi) of each query position.
    let ranges: Vec<(usize, usize)> = (0..dm.t)
        .map(|ti| {
            let row = &bias[(bi * dm.t + ti) * dm.big_t..(bi * dm.t + ti + 1) * dm.big_t];
            let lo = row.iter().position(|&m| m > T::NEG_INF).unwrap_or(0);
            let hi = row
                .iter()
                .rposition(|&m| m > T::NEG_INF)
                .map_or(dm.big_t, |j| j + 1);
            (lo, hi.max(lo + 1))
        })
        .collect();
    let mut out = Vec::new();
    for gi in 0..dm.groups() {
        for t0 in (0..dm.t).step_by(QUERY_BLOCK) {
            let n = QUERY_BLOCK.min(dm.t - t0);
            let rs = &ranges[t0..t0 + n];
            let k0 = rs.iter().map(|r| r.0).min().unwrap_or(0);
            let k1 = rs.iter().map(|r| r.1).max().unwrap_or(dm.big_t);
            out.push(Block {
                r0: gi * dm.t + t0,
                n,
                t0,
                k0,
                k1,
            });
        }
    }
    out
}

/// Probabilities `[n, k1 - k0]` of one block: `softmax(q k^T * scale + bias)` over its keys
/// (the masked keys outside the range have probability 0).
#[allow(clippy::too_many_arguments)]
fn probs<T: Real>(
    qg: &[T],
    kk: &[T],
    bias: &[T],
    bi: usize,
    dm: Dims,
    blk: Block,
    scale: T,
) -> Vec<T> {
    let (d, kn) = (dm.d, blk.keys());
    let mut p = vec![T::from_f64(0.0); blk.n * kn];
    let q = &qg[blk.r0 * d..(blk.r0 + blk.n) * d];
    gemm_seq(
        blk.n,
        kn,
        d,
        &mut p,
        q,
        false,
        &kk[blk.k0 * d..blk.k1 * d],
        true,
        false,
    );
    simd!(softmax_rows(&mut p, bias, bi, dm, blk, scale));
    p
}

/// Scores `[n, kn]` -> probabilities in place: `softmax(s * scale + bias row)`.
#[inline(always)]
fn softmax_rows<T: Real>(p: &mut [T], bias: &[T], bi: usize, dm: Dims, blk: Block, scale: T) {
    for (i, pr) in p.chunks_mut(blk.keys()).enumerate() {
        let m0 = (bi * dm.t + blk.t0 + i) * dm.big_t;
        let mr = &bias[m0 + blk.k0..m0 + blk.k1];
        for (o, &m) in pr.iter_mut().zip(mr) {
            *o = *o * scale + m;
        }
        let mx = max(pr);
        for o in pr.iter_mut() {
            *o = (*o - mx).exp();
        }
        let inv = T::from_f64(1.0) / sum(pr);
        pr.iter_mut().for_each(|o| *o *= inv);
    }
}

/// `dS = scale * P * (dP - rowsum(dP * P))` in place of `dP`, row by row.
#[inline(always)]
fn softmax_grad_rows<T: Real>(ds: &mut [T], p: &[T], keys: usize, scale: T) {
    for (dr, pr) in ds.chunks_mut(keys).zip(p.chunks(keys)) {
        let dt = dot(dr, pr);
        for (o, &pv) in dr.iter_mut().zip(pr) {
            *o = scale * pv * (*o - dt);
        }
    }
}

/// The output `[b, h, t, d]`, or `[b, t, h, d]` when `rows_out`.
#[allow(clippy::too_many_arguments)]
fn forward<T: Real>(
    q: View<T>,
    k: View<T>,
    v: View<T>,
    bias: &[T],
    b: usize,
    dm: Dims,
    scale: T,
    rows_out: bool,
) -> Vec<T> {
    let g = dm.groups();
    let chunk = g * dm.t * dm.d;
    let mut out = vec![T::from_f64(0.0); b * dm.h * dm.t * dm.d];
    let task = |task: usize, oc: &mut [T]| {
        let (bi, kv) = (task / dm.kvh, task % dm.kvh);
        let qg = q.gather(bi, kv * g, g, dm.t);
        let kk = k.gather(bi, kv, 1, dm.big_t);
        let vv = v.gather(bi, kv, 1, dm.big_t);
        let d = dm.d;
        for blk in blocks(bias, bi, dm) {
            let p = probs(&qg, &kk, bias, bi, dm, blk, scale);
            let o = &mut oc[blk.r0 * d..(blk.r0 + blk.n) * d];
            let vb = &vv[blk.k0 * d..blk.k1 * d];
            gemm_seq(blk.n, d, blk.keys(), o, &p, false, vb, false, false);
        }
    };
    if !rows_out {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, oc)| task(i, oc));
        return out;
    }
    // Per task `[g, t, d]`, then scattered token by token into `[b, t, h, d]`.
    let parts: Vec<Vec<T>> = (0..b * dm.kvh)
        .into_par_iter()
        .map(|i| {
            let mut oc = vec![T::from_f64(0.0); chunk];
            task(i, &mut oc);
            oc
        })
        .collect();
    out.par_chunks_mut(dm.h * dm.d)
        .enumerate()
        .for_each(|(bt, row)| {
            let (bi, ti) = (bt / dm.t, bt % dm.t);
            for (hi, dst) in row.chunks_mut(dm.d).enumerate() {
                let part = &parts[bi * dm.kvh + hi / g];
                let r = (hi % g) * dm.t + ti;
                dst.copy_from_slice(&part[r * dm.d..(r + 1) * dm.d]);
            }
        });
    out
}

/// `(dq [b, h, t, d], dk, dv [b, kvh, T, d])`, contiguous.
#[allow(clippy::too_many_arguments)]
fn backward<T: Real>(
    q: View<T>,
    k: View<T>,
    v: View<T>,
    dout: View<T>,
    bias: &[T],
    b: usize,
    dm: Dims,
    scale: T,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let g = dm.groups();
    let (rows, big_t, d) = (g * dm.t, dm.big_t, dm.d);
    let zero = T::from_f64(0.0);
    let mut dq = vec![zero; b * dm.h * dm.t * d];
    let mut dk = vec![zero; b * dm.kvh * big_t * d];
    let mut dv = vec![zero; b * dm.kvh * big_t * d];
    dq.par_chunks_mut(rows * d)
        .zip(
            dk.par_chunks_mut(big_t * d)
                .zip(dv.par_chunks_mut(big_t * d)),
        )
        .enumerate()
        .for_each(|(task, (dqc, (dkc, dvc)))| {
            let (bi, kv) = (task / dm.kvh, task % dm.kvh);
            let qg = q.gather(bi, kv * g, g, dm.t);
            let kk = k.gather(bi, kv, 1, big_t);
            let vv = v.gather(bi, kv, 1, big_t);
            let doc = dout.gather(bi, kv * g, g, dm.t);
            let doc = &doc[..];
            for blk in blocks(bias, bi, dm) {
                let (n, kn) = (blk.n, blk.keys());
                let p = probs(&qg, &kk, bias, bi, dm, blk, scale);
                let (rr, keys) = (blk.r0 * d..(blk.r0 + n) * d, blk.k0 * d..blk.k1 * d);
                let (q_b, do_b) = (&qg[rr.clone()], &doc[rr.clone()]);
                // dV[keys] += P^T dO
                gemm_seq(
                    kn,
                    d,
                    n,
                    &mut dvc[keys.clone()],
                    &p,
                    true,
                    do_b,
                    false,
                    true,
                );
                // dP = dO V^T, then dS = scale * P * (dP - rowsum(dP * P)) in place.
                let mut ds = vec![zero; n * kn];
                gemm_seq(
                    n,
                    kn,
                    d,
                    &mut ds,
                    do_b,
                    false,
                    &vv[keys.clone()],
                    true,
                    false,
                );
                simd!(softmax_grad_rows(&mut ds, &p, kn, scale));
                // dQ = dS K[keys], dK[keys] += dS^T Q
                gemm_seq(
                    n,
                    d,
                    kn,
                    &mut dqc[rr],
                    &ds,
                    false,
                    &kk[keys.clone()],
                    false,
                    false,
                );
                gemm_seq(kn, d, n, &mut dkc[keys], &ds, true, q_b, false, true);
            }
        });
    (dq, dk, dv)
}

/// Runs `f` on the CPU elements and layout of `t` (strides kept).
fn with_view<T: Real, R>(
    t: &Tensor,
    f: impl FnOnce(View<T>) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(s) => f(View::new(s.as_slice::<T>()?, l)?),
        _ => candle_core::bail!("attention: tensor is not on the CPU"),
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "fused-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("attention fwd");
        let (b, h, t, d) = ql.shape().dims4()?;
        let (_, kvh, big_t, _) = kl.shape().dims4()?;
        let dm = Dims {
            h,
            t,
            d,
            kvh,
            big_t,
        };
        dispatch!(qs.dtype(), T => {
            let q = View::new(qs.as_slice::<T>()?, ql)?;
            let k = View::new(ks.as_slice::<T>()?, kl)?;
            let v = View::new(vs.as_slice::<T>()?, vl)?;
            let scale = T::from_f64(self.scale);
            let rows_out = self.rows_out;
            let out = with_slice::<T, _>(&self.bias, |m| {
                Ok(forward(q, k, v, m, b, dm, scale, rows_out))
            })?;
            let shape = if rows_out {
                Shape::from((b, t, h * d))
            } else {
                Shape::from((b, h, t, d))
            };
            Ok((T::to_cpu_storage_owned(out), shape))
        })
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        dout: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _t = crate::op_time::span("attention bwd");
        let (b, h, t, d) = q.dims4()?;
        let (_, kvh, big_t, _) = k.dims4()?;
        let dm = Dims {
            h,
            t,
            d,
            kvh,
            big_t,
        };
        dispatch!(q.dtype(), T => {
            let scale = T::from_f64(self.scale);
            let (dq, dk, dv) = with_view::<T, _>(q, |qv| {
                with_view::<T, _>(k, |kv| {
                    with_view::<T, _>(v, |vv| {
                        with_slice::<T, _>(dout, |g| {
                            // dout is contiguous, `[b, h, t, d]` or `[b, t, h, d]`.
                            let st = if self.rows_out {
                                [t * h * d, d, h * d]
                            } else {
                                [h * t * d, t * d, d]
                            };
                            let gv = View { data: g, off: 0, st, d };
                            with_slice::<T, _>(&self.bias, |m| {
                                Ok(backward(qv, kv, vv, gv, m, b, dm, scale))
                            })
                        })
                    })
                })
            })?;
            let keep = |t: &Tensor, g: Vec<T>| t.track_op().then(|| tensor(g, t.dims())).transpose();
            Ok((keep(q, dq)?, keep(k, dk)?, keep(v, dv)?))
        })
    }
}

/// Additive attention bias `[b, 1, t, past + t]` for left-padded rows: query `i` of row `r`
/// sees keys `j <= past + i` that are not padding (`j >= pad[r]`). A fully masked row (a pad
/// query) keeps its own key so softmax stays finite.
pub fn causal_bias(
    pad: &[usize],
    past: usize,
    t: usize,
    device: &candle_core::Device,
) -> candle_core::Result<Tensor> {
    let total = past + t;
    let mut data = vec![0f32; pad.len() * t * total];
    for (r, &p) in pad.iter().enumerate() {
        for i in 0..t {
            let row = &mut data[(r * t + i) * total..(r * t + i + 1) * total];
            let qpos = past + i;
            for (j, x) in row.iter_mut().enumerate() {
                let visible = j <= qpos && (j >= p || j == qpos);
                if !visible {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
    Tensor::from_vec(data, (pad.len(), 1, t, total), device)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
    use super::*;
    use candle_core::{DType, Device, Var, D};

    /// transformers' eager attention with repeated kv heads.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor, scale: f64) -> Tensor {
        let (b, h, _, _) = q.dims4().unwrap();
        let (_, kvh, big_t, d) = k.dims4().unwrap();
        let rep = |x: &Tensor| {
            x.unsqueeze(2)
                .unwrap()
                .expand((b, kvh, h / kvh, big_t, d))
                .unwrap()
                .reshape((b, h, big_t, d))
                .unwrap()
        };
        let (q, k, v) = (
            q.contiguous().unwrap(),
            k.contiguous().unwrap(),
            v.contiguous().unwrap(),
        );
        let (k, v) = (&k, &v);
        let s = (q.matmul(&rep(k).t().unwrap()).unwrap() * scale).unwrap();
        let p = candle_nn::ops::softmax(&s.broadcast_add(bias).unwrap(), D::Minus1).unwrap();
        p.matmul(&rep(v)).unwrap()
    }

    #[test]
    fn matches_repeated_head_attention_values_and_gradients() {
        // A short causal case with a cache, and one over several query blocks with padding.
        check_against_reference((2, 6, 2, 5, 3, 8), &[0, 2]);
        check_against_reference((3, 4, 2, 70, 0, 8), &[0, 5, 40]);
        check_against_reference((1, 2, 1, 2 * QUERY_BLOCK + 1, 7, 4), &[3]);
    }

    #[test]
    fn a_mask_with_holes_matches_too() {
        // Not causal: every query sees keys 0..=5 and every third key after, so the key ranges of
        // the blocks hold masked keys inside them too.
        let (b, t) = (2, 40);
        let v: Vec<f64> = (0..b * t * t)
            .map(|i| {
                let j = i % t;
                if j <= 5 || j % 3 == 0 {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let bias = Tensor::from_vec(v, (b, 1, t, t), &Device::Cpu).unwrap();
        check_with_bias((b, 4, 2, t, 0, 8), &bias);
    }

    fn check_against_reference(shape: (usize, usize, usize, usize, usize, usize), pad: &[usize]) {
        let (_, _, _, t, past, _) = shape;
        let bias = super::causal_bias(pad, past, t, &Device::Cpu).unwrap();
        check_with_bias(shape, &bias);
    }

    fn check_with_bias(shape: (usize, usize, usize, usize, usize, usize), bias: &Tensor) {
        let (b, h, kvh, t, past, d) = shape;
        let big_t = past + t;
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let bias = bias.to_dtype(dtype).unwrap();
            // q as the decoder makes it: a transposed [b, t, h, d] view.
            let qb = Var::from_tensor(&rand(&[b, t, h, d], 1, dtype)).unwrap();
            let q = qb.as_tensor().transpose(1, 2).unwrap();
            let k = Var::from_tensor(&rand(&[b, kvh, big_t, d], 2, dtype)).unwrap();
            let vb = Var::from_tensor(&rand(&[b, big_t, kvh, d], 3, dtype)).unwrap();
            let v = vb.as_tensor().transpose(1, 2).unwrap();
            let coef = rand(&[b, h, t, d], 4, dtype);
            let got = attention(&q, k.as_tensor(), &v, &bias, 0.3).unwrap();
            let want = reference(&q, k.as_tensor(), &v, &bias, 0.3);
            assert!(rel_diff(&got, &want) < tol);
            let g1 = grads_of(&got, &coef);
            let g2 = grads_of(&want, &coef);
            for x in [&qb, &k, &vb] {
                let dd = rel_diff(
                    g1.get(x.as_tensor()).unwrap(),
                    g2.get(x.as_tensor()).unwrap(),
                );
                assert!(dd < tol, "{dtype:?}: {dd}");
            }
            // The `[b, t, h * d]` layout: same values and gradients.
            let rows = attention_rows(&q, k.as_tensor(), &v, &bias, 0.3).unwrap();
            let want_rows = want
                .transpose(1, 2)
                .unwrap()
                .reshape((b, t, h * d))
                .unwrap();
            assert!(rel_diff(&rows, &want_rows) < tol);
            let coef_rows = coef
                .transpose(1, 2)
                .unwrap()
                .reshape((b, t, h * d))
                .unwrap();
            let g3 = grads_of(&rows, &coef_rows);
            for x in [&qb, &k, &vb] {
                let dd = rel_diff(
                    g3.get(x.as_tensor()).unwrap(),
                    g2.get(x.as_tensor()).unwrap(),
                );
                assert!(dd < tol, "rows {dtype:?}: {dd}");
            }
        }
    }

    #[test]
    fn rejects_shapes_that_do_not_fit() {
        let q = rand(&[1, 4, 3, 8], 1, DType::F32);
        let k = rand(&[1, 3, 3, 8], 2, DType::F32);
        let bias = super::causal_bias(&[0], 0, 3, &Device::Cpu).unwrap();
        assert!(attention(&q, &k, &k, &bias, 1.0).is_err());
    }
}
