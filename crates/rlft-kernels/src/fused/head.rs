//! LM head + log-softmax + gather (+ entropy) with backward, never holding `[rows, vocab]`.
//!
//! For each row `i` of `hidden [n, h]` and the head `weight [V, h]`:
//! `logits_i = hidden_i @ weight^T`, `lse_i = logsumexp(logits_i)`,
//! `out_i = logits_i[target_i] - lse_i`, and optionally the entropy
//! `H_i = lse_i - sum_v p_iv logits_iv` with `p_i = softmax(logits_i)` (a detached metric).
//!
//! The forward pass computes the logits a block of rows at a time (one gemm per block), then the
//! row statistics in parallel (rayon over rows). What the backward needs depends on what tracks a
//! graph:
//!
//! - only `hidden` (frozen head, e.g. LoRA): the forward also computes
//!   `g_i = d out_i / d hidden_i = weight[target_i] - p_i @ weight` (one more gemm per block) and
//!   keeps `g [n, h]` in the op, so the backward is `dhidden = dy[:, None] * g`, no gemm.
//! - the head (full fine-tuning, tied embeddings): the forward keeps `lse [n]`; the backward
//!   takes the probabilities tile by tile over the vocabulary (`[rows, vocab tile]`), forms
//!   `G = dy[:, None] * (onehot - p)` and accumulates `dweight = G^T @ hidden` and (when `hidden`
//!   tracks) `dhidden = G @ weight`, every element of `dweight` written once per chunk of up to
//!   1024 rows. Where `[n, V]` is small ([`KEEP_PROBS`] elements: 128 MiB of f32, 512 rows of
//!   SmolLM2's vocabulary) the forward keeps the probabilities for the backward, which then
//!   reads its tiles from them; above that it recomputes each tile's logits (one gemm more
//!   than the composite: the price of never storing `[n, V]`).

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::{contiguous_slice, dispatch, tensor, with_slice};
use crate::gemm::gemm;
use crate::math::{max, Real, LANES};
use crate::simd;

/// Elements of one forward logits block `[rows, vocab]` (f32: 32 MiB; 170 rows of SmolLM2's
/// 49152-token vocabulary). Blocks of 128 to 512 rows run the forward alike; much thinner
/// blocks make thin, slower gemms.
const FWD_TILE: usize = 1 << 23;
/// The fewest rows per forward block, whatever the vocabulary.
const FWD_MIN_ROWS: usize = 32;
/// Rows per backward chunk: `dweight` is read and written once per chunk.
const BWD_ROWS: usize = 1024;
/// Elements of one backward logits tile `[rows, vocab tile]` (f32: 8 MiB). Tiles of 1M to 4M
/// elements run alike.
const BWD_TILE: usize = 1 << 21;

/// The most elements of `[n, V]` probabilities a trainable head's forward keeps for its
/// backward (f32: 128 MiB); above it the backward recomputes the logits. Keeping them saves
/// the backward's logits gemm (`2 n V h` FLOPs; docs/kernels.md has the gain) for that much
/// memory, held from the head's forward to its backward (the first op
/// of the backward pass).
pub const KEEP_PROBS: usize = 1 << 25;

/// Block sizes of the forward and backward passes (tests shrink them to cover every edge).
#[derive(Debug, Clone, Copy)]
struct Blocks {
    /// Elements per forward block `[rows, vocab]`.
    fwd_tile: usize,
    /// The fewest rows per forward block.
    fwd_min_rows: usize,
    /// Rows per backward chunk.
    bwd_rows: usize,
    /// Elements per backward tile.
    bwd_tile: usize,
    /// The most `[n, V]` probabilities a trainable head keeps for the backward.
    keep_probs: usize,
}

