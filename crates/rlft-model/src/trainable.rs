//! The training side of the model: trainable weights, per-token log-probs with a graph, the SFT
//! loss.
//!
//! A trainable weight is a candle [`Var`] stored in the model itself, so
//! [`CausalLm::forward`] with `grad = true` builds the autograd graph through it; frozen weights
//! stay plain tensors and get no gradient. One SFT step:
//!
//! ```
//! # fn main() -> rlft_model::Result<()> {
//! # let cfg = rlft_model::tiny::tiny_config(rlft_model::Family::Llama);
//! # let dev = candle_core::Device::Cpu;
//! # let mut model = rlft_model::tiny::random_model(cfg, 0, candle_core::DType::F32, &dev)?;
//! use rlft_model::trainable::*;
//! let vars = make_trainable(&mut model, |_name| true)?;
//! let rows = vec![vec![1, 72, 105, 2], vec![1, 33, 2]];
//! let nt = next_token_batch(&rows, &[1, 1], 2, &dev)?;
//! let logprobs = sequence_logprobs(&model, &nt.batch, &nt.targets, true)?;
//! let loss = masked_mean_nll(&logprobs, &nt.mask)?;
//! let grads = backward(&loss, &vars)?;
//! # Ok(()) }
//! ```

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};

use crate::decoder::{Batch, CausalLm};
use crate::error::{ModelError, Result};

/// Rows of `[rows, vocab]` logits materialised at a time by [`sequence_logprobs`].
pub const LOGPROB_CHUNK: usize = 256;

/// Makes the weights whose HF name passes `filter` trainable: each is copied into a [`Var`]
/// whose tensor replaces the weight in `model`. Returns `(HF name, Var)` in
/// [`CausalLm::named_weights`] order (a tied `lm_head` is the embedding). Weights that are
/// already `Var`s are kept as they are, so calling this twice is harmless.
///
/// An optimizer updates the `Var`s in place (`Var::set`), which the model sees directly.
/// Errors when no weight matches (a typo in a filter would otherwise train nothing).
pub fn make_trainable(
    model: &mut CausalLm,
    filter: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Var)>> {
    // Weights kept in GGUF blocks become tensors before they can train.
    model.dequantize_weights(&filter)?;
    let mut out = Vec::new();
    for (name, w) in model.weights_mut() {
        if !filter(&name) {
            continue;
        }
        let var = Var::from_tensor(w)?;
        *w = var.as_tensor().clone();
        out.push((name, var));
    }
    // Weights that will move no longer match their GGUF blocks.
    model.drop_stale_quantized();
    if out.is_empty() {
        return Err(ModelError::Invalid(
            "no weight matches the trainable-weights filter: check the names against \
             `CausalLm::named_weights` (HF names such as `model.layers.0.self_attn.q_proj.weight`)"
                .into(),
        ));
    }
    Ok(out)
}

/// A copy of `model` whose weights (and LoRA adapters) share storage with it but are plain
/// tensors (no `Var`), for no-grad passes (old-policy and reference log-probs) on a model being
/// trained: they take the fused inference kernels and record no graph, yet see every optimizer
/// update.
pub fn detached(model: &CausalLm) -> CausalLm {
    let mut m = model.clone();
    for (_, w) in m.weights_mut() {
        *w = w.detach();
    }
    for (_, lin) in m.linears_mut() {
        if let Some(l) = &mut lin.lora {
            l.a = l.a.detach();
            l.b = l.b.detach();
        }
    }
    m
}

/// `loss.backward()`, keeping only the gradients of `vars`.
///
/// candle's backward also stores a gradient for every untracked operand of a tracked op (frozen
/// weights' transposed views, the attention mask, the rotary tables): this drops them, so the
/// store holds exactly the trainable weights.
///
/// The gradients are detached: candle leaves a variable's gradient tracked when it was computed
/// from tracked operands (a weight's `dW = dYᵀ X` from the activations), so a kept gradient, a
/// sum of them or optimizer state made from one would hold the whole forward graph alive.
pub fn backward(loss: &Tensor, vars: &[(String, Var)]) -> Result<GradStore> {
    let mut all = loss.backward()?;
    let mut out = GradStore::default();
    for (_, var) in vars {
        if let Some(g) = all.remove(var.as_tensor()) {
            out.insert(var.as_tensor(), g.detach());
        }
    }
    Ok(out)
}

