//! Everything before the first step: model, trainable parameters, data, step arithmetic; and
//! the pieces the loop needs (optimiser, schedule, restore, final export).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rlft_data::{load_dataset, train_test_split, Dataset};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::LoraConfig;
use rlft_model::{CausalLm, LoadedModel};
use rlft_train::{AdamW, LrScheduler};
use serde_json::Value;

use super::{Result, SftError};
use crate::config::sft::SftConfig;
use crate::sft_data::{
    build_example, fit_length, LengthPolicy, LengthReport, SftExample, SftFormat,
};
use crate::train_setup::{self, OptimSettings};

/// A model and data ready to train.
pub struct Prepared {
    /// The model being trained (trainable weights are `Var`s inside it).
    pub model: CausalLm,
    /// Tokenizer, template and generation defaults of the model.
    pub loaded: LoadedModel,
    /// Trainable parameters (HF or PEFT names).
    pub vars: Vec<(String, Var)>,
    /// LoRA settings when training adapters.
    pub lora: Option<LoraConfig>,
    /// `adapter_config.json` for checkpoints when training adapters.
    pub adapter_config: Option<Value>,
    /// Training examples.
    pub train: Vec<SftExample>,
    /// Held-out examples.
    pub eval: Vec<SftExample>,
    /// Optimiser steps of the whole run.
    pub total_steps: usize,
    /// Padding id.
    pub pad_id: u32,
}

fn examples(
    cfg: &SftConfig,
    loaded: &LoadedModel,
    ds: &Dataset,
    what: &str,
) -> Result<Vec<SftExample>> {
    if ds.is_empty() {
        return Err(SftError::Other(format!(
            "the {what} dataset is empty; point `dataset` at a file with rows"
        )));
    }
    let format = SftFormat::detect(&ds.columns)?;
    let template = loaded.text.compile_chat_template().ok();
    let policy = if cfg.truncation == "drop" {
        LengthPolicy::Drop
    } else {
        LengthPolicy::Truncate
    };
    let mut report = LengthReport::default();
    let mut out = Vec::with_capacity(ds.len());
    for (i, row) in ds.iter().enumerate() {
        let ex = build_example(
            &loaded.text,
            template.as_ref(),
            &format,
            row,
            i,
            cfg.system_prompt.as_deref(),
        )?;
        if let Some(ex) = fit_length(ex, cfg.max_length, policy, &mut report) {
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
        return Err(SftError::Other(format!(
            "no {what} example is left after the length policy; raise max_length or use \
             truncation = \"truncate\""
        )));
    }
    Ok(out)
}

/// Loads model and data and derives the step arithmetic (printed).
pub fn prepare(cfg: &SftConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let dtype = if cfg.bf16 { DType::BF16 } else { DType::F32 };
    let mut loaded = load_model(
        model_path,
        &LoadOptions {
            device: device.clone(),
            dtype,
        },
    )?;
    // SFT never decodes: no GGUF blocks beside the weights.
    loaded.model.drop_quantized();
    let mut model = loaded.model.clone();
    let (vars, lora, adapter_config) =
        train_setup::trainable(&mut model, cfg.use_peft, &cfg.lora, cfg.seed, &cfg.model)?;
    let full = load_dataset(&cfg.dataset, Some(&cfg.dataset_split))?;
    let (train_ds, eval_ds) = match (&cfg.eval_dataset, &cfg.eval_split) {
        (Some(p), split) => (full, Some(load_dataset(p, split.as_deref())?)),
        (None, Some(split)) => (full, Some(load_dataset(&cfg.dataset, Some(split))?)),
        (None, None) if cfg.eval_size > 0.0 => {
            let parts = if cfg.eval_size >= 1.0 {
                train_test_split(&full, cfg.eval_size as usize, cfg.seed)?
            } else {
                train_test_split(&full, cfg.eval_size, cfg.seed)?
            };
            (parts.train, Some(parts.test))
        }
        (None, None) => (full, None),
    };
    let train = examples(cfg, &loaded, &train_ds, "train")?;
    let eval = match &eval_ds {
        Some(d) => examples(cfg, &loaded, d, "eval")?,
        None => Vec::new(),
    };
    let per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps;
    let steps_per_epoch = train.len().div_ceil(per_step);
    let total_steps = if cfg.max_steps > 0 {
        cfg.max_steps
    } else {
        ((steps_per_epoch as f64) * cfg.num_train_epochs)
            .ceil()
            .max(1.0) as usize
    };
    let trainable: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    eprintln!(
        "batch: {} examples/micro-batch x {} accumulation = {per_step} per step; {} steps/epoch; \
         {total_steps} steps; {trainable} trainable parameters{}",
        cfg.per_device_train_batch_size,
        cfg.gradient_accumulation_steps,
        steps_per_epoch,
        if cfg.use_peft { " (LoRA)" } else { "" }
    );
    let pad_id = loaded.generation.pad_token_id.unwrap_or(0);
    Ok(Prepared {
        model,
        loaded,
        vars,
        lora,
        adapter_config,
        train,
        eval,
        total_steps,
        pad_id,
    })
}

/// The optimiser settings of the config.
fn optim_settings(cfg: &SftConfig) -> OptimSettings {
    OptimSettings {
        learning_rate: cfg.learning_rate,
        adam_beta1: cfg.adam_beta1,
        adam_beta2: cfg.adam_beta2,
        adam_epsilon: cfg.adam_epsilon,
        weight_decay: cfg.weight_decay,
        lr_scheduler_type: cfg.lr_scheduler_type.clone(),
        min_lr_rate: cfg.min_lr_rate,
        warmup_ratio: cfg.warmup_ratio,
        warmup_steps: cfg.warmup_steps,
    }
}

/// AdamW over the trainable parameters (no decay on vectors: biases, norms).
pub fn optimizer(cfg: &SftConfig, vars: &[(String, Var)]) -> Result<AdamW> {
    Ok(train_setup::optimizer(&optim_settings(cfg), vars)?)
}

/// The LR schedule of the config.
pub fn scheduler(cfg: &SftConfig) -> Result<LrScheduler> {
    Ok(train_setup::scheduler(&optim_settings(cfg))?)
}

/// Copies checkpointed tensors into the trainable `Var`s (names must match).
pub fn restore_weights(vars: &[(String, Var)], saved: &[(String, Tensor)]) -> Result<()> {
    train_setup::restore_weights(vars, saved).map_err(SftError::Other)
}

/// Writes the final model: the adapter (PEFT) plus a merged HF directory with LoRA, or a full HF
/// directory. Returns the directory of the usable model.
pub fn export_final(cfg: &SftConfig, p: &Prepared) -> Result<PathBuf> {
    Ok(train_setup::export_final(
        &cfg.output_dir,
        &cfg.model,
        &p.model,
        p.lora.as_ref(),
        &p.loaded.text,
        &p.loaded.generation,
    )?)
}