impl Blocks {
    /// Rows per forward block for `n` rows and a vocabulary of `v`.
    ///
    /// The rows are split evenly: `n = 512` runs as 4 x 128, not 170 + 170 + 170 + 2 (a
    /// 2-row block streams the whole head for almost no work).
    fn fwd_rows(&self, n: usize, v: usize) -> usize {
        let most = (self.fwd_tile / v.max(1)).max(self.fwd_min_rows).max(1);
        let blocks = n.div_ceil(most).max(1);
        n.div_ceil(blocks).max(1)
    }
}

const DEFAULT_BLOCKS: Blocks = Blocks {
    fwd_tile: FWD_TILE,
    fwd_min_rows: FWD_MIN_ROWS,
    bwd_rows: BWD_ROWS,
    bwd_tile: BWD_TILE,
    keep_probs: KEEP_PROBS,
};

/// Log-probabilities of `targets` under `softmax(hidden @ weight^T)`, fused: `hidden [n, h]`,
/// `weight [V, h]` (same dtype, CPU f32/f64), `targets [n]` (any integer dtype, each in
/// `[0, V)`) -> `([n] log-probs, with entropy the [n] entropies)` in the dtype of `hidden`.
///
/// One graph node with inputs `hidden` and `weight`; the backward gives `dhidden` when `hidden`
/// tracks a graph and `dweight` when `weight` does (a trainable head). The entropy is detached.
/// Extra memory: a forward block of about 8M elements (`[170, V]` for `V = 49152`), a backward
/// tile of about 2M, `[n, h]` kept for the backward, and `dweight`; never `[n, V]`.
pub fn lm_head_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    entropy: bool,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    lm_head_logprobs_with(hidden, weight, targets, entropy, DEFAULT_BLOCKS)
}

fn lm_head_logprobs_with(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    entropy: bool,
    blocks: Blocks,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let (n, h) = hidden.dims2()?;
    let (v, hw) = weight.dims2()?;
    if h != hw {
        candle_core::bail!("lm_head_logprobs: hidden is [{n}, {h}] but the weight is [{v}, {hw}]");
    }
    if hidden.dtype() != weight.dtype() {
        candle_core::bail!(
            "lm_head_logprobs: hidden is {:?} but the weight is {:?}",
            hidden.dtype(),
            weight.dtype()
        );
    }
    let targets = target_ids(targets, n, v)?;
    let want_g = hidden.track_op() && !weight.track_op();
    let state = Arc::new(Mutex::new(State::default()));
    let op = LmHead {
        targets,
        want_g,
        want_lse: weight.track_op(),
        want_entropy: entropy,
        blocks,
        state: state.clone(),
    };
    let out = hidden.contiguous()?.apply_op2(&weight.contiguous()?, op)?;
    let ent = if entropy {
        let ent = lock(&state)?.entropy.take();
        match ent {
            Some(e) => Some(e),
            None => candle_core::bail!("lm_head_logprobs: the forward left no entropy"),
        }
    } else {
        None
    };
    Ok((out, ent))
}

/// `targets` as row indices into the vocabulary, checked: `n` of them, each in `[0, v)`.
pub(super) fn target_ids(targets: &Tensor, n: usize, v: usize) -> candle_core::Result<Vec<u32>> {
    let t = targets.flatten_all()?;
    if t.dim(0)? != n {
        candle_core::bail!(
            "lm_head_logprobs: {} targets for {n} hidden rows",
            t.dim(0)?
        );
    }
    let ids: Vec<i64> = match t.dtype() {
        DType::U8 | DType::U32 | DType::I64 => t.to_dtype(DType::I64)?.to_vec1()?,
        other => candle_core::bail!("lm_head_logprobs: targets must be integers, not {other:?}"),
    };
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            if id < 0 || id as u64 >= v as u64 {
                candle_core::bail!(
                    "lm_head_logprobs: target {id} at row {i} is outside the vocabulary [0, {v})"
                )
            }
            Ok(id as u32)
        })
        .collect()
}

