//! Everything before the first GRPO step: model, trainable parameters, reference model,
//! prompts, rewards, and the batch arithmetic.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlft_data::{list_splits, load_dataset, Dataset};
use rlft_model::load::LoadOptions;
use rlft_model::CausalLm;
use rlft_rewards::{build_reward, Reward, RewardError, RewardKind, RewardSet, RewardSpec};
use rlft_text::TextBundle;

use crate::config::online::{BatchPlan, EvalDecoding, OnlineConfig};
use crate::data::prompts::{build_prompts, PromptFormat, PromptItem, PromptReport};
use crate::error::{Result, TrainerError};
use crate::online::critic::Critic;
use crate::reward_model::reward::{ModelReward, PolicyModel, PromptSource};
use crate::rollout::eval::EvalSettings;
use crate::rollout::{RolloutSettings, Turns};
use crate::run::optim::mix;
use crate::run::{setup, Policy};

/// Prompts an eval pass generates at once (also what `rlft plan` sizes its KV caches for).
pub const EVAL_BATCH: usize = 16;

/// The sampling of one rollout of `policy` with seed `seed`.
pub fn rollout_settings(cfg: &OnlineConfig, policy: &Policy, seed: u64) -> RolloutSettings {
    sampling_settings(cfg, &policy.generation.eos_token_ids, policy.pad_id, seed)
}

/// A config's rollout sampling for a model with these end and padding ids.
pub fn sampling_settings(
    cfg: &OnlineConfig,
    eos_token_ids: &[u32],
    pad_token_id: u32,
    seed: u64,
) -> RolloutSettings {
    RolloutSettings {
        num_generations: cfg.num_generations,
        max_new_tokens: cfg.max_completion_length,
        sampling: cfg.rollout.sampling(),
        seed,
        eos_token_ids: eos_token_ids.to_vec(),
        pad_token_id,
    }
}

/// Eval settings of a config.
pub fn eval_settings(cfg: &OnlineConfig, eos_token_ids: &[u32], pad_token_id: u32) -> EvalSettings {
    EvalSettings {
        greedy: cfg.eval_decoding == EvalDecoding::Greedy,
        sampling: cfg.rollout.sampling(),
        max_new_tokens: cfg.eval_completion_length(),
        seed: mix(cfg.args.seed, u64::MAX),
        eos_token_ids: eos_token_ids.to_vec(),
        pad_token_id,
        batch_size: EVAL_BATCH,
    }
}

/// A policy, prompts and rewards ready to train.
pub struct Prepared {
    /// The policy being trained, its trainable parameters, tokenizer and template.
    pub policy: Policy,
    /// Frozen reference for the KL term with full fine-tuning and `beta > 0` (with LoRA the
    /// reference is the policy with adapters off, so this stays `None`).
    pub reference: Option<CausalLm>,
    /// Training prompts.
    pub train: Vec<PromptItem>,
    /// Eval prompts (may be empty).
    pub eval: Vec<PromptItem>,
    /// Reward functions.
    pub rewards: RewardSet,
    /// Batch arithmetic.
    pub plan: BatchPlan,
    /// PPO's value model (`advantage_estimator = "gae"`).
    pub critic: Option<Critic>,
    /// The tools completions may call (`[[tools]]`), with the template that shows them.
    pub turns: Option<Turns>,
}

/// The reward functions of a config. A `type = "model"` reward loads its reward model here
/// (once, on `device`, in the run's dtype; `model_path` is what the config's `model`
/// resolved to, for an adapter's `base`); the other kinds are built by
/// [`rlft_rewards::build_reward`].
pub fn reward_set(cfg: &OnlineConfig, model_path: &Path, device: &Device) -> Result<RewardSet> {
    let prompts = PromptSource {
        column: &cfg.rollout.prompt_column,
        system_prompt: cfg.args.system_prompt.as_deref(),
    };
    let policy = PolicyModel {
        name: &cfg.args.model,
        path: model_path,
    };
    let opts = LoadOptions {
        device: device.clone(),
        dtype: if cfg.args.bf16 {
            DType::BF16
        } else {
            DType::F32
        },
        ..Default::default()
    };
    let mut build = |spec: &RewardSpec| -> std::result::Result<Box<dyn Reward>, RewardError> {
        match &spec.kind {
            RewardKind::Model(m) => {
                let r = ModelReward::load(spec.display_name(), m, prompts, policy, &opts)?;
                eprintln!(
                    "reward `{}`: reward model {} ({} sequences per pass)",
                    spec.display_name(),
                    r.model().source.display(),
                    m.batch_size
                );
                Ok(Box::new(r))
            }
            _ => build_reward(spec),
        }
    };
    Ok(RewardSet::with_builder(
        &cfg.rollout.rewards,
        cfg.rollout.reward_weights.as_deref(),
        &mut build,
    )?)
}