/// Per-token log-probs of `targets [b, n]` (u32) predicted from the last `n` positions of
/// `batch` (`n <= t`): `targets[r][j]` is the token that follows position `t - n + j` of row
/// `r`. Returns `[b, n]` (f32; f64 for f64 models).
///
/// For next-token log-probs of whole sequences, feed every token but the last and target every
/// token but the first (see [`next_token_batch`]); for completion-only losses pass just the
/// completion tokens as targets, which skips the LM head on the prompt. `grad = true` uses the
/// differentiable ops, so the result has a graph through every trainable weight.
pub fn sequence_logprobs(
    model: &CausalLm,
    batch: &Batch,
    targets: &Tensor,
    grad: bool,
) -> Result<Tensor> {
    Ok(sequence_logprobs_entropy(model, batch, targets, grad, false, 1.0)?.0)
}

/// [`sequence_logprobs`] plus, when `entropy`, the entropy `[b, n]` of the model's next-token
/// distribution at each target position (detached; a metric such as GRPO's `entropy`), both
/// of the distribution at `temperature` (`softmax(logits / temperature)`, the distribution
/// sampling draws from; computed as the LM head of `hidden / temperature`, exact because the
/// head has no bias).
pub fn sequence_logprobs_entropy(
    model: &CausalLm,
    batch: &Batch,
    targets: &Tensor,
    grad: bool,
    entropy: bool,
    temperature: f64,
) -> Result<(Tensor, Option<Tensor>)> {
    let (b, t) = batch.ids.dims2()?;
    let (tb, n) = targets.dims2()?;
    if tb != b || n == 0 || n > t {
        return Err(ModelError::Invalid(format!(
            "sequence_logprobs: targets are [{tb}, {n}] for a batch of [{b}, {t}] ids; \
             expected [{b}, n] with 1 <= n <= {t}"
        )));
    }
    let hidden = model.forward(batch, None, grad)?;
    let h = hidden.dim(2)?;
    let mut rows = hidden.narrow(1, t - n, n)?.reshape((b * n, h))?;
    if temperature != 1.0 {
        rows = (rows / temperature)?;
    }
    let (lp, ent) =
        model.target_logprobs_entropy(&rows, &targets.flatten_all()?, LOGPROB_CHUNK, entropy)?;
    let ent = match ent {
        Some(e) => Some(e.reshape((b, n))?),
        None => None,
    };
    Ok((lp.reshape((b, n))?, ent))
}

/// Mean negative log-likelihood over the positions where `mask` is 1:
/// `-sum(logprobs * mask) / max(sum(mask), 1)`; `logprobs` and `mask` of one shape (any),
/// mask of any float dtype. Returns a scalar in the dtype of `logprobs`.
pub fn masked_mean_nll(logprobs: &Tensor, mask: &Tensor) -> Result<Tensor> {
    if logprobs.dims() != mask.dims() {
        return Err(ModelError::Invalid(format!(
            "masked_mean_nll: log-probs {:?} and mask {:?} differ in shape",
            logprobs.dims(),
            mask.dims()
        )));
    }
    let mask = mask.to_dtype(logprobs.dtype())?;
    let total = (logprobs * &mask)?.sum_all()?;
    let count = mask.sum_all()?.maximum(1.0)?;
    Ok(total.neg()?.div(&count)?)
}

/// A left-padded next-token batch: what [`sequence_logprobs`] and [`masked_mean_nll`] take.
#[derive(Debug, Clone)]
pub struct NextTokenBatch {
    /// Every token of each row but the last, left-padded to `[b, t]`, `t = max len - 1`.
    pub batch: Batch,
    /// `[b, t]` u32: the token following each input position (`pad_id` on padding).
    pub targets: Tensor,
    /// `[b, t]` f32: 1 where the target counts in the loss, 0 on padding and before
    /// `loss_start`.
    pub mask: Tensor,
}

