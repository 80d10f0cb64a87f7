//! Per-token log-probs of completions that share prompts: each prompt runs once, and the
//! completions of its group attend to its keys and values.
//!
//! In a GRPO step the G completions of a prompt are scored (policy with gradients, old policy,
//! reference) after the same prompt. Running `prompt + completion` rows recomputes the prompt G
//! times; here the prompt pass runs once per unique prompt and every layer's prompt keys/values
//! are gathered (`index_select`) into the completion rows' attention. The gather is
//! differentiable, so the gradients of all G completions flow back into the one prompt pass:
//! log-probs and gradients equal those of the unshared rows (tests below).
//!
//! Shapes: `P` unique prompts left-padded to `Tp`; `N` completions right-padded to `Tc`; the
//! completion pass sees `Ts = max(Tc - 1, 1)` inputs (completion tokens but the last). The
//! first completion token is predicted from the prompt's last hidden state.

use candle_core::{Device, Tensor};

use crate::decoder::{Batch, CausalLm};
use crate::error::{ModelError, Result};
use crate::trainable::LOGPROB_CHUNK;

/// Prompts and the completions that follow them, as the two batches of a shared pass.
#[derive(Debug)]
pub struct SharedPrefixBatch {
    /// `[P, Tp]` left-padded prompts.
    pub prefix: Batch,
    /// `[N, Ts]` completion inputs continuing their prompt (positions and bias over
    /// `Tp + Ts` keys).
    pub suffix: Batch,
    /// `[N]` u32: the prompt row of each completion.
    pub group: Tensor,
    /// `[N, Tc]` u32 completion tokens (pad id past each end).
    pub targets: Tensor,
    /// `[N, Tc]` f32: 1 on completion tokens, 0 on padding.
    pub mask: Tensor,
    /// Completion lengths.
    pub lens: Vec<usize>,
    /// Non-padding input tokens computed (prompts once, completions but their last token).
    pub num_tokens: usize,
}

/// Builds a [`SharedPrefixBatch`]: `prompts` are the unique prompts, `group[i]` the prompt of
/// completion `i`. Every prompt and completion needs at least one token.
pub fn shared_prefix_batch(
    prompts: &[&[u32]],
    completions: &[&[u32]],
    group: &[usize],
    pad_id: u32,
    device: &Device,
) -> Result<SharedPrefixBatch> {
    if group.len() != completions.len() || group.iter().any(|&g| g >= prompts.len()) {
        return Err(ModelError::Invalid(format!(
            "shared_prefix_batch: {} completions with {} group entries over {} prompts",
            completions.len(),
            group.len(),
            prompts.len()
        )));
    }
    if prompts.iter().any(|p| p.is_empty()) || completions.iter().any(|c| c.is_empty()) {
        return Err(ModelError::Invalid(
            "shared_prefix_batch: empty prompt or completion".into(),
        ));
    }
    let tp = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let tc = completions.iter().map(|c| c.len()).max().unwrap_or(0);
    let ts = tc.saturating_sub(1).max(1);
    let pads: Vec<usize> = prompts.iter().map(|p| tp - p.len()).collect();
    let rows: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let prefix = Batch::left_padded(&rows, &pads, 0, pad_id, device)?;
    let n = completions.len();
    let mut inputs = Vec::with_capacity(n);
    let mut targets = Vec::with_capacity(n * tc);
    let mut mask = Vec::with_capacity(n * tc);
    let mut num_tokens: usize = prompts.iter().map(|p| p.len()).sum();
    for c in completions {
        let mut padded = c.to_vec();
        padded.resize(tc.max(ts + 1), pad_id);
        inputs.push(padded[..ts].to_vec());
        targets.extend_from_slice(&padded[..tc]);
        mask.extend((0..tc).map(|j| if j < c.len() { 1f32 } else { 0.0 }));
        num_tokens += c.len() - 1;
    }
    let suffix_pads: Vec<usize> = group.iter().map(|&g| pads[g]).collect();
    let suffix = Batch::left_padded(&inputs, &suffix_pads, tp, pad_id, device)?;
    let group_ids: Vec<u32> = group.iter().map(|&g| g as u32).collect();
    Ok(SharedPrefixBatch {
        prefix,
        suffix,
        group: Tensor::from_vec(group_ids, n, device)?,
        targets: Tensor::from_vec(targets, (n, tc), device)?,
        mask: Tensor::from_vec(mask, (n, tc), device)?,
        lens: completions.iter().map(|c| c.len()).collect(),
        num_tokens,
    })
}