/// What the forward leaves for the backward and for the caller (all detached CPU tensors).
#[derive(Default)]
struct State {
    /// `[n, h]`: `d out_i / d hidden_i` (only `hidden` trainable).
    g: Option<Tensor>,
    /// `[n]`: the log-sum-exp of each row (trainable head).
    lse: Option<Tensor>,
    /// `[n, V]`: the probabilities (trainable head, `n V <= keep_probs`), taken by the
    /// backward.
    probs: Option<Tensor>,
    /// `[n]`: the entropies, taken by [`lm_head_logprobs`].
    entropy: Option<Tensor>,
}

fn lock(state: &Mutex<State>) -> candle_core::Result<std::sync::MutexGuard<'_, State>> {
    state
        .lock()
        .map_err(|_| candle_core::Error::Msg("lm_head_logprobs: state lock poisoned".into()))
}

/// The custom op: inputs `hidden [n, h]`, `weight [V, h]`; output `[n]` log-probs.
struct LmHead {
    /// `[n]`, each checked to be in `[0, V)`.
    targets: Vec<u32>,
    /// Compute `g` in the forward (`hidden` tracks, the weight does not).
    want_g: bool,
    /// Keep `lse` for a backward that recomputes the logits (the weight tracks).
    want_lse: bool,
    /// Compute the entropies.
    want_entropy: bool,
    blocks: Blocks,
    state: Arc<Mutex<State>>,
}

/// Per-row results of the forward.
struct Forward<T> {
    out: Vec<T>,
    lse: Vec<T>,
    entropy: Vec<T>,
    g: Vec<T>,
    /// `[n, v]` probabilities when kept, else empty.
    probs: Vec<T>,
}

/// Statistics of one row of logits: `(picked - lse, lse, entropy)`. With `normalize`, the row is
/// overwritten with its softmax.
fn row_stats<T: Real>(row: &mut [T], target: usize, normalize: bool) -> (T, T, T) {
    simd!(row_stats_inner(row, target, normalize))
}

/// Elements per partial sum of [`row_stats`]: summed in `T` with vector lanes, then the
/// partial sums in f64.
pub(super) const SUM_CHUNK: usize = 1024;

#[inline(always)]
fn row_stats_inner<T: Real>(row: &mut [T], target: usize, normalize: bool) -> (T, T, T) {
    let mx = max(row);
    let picked = row[target];
    // sum(e) and sum(e * (l - max)) with e = exp(l - max).
    let (mut s, mut sl) = (0f64, 0f64);
    for c in row.chunks_mut(SUM_CHUNK) {
        let (a, b) = if normalize {
            exp_sums::<T, true>(c, mx)
        } else {
            exp_sums::<T, false>(c, mx)
        };
        s += a.to_f64();
        sl += b.to_f64();
    }
    if normalize {
        let inv = T::from_f64(1.0 / s);
        row.iter_mut().for_each(|x| *x *= inv);
    }
    let ln_s = s.ln();
    let lse = mx + T::from_f64(ln_s);
    // H = lse - sum(p * l) = ln(s) - sum(e * (l - max)) / s.
    let ent = T::from_f64(ln_s - sl / s);
    (picked - lse, lse, ent)
}

/// `(sum(e), sum(e * d))` with `d = x - mx`, `e = exp(d)` over a chunk of at most
/// [`SUM_CHUNK`] elements; `WRITE` stores `e` in place of `x`.
///
/// Two passes over the chunk (it stays in L1): a plain map `x -> e` (which the loop vectoriser
/// turns into vector code, the exp included), then the two sums in [`LANES`] partial lanes. One
/// fused loop with the exp inside the lanes does not vectorise (several times slower per
/// element).
#[inline(always)]
pub(super) fn exp_sums<T: Real, const WRITE: bool>(c: &mut [T], mx: T) -> (T, T) {
    const L: usize = LANES;
    let zero = T::from_f64(0.0);
    let mut buf = [zero; SUM_CHUNK];
    let e = &mut buf[..c.len()];
    e.iter_mut()
        .zip(c.iter())
        .for_each(|(e, &x)| *e = (x - mx).exp());
    let (mut a, mut b) = ([zero; L], [zero; L]);
    let mut ic = c.chunks_exact_mut(L);
    let mut ie = e.chunks_exact(L);
    for (xc, ec) in (&mut ic).zip(&mut ie) {
        for l in 0..L {
            a[l] += ec[l];
            b[l] += ec[l] * (xc[l] - mx);
            if WRITE {
                xc[l] = ec[l];
            }
        }
    }
    let (mut sa, mut sb) = (zero, zero);
    for (x, &e) in ic.into_remainder().iter_mut().zip(ie.remainder()) {
        sa += e;
        sb += e * (*x - mx);
        if WRITE {
            *x = e;
        }
    }
    for l in 0..L {
        sa += a[l];
        sb += b[l];
    }
    (sa, sb)
}

