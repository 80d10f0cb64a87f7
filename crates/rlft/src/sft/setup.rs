//! Everything before the first step: model, trainable parameters, data, step arithmetic; and
//! the pieces the loop needs (optimiser, schedule, restore, final export).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rlft_data::{load_dataset, train_test_split, Dataset};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::{CausalLm, LoadedModel};
use rlft_train::{AdamW, AdamWConfig, LrSchedule, LrScheduler, ParamGroup, Warmup};
use serde_json::Value;

use super::{Result, SftError};
use crate::config::sft::SftConfig;
use crate::sft_data::{
    build_example, fit_length, LengthPolicy, LengthReport, SftExample, SftFormat,
};

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
    let loaded = load_model(
        model_path,
        &LoadOptions {
            device: device.clone(),
            dtype,
        },
    )?;
    let mut model = loaded.model.clone();
    let (vars, lora, adapter_config) = if cfg.use_peft {
        let l = LoraConfig {
            r: cfg.lora.r,
            lora_alpha: cfg.lora.lora_alpha,
            lora_dropout: cfg.lora.lora_dropout,
            target_modules: cfg.lora.target_modules.clone(),
            use_rslora: cfg.lora.use_rslora,
            init_lora_weights: true,
            seed: cfg.seed,
        };
        let vars = attach_lora(&mut model, &l)?;
        let modules = l.resolve_targets()?;
        let ac = rlft_model::peft::adapter_config_json(&l, &modules, Some(&cfg.model));
        (vars, Some(l), Some(ac))
    } else {
        (
            rlft_model::trainable::make_trainable(&mut model, |_| true)?,
            None,
            None,
        )
    };
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

/// AdamW over the trainable parameters (no decay on vectors: biases, norms).
pub fn optimizer(cfg: &SftConfig, vars: &[(String, Var)]) -> Result<AdamW> {
    let groups = ParamGroup::split_decay(vars.iter().map(|(_, v)| v.clone()).collect());
    Ok(AdamW::new(
        groups,
        AdamWConfig {
            lr: cfg.learning_rate,
            beta1: cfg.adam_beta1,
            beta2: cfg.adam_beta2,
            eps: cfg.adam_epsilon,
            weight_decay: cfg.weight_decay,
        },
    )?)
}

/// The LR schedule of the config.
pub fn scheduler(cfg: &SftConfig) -> Result<LrScheduler> {
    let schedule = match LrSchedule::from_name(&cfg.lr_scheduler_type)? {
        LrSchedule::CosineWithMinLr { .. } => LrSchedule::CosineWithMinLr {
            min_lr_rate: cfg.min_lr_rate,
        },
        s => s,
    };
    let warmup = if cfg.warmup_steps > 0 {
        Warmup::Steps(cfg.warmup_steps)
    } else {
        Warmup::Ratio(cfg.warmup_ratio)
    };
    Ok(LrScheduler {
        base_lr: cfg.learning_rate,
        schedule,
        warmup,
    })
}

/// Copies checkpointed tensors into the trainable `Var`s (names must match).
pub fn restore_weights(vars: &[(String, Var)], saved: &[(String, Tensor)]) -> Result<()> {
    let map: std::collections::HashMap<&str, &Tensor> =
        saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for (name, var) in vars {
        let t = map.get(name.as_str()).ok_or_else(|| {
            SftError::Other(format!(
                "checkpoint lacks trainable tensor `{name}`; it was written by another config \
                 (LoRA vs full, or other target_modules)"
            ))
        })?;
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Writes the final model: the adapter (PEFT) plus a merged HF directory with LoRA, or a full HF
/// directory. Returns the directory of the usable model.
pub fn export_final(cfg: &SftConfig, p: &Prepared) -> Result<PathBuf> {
    let opts = rlft_model::export::ExportOptions {
        overwrite: true,
        ..Default::default()
    };
    let plain = rlft_model::trainable::detached(&p.model);
    if let Some(l) = &p.lora {
        let adapter = cfg.output_dir.join("adapter");
        rlft_model::peft::save_adapter(&plain, l, &adapter, Some(&cfg.model))?;
        let mut merged = plain;
        rlft_model::lora::merge_lora(&mut merged)?;
        let out = cfg.output_dir.join("final");
        rlft_model::export::save_hf_dir(
            &merged,
            &p.loaded.text,
            &p.loaded.generation,
            &out,
            &opts,
        )?;
        eprintln!(
            "wrote adapter {} and merged model {}",
            adapter.display(),
            out.display()
        );
        Ok(out)
    } else {
        let out = cfg.output_dir.join("final");
        rlft_model::export::save_hf_dir(&plain, &p.loaded.text, &p.loaded.generation, &out, &opts)?;
        eprintln!("wrote {}", out.display());
        Ok(out)
    }
}
