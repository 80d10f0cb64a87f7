//! Everything before the first DPO step: the policy (LoRA adapters or every weight), the
//! reference (the base with adapters off under LoRA, else a frozen copy of the starting
//! weights), the tokenized pairs, their precomputed reference log-probs when asked, and the
//! step arithmetic.

use std::path::Path;

use candle_core::Device;
use rlft_data::Dataset;
use rlft_model::CausalLm;
use rlft_text::TextBundle;

use super::{reference_logps, Reference};
use crate::config::dpo::DpoConfig;
use crate::data::dpo::{dpo_pairs, DpoLimits, DpoPair};
use crate::error::{Result, TrainerError};
use crate::run::{offline, setup, Policy};

/// A policy, its reference and pairs ready to train.
pub struct Prepared {
    /// The model being trained.
    pub policy: Policy,
    /// The reference model.
    pub reference: Reference,
    /// Training pairs.
    pub train: Vec<DpoPair>,
    /// Held-out pairs.
    pub eval: Vec<DpoPair>,
    /// Optimiser steps of the whole run.
    pub total_steps: usize,
}

fn pairs(cfg: &DpoConfig, text: &TextBundle, ds: &Dataset, what: &str) -> Result<Vec<DpoPair>> {
    if ds.is_empty() {
        return Err(TrainerError::Data(format!(
            "the {what} dataset is empty; point `dataset` at preference rows (prompt, chosen, \
             rejected)"
        )));
    }
    let lim = DpoLimits {
        max_length: cfg.max_length,
        max_prompt_length: cfg.max_prompt_length,
        truncation_mode: cfg.truncation_mode,
    };
    let (pairs, rep) = dpo_pairs(ds, text, cfg.args.system_prompt.as_deref(), &lim)?;
    eprintln!("{what}: {rep}");
    Ok(pairs)
}

/// Fills `pairs[i].ref_logps` with `reference`'s log-probs, `batch` pairs per pass.
fn precompute(
    reference: &CausalLm,
    pairs: &mut [DpoPair],
    batch: usize,
    pad_id: u32,
) -> Result<()> {
    let idx: Vec<usize> = (0..pairs.len()).collect();
    let refs = rlft_kernels::pool::on_pool_for(reference.device(), || {
        reference_logps(reference, pairs, &idx, batch, pad_id)
    })?;
    for (p, r) in pairs.iter_mut().zip(refs) {
        p.ref_logps = Some(r);
    }
    Ok(())
}

/// Loads the model and the pairs, builds the reference, precomputes its log-probs when
/// `precompute_ref_log_probs`, and prints the step arithmetic.
pub fn prepare(cfg: &DpoConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let a = &cfg.args;
    let (mut policy, base) = setup::load_policy(a, model_path, device, false)?;
    if a.use_peft && cfg.disable_dropout {
        setup::disable_lora_dropout(&mut policy.model);
    }
    let (train_ds, eval_ds) = crate::data::train_eval_datasets(a, cfg.eval_size)?;
    let mut train = pairs(cfg, &policy.text, &train_ds, "train")?;
    let mut eval = match &eval_ds {
        Some(d) => pairs(cfg, &policy.text, d, "eval")?,
        None => Vec::new(),
    };
    // Full fine-tuning: the trainable copy owns new storage, so `base` keeps the starting
    // weights. With LoRA the policy with its adapters off is the reference.
    let mut reference = if policy.lora.is_some() {
        drop(base);
        Reference::AdaptersOff
    } else {
        Reference::Frozen(Box::new(base))
    };
    if cfg.precompute_ref_log_probs {
        let t = std::time::Instant::now();
        let model = reference.model(&policy.model);
        precompute(&model, &mut train, cfg.ref_batch(), policy.pad_id)?;
        precompute(&model, &mut eval, cfg.ref_batch(), policy.pad_id)?;
        eprintln!(
            "reference log-probs of {} pairs precomputed in {:.1}s",
            train.len() + eval.len(),
            t.elapsed().as_secs_f64()
        );
        reference = Reference::Precomputed;
    }
    let total_steps = offline::total_steps(a, train.len());
    eprintln!(
        "batch: {} pairs/micro-batch x {} accumulation = {} pairs per step; {total_steps} \
         steps; {}; reference: {}",
        a.per_device_train_batch_size,
        a.gradient_accumulation_steps,
        a.train_batch(),
        setup::trainable_summary(&policy),
        reference.describe()
    );
    Ok(Prepared {
        policy,
        reference,
        train,
        eval,
        total_steps,
    })
}
