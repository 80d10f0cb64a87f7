//! What every trainer's setup and end share: the trainable parameters (full or LoRA), a
//! checkpoint of the run and restoring one, and the final export.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::{CausalLm, ModelError};
use rlft_train::checkpoint::{Checkpoint, OptimizerState, TrainerState, Weights};
use rlft_train::{AdamW, TrainError};
use serde_json::Value;

use super::Policy;
use crate::config::{LoraSettings, TrainingArgs};
use crate::data::DataCursor;
use crate::error::{Result, TrainerError};

/// Trainable parameters of a run: LoRA adapters attached to `model` when `use_peft` (returning
/// their config and `adapter_config.json`), else every weight.
#[allow(clippy::type_complexity)]
pub fn trainable(
    model: &mut CausalLm,
    use_peft: bool,
    lora: &LoraSettings,
    seed: u64,
    model_name: &str,
) -> Result<(Vec<(String, Var)>, Option<LoraConfig>, Option<Value>), ModelError> {
    if use_peft {
        let l = LoraConfig {
            r: lora.r,
            lora_alpha: lora.lora_alpha,
            lora_dropout: lora.lora_dropout,
            target_modules: lora.target_modules.clone(),
            use_rslora: lora.use_rslora,
            init_lora_weights: true,
            seed,
        };
        let vars = attach_lora(model, &l)?;
        let modules = l.resolve_targets()?;
        let ac = rlft_model::peft::adapter_config_json(&l, &modules, Some(model_name));
        Ok((vars, Some(l), Some(ac)))
    } else {
        Ok((
            rlft_model::trainable::make_trainable(model, |_| true)?,
            None,
            None,
        ))
    }
}

/// Sets the LoRA adapters' dropout to 0 in training (TRL's `disable_dropout_in_model` on PEFT's
/// dropout modules); the adapter config written out keeps its `lora_dropout`.
pub fn disable_lora_dropout(model: &mut CausalLm) {
    for (_, lin) in model.linears_mut() {
        if let Some(l) = &mut lin.lora {
            l.dropout = 0.0;
        }
    }
}

/// Copies checkpointed tensors into the trainable `Var`s (names must match).
pub fn restore_weights(vars: &[(String, Var)], saved: &[(String, Tensor)]) -> Result<()> {
    let map: std::collections::HashMap<&str, &Tensor> =
        saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for (name, var) in vars {
        let t = map.get(name.as_str()).ok_or_else(|| {
            TrainerError::Other(format!(
                "checkpoint lacks trainable tensor `{name}`; it was written by another config \
                 (LoRA vs full, or other target_modules)"
            ))
        })?;
        var.set(&t.to_dtype(var.dtype())?)?;
    }
    Ok(())
}

/// Writes the final model under `output_dir`: with LoRA the adapter (PEFT, `adapter/`) plus a
/// merged HF directory (`final/`), else a full HF directory (`final/`). Returns the directory
/// of the usable model.
pub fn export_final(
    output_dir: &Path,
    model_name: &str,
    policy: &Policy,
) -> Result<PathBuf, ModelError> {
    let opts = rlft_model::export::ExportOptions {
        overwrite: true,
        ..Default::default()
    };
    let (text, generation) = (&policy.text, &policy.generation);
    let plain = rlft_model::trainable::detached(&policy.model);
    let out = output_dir.join("final");
    if let Some(l) = &policy.lora {
        let adapter = output_dir.join("adapter");
        rlft_model::peft::save_adapter(&plain, l, &adapter, Some(model_name))?;
        // Merged one tensor at a time as it is written: no merged copy of the model.
        let merged = rlft_model::export::ExportOptions {
            merge_adapters: true,
            ..opts
        };
        rlft_model::export::save_hf_dir(&plain, text, generation, &out, &merged)?;
        eprintln!(
            "wrote adapter {} and merged model {}",
            adapter.display(),
            out.display()
        );
    } else {
        rlft_model::export::save_hf_dir(&plain, text, generation, &out, &opts)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(out)
}

/// A checkpoint of a run: the trainable weights `vars` (and the policy's adapter config), the AdamW state, the
/// trainer state with the data position, and how the run derives its random streams.
pub fn checkpoint(
    vars: &[(String, Var)],
    adapter_config: Option<Value>,
    opt: &AdamW,
    state: &TrainerState,
    data: &DataCursor,
    seed: u64,
) -> Result<Checkpoint, TrainError> {
    let mut state = state.clone();
    state.rlft.data_position = data.position();
    Ok(Checkpoint {
        weights: Weights {
            tensors: vars
                .iter()
                .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
                .collect(),
            adapter_config,
        },
        optimizer: Some(OptimizerState {
            tensors: opt.state_tensors()?,
            state: serde_json::json!({"kernel": "adamw"}),
        }),
        trainer_state: state,
        rng_state: serde_json::json!({"seed": seed, "scheme": "mix(seed, global_step)"}),
    })
}

/// Loads the model `args` names (resolved to `model_path`) on `device` in the run's dtype and
/// makes its trainable parameters (LoRA adapters or every weight): the policy, and the loaded
/// model as it was (the initial weights a KL reference may keep). `decodes`: the trainer
/// generates, so the GGUF blocks the decode kernels read stay beside the weights.
pub fn load_policy(
    args: &TrainingArgs,
    model_path: &Path,
    device: &Device,
    decodes: bool,
) -> Result<(Policy, CausalLm)> {
    let dtype = if args.bf16 { DType::BF16 } else { DType::F32 };
    let mut loaded = load_model(
        model_path,
        &LoadOptions {
            device: device.clone(),
            dtype,
            // Under LoRA the base never changes: it stays in the file's blocks.
            keep_quantized: args.use_peft,
        },
    )?;
    if !decodes {
        loaded.model.drop_quantized();
    }
    let base = loaded.model;
    let mut model = base.clone();
    let (vars, lora, adapter_config) = trainable(
        &mut model,
        args.use_peft,
        &args.lora,
        args.seed,
        &args.model,
    )?;
    let pad_id = rlft_model::score::pad_id_of(&loaded.generation);
    let policy = Policy {
        model,
        vars,
        lora,
        adapter_config,
        text: loaded.text,
        generation: loaded.generation,
        pad_id,
    };
    Ok((policy, base))
}

/// Trainable parameters of `policy`, for the start-up line.
pub fn trainable_summary(policy: &Policy) -> String {
    let n: usize = policy.vars.iter().map(|(_, v)| v.elem_count()).sum();
    format!(
        "{n} trainable parameters{}",
        if policy.lora.is_some() { " (LoRA)" } else { "" }
    )
}
