//! LM head log-probs over a frozen head kept in GGUF blocks, never dequantised whole.
//!
//! The quantised twin of [`super::head::lm_head_logprobs`] for a frozen head (the `want_g`
//! path there): for each row `i` of `hidden [n, h]` and the head `W [V, h]` held as a
//! [`QuantWeight`], `logits_i = hidden_i @ W^T`, `out_i = logits_i[target_i] - lse_i` and the
//! detached entropy `H_i = lse_i - sum_v p_iv logits_iv`, `p_i = softmax(logits_i)`.
//!
//! Why a separate op: a 151936 x 896 head (Qwen2.5-0.5B) is 544 MB as f32 but about 145 MB as
//! Q8_0, and the dense op needs the f32 matrix. Here the head is dequantised once per forward,
//! a chunk of `vc` vocabulary rows at a time, and each chunk serves every row of `hidden`:
//!
//! - the chunk's rows are dequantised into a scratch `Wc [vc, h]` (rayon over row pieces);
//! - `L = hidden @ Wc^T` (`[n, vc]`, one gemm);
//! - each row folds `L_i` into an online (flash-style) softmax: running max `m_i`,
//!   `s_i = sum exp(l - m_i)` and `sl_i = sum exp(l - m_i) (l - m_i)` (f64), rescaled by
//!   `e^(m - m')` when the max grows, and the target's logit when it falls in the chunk;
//! - when `hidden` tracks a graph, `L_i` is replaced by `exp(L_i - m_i)` and
//!   `pw_i = sum_v exp(l_iv - m_i) W_v` accumulates by gemm (`pw += E @ Wc`, its rows first
//!   rescaled with the max).
//!
//! At the end `lse = m + ln s`, `H = ln s - sl / s` and `g_i = W[t_i] - pw_i / s_i`
//! (`= d out_i / d hidden_i`), kept in the op so the backward is `dhidden = dy[:, None] * g`.
//!
//! Memory besides the blocks: the scratch `[vc, h]` and logits `[n, vc]`, each at most 4M f32
//! (16 MiB) unless the floor of 256 vocabulary rows per chunk asks for more, plus `pw` and
//! `g [n, h]` when `hidden` tracks. Results are deterministic: every reduction runs in a fixed
//! order (gemm splits only its output; rows are independent).
//!
//! Tolerance: against the dense op on the dequantised f32 weight (bit-identical weights) the
//! log-probs, entropies and `dhidden` agree to about 1e-6 relative (tests assert 1e-5); they
//! differ only in gemm summation order and the rounding of the chunk rescaling.

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use super::contiguous_slice;
use super::head::{exp_sums, target_ids, SUM_CHUNK};
use crate::gemm::gemm;
use crate::math::max;
use crate::quant::QuantWeight;
use crate::simd;

/// Elements of one logits chunk `[n, vc]` (f32: 16 MiB).
const LOGITS_TILE: usize = 1 << 22;
/// Elements of the dequantised scratch `[vc, h]` (f32: 16 MiB; 4681 rows at `h = 896`).
const SCRATCH: usize = 1 << 22;
/// The fewest vocabulary rows per chunk: thinner chunks make thin, slow gemms.
const MIN_CHUNK_ROWS: usize = 256;
/// Vocabulary rows one rayon task dequantises.
const DEQUANT_PIECE: usize = 64;

/// Vocabulary rows per chunk for `n` hidden rows, `h` columns and a vocabulary of `v`.
fn chunk_rows(n: usize, h: usize, v: usize) -> usize {
    (LOGITS_TILE / n.max(1))
        .min(SCRATCH / h.max(1))
        .max(MIN_CHUNK_ROWS)
        .min(v.max(1))
}

/// Log-probabilities of `targets` under `softmax(hidden @ W^T)` for a frozen head `W [V, h]`
/// in GGUF blocks: `hidden [n, h]` (f32, CPU), `targets [n]` (integers in `[0, V)`) ->
/// `([n] log-probs, with entropy the [n] detached entropies)`.
///
/// One graph node on `hidden`; its backward gives `dhidden` (the head is frozen). The head is
/// dequantised once per call, a chunk of rows at a time, never whole.
pub fn quant_lm_head_logprobs(
    hidden: &Tensor,
    weight: &Arc<QuantWeight>,
    targets: &Tensor,
    entropy: bool,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let (n, h) = hidden.dims2()?;
    let (v, _) = weight.dims();
    quant_lm_head_logprobs_with(hidden, weight, targets, entropy, chunk_rows(n, h, v))
}