/// The passes besides generation and the update that a config's rollouts take: the trainer
/// runs them and `rlft plan` sizes them from this one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passes {
    /// A reference log-prob pass (`beta > 0`).
    pub reference: bool,
    /// A frozen reference copy of the weights (`beta > 0` with full fine-tuning).
    pub reference_copy: bool,
    /// A sampling-policy log-prob pass: a rollout feeds more than one optimiser step, or the
    /// KL to the reference enters the reward (it is taken at the sampling policy).
    pub old: bool,
    /// The loss takes the sampling-policy log-probs (more than one step per rollout; else the
    /// ratio is 1 and the loss uses the policy's own detached log-probs, as TRL does).
    pub old_in_loss: bool,
}

/// Whether rollouts come from servers with the importance-sampling correction on.
fn is_corrected(cfg: &OnlineConfig) -> bool {
    cfg.servers.correction().is_some()
}

/// The passes of `cfg` with batch plan `plan`.
pub fn passes(cfg: &OnlineConfig, plan: &BatchPlan) -> Passes {
    Passes {
        reference: cfg.beta > 0.0,
        reference_copy: cfg.beta > 0.0 && !cfg.args.use_peft,
        // Server rollouts with the IS correction always take the trainer's own log-probs (TRL
        // grpo_trainer.py:2643-2646), and the loss uses them as the old policy.
        old: plan.steps_per_rollout > 1 || cfg.kl_in_reward() || is_corrected(cfg),
        old_in_loss: plan.steps_per_rollout > 1 || is_corrected(cfg),
    }
}

/// Where a config's eval prompts come from: `eval_dataset` (with `eval_split`), else
/// `dataset`'s `eval_split`, else its `test` split when the DatasetDict has one.
pub fn eval_source(cfg: &OnlineConfig) -> Option<(PathBuf, Option<String>)> {
    let a = &cfg.args;
    match (&a.eval_dataset, &a.eval_split) {
        (Some(p), split) => Some((p.clone(), split.clone())),
        (None, Some(split)) => Some((a.dataset.clone(), Some(split.clone()))),
        (None, None) => {
            let splits = list_splits(&a.dataset).unwrap_or_default();
            (splits.iter().any(|s| s == "test") && a.dataset_split != "test")
                .then(|| (a.dataset.clone(), Some("test".to_string())))
        }
    }
}

/// The prompts of `ds` as the config renders and limits them (`prompt_column`,
/// `system_prompt`, the tools' schemas, `max_prompt_length`, `prompt_truncation`).
pub fn prompts(
    cfg: &OnlineConfig,
    ds: &Dataset,
    text: &TextBundle,
) -> Result<(Vec<PromptItem>, PromptReport)> {
    let tools = rlft_tools::ToolBox::new(&cfg.rollout.tools)?.schemas();
    let format = PromptFormat {
        column: &cfg.rollout.prompt_column,
        system_prompt: cfg.args.system_prompt.as_deref(),
        tools: (!tools.is_empty()).then_some(&tools[..]),
    };
    build_prompts(
        ds,
        text,
        format,
        cfg.max_prompt_length,
        cfg.prompt_truncation,
    )
}