/// The forward over blocks of rows: `x [n, h]`, `w [v, h]`.
fn forward<T: Real>(
    x: &[T],
    w: &[T],
    (n, h, v): (usize, usize, usize),
    targets: &[u32],
    want_g: bool,
    keep: bool,
    blocks: Blocks,
) -> Forward<T> {
    let zero = T::from_f64(0.0);
    let blk = blocks.fwd_rows(n, v);
    // With `keep`, every block's logits (then probabilities) stay: one `[n, v]` buffer.
    let mut logits = vec![zero; if keep { n * v } else { blk * v }];
    let mut pw = if want_g {
        vec![zero; blk * h]
    } else {
        Vec::new()
    };
    let mut res = Forward {
        out: Vec::with_capacity(n),
        lse: Vec::with_capacity(n),
        entropy: Vec::with_capacity(n),
        g: if want_g {
            vec![zero; n * h]
        } else {
            Vec::new()
        },
        probs: Vec::new(),
    };
    let mut stats = Vec::with_capacity(blk);
    for r0 in (0..n).step_by(blk) {
        let m = blk.min(n - r0);
        let logits = if keep {
            &mut logits[r0 * v..(r0 + m) * v]
        } else {
            &mut logits[..m * v]
        };
        // logits [m, v] = x_blk [m, h] @ w^T.
        gemm(
            m,
            v,
            h,
            logits,
            &x[r0 * h..(r0 + m) * h],
            false,
            w,
            true,
            false,
        );
        logits
            .par_chunks_mut(v)
            .zip(&targets[r0..r0 + m])
            .map(|(row, &t)| row_stats(row, t as usize, want_g || keep))
            .collect_into_vec(&mut stats);
        for &(o, l, e) in &stats {
            res.out.push(o);
            res.lse.push(l);
            res.entropy.push(e);
        }
        if want_g {
            // g_i = w[t_i] - p_i @ w: pw [m, h] = p [m, v] @ w [v, h].
            gemm(m, h, v, &mut pw[..m * h], logits, false, w, false, false);
            res.g[r0 * h..(r0 + m) * h]
                .par_chunks_mut(h)
                .zip(pw.par_chunks(h))
                .zip(&targets[r0..r0 + m])
                .for_each(|((g, pw), &t)| {
                    let wt = &w[t as usize * h..(t as usize + 1) * h];
                    for ((g, &a), &b) in g.iter_mut().zip(wt).zip(pw) {
                        *g = a - b;
                    }
                });
        }
    }
    if keep {
        res.probs = logits;
    }
    res
}