fn quant_lm_head_logprobs_with(
    hidden: &Tensor,
    weight: &Arc<QuantWeight>,
    targets: &Tensor,
    entropy: bool,
    chunk: usize,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let (n, h) = hidden.dims2()?;
    let (v, hw) = weight.dims();
    if h != hw {
        candle_core::bail!(
            "quant_lm_head_logprobs: hidden is [{n}, {h}] but the head is [{v}, {hw}]"
        );
    }
    if hidden.dtype() != DType::F32 || !matches!(hidden.device(), Device::Cpu) {
        candle_core::bail!(
            "quant_lm_head_logprobs: hidden must be f32 on the CPU, not {:?} on {:?}",
            hidden.dtype(),
            hidden.device().location()
        );
    }
    let state = Arc::new(Mutex::new(State::default()));
    let op = QuantHead {
        weight: weight.clone(),
        targets: target_ids(targets, n, v)?,
        want_g: hidden.track_op(),
        want_entropy: entropy,
        chunk,
        state: state.clone(),
    };
    let out = hidden.contiguous()?.apply_op1(op)?;
    let ent = if entropy {
        match lock(&state)?.entropy.take() {
            Some(e) => Some(e),
            None => candle_core::bail!("quant_lm_head_logprobs: the forward left no entropy"),
        }
    } else {
        None
    };
    Ok((out, ent))
}

/// What the forward leaves for the backward and the caller (detached CPU tensors).
#[derive(Default)]
struct State {
    /// `[n, h]`: `d out_i / d hidden_i` (when `hidden` tracks).
    g: Option<Tensor>,
    /// `[n]`: the entropies, taken by [`quant_lm_head_logprobs`].
    entropy: Option<Tensor>,
}

fn lock(state: &Mutex<State>) -> candle_core::Result<std::sync::MutexGuard<'_, State>> {
    state
        .lock()
        .map_err(|_| candle_core::Error::Msg("quant_lm_head_logprobs: state lock poisoned".into()))
}

/// The custom op: input `hidden [n, h]`, the head captured; output `[n]` log-probs.
struct QuantHead {
    weight: Arc<QuantWeight>,
    /// `[n]`, each checked to be in `[0, V)`.
    targets: Vec<u32>,
    /// Compute `g` in the forward (`hidden` tracks a graph).
    want_g: bool,
    want_entropy: bool,
    /// Vocabulary rows per chunk.
    chunk: usize,
    state: Arc<Mutex<State>>,
}

/// One row's online softmax over the chunks seen so far.
#[derive(Clone, Copy)]
struct Running {
    /// The largest logit so far (`-inf` before the first chunk).
    m: f32,
    /// `sum exp(l - m)`.
    s: f64,
    /// `sum exp(l - m) (l - m)`.
    sl: f64,
    /// The target's logit (set by the chunk that holds it).
    picked: f32,
}

impl Default for Running {
    fn default() -> Self {
        Running {
            m: f32::NEG_INFINITY,
            s: 0.0,
            sl: 0.0,
            picked: 0.0,
        }
    }
}

/// Per-row results of the forward.
struct Forward {
    out: Vec<f32>,
    entropy: Vec<f32>,
    /// `[n, h]` when `hidden` tracks, else empty.
    g: Vec<f32>,
}

/// Folds one row's chunk of logits `row` into `st`; `target` is the target's index in the
/// chunk when it falls there. `WRITE` (the gradient is wanted) overwrites `row` with
/// `exp(l - m')` for the `pw` gemm and rescales the row's `pw` to the new max `m'`.
fn absorb<const WRITE: bool>(
    st: &mut Running,
    row: &mut [f32],
    pw: &mut [f32],
    target: Option<usize>,
) {
    simd!(absorb_inner::<WRITE>(st, row, pw, target))
}

