//! Micro-batches of SFT examples as tensors, and the loss over them.

use candle_core::{Device, Tensor};
use rlft_model::decoder::{Batch, CausalLm};
use rlft_model::trainable::sequence_logprobs;

use crate::data::sft::SftExample;

/// A left-padded next-token micro-batch.
pub struct MicroBatch {
    /// Inputs: every token of each example but the last, `[b, t]`.
    pub batch: Batch,
    /// The token following each input position, `[b, t]` u32.
    pub targets: Tensor,
    /// 1 where the target is trained on, `[b, t]` f32.
    pub mask: Tensor,
    /// Number of trained targets.
    pub num_targets: usize,
    /// Input tokens (padding excluded).
    pub num_tokens: usize,
}

/// Builds a micro-batch from examples (each at least 2 tokens).
pub fn micro_batch(
    examples: &[&SftExample],
    pad_id: u32,
    device: &Device,
) -> rlft_model::Result<MicroBatch> {
    let t = examples
        .iter()
        .map(|e| e.input_ids.len() - 1)
        .max()
        .unwrap_or(0);
    let rows: Vec<Vec<u32>> = examples
        .iter()
        .map(|e| e.input_ids[..e.input_ids.len() - 1].to_vec())
        .collect();
    let pads: Vec<usize> = rows.iter().map(|r| t - r.len()).collect();
    let batch = Batch::left_padded(&rows, &pads, 0, pad_id, device)?;
    let mut targets = Vec::with_capacity(examples.len() * t);
    let mut mask = Vec::with_capacity(examples.len() * t);
    let mut num_targets = 0;
    for (e, &p) in examples.iter().zip(&pads) {
        targets.extend(std::iter::repeat_n(pad_id, p));
        mask.extend(std::iter::repeat_n(0f32, p));
        targets.extend_from_slice(&e.input_ids[1..]);
        for &m in &e.loss_mask[1..] {
            mask.push(if m { 1.0 } else { 0.0 });
            num_targets += usize::from(m);
        }
    }
    Ok(MicroBatch {
        batch,
        targets: Tensor::from_vec(targets, (examples.len(), t), device)?,
        mask: Tensor::from_vec(mask, (examples.len(), t), device)?,
        num_targets,
        num_tokens: rows.iter().map(Vec::len).sum(),
    })
}

/// Summed negative log-likelihood of the trained targets (a scalar; differentiable when
/// `grad`). Dividing by the step's total target count gives the token-mean loss, which makes
/// batch 8 x accumulation 1 equal batch 1 x accumulation 8.
pub fn summed_nll(model: &CausalLm, mb: &MicroBatch, grad: bool) -> rlft_model::Result<Tensor> {
    let lp = sequence_logprobs(model, &mb.batch, &mb.targets, grad)?;
    let mask = mb.mask.to_dtype(lp.dtype())?;
    Ok((lp * mask)?.sum_all()?.neg()?)
}