impl CausalLm {
    /// The shared pass: returns the final-normed hidden states that predict each completion
    /// token, `[N, Tc, hidden]` (position 0 from the prompt's last position, the others from
    /// the completion pass). Differentiable when `grad`.
    ///
    /// Prompt rows and completion rows form one `[1, P * Tp + N * Ts, hidden]` stream: every
    /// norm, projection and MLP runs once over all of them (one gemm per linear, and one
    /// weight gradient, not two to add), and only attention splits them.
    pub fn forward_shared_prefix(&self, sb: &SharedPrefixBatch, grad: bool) -> Result<Tensor> {
        let (p, tp) = sb.prefix.ids.dims2()?;
        let (n, ts) = sb.suffix.ids.dims2()?;
        let (rp, rs) = (p * tp, n * ts);
        let ids = Tensor::cat(
            &[sb.prefix.ids.flatten_all()?, sb.suffix.ids.flatten_all()?],
            0,
        )?;
        let mut x = self.embed_ids(&ids)?.unsqueeze(0)?;
        let ctx = StreamContext {
            rope_p: self.rope_tables(&sb.prefix)?,
            rope_s: self.rope_tables(&sb.suffix)?,
            bias_p: sb.prefix.bias.clone(),
            bias_s: sb.suffix.bias.clone(),
            group: sb.group.clone(),
            shape: (p, tp, n, ts),
        };
        if grad && crate::checkpoint::active(self) {
            let m = self.clone();
            let step: crate::checkpoint::LayerFn =
                std::rc::Rc::new(move |li, x| m.stream_layer(&m.layers[li], x.clone(), &ctx, true));
            let n_layers = self.layers.len();
            x = crate::checkpoint::run_layers(self, x, n_layers, self.dropout_counters(), step)?;
        } else {
            for layer in &self.layers {
                x = self.stream_layer(layer, x, &ctx, grad)?;
            }
        }
        let hidden = self.final_norm(&x, grad)?;
        let h = hidden.dim(2)?;
        let last = hidden
            .narrow(1, 0, rp)?
            .reshape((p, tp, h))?
            .narrow(1, tp - 1, 1)?
            .contiguous()?
            .index_select(&sb.group, 0)?;
        let tc = sb.targets.dim(1)?;
        if tc == 1 {
            return Ok(last);
        }
        let hs = hidden.narrow(1, rp, rs)?.reshape((n, ts, h))?;
        Ok(Tensor::cat(&[last, hs.narrow(1, 0, tc - 1)?], 1)?)
    }
}

/// What every layer of the shared stream needs besides its input.
struct StreamContext {
    /// Rotary tables of the prompt and completion rows.
    rope_p: (Tensor, Tensor),
    rope_s: (Tensor, Tensor),
    /// Attention biases of the prompt and completion rows.
    bias_p: Tensor,
    bias_s: Tensor,
    /// `[N]` prompt row of each completion.
    group: Tensor,
    /// `(P, Tp, N, Ts)`.
    shape: (usize, usize, usize, usize),
}

impl CausalLm {
    /// One layer over the `[1, P * Tp + N * Ts, hidden]` stream.
    fn stream_layer(
        &self,
        layer: &crate::decoder::Layer,
        x: Tensor,
        c: &StreamContext,
        grad: bool,
    ) -> Result<Tensor> {
        let (p, tp, n, ts) = c.shape;
        let rp = p * tp;
        let proj = self.layer_proj(layer, &x, grad)?;
        let (cos_p, sin_p) = &c.rope_p;
        let (cos_s, sin_s) = &c.rope_s;
        let (qp, kp, vp) = self.layer_heads(layer, &proj.rows(0, p, tp)?, cos_p, sin_p, grad)?;
        let (qs, ks, vs) = self.layer_heads(layer, &proj.rows(rp, n, ts)?, cos_s, sin_s, grad)?;
        let attn_p = crate::ops::attention_rows(&qp, &kp, &vp, &c.bias_p, grad)?;
        // Each completion row sees its prompt's keys/values, then its own.
        let k = Tensor::cat(&[kp.contiguous()?.index_select(&c.group, 0)?, ks], 2)?;
        let v = Tensor::cat(&[vp.contiguous()?.index_select(&c.group, 0)?, vs], 2)?;
        let attn_s = crate::ops::attention_rows(&qs, &k, &v, &c.bias_s, grad)?;
        let f = attn_p.dim(2)?;
        let attn = Tensor::cat(
            &[attn_p.reshape((1, rp, f))?, attn_s.reshape((1, n * ts, f))?],
            1,
        )?;
        self.layer_out(layer, x, &attn, grad)
    }
}