#[inline(always)]
fn absorb_inner<const WRITE: bool>(
    st: &mut Running,
    row: &mut [f32],
    pw: &mut [f32],
    target: Option<usize>,
) {
    if let Some(t) = target {
        st.picked = row[t];
    }
    let mx = st.m.max(max(row));
    let (mut a, mut b) = (0f64, 0f64);
    for c in row.chunks_mut(SUM_CHUNK) {
        let (ca, cb) = exp_sums::<f32, WRITE>(c, mx);
        a += ca as f64;
        b += cb as f64;
    }
    if st.m == f32::NEG_INFINITY {
        // First chunk: nothing to rescale (and `-inf * 0` would be NaN).
        (st.s, st.sl) = (a, b);
    } else {
        // Old terms move from max `m` to `m'`: e' = e * r and (l - m') = (l - m) + d,
        // with d = m - m' and r = e^d.
        let d = (st.m - mx) as f64;
        let r = d.exp();
        st.sl = r * (st.sl + d * st.s) + b;
        st.s = r * st.s + a;
        if WRITE && r != 1.0 {
            let r = r as f32;
            pw.iter_mut().for_each(|x| *x *= r);
        }
    }
    st.m = mx;
}

/// Dequantises head rows `v0..v0 + vb` into `wc [vb, h]`, pieces of rows in parallel.
fn dequant_chunk(w: &QuantWeight, v0: usize, vb: usize, wc: &mut [f32]) {
    let h = w.dims().1;
    wc[..vb * h]
        .par_chunks_mut(DEQUANT_PIECE * h)
        .enumerate()
        .for_each(|(j, c)| w.dequant_rows(v0 + j * DEQUANT_PIECE, c.len() / h, c));
}

/// Folds the chunk `logits [n, vb]` (vocabulary rows `v0..v0 + vb`) into every row's state,
/// rows in parallel; with `pw` the logits become the exp-weights of the `pw` gemm.
fn absorb_chunk(
    logits: &mut [f32],
    (vb, v0): (usize, usize),
    rows: &mut [Running],
    targets: &[u32],
    pw: Option<&mut [f32]>,
) {
    let local = |t: u32| (t as usize).checked_sub(v0).filter(|&t| t < vb);
    // Not 0: the forward skips the chunks when there are no rows.
    let n = rows.len();
    let it = logits
        .par_chunks_mut(vb)
        .zip(rows.par_iter_mut())
        .zip(targets.par_iter());
    match pw {
        Some(pw) => {
            let h = pw.len() / n;
            it.zip(pw.par_chunks_mut(h))
                .for_each(|(((l, st), &t), p)| absorb::<true>(st, l, p, local(t)));
        }
        None => it.for_each(|((l, st), &t)| absorb::<false>(st, l, &mut [], local(t))),
    }
}

/// The forward: `x [n, h]` against the whole head, one vocabulary chunk of `chunk` rows at a
/// time (each dequantised once).
fn forward(x: &[f32], w: &QuantWeight, targets: &[u32], want_g: bool, chunk: usize) -> Forward {
    let n = targets.len();
    let (v, h) = w.dims();
    let vc = chunk.clamp(1, v.max(1));
    let mut rows = vec![Running::default(); n];
    let mut pw = vec![0f32; if want_g { n * h } else { 0 }];
    if n > 0 {
        let mut wc = vec![0f32; vc * h];
        let mut logits = vec![0f32; n * vc];
        for v0 in (0..v).step_by(vc) {
            let vb = vc.min(v - v0);
            let (wc, logits) = (&mut wc[..vb * h], &mut logits[..n * vb]);
            dequant_chunk(w, v0, vb, wc);
            // L [n, vb] = x [n, h] @ Wc^T.
            gemm(n, vb, h, logits, x, false, wc, true, false);
            let pw_rows = want_g.then_some(&mut pw[..]);
            absorb_chunk(logits, (vb, v0), &mut rows, targets, pw_rows);
            if want_g {
                // pw [n, h] += E [n, vb] @ Wc [vb, h].
                gemm(n, h, vb, &mut pw, logits, false, wc, false, true);
            }
        }
    }
    finish(w, &rows, targets, pw, want_g)
}

