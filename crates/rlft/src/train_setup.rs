//! Setup shared by the trainers: trainable parameters (full or LoRA), AdamW, the LR schedule,
//! restoring checkpointed weights, and the final export.

use std::path::{Path, PathBuf};

use candle_core::{Tensor, Var};
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::{CausalLm, GenerationConfig, ModelError};
use rlft_text::TextBundle;
use rlft_train::checkpoint::{Checkpoint, DataPosition, OptimizerState, TrainerState, Weights};
use rlft_train::{AdamW, AdamWConfig, LrSchedule, LrScheduler, ParamGroup, TrainError, Warmup};
use serde_json::Value;

use crate::config::sft::LoraSettings;

/// Optimiser and schedule settings (TRL names), as every trainer config has them.
#[derive(Debug, Clone)]
pub struct OptimSettings {
    /// Peak learning rate.
    pub learning_rate: f64,
    /// AdamW beta1.
    pub adam_beta1: f64,
    /// AdamW beta2.
    pub adam_beta2: f64,
    /// AdamW epsilon.
    pub adam_epsilon: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Schedule name.
    pub lr_scheduler_type: String,
    /// Final LR fraction for cosine_with_min_lr.
    pub min_lr_rate: f64,
    /// Warmup fraction.
    pub warmup_ratio: f64,
    /// Warmup steps (win over the ratio when > 0).
    pub warmup_steps: usize,
}

/// AdamW over the trainable parameters (no decay on vectors: biases, norms).
pub fn optimizer(s: &OptimSettings, vars: &[(String, Var)]) -> Result<AdamW, TrainError> {
    let groups = ParamGroup::split_decay(vars.iter().map(|(_, v)| v.clone()).collect());
    AdamW::new(
        groups,
        AdamWConfig {
            lr: s.learning_rate,
            beta1: s.adam_beta1,
            beta2: s.adam_beta2,
            eps: s.adam_epsilon,
            weight_decay: s.weight_decay,
        },
    )
}

/// The LR schedule of the settings.
pub fn scheduler(s: &OptimSettings) -> Result<LrScheduler, TrainError> {
    // `cosine_with_min_lr` takes its final fraction from `min_lr_rate` (TRL's
    // `lr_scheduler_kwargs`), so it is built here rather than from the name alone.
    let schedule = if s.lr_scheduler_type == "cosine_with_min_lr" {
        LrSchedule::CosineWithMinLr {
            min_lr_rate: s.min_lr_rate,
        }
    } else {
        LrSchedule::from_name(&s.lr_scheduler_type)?
    };
    let warmup = if s.warmup_steps > 0 {
        Warmup::Steps(s.warmup_steps)
    } else {
        Warmup::Ratio(s.warmup_ratio)
    };
    Ok(LrScheduler {
        base_lr: s.learning_rate,
        schedule,
        warmup,
    })
}

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

/// Copies checkpointed tensors into the trainable `Var`s (names must match).
pub fn restore_weights(vars: &[(String, Var)], saved: &[(String, Tensor)]) -> Result<(), String> {
    let map: std::collections::HashMap<&str, &Tensor> =
        saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for (name, var) in vars {
        let t = map.get(name.as_str()).ok_or_else(|| {
            format!(
                "checkpoint lacks trainable tensor `{name}`; it was written by another config \
                 (LoRA vs full, or other target_modules)"
            )
        })?;
        let t = t.to_dtype(var.dtype()).map_err(|e| e.to_string())?;
        var.set(&t).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes the final model under `output_dir`: with LoRA the adapter (PEFT, `adapter/`) plus a
/// merged HF directory (`final/`), else a full HF directory (`final/`). Returns the directory
/// of the usable model.
pub fn export_final(
    output_dir: &Path,
    model_name: &str,
    model: &CausalLm,
    lora: Option<&LoraConfig>,
    text: &TextBundle,
    generation: &GenerationConfig,
) -> Result<PathBuf, ModelError> {
    let opts = rlft_model::export::ExportOptions {
        overwrite: true,
        ..Default::default()
    };
    let plain = rlft_model::trainable::detached(model);
    let out = output_dir.join("final");
    if let Some(l) = lora {
        let adapter = output_dir.join("adapter");
        rlft_model::peft::save_adapter(&plain, l, &adapter, Some(model_name))?;
        let mut merged = plain;
        rlft_model::lora::merge_lora(&mut merged)?;
        rlft_model::export::save_hf_dir(&merged, text, generation, &out, &opts)?;
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

/// Where a trainer is in its data: a shuffled order per epoch (deterministic from the seed), so
/// a checkpoint's [`DataPosition`] resumes at exactly the next example.
#[derive(Debug, Clone)]
pub struct DataCursor {
    len: usize,
    seed: u64,
    pos: DataPosition,
    order: Vec<usize>,
}

/// Shuffled order of `epoch` over `n` items.
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    rlft_data::split::permutation(n, seed.wrapping_add(epoch.wrapping_mul(0x9E37_79B9)))
}

impl DataCursor {
    /// A cursor over `len` items at `pos` (the default position starts epoch 0).
    pub fn new(len: usize, seed: u64, pos: DataPosition) -> Self {
        DataCursor {
            len,
            seed,
            order: epoch_order(len, seed, pos.epoch),
            pos,
        }
    }

    /// The next `n` item indices, reshuffling at each epoch end.
    pub fn take(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if self.pos.index as usize >= self.len {
                self.pos.epoch += 1;
                self.pos.index = 0;
                self.order = epoch_order(self.len, self.seed, self.pos.epoch);
            }
            out.push(self.order[self.pos.index as usize]);
            self.pos.index += 1;
        }
        out
    }

    /// The position to checkpoint.
    pub fn position(&self) -> DataPosition {
        self.pos
    }

    /// Fractional epochs done (`epoch + index / len`), as `trainer_state.json` reports it.
    pub fn epoch(&self) -> f64 {
        self.pos.epoch as f64 + self.pos.index as f64 / self.len.max(1) as f64
    }
}

/// A checkpoint of a run: the trainable weights (and adapter config), the AdamW state, the
/// trainer state with the data position, and the trainer's RNG description.
pub fn checkpoint(
    vars: &[(String, Var)],
    adapter_config: Option<&Value>,
    opt: &AdamW,
    state: &TrainerState,
    data: &DataCursor,
    rng_state: Value,
) -> Result<Checkpoint, TrainError> {
    let mut state = state.clone();
    state.rlft.data_position = data.position();
    Ok(Checkpoint {
        weights: Weights {
            tensors: vars
                .iter()
                .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
                .collect(),
            adapter_config: adapter_config.cloned(),
        },
        optimizer: Some(OptimizerState {
            tensors: opt.state_tensors()?,
            state: serde_json::json!({"kernel": "adamw"}),
        }),
        trainer_state: state,
        rng_state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schedule_name_builds() {
        let mut s = OptimSettings {
            learning_rate: 1e-3,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_epsilon: 1e-8,
            weight_decay: 0.0,
            lr_scheduler_type: String::new(),
            min_lr_rate: 0.1,
            warmup_ratio: 0.0,
            warmup_steps: 0,
        };
        for name in ["constant", "linear", "cosine", "cosine_with_min_lr"] {
            s.lr_scheduler_type = name.into();
            let sched = scheduler(&s).unwrap();
            let end = sched.lr_at(100, 100);
            if name == "cosine_with_min_lr" {
                assert!((end - 1e-4).abs() < 1e-12, "{end}");
            }
        }
        s.lr_scheduler_type = "cosine_restarts".into();
        assert!(scheduler(&s).is_err());
    }
}
