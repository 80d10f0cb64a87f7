//! The training-side benchmark work of `rlft bench` (cases `fwd_bwd`, `lora`, `ref_pass`) and of
//! `examples/fwd_bwd_bench.rs`, one implementation for both, in the shape of the reference's
//! `bench/reference/bench.py` (`fwd_bwd` and `lora` cases):
//!
//! - [`BenchBatch`]: [`BATCH`] x [`SEQ`] random ids from a fixed seed; the loss is the negative
//!   mean log-prob of the [`SEQ`] - [`PROMPT`] "completion" tokens (positions 64..127) of each
//!   row;
//! - [`fwd_bwd`]: one timed forward + backward through every trainable weight of a model;
//! - [`ref_pass`]: one timed no-grad log-prob pass over the same batch, the work of a GRPO step's
//!   reference (or old-policy) phase;
//! - [`bench_lora_config`]: the LoRA of bench.py's `lora` case (rank r, alpha 2r, no dropout);
//! - [`process`]: peak RSS (VmHWM, reset after loading), CPU seconds and the CPU share other
//!   processes took while a benchmark ran, measured as bench.py measures them.
//!
//! Simplification: the model sees 127 positions (the last token's hidden state predicts
//! nothing), and the LM head runs on the 64 completion positions only, where bench.py runs all
//! 128 positions and computes logits for every one of them.

pub mod process;

use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

use crate::decoder::{Batch, CausalLm};
use crate::error::Result;
use crate::lora::LoraConfig;
use crate::trainable::{masked_mean_nll, sequence_logprobs};

/// Rows of the benchmark batch.
pub const BATCH: usize = 8;
/// Tokens per row.
pub const SEQ: usize = 128;
/// Tokens of each row's "prompt": the loss covers positions `PROMPT..SEQ`.
pub const PROMPT: usize = 64;

/// The fixed benchmark batch: inputs, completion targets and their mask.
#[derive(Debug, Clone)]
pub struct BenchBatch {
    /// The first `SEQ - 1` ids of each row (no padding).
    pub batch: Batch,
    /// `[BATCH, SEQ - PROMPT]` u32: tokens `PROMPT..SEQ` of each row.
    pub targets: Tensor,
    /// `[BATCH, SEQ - PROMPT]` f32 ones.
    pub mask: Tensor,
}

impl BenchBatch {
    /// Builds the batch for a model of `vocab_size` tokens: ids from a fixed LCG (bench.py draws
    /// them with `torch.randint`; any fixed ids do, the work does not depend on them).
    pub fn new(vocab_size: usize, device: &Device) -> Result<Self> {
        let vocab = vocab_size.max(1) as u64;
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let ids: Vec<u32> = (0..BATCH * SEQ)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) % vocab) as u32
            })
            .collect();
        let ids = Tensor::from_vec(ids, (BATCH, SEQ), device)?;
        let inputs: Vec<Vec<u32>> = ids.narrow(1, 0, SEQ - 1)?.to_vec2()?;
        let batch = Batch::left_padded(&inputs, &[0; BATCH], 0, 0, device)?;
        // Targets: tokens PROMPT..SEQ-1, predicted from the last SEQ-PROMPT input positions.
        let targets = ids.narrow(1, PROMPT, SEQ - PROMPT)?.contiguous()?;
        let mask = Tensor::ones((BATCH, SEQ - PROMPT), DType::F32, device)?;
        Ok(BenchBatch {
            batch,
            targets,
            mask,
        })
    }

    /// Input tokens per pass (`BATCH * SEQ`, the figure bench.py's tokens/s uses).
    pub fn tokens(&self) -> usize {
        BATCH * SEQ
    }
}

/// The LoRA of bench.py's `lora` case: rank `rank`, alpha `2 * rank`, no dropout, on
/// `target_modules` (`["all-linear"]` there: q, k, v, o, gate, up, down).
pub fn bench_lora_config(rank: usize, target_modules: Vec<String>) -> LoraConfig {
    LoraConfig {
        r: rank,
        lora_alpha: 2.0 * rank as f64,
        target_modules,
        ..LoraConfig::default()
    }
}

/// Times of one forward + backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FwdBwdTiming {
    /// Forward and loss, wall seconds.
    pub forward_s: f64,
    /// `loss.backward()`, wall seconds.
    pub backward_s: f64,
    /// CPU seconds (all threads) of the backward, which machine noise disturbs less.
    pub backward_cpu_s: f64,
    /// The loss.
    pub loss: f32,
}

impl FwdBwdTiming {
    /// Forward + backward wall seconds.
    pub fn total_s(&self) -> f64 {
        self.forward_s + self.backward_s
    }
}

/// One forward + backward of `model` on `b`: the loss through every trainable weight (the `Var`s
/// inside the model, see [`crate::trainable::make_trainable`] and [`crate::lora::attach_lora`]).
/// Returns the times and candle's raw gradient store, which also holds gradients of untracked
/// operands (see [`crate::trainable::backward`]); drop it before the next rep.
pub fn fwd_bwd(model: &CausalLm, b: &BenchBatch) -> Result<(FwdBwdTiming, GradStore)> {
    let t0 = Instant::now();
    let lp = sequence_logprobs(model, &b.batch, &b.targets, true)?;
    let loss = masked_mean_nll(&lp, &b.mask)?;
    let loss_v = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    let t1 = Instant::now();
    let c1 = process::cpu_seconds();
    let grads = loss.backward()?;
    let t2 = Instant::now();
    let timing = FwdBwdTiming {
        forward_s: (t1 - t0).as_secs_f64(),
        backward_s: (t2 - t1).as_secs_f64(),
        backward_cpu_s: process::cpu_seconds() - c1,
        loss: loss_v,
    };
    Ok((timing, grads))
}

/// One no-grad pass of `model` over `b` returning the completion tokens' log-probs: what a GRPO
/// step's reference (or old-policy) phase computes. Returns wall seconds. Pass a model without
/// trainable weights (as loaded, or [`crate::trainable::detached`]) so the fused inference
/// kernels run, as in training.
pub fn ref_pass(model: &CausalLm, b: &BenchBatch) -> Result<f64> {
    let t0 = Instant::now();
    let lp = sequence_logprobs(model, &b.batch, &b.targets, false)?;
    // Reading one value forces any lazy work to finish (a no-op on the eager CPU backend).
    let _ = lp.sum_all()?.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// Median of `v` (the mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::tiny::{random_model, tiny_config};
    use crate::trainable::make_trainable;

    #[test]
    fn fwd_bwd_and_ref_pass_on_a_tiny_model() {
        let dev = Device::Cpu;
        let mut model = random_model(tiny_config(Family::Llama), 0, DType::F32, &dev).unwrap();
        let b = BenchBatch::new(model.config.vocab_size, &dev).unwrap();
        assert_eq!(b.targets.dims(), &[BATCH, SEQ - PROMPT]);
        assert!(ref_pass(&model, &b).unwrap() > 0.0);
        let vars = make_trainable(&mut model, |_| true).unwrap();
        let (t, grads) = fwd_bwd(&model, &b).unwrap();
        assert!(t.loss.is_finite() && t.total_s() > 0.0);
        assert!(vars.iter().all(|(_, v)| grads.get(v.as_tensor()).is_some()));
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