/// The tools and environment of a config for a model with tokenizer `text` (`None` with
/// neither).
pub fn turns(cfg: &OnlineConfig, text: &TextBundle) -> Result<Option<Turns>> {
    let r = &cfg.rollout;
    let env = r.environment.as_ref();
    let turns = Turns::new(&r.tools, r.max_tool_calling_iterations, env, text)?;
    if !r.tools.is_empty() {
        let names: Vec<&str> = r.tools.iter().map(|t| t.display_name()).collect();
        eprintln!("tools: {}", names.join(", "));
    }
    if let Some(env) = env {
        let at = env.url.clone().unwrap_or_else(|| env.command.join(" "));
        eprintln!("environment: {at}");
    }
    Ok(turns)
}

/// Loads the eval prompts the config names: `eval_dataset` (with `eval_split`), else
/// `dataset`'s `eval_split` (default "test" when the DatasetDict has one). Empty when none.
pub fn eval_prompts(cfg: &OnlineConfig, text: &TextBundle) -> Result<Vec<PromptItem>> {
    let Some((path, split)) = eval_source(cfg) else {
        return Ok(Vec::new());
    };
    let ds = load_dataset(&path, split.as_deref())?;
    let (mut items, report) = prompts(cfg, &ds, text)?;
    if cfg.rollout.eval_max_prompts > 0 {
        items.truncate(cfg.rollout.eval_max_prompts);
    }
    eprintln!("eval prompts: {report}; using {}", items.len());
    Ok(items)
}

/// Loads the policy, prompts and rewards; prints the batch arithmetic.
pub fn prepare(cfg: &OnlineConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let a = &cfg.args;
    let mut rewards = reward_set(cfg, model_path, device)?;
    let (policy, base) = setup::load_policy(a, model_path, device, true)?;
    // Full fine-tuning: the trainable copy owns new storage, so `base` stays the initial
    // weights; keep it only when the KL term needs it.
    let reference = passes(cfg, &cfg.plan(1)).reference_copy.then(|| {
        // The reference only scores: its GGUF blocks would be dead weight.
        let mut r = base;
        r.drop_quantized();
        r
    });
    let ds = load_dataset(&a.dataset, Some(&a.dataset_split))?;
    if ds.is_empty() {
        return Err(TrainerError::Data(format!(
            "{} has no rows; point `dataset` at a file with prompts",
            a.dataset.display()
        )));
    }
    let turns = turns(cfg, &policy.text)?;
    let (train, report) = prompts(cfg, &ds, &policy.text)?;
    eprintln!("train prompts: {report}");
    // Every reward must find its columns: score one dummy completion of the first row.
    check_reward_columns(cfg, &mut rewards, &train)?;
    let eval = eval_prompts(cfg, &policy.text)?;
    let plan = cfg.plan(train.len());
    eprintln!("{plan}; {}", setup::trainable_summary(&policy));
    for w in cfg.warnings() {
        eprintln!("warning: {w}");
    }
    if cfg.beta > 0.0 {
        eprintln!(
            "reference model: {}",
            if policy.lora.is_some() {
                "the base (adapters off, no second copy)"
            } else {
                "a frozen copy of the initial weights"
            }
        );
    }
    let critic = match &cfg.estimator.value_model {
        Some(v) => {
            // `value_model` naming the policy's `model` reads what it resolved to; another
            // built-in name is fetched.
            let path = if v.as_os_str() == a.model.as_str() {
                model_path.to_path_buf()
            } else {
                rlft_model::load::resolve(&v.to_string_lossy())?
            };
            let c = crate::online::critic::load_critic(a, &path, device)?;
            let n: usize = c.vars.iter().map(|(_, v)| v.elem_count()).sum();
            eprintln!("critic: {} ({n} trainable parameters)", path.display());
            Some(c)
        }
        None => None,
    };
    Ok(Prepared {
        policy,
        reference,
        train,
        eval,
        rewards,
        plan,
        critic,
        turns,
    })
}

/// Scores an empty completion of the first prompt so a missing reward column (e.g. `answer`)
/// or an external reward that does not start fails before any generation.
fn check_reward_columns(
    cfg: &OnlineConfig,
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
        completion_ids: &[],
        completion_tokens: 0,
        truncated: false,
        environment_reward: None,
    };
    rewards.score(&[probe]).map_err(|e| {
        TrainerError::Data(format!(
            "the rewards cannot score row {} of {}: {e}",
            first.row_index,
            cfg.args.dataset.display()
        ))
    })?;
    Ok(())
}