/// Per-token log-probs `[N, Tc]` of the completion tokens (and with `entropy` the detached
/// entropies) at `temperature`, from a shared pass.
pub fn shared_prefix_logprobs(
    model: &CausalLm,
    sb: &SharedPrefixBatch,
    grad: bool,
    entropy: bool,
    temperature: f64,
) -> Result<(Tensor, Option<Tensor>)> {
    let hidden = model.forward_shared_prefix(sb, grad)?;
    let (n, tc, h) = hidden.dims3()?;
    let mut rows = hidden.reshape((n * tc, h))?;
    if temperature != 1.0 {
        rows = (rows / temperature)?;
    }
    let (lp, ent) =
        model.target_logprobs_entropy(&rows, &sb.targets.flatten_all()?, LOGPROB_CHUNK, entropy)?;
    let ent = match ent {
        Some(e) => Some(e.reshape((n, tc))?),
        None => None,
    };
    Ok((lp.reshape((n, tc))?, ent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::tiny::{random_model, tiny_config};
    use crate::trainable::{make_trainable, sequence_logprobs};
    use candle_core::DType;

    /// Unshared reference: prompt + completion rows, completion tokens as targets.
    fn unshared(
        m: &CausalLm,
        prompts: &[&[u32]],
        comps: &[&[u32]],
        group: &[usize],
        grad: bool,
    ) -> Tensor {
        let tc = comps.iter().map(|c| c.len()).max().unwrap();
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (c, &g) in comps.iter().zip(group) {
            let mut padded = c.to_vec();
            padded.resize(tc, 0);
            let mut row = prompts[g].to_vec();
            row.extend_from_slice(&padded[..tc - 1]);
            rows.push(row);
            targets.extend_from_slice(&padded);
        }
        let t = rows.iter().map(Vec::len).max().unwrap();
        let pads: Vec<usize> = rows.iter().map(|r| t - r.len()).collect();
        let batch = Batch::left_padded(&rows, &pads, 0, 0, &Device::Cpu).unwrap();
        let targets = Tensor::from_vec(targets, (comps.len(), tc), &Device::Cpu).unwrap();
        sequence_logprobs(m, &batch, &targets, grad).unwrap()
    }

    #[test]
    fn shared_equals_unshared_logprobs_and_gradients() {
        for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
            let mut m = random_model(tiny_config(family), 11, DType::F32, &Device::Cpu).unwrap();
            let vars = make_trainable(&mut m, |_| true).unwrap();
            let p0: Vec<u32> = vec![5, 6, 7, 8, 9];
            let p1: Vec<u32> = vec![10, 11];
            let prompts: Vec<&[u32]> = vec![&p0, &p1];
            let c: Vec<Vec<u32>> = vec![
                vec![12, 13, 14],
                vec![15],
                vec![16, 17],
                vec![18, 19, 20, 21],
            ];
            let comps: Vec<&[u32]> = c.iter().map(|x| &x[..]).collect();
            let group = [0, 0, 1, 1];
            let sb = shared_prefix_batch(&prompts, &comps, &group, 0, &Device::Cpu).unwrap();
            let (shared, _) = shared_prefix_logprobs(&m, &sb, true, false, 1.0).unwrap();
            let plain = unshared(&m, &prompts, &comps, &group, true);
            let (a, b): (Vec<Vec<f32>>, Vec<Vec<f32>>) =
                (shared.to_vec2().unwrap(), plain.to_vec2().unwrap());
            for (i, c) in comps.iter().enumerate() {
                for j in 0..c.len() {
                    assert!((a[i][j] - b[i][j]).abs() < 1e-5, "{family:?} [{i}][{j}]");
                }
            }
            // Same loss -> same gradients on every weight.
            let loss = |lp: &Tensor| (lp * &sb.mask).unwrap().sum_all().unwrap();
            let ga = loss(&shared).backward().unwrap();
            let gb = loss(&plain).backward().unwrap();
            for (name, v) in &vars {
                let (x, y) = (
                    ga.get(v.as_tensor()).unwrap(),
                    gb.get(v.as_tensor()).unwrap(),
                );
                let d = (x - y)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                let s = y
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(
                    d <= 1e-4 * s.max(1e-3),
                    "{family:?} {name}: {d} vs scale {s}"
                );
            }
        }
    }
}