/// Where the backward takes each row's probabilities from.
#[derive(Clone, Copy)]
enum Probs<'a, T> {
    /// The forward's `[n, v]` probabilities.
    Kept(&'a [T]),
    /// Recomputed from the logits: the `[n]` log-sum-exp of each row.
    Recompute(&'a [T]),
}

/// The backward of a trainable head: `x [n, h]`, `w [v, h]`, `probs` (kept, or `lse [n]` to
/// recompute them), `dy [n]` -> `(dx [n, h] when want_dx, dw [v, h])`, tiled
/// `[rows, vocab tile]`.
#[allow(clippy::too_many_arguments)]
fn backward_tiled<T: Real>(
    x: &[T],
    w: &[T],
    (n, h, v): (usize, usize, usize),
    targets: &[u32],
    probs: Probs<'_, T>,
    dy: &[T],
    want_dx: bool,
    blocks: Blocks,
) -> (Option<Vec<T>>, Vec<T>) {
    let zero = T::from_f64(0.0);
    let mut dw = vec![zero; v * h];
    let mut dx = if want_dx {
        vec![zero; n * h]
    } else {
        Vec::new()
    };
    let rows = blocks.bwd_rows.min(n).max(1);
    let vt = (blocks.bwd_tile / rows).clamp(1, v.max(1));
    let mut tile = vec![zero; rows * vt];
    for r0 in (0..n).step_by(rows) {
        let m = rows.min(n - r0);
        let xb = &x[r0 * h..(r0 + m) * h];
        for v0 in (0..v).step_by(vt) {
            let vb = vt.min(v - v0);
            let wt = &w[v0 * h..(v0 + vb) * h];
            let tile = &mut tile[..m * vb];
            let onehot = |row: &mut [T], t: u32, d: T| {
                let t = t as usize;
                if (v0..v0 + vb).contains(&t) {
                    row[t - v0] += d;
                }
            };
            // G = dy * (onehot - p).
            match probs {
                Probs::Kept(p) => {
                    tile.par_chunks_mut(vb)
                        .enumerate()
                        .zip(&targets[r0..r0 + m])
                        .zip(&dy[r0..r0 + m])
                        .for_each(|(((i, row), &t), &d)| {
                            let pr = &p[(r0 + i) * v + v0..(r0 + i) * v + v0 + vb];
                            for (x, &p) in row.iter_mut().zip(pr) {
                                *x = -(d * p);
                            }
                            onehot(row, t, d);
                        });
                }
                Probs::Recompute(lse) => {
                    // L [m, vb] = x_blk [m, h] @ w_tile^T, p = exp(L - lse).
                    gemm(m, vb, h, tile, xb, false, wt, true, false);
                    tile.par_chunks_mut(vb)
                        .zip(&targets[r0..r0 + m])
                        .zip(lse[r0..r0 + m].par_iter().zip(&dy[r0..r0 + m]))
                        .for_each(|((row, &t), (&l, &d))| {
                            simd!({
                                for x in row.iter_mut() {
                                    *x = -(d * (*x - l).exp());
                                }
                            });
                            onehot(row, t, d);
                        });
                }
            }
            // dw_tile [vb, h] (+)= G^T [vb, m] @ x_blk [m, h].
            gemm(
                vb,
                h,
                m,
                &mut dw[v0 * h..(v0 + vb) * h],
                tile,
                true,
                xb,
                false,
                r0 > 0,
            );
            if want_dx {
                // dx_blk [m, h] (+)= G [m, vb] @ w_tile [vb, h].
                let dxb = &mut dx[r0 * h..(r0 + m) * h];
                gemm(m, h, vb, dxb, tile, false, wt, false, v0 > 0);
            }
        }
    }
    (want_dx.then_some(dx), dw)
}

impl CustomOp2 for LmHead {
    fn name(&self) -> &'static str {
        "fused-lm-head-logprobs"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("lm-head fwd");
        let (n, h) = xl.shape().dims2()?;
        let (v, hw) = wl.shape().dims2()?;
        if h != hw || self.targets.len() != n {
            candle_core::bail!(
                "lm_head_logprobs: hidden [{n}, {h}], weight [{v}, {hw}], {} targets",
                self.targets.len()
            );
        }
        if let Some(&t) = self.targets.iter().find(|&&t| t as usize >= v) {
            candle_core::bail!("lm_head_logprobs: target {t} is outside the vocabulary [0, {v})");
        }
        dispatch!(xs.dtype(), T => {
            let x = contiguous_slice::<T>(xs, xl)?;
            let w = contiguous_slice::<T>(ws, wl)?;
            let keep = self.want_lse && n * v <= self.blocks.keep_probs;
            let f = forward(x, w, (n, h, v), &self.targets, self.want_g, keep, self.blocks);
            let mut st = lock(&self.state)?;
            if self.want_g {
                st.g = Some(tensor(f.g, &[n, h])?);
            }
            if self.want_lse {
                st.lse = Some(tensor(f.lse, &[n])?);
            }
            st.probs = if keep {
                Some(tensor(f.probs, &[n, v])?)
            } else {
                None
            };
            if self.want_entropy {
                st.entropy = Some(tensor(f.entropy, &[n])?);
            }
            Ok((T::to_cpu_storage_owned(f.out), Shape::from(n)))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _out: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let _t = crate::op_time::span("lm-head bwd");
        let want_dx = x.track_op();
        let want_dw = w.track_op();
        let (n, h) = x.dims2()?;
        let v = w.dim(0)?;
        // The kept probabilities serve one backward; a second one recomputes them.
        let (g, lse, probs) = {
            let mut st = lock(&self.state)?;
            (st.g.clone(), st.lse.clone(), st.probs.take())
        };
        if want_dw {
            let Some(lse) = lse else {
                candle_core::bail!(
                    "lm_head_logprobs: the weight started tracking after the forward"
                )
            };
            return dispatch!(x.dtype(), T => {
                let (dx, dw) = with_slice::<T, _>(x, |xv| {
                    with_slice::<T, _>(w, |wv| {
                        with_slice::<T, _>(probs.as_ref().unwrap_or(&lse), |pv| {
                            let pv = if probs.is_some() {
                                Probs::Kept(pv)
                            } else {
                                Probs::Recompute(pv)
                            };
                            with_slice::<T, _>(dy, |dyv| {
                                Ok(backward_tiled(
                                    xv, wv, (n, h, v), &self.targets, pv, dyv, want_dx,
                                    self.blocks,
                                ))
                            })
                        })
                    })
                })?;
                let dx = match dx {
                    Some(dx) => Some(tensor(dx, &[n, h])?),
                    None => None,
                };
                Ok((dx, Some(tensor(dw, &[v, h])?)))
            });
        }
        if !want_dx {
            return Ok((None, None));
        }
        let Some(g) = g else {
            candle_core::bail!("lm_head_logprobs: hidden started tracking after the forward")
        };
        dispatch!(x.dtype(), T => {
            let dx = with_slice::<T, _>(&g, |gv| {
                with_slice::<T, _>(dy, |dyv| {
                    let mut dx = vec![T::from_f64(0.0); n * h];
                    dx.par_chunks_mut(h)
                        .zip(gv.par_chunks(h))
                        .zip(dyv.par_iter())
                        .for_each(|((o, g), &d)| {
                            for (o, &g) in o.iter_mut().zip(g) {
                                *o = d * g;
                            }
                        });
                    Ok(dx)
                })
            })?;
            Ok((Some(tensor(dx, &[n, h])?), None))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{grads_of, rand, rel_diff};
    use super::*;
    use candle_core::{Device, Var, D};

    /// The composite of `CausalLm::target_logprobs_entropy`, in one chunk.
    fn composite(x: &Tensor, w: &Tensor, targets: &Tensor) -> (Tensor, Tensor) {
        let logits = x.matmul(&w.t().unwrap()).unwrap();
        let lse = logits.log_sum_exp(D::Minus1).unwrap();
        let (l, m) = (logits.detach(), lse.detach());
        let p = l
            .broadcast_sub(&m.unsqueeze(1).unwrap())
            .unwrap()
            .exp()
            .unwrap();
        let ent = (m - (p * &l).unwrap().sum(D::Minus1).unwrap()).unwrap();
        let picked = logits
            .gather(&targets.unsqueeze(1).unwrap(), 1)
            .unwrap()
            .squeeze(1)
            .unwrap();
        ((picked - lse).unwrap(), ent)
    }

    fn targets(n: usize, v: usize, seed: u32) -> Tensor {
        let t: Vec<u32> = (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7) % v as u32)
            .collect();
        Tensor::from_vec(t, n, &Device::Cpu).unwrap()
    }

    /// Tiny blocks: several forward blocks, backward chunks and vocabulary tiles, all ragged.
    const SMALL: Blocks = Blocks {
        fwd_tile: 16 * 301,
        fwd_min_rows: 1,
        bwd_rows: 24,
        bwd_tile: 24 * 37,
        keep_probs: 0,
    };

    /// [`SMALL`] keeping the probabilities for the backward.
    const SMALL_KEPT: Blocks = Blocks {
        keep_probs: usize::MAX,
        ..SMALL
    };

    #[test]
    fn forward_blocks_split_rows_evenly() {
        let b = DEFAULT_BLOCKS;
        // At most 170 rows of a 49152 vocabulary per block, spread evenly over the blocks.
        assert_eq!(b.fwd_rows(512, 49152), 128);
        assert_eq!(b.fwd_rows(1016, 49152), 170);
        assert_eq!(b.fwd_rows(171, 49152), 86);
        assert_eq!(b.fwd_rows(170, 49152), 170);
        assert_eq!(b.fwd_rows(5, 49152), 5);
        assert_eq!(b.fwd_rows(0, 49152), 1);
        // A huge vocabulary still gets up to FWD_MIN_ROWS (32) rows per block: 100 = 4 x 25.
        assert_eq!(b.fwd_rows(100, 1 << 30), 25);
        for n in 1..600 {
            let r = b.fwd_rows(n, 49152);
            let blocks = n.div_ceil(r);
            assert!(
                r <= 170 && r * blocks >= n && r * (blocks - 1) < n,
                "n={n} r={r}"
            );
            assert!(
                r * blocks - n < blocks,
                "n={n}: blocks of {r} leave a ragged tail"
            );
        }
    }

    fn check(dtype: DType, tol: f64, train_x: bool, train_w: bool, blocks: Blocks) {
        let (n, h, v) = (83, 24, 301);
        let ctx = format!("{dtype:?} train_x={train_x} train_w={train_w} {blocks:?}");
        // Logits of a few units so the softmax is far from uniform.
        let x0 = (rand(&[n, h], 1, dtype) * 2.0).unwrap();
        let w0 = (rand(&[v, h], 2, dtype) * 1.5).unwrap();
        let xv = Var::from_tensor(&x0).unwrap();
        let wv = Var::from_tensor(&w0).unwrap();
        let x = if train_x { xv.as_tensor().clone() } else { x0 };
        let w = if train_w { wv.as_tensor().clone() } else { w0 };
        let t = targets(n, v, 7);
        let coef = rand(&[n], 3, dtype);
        let (got, got_ent) = lm_head_logprobs_with(&x, &w, &t, true, blocks).unwrap();
        let (want, want_ent) = composite(&x, &w, &t);
        assert_eq!(got.dims(), &[n]);
        let d = rel_diff(&got, &want);
        assert!(d < tol, "{ctx}: values {d}");
        let got_ent = got_ent.unwrap();
        assert!(!got_ent.track_op());
        let d = rel_diff(&got_ent, &want_ent);
        assert!(d < tol, "{ctx}: entropy {d}");
        if !train_x && !train_w {
            assert!(!got.track_op());
            return;
        }
        let g1 = grads_of(&got, &coef);
        let g2 = grads_of(&want, &coef);
        for (train, var, name) in [(train_x, &xv, "dhidden"), (train_w, &wv, "dweight")] {
            if train {
                let (a, b) = (g1.get(var).unwrap(), g2.get(var).unwrap());
                let d = rel_diff(a, b);
                assert!(d < tol, "{ctx}: {name} {d}");
            } else {
                assert!(g1.get(var).is_none(), "{ctx}: {name} should be absent");
            }
        }
    }

    #[test]
    fn matches_composite_values_entropy_and_gradients() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            for blocks in [DEFAULT_BLOCKS, SMALL, SMALL_KEPT] {
                for (train_x, train_w) in
                    [(true, false), (true, true), (false, true), (false, false)]
                {
                    check(dtype, tol, train_x, train_w, blocks);
                }
            }
        }
    }

    /// A trainable head's kept probabilities serve the first backward; a second backward of
    /// the same graph recomputes them and gives the same gradients.
    #[test]
    fn second_backward_recomputes() {
        let (n, h, v) = (37, 16, 211);
        let xv = Var::from_tensor(&rand(&[n, h], 4, DType::F64)).unwrap();
        let wv = Var::from_tensor(&rand(&[v, h], 5, DType::F64)).unwrap();
        let t = targets(n, v, 1);
        for blocks in [DEFAULT_BLOCKS, SMALL_KEPT] {
            let (lp, _) =
                lm_head_logprobs_with(xv.as_tensor(), wv.as_tensor(), &t, false, blocks).unwrap();
            let loss = lp.sum_all().unwrap();
            let g1 = loss.backward().unwrap();
            let g2 = loss.backward().unwrap();
            for var in [&xv, &wv] {
                let d = rel_diff(g1.get(var).unwrap(), g2.get(var).unwrap());
                assert!(d < 1e-12, "{blocks:?}: {d}");
            }
        }
    }

    #[test]
    fn f32_values_match_to_1e6() {
        // The brief's bar for values: ~1e-6 relative in f32.
        let (n, h, v) = (70, 64, 4099);
        let x = rand(&[n, h], 11, DType::F32);
        let w = rand(&[v, h], 12, DType::F32);
        let t = targets(n, v, 3);
        let (got, ent) = lm_head_logprobs(&x, &w, &t, true).unwrap();
        let (want, want_ent) = composite(&x, &w, &t);
        assert!(rel_diff(&got, &want) < 1e-6, "{}", rel_diff(&got, &want));
        let d = rel_diff(&ent.unwrap(), &want_ent);
        assert!(d < 1e-6, "{d}");
    }

    #[test]
    fn rejects_bad_targets_and_shapes() {
        let x = rand(&[4, 8], 1, DType::F32);
        let w = rand(&[10, 8], 2, DType::F32);
        let t = Tensor::new(&[0u32, 9, 10, 1], &Device::Cpu).unwrap();
        let e = lm_head_logprobs(&x, &w, &t, false).unwrap_err().to_string();
        assert!(e.contains("target 10 at row 2"), "{e}");
        let t = Tensor::new(&[0i64, -1, 2, 1], &Device::Cpu).unwrap();
        assert!(lm_head_logprobs(&x, &w, &t, false).is_err());
        let t = Tensor::new(&[0u32, 1, 2], &Device::Cpu).unwrap();
        assert!(lm_head_logprobs(&x, &w, &t, false).is_err());
        let t = Tensor::new(&[0u32, 1, 2, 3], &Device::Cpu).unwrap();
        let w7 = rand(&[10, 7], 2, DType::F32);
        assert!(lm_head_logprobs(&x, &w7, &t, false).is_err());
        let w64 = w.to_dtype(DType::F64).unwrap();
        assert!(lm_head_logprobs(&x, &w64, &t, false).is_err());
    }

    #[test]
    fn no_rows() {
        let xv = Var::from_tensor(&rand(&[0, 8], 1, DType::F64)).unwrap();
        let w = rand(&[10, 8], 2, DType::F64);
        let t = Tensor::zeros(0, DType::U32, &Device::Cpu).unwrap();
        let (lp, ent) = lm_head_logprobs(&xv, &w, &t, true).unwrap();
        assert_eq!(lp.dims(), &[0]);
        assert_eq!(ent.unwrap().dims(), &[0]);
        let g = lp.sum_all().unwrap().backward().unwrap();
        assert_eq!(g.get(&xv).unwrap().dims(), &[0, 8]);
    }
}
