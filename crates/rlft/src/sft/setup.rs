//! Everything before the first SFT step: the policy, the examples, the step arithmetic.

use std::path::Path;

use candle_core::Device;
use rlft_data::Dataset;
use rlft_text::TextBundle;

use crate::config::sft::SftConfig;
use crate::data::sft::{build_example, fit_length, LengthReport, SftExample, SftFormat};
use crate::error::{Result, TrainerError};
use crate::run::{setup, Policy};

/// A policy and examples ready to train.
pub struct Prepared {
    /// The model being trained, its trainable parameters, tokenizer and template.
    pub policy: Policy,
    /// Training examples.
    pub train: Vec<SftExample>,
    /// Held-out examples.
    pub eval: Vec<SftExample>,
    /// Optimiser steps of the whole run.
    pub total_steps: usize,
}

fn examples(
    cfg: &SftConfig,
    text: &TextBundle,
    ds: &Dataset,
    what: &str,
) -> Result<Vec<SftExample>> {
    if ds.is_empty() {
        return Err(TrainerError::Data(format!(
            "the {what} dataset is empty; point `dataset` at a file with rows"
        )));
    }
    let format = SftFormat::detect(&ds.columns)?;
    let template = text.compile_chat_template().ok();
    let mut report = LengthReport::default();
    let mut out = Vec::with_capacity(ds.len());
    for (i, row) in ds.iter().enumerate() {
        let system = cfg.args.system_prompt.as_deref();
        let ex = build_example(text, template.as_ref(), &format, row, i, system)?;
        if let Some(ex) = fit_length(ex, cfg.max_length, cfg.truncation, &mut report) {
            if ex.input_ids.len() >= 2 && ex.loss_mask[1..].iter().any(|&m| m) {
                out.push(ex);
            } else {
                report.dropped += 1;
            }
        }
    }
    eprintln!(
        "{what}: {} examples ({} kept whole, {} truncated, {} dropped; max_length {})",
        out.len(),
        report.kept,
        report.truncated,
        report.dropped,
        cfg.max_length
    );
    if out.is_empty() {
        return Err(TrainerError::Data(format!(
            "no {what} example is left after the length policy; raise max_length or use \
             truncation = \"truncate\""
        )));
    }
    Ok(out)
}

/// Loads the policy and the examples and derives the step arithmetic (printed).
pub fn prepare(cfg: &SftConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let a = &cfg.args;
    // SFT never decodes: no GGUF blocks beside the weights, and no initial copy kept.
    let (policy, _) = setup::load_policy(a, model_path, device, false)?;
    let (train_ds, eval_ds) = crate::data::train_eval_datasets(a, cfg.eval_size)?;
    let train = examples(cfg, &policy.text, &train_ds, "train")?;
    let eval = match &eval_ds {
        Some(d) => examples(cfg, &policy.text, d, "eval")?,
        None => Vec::new(),
    };
    let per_step = a.train_batch();
    let steps_per_epoch = train.len().div_ceil(per_step);
    let total_steps = crate::run::offline::total_steps(a, train.len());
    eprintln!(
        "batch: {} examples/micro-batch x {} accumulation = {per_step} per step; {} steps/epoch; \
         {total_steps} steps; {}",
        a.per_device_train_batch_size,
        a.gradient_accumulation_steps,
        steps_per_epoch,
        setup::trainable_summary(&policy)
    );
    Ok(Prepared {
        policy,
        train,
        eval,
        total_steps,
    })
}