/// Log-probs, entropies and (with `want_g`) `g = W[t] - pw / s` from the final row states;
/// `pw` becomes `g` in place.
fn finish(
    w: &QuantWeight,
    rows: &[Running],
    targets: &[u32],
    mut pw: Vec<f32>,
    want_g: bool,
) -> Forward {
    let (out, entropy) = rows
        .iter()
        .map(|st| {
            let ln_s = st.s.ln();
            let lse = st.m + ln_s as f32;
            (st.picked - lse, (ln_s - st.sl / st.s) as f32)
        })
        .unzip();
    if want_g {
        let h = w.dims().1;
        pw.par_chunks_mut(h)
            .zip(rows.par_iter().zip(targets.par_iter()))
            .for_each_init(
                || vec![0f32; h],
                |wt, (g, (st, &t))| {
                    w.dequant_rows(t as usize, 1, wt);
                    let inv = (1.0 / st.s) as f32;
                    g.iter_mut()
                        .zip(wt.iter())
                        .for_each(|(g, &a)| *g = a - *g * inv);
                },
            );
    }
    Forward {
        out,
        entropy,
        g: pw,
    }
}

impl CustomOp1 for QuantHead {
    fn name(&self) -> &'static str {
        "fused-quant-lm-head-logprobs"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let _t = crate::op_time::span("quant-lm-head fwd");
        let (n, h) = xl.shape().dims2()?;
        let (v, hw) = self.weight.dims();
        if h != hw || self.targets.len() != n {
            candle_core::bail!(
                "quant_lm_head_logprobs: hidden [{n}, {h}], head [{v}, {hw}], {} targets",
                self.targets.len()
            );
        }
        if xs.dtype() != DType::F32 {
            candle_core::bail!(
                "quant_lm_head_logprobs: hidden is {:?}, not F32",
                xs.dtype()
            );
        }
        let x = contiguous_slice::<f32>(xs, xl)?;
        let f = forward(x, &self.weight, &self.targets, self.want_g, self.chunk);
        let mut st = lock(&self.state)?;
        if self.want_g {
            st.g = Some(Tensor::from_vec(f.g, (n, h), &Device::Cpu)?);
        }
        if self.want_entropy {
            st.entropy = Some(Tensor::from_vec(f.entropy, n, &Device::Cpu)?);
        }
        Ok((f32::to_cpu_storage_owned(f.out), Shape::from(n)))
    }

    /// `dhidden = dy[:, None] * g`, with `g` from the forward.
    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let _t = crate::op_time::span("quant-lm-head bwd");
        let Some(g) = lock(&self.state)?.g.clone() else {
            candle_core::bail!("quant_lm_head_logprobs: hidden started tracking after the forward")
        };
        Ok(Some(g.broadcast_mul(&dy.unsqueeze(1)?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::head::lm_head_logprobs;
    use super::super::test_util::{rand, rel_diff};
    use super::*;
    use crate::quant::test_blocks::{random_blocks, reference};
    use candle_core::Var;
    use rlft_gguf::GgmlType;

    const V: usize = 1000;
    const H: usize = 64;
    const N: usize = 37;

    /// A `[V, H]` head of `ty` and the loader's f32 tensor of the same blocks.
    fn head(ty: GgmlType, seed: u64) -> (Arc<QuantWeight>, Tensor) {
        let data = random_blocks(ty, V, H, seed);
        let q = QuantWeight::from_gguf(ty, V, H, &data).unwrap();
        let w = Tensor::from_vec(reference(ty, V, H, &data), (V, H), &Device::Cpu).unwrap();
        (Arc::new(q), w)
    }

    /// Targets spread over the vocabulary, the first and the last id included.
    fn targets() -> Tensor {
        let mut t: Vec<u32> = (0..N as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % V as u32)
            .collect();
        t[0] = 0;
        t[N - 1] = V as u32 - 1;
        Tensor::from_vec(t, N, &Device::Cpu).unwrap()
    }

    /// Hidden rows giving logits of a few units.
    fn hidden() -> Tensor {
        (rand(&[N, H], 2, DType::F32) * 0.3).unwrap()
    }

    /// Log-probs, entropies and `d sum(coef * out) / d hidden` of the quantised op (`chunk`
    /// rows per vocabulary chunk) and of the dense op on the dequantised weight.
    fn check(ty: GgmlType, chunk: usize) {
        let ctx = format!("{ty:?} chunk {chunk}");
        let (q, w) = head(ty, 1);
        let xv = Var::from_tensor(&hidden()).unwrap();
        let t = targets();
        let coef = rand(&[N], 3, DType::F32);
        let (got, got_ent) =
            quant_lm_head_logprobs_with(xv.as_tensor(), &q, &t, true, chunk).unwrap();
        let (want, want_ent) = lm_head_logprobs(xv.as_tensor(), &w, &t, true).unwrap();
        assert_eq!(got.dims(), &[N]);
        let d = rel_diff(&got, &want);
        assert!(d < 1e-5, "{ctx}: log-probs {d}");
        let got_ent = got_ent.unwrap();
        assert!(!got_ent.track_op(), "{ctx}: the entropy is detached");
        let d = rel_diff(&got_ent, &want_ent.unwrap());
        assert!(d < 1e-5, "{ctx}: entropies {d}");
        let grad = |y: Tensor| {
            let g = (y * &coef).unwrap().sum_all().unwrap().backward().unwrap();
            g.get(&xv).unwrap().clone()
        };
        let d = rel_diff(&grad(got), &grad(want));
        assert!(d < 1e-5, "{ctx}: dhidden {d}");
    }

    #[test]
    fn quant_head_matches_the_dense_op() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
            // One row per chunk, 10 chunks of 96 + 40, and the default (one chunk of 1000).
            for chunk in [1, 96, chunk_rows(N, H, V)] {
                check(ty, chunk);
            }
        }
    }

    #[test]
    fn quant_head_frozen_hidden_and_repeatable() {
        let (q, w) = head(GgmlType::Q8_0, 4);
        let (x, t) = (hidden(), targets());
        let (got, ent) = quant_lm_head_logprobs_with(&x, &q, &t, false, 96).unwrap();
        assert!(ent.is_none());
        assert!(!got.track_op());
        let (want, _) = lm_head_logprobs(&x, &w, &t, false).unwrap();
        assert!(rel_diff(&got, &want) < 1e-5);
        // Same inputs, bit-identical outputs (values, entropies and the gradient).
        let xv = Var::from_tensor(&x).unwrap();
        let run = || {
            let (lp, ent) = quant_lm_head_logprobs_with(&xv, &q, &t, true, 96).unwrap();
            let g = lp.sum_all().unwrap().backward().unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                v.iter().map(|x| x.to_bits()).collect()
            };
            (bits(&lp), bits(&ent.unwrap()), bits(g.get(&xv).unwrap()))
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn quant_head_chunk_sizes() {
        // Qwen2.5-0.5B: the scratch bounds the chunk (4681 rows of 896), then the logits.
        let v = 151_936;
        assert_eq!(chunk_rows(512, 896, v), 4681);
        assert_eq!(chunk_rows(4096, 896, v), 1024);
        assert_eq!(chunk_rows(1 << 20, 896, v), MIN_CHUNK_ROWS);
        assert_eq!(chunk_rows(0, 896, v), 4681);
        assert_eq!(chunk_rows(37, 64, 1000), 1000);
    }

    #[test]
    fn quant_head_rejects_bad_inputs() {
        let (q, _) = head(GgmlType::Q4_1, 2);
        let x = hidden();
        let mut ids: Vec<u32> = targets().to_vec1().unwrap();
        ids[5] = V as u32;
        let t = Tensor::from_vec(ids, N, &Device::Cpu).unwrap();
        let e = quant_lm_head_logprobs(&x, &q, &t, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("target 1000 at row 5"), "{e}");
        let t = targets();
        let x64 = x.to_dtype(DType::F64).unwrap();
        let e = quant_lm_head_logprobs(&x64, &q, &t, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be f32"), "{e}");
        let x32 = rand(&[N, 32], 1, DType::F32);
        assert!(quant_lm_head_logprobs(&x32, &q, &t, false).is_err());
        let t3 = Tensor::new(&[0u32, 1, 2], &Device::Cpu).unwrap();
        assert!(quant_lm_head_logprobs(&x, &q, &t3, false).is_err());
    }

    #[test]
    fn quant_head_no_rows() {
        let (q, _) = head(GgmlType::Q8_0, 3);
        let xv = Var::from_tensor(&rand(&[0, H], 1, DType::F32)).unwrap();
        let t = Tensor::zeros(0, DType::U32, &Device::Cpu).unwrap();
        let (lp, ent) = quant_lm_head_logprobs(&xv, &q, &t, true).unwrap();
        assert_eq!(lp.dims(), &[0]);
        assert_eq!(ent.unwrap().dims(), &[0]);
        let g = lp.sum_all().unwrap().backward().unwrap();
        assert_eq!(g.get(&xv).unwrap().dims(), &[0, H]);
    }
}