/// Builds a [`NextTokenBatch`] from rows of token ids (each at least 2 long). The loss of row `r`
/// covers its tokens `loss_start[r]..` (1 = every token after the first; the prompt length =
/// completion only).
pub fn next_token_batch(
    rows: &[Vec<u32>],
    loss_start: &[usize],
    pad_id: u32,
    device: &Device,
) -> Result<NextTokenBatch> {
    if loss_start.len() != rows.len() {
        return Err(ModelError::Invalid(format!(
            "next_token_batch: {} rows but {} loss starts",
            rows.len(),
            loss_start.len()
        )));
    }
    if let Some(r) = rows.iter().position(|r| r.len() < 2) {
        return Err(ModelError::Invalid(format!(
            "next_token_batch: row {r} has {} tokens; next-token training needs at least 2",
            rows[r].len()
        )));
    }
    let t = rows.iter().map(|r| r.len() - 1).max().unwrap_or(0);
    let inputs: Vec<Vec<u32>> = rows.iter().map(|r| r[..r.len() - 1].to_vec()).collect();
    let pad: Vec<usize> = inputs.iter().map(|r| t - r.len()).collect();
    let batch = Batch::left_padded(&inputs, &pad, 0, pad_id, device)?;
    let mut targets = Vec::with_capacity(rows.len() * t);
    let mut mask = Vec::with_capacity(rows.len() * t);
    for ((row, &p), &start) in rows.iter().zip(&pad).zip(loss_start) {
        for j in 0..t {
            // Input position j holds row[j - p]; its target is row[j - p + 1].
            let tok = (j >= p).then(|| j - p + 1);
            targets.push(tok.map_or(pad_id, |i| row[i]));
            mask.push(if tok.is_some_and(|i| i >= start) {
                1f32
            } else {
                0.0
            });
        }
    }
    Ok(NextTokenBatch {
        batch,
        targets: Tensor::from_vec(targets, (rows.len(), t), device)?,
        mask: Tensor::from_vec(mask, (rows.len(), t), device)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_token_batch_aligns_targets_and_mask() {
        let rows = vec![vec![10, 11, 12, 13], vec![20, 21]];
        let nt = next_token_batch(&rows, &[1, 1], 0, &Device::Cpu).unwrap();
        let ids: Vec<Vec<u32>> = nt.batch.ids.to_vec2().unwrap();
        let targets: Vec<Vec<u32>> = nt.targets.to_vec2().unwrap();
        let mask: Vec<Vec<f32>> = nt.mask.to_vec2().unwrap();
        let pos: Vec<Vec<u32>> = nt.batch.positions.to_vec2().unwrap();
        assert_eq!(ids, [[10, 11, 12], [0, 0, 20]]);
        assert_eq!(targets, [[11, 12, 13], [0, 0, 21]]);
        assert_eq!(mask, [[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]);
        assert_eq!(pos, [[0, 1, 2], [0, 0, 0]]);
        // Completion-only: row 0's loss starts at token 3.
        let nt = next_token_batch(&rows, &[3, 1], 0, &Device::Cpu).unwrap();
        let mask: Vec<Vec<f32>> = nt.mask.to_vec2().unwrap();
        assert_eq!(mask, [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]);
        assert!(next_token_batch(&[vec![1]], &[1], 0, &Device::Cpu).is_err());
        assert!(next_token_batch(&rows, &[1], 0, &Device::Cpu).is_err());
    }

    #[test]
    fn masked_mean_nll_averages_counted_positions() {
        let lp = Tensor::new(&[[-1f32, -2.0], [-4.0, -8.0]], &Device::Cpu).unwrap();
        let mask = Tensor::new(&[[1f32, 0.0], [1.0, 1.0]], &Device::Cpu).unwrap();
        let l = masked_mean_nll(&lp, &mask)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(l, 13.0 / 3.0);
        let none = mask.zeros_like().unwrap();
        let l = masked_mean_nll(&lp, &none)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(l, 0.0);
        assert!(masked_mean_nll(&lp, &mask.flatten_all().unwrap()).is_err());
    }

    /// candle leaves a variable's gradient tracked when its operands were (here d/dw of
    /// `w * x²` is `x²`, tracked through the var `x`); `backward` hands it back detached.
    #[test]
    fn backward_detaches_the_gradients() {
        let dev = Device::Cpu;
        let w = Var::new(&[1f32, 2.0], &dev).unwrap();
        let x = Var::new(&[3f32, 4.0], &dev).unwrap();
        let y = (w.as_tensor() * x.as_tensor().sqr().unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let raw = y.backward().unwrap();
        assert!(raw.get(w.as_tensor()).unwrap().track_op());
        let grads = backward(&y, &[("w".into(), w.clone())]).unwrap();
        let g = grads.get(w.as_tensor()).unwrap();
        assert!(!g.track_op());
        assert_eq!(g.to_vec1::<f32>().unwrap(), [9.0, 16.0]);
    }
}
