//! Everything before the first GRPO step: model, trainable parameters, reference model,
//! prompts, rewards, and the batch arithmetic.

use std::path::Path;

use candle_core::{DType, Device, Var};
use rlft_data::{list_splits, load_dataset};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::LoraConfig;
use rlft_model::{CausalLm, GenerationConfig};
use rlft_rewards::RewardSet;
use rlft_text::TextBundle;
use serde_json::Value;

use super::prompts::{build_prompts, PromptItem, PromptPolicy};
use super::{GrpoError, Result};
use crate::config::grpo::{BatchPlan, GrpoConfig};
use crate::train_setup::{self, OptimSettings};

/// A model, prompts and rewards ready to train.
pub struct Prepared {
    /// The policy being trained (trainable weights are `Var`s inside it).
    pub model: CausalLm,
    /// Frozen reference for the KL term with full fine-tuning and `beta > 0` (with LoRA the
    /// reference is the policy with adapters off, so this stays `None`).
    pub reference: Option<CausalLm>,
    /// Tokenizer and chat template.
    pub text: TextBundle,
    /// Generation defaults of the model (eos ids, pad id).
    pub generation: GenerationConfig,
    /// Trainable parameters (HF or PEFT names).
    pub vars: Vec<(String, Var)>,
    /// LoRA settings when training adapters.
    pub lora: Option<LoraConfig>,
    /// `adapter_config.json` for checkpoints when training adapters.
    pub adapter_config: Option<Value>,
    /// Training prompts.
    pub train: Vec<PromptItem>,
    /// Eval prompts (may be empty).
    pub eval: Vec<PromptItem>,
    /// Reward functions.
    pub rewards: RewardSet,
    /// Batch arithmetic.
    pub plan: BatchPlan,
    /// Padding id.
    pub pad_id: u32,
}

/// The optimiser settings of a GRPO config.
pub fn optim_settings(cfg: &GrpoConfig) -> OptimSettings {
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

/// The reward functions of a config.
pub fn reward_set(cfg: &GrpoConfig) -> Result<RewardSet> {
    Ok(RewardSet::new(&cfg.rewards, cfg.reward_weights.as_deref())?)
}

/// Loads the eval prompts the config names: `eval_dataset` (with `eval_split`), else
/// `dataset`'s `eval_split` (default "test" when the DatasetDict has one). Empty when none.
pub fn eval_prompts(cfg: &GrpoConfig, text: &TextBundle) -> Result<Vec<PromptItem>> {
    let ds = match (&cfg.eval_dataset, &cfg.eval_split) {
        (Some(p), split) => Some(load_dataset(p, split.as_deref())?),
        (None, Some(split)) => Some(load_dataset(&cfg.dataset, Some(split))?),
        (None, None) => {
            let splits = list_splits(&cfg.dataset).unwrap_or_default();
            if splits.iter().any(|s| s == "test") && cfg.dataset_split != "test" {
                Some(load_dataset(&cfg.dataset, Some("test"))?)
            } else {
                None
            }
        }
    };
    let Some(ds) = ds else { return Ok(Vec::new()) };
    let (mut items, report) = build_prompts(
        &ds,
        text,
        &cfg.prompt_column,
        cfg.system_prompt.as_deref(),
        cfg.max_prompt_length,
        policy(cfg),
    )?;
    if cfg.eval_max_prompts > 0 {
        items.truncate(cfg.eval_max_prompts);
    }
    eprintln!("eval prompts: {report}; using {}", items.len());
    Ok(items)
}

fn policy(cfg: &GrpoConfig) -> PromptPolicy {
    if cfg.prompt_truncation == "truncate" {
        PromptPolicy::Truncate
    } else {
        PromptPolicy::Drop
    }
}

/// Loads model, prompts and rewards; prints the batch arithmetic.
pub fn prepare(cfg: &GrpoConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let rewards = reward_set(cfg)?;
    let dtype = if cfg.bf16 { DType::BF16 } else { DType::F32 };
    let loaded = load_model(
        model_path,
        &LoadOptions {
            device: device.clone(),
            dtype,
        },
    )?;
    let base = loaded.model;
    let mut model = base.clone();
    let (vars, lora, adapter_config) =
        train_setup::trainable(&mut model, cfg.use_peft, &cfg.lora, cfg.seed, &cfg.model)?;
    // Full fine-tuning: the trainable copy owns new storage, so `base` stays the initial
    // weights; keep it only when the KL term needs it.
    let reference = (cfg.beta > 0.0 && lora.is_none()).then(|| {
        // The reference only scores: its GGUF blocks would be dead weight.
        let mut r = base;
        r.drop_quantized();
        r
    });
    let ds = load_dataset(&cfg.dataset, Some(&cfg.dataset_split))?;
    if ds.is_empty() {
        return Err(GrpoError::Data(format!(
            "{} has no rows; point `dataset` at a file with prompts",
            cfg.dataset.display()
        )));
    }
    let (train, report) = build_prompts(
        &ds,
        &loaded.text,
        &cfg.prompt_column,
        cfg.system_prompt.as_deref(),
        cfg.max_prompt_length,
        policy(cfg),
    )?;
    eprintln!("train prompts: {report}");
    // Every reward must find its columns: score one dummy completion of the first row.
    let mut rewards = rewards;
    check_reward_columns(cfg, &mut rewards, &train)?;
    let eval = eval_prompts(cfg, &loaded.text)?;
    let plan = cfg.plan(train.len());
    let trainable: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    eprintln!(
        "{plan}; {trainable} trainable parameters{}",
        if cfg.use_peft { " (LoRA)" } else { "" }
    );
    if cfg.beta > 0.0 {
        eprintln!(
            "reference model: {}",
            if lora.is_some() {
                "the base (adapters off, no second copy)"
            } else {
                "a frozen copy of the initial weights"
            }
        );
    }
    let pad_id = loaded
        .generation
        .pad_token_id
        .or_else(|| loaded.generation.eos_token_ids.first().copied())
        .unwrap_or(0);
    Ok(Prepared {
        model,
        reference,
        text: loaded.text,
        generation: loaded.generation,
        vars,
        lora,
        adapter_config,
        train,
        eval,
        rewards,
        plan,
        pad_id,
    })
}

/// Scores an empty completion of the first prompt so a missing reward column (e.g. `answer`)
/// or an external reward that does not start fails before any generation.
fn check_reward_columns(
    cfg: &GrpoConfig,
    rewards: &mut RewardSet,
    train: &[PromptItem],
) -> Result<()> {
    let Some(first) = train.first() else {
        return Ok(());
    };
    let probe = rlft_rewards::Sample {
        prompt: &first.text,
        completion: "",
        row: &first.row,
        completion_tokens: 0,
        truncated: false,
    };
    rewards.score(&[probe]).map_err(|e| {
        GrpoError::Data(format!(
            "the rewards cannot score row {} of {}: {e}",
            first.row_index,
            cfg.dataset.display()
        ))
    })?;
    Ok(())
}
