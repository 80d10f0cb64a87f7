//! From configs (and their datasets) to a [`RunShape`]: the lengths a run will see and the
//! settings memory depends on.

use rlft_data::load_dataset;
use rlft_model::load::{load_metadata, ModelMetadata};
use rlft_model::lora::resolve_targets;
use rlft_text::TextBundle;
use serde::Serialize;

use super::{
    CriticShape, EvalPrompts, GrpoShape, LoraShape, ModelDims, PlanError, RunShape, SftShape,
    Tuning, Workload,
};
use crate::config::grpo::GrpoConfig;
use crate::config::sft::SftConfig;
use crate::config::{LoraSettings, TrainingArgs};
use crate::data::sft::{build_example, fit_length, LengthReport, SftFormat};
pub use crate::grpo::setup::EVAL_BATCH;

/// Where the lengths of a plan come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthSource {
    /// The dataset's longest prompt / example (after the length policy).
    Dataset,
    /// The config's limits (`max_prompt_length`, `max_length`): the worst case.
    Config,
}

/// Prompt lengths of a GRPO run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GrpoLengths {
    /// Longest training prompt in tokens.
    pub prompt_tokens: usize,
    /// Eval prompts (all of them; a run generates 16 at a time); None without eval prompts.
    pub eval: Option<EvalPrompts>,
    /// Where they come from.
    pub source: LengthSource,
}

/// Example lengths of an SFT run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SftLengths {
    /// Longest example in tokens.
    pub example_tokens: usize,
    /// Eval examples exist (eval loss passes run).
    pub eval: bool,
    /// Where they come from.
    pub source: LengthSource,
}

fn longest_prompt(
    cfg: &GrpoConfig,
    text: &TextBundle,
    path: &std::path::Path,
    split: Option<&str>,
) -> Result<(usize, usize), PlanError> {
    let ds = load_dataset(path, split)?;
    let (items, _) =
        crate::grpo::setup::prompts(cfg, &ds, text).map_err(|e| PlanError::Data(e.to_string()))?;
    let longest = items.iter().map(|i| i.ids.len()).max().unwrap_or(0);
    Ok((items.len(), longest))
}

/// The prompt lengths of a GRPO config: with `read_data`, its datasets' longest prompts as the
/// chat template renders them (the trainer's own code); else `max_prompt_length`. Eval prompts
/// follow the trainer's rule (`eval_dataset`, else `eval_split`, else a `test` split).
pub fn grpo_lengths(
    cfg: &GrpoConfig,
    text: &TextBundle,
    read_data: bool,
) -> Result<GrpoLengths, PlanError> {
    let eval_source = crate::grpo::setup::eval_source(cfg);
    let cap = |n: usize| {
        if cfg.eval_max_prompts > 0 {
            n.min(cfg.eval_max_prompts)
        } else {
            n
        }
    };
    if !read_data {
        return Ok(GrpoLengths {
            prompt_tokens: cfg.max_prompt_length,
            eval: eval_source.map(|_| EvalPrompts {
                prompts: EVAL_BATCH,
                prompt_tokens: cfg.max_prompt_length,
            }),
            source: LengthSource::Config,
        });
    }
    let (_, prompt_tokens) = longest_prompt(
        cfg,
        text,
        &cfg.args.dataset,
        Some(cfg.args.dataset_split.as_str()),
    )?;
    if prompt_tokens == 0 {
        return Err(PlanError::Data(format!(
            "{} has no usable prompt (all dropped for max_prompt_length {}?)",
            cfg.args.dataset.display(),
            cfg.max_prompt_length
        )));
    }
    let eval = match eval_source {
        Some((path, split)) => {
            let (n, longest) = longest_prompt(cfg, text, &path, split.as_deref())?;
            (cap(n) > 0).then_some(EvalPrompts {
                prompts: cap(n),
                prompt_tokens: longest,
            })
        }
        None => None,
    };
    Ok(GrpoLengths {
        prompt_tokens,
        eval,
        source: LengthSource::Dataset,
    })
}

/// The example lengths of an SFT config: with `read_data`, the longest example after the
/// length policy (the trainer's own formatting); else `max_length`.
pub fn sft_lengths(
    cfg: &SftConfig,
    text: &TextBundle,
    read_data: bool,
) -> Result<SftLengths, PlanError> {
    let a = &cfg.args;
    let eval = a.eval_dataset.is_some() || a.eval_split.is_some() || cfg.eval_size > 0.0;
    if !read_data {
        return Ok(SftLengths {
            example_tokens: cfg.max_length,
            eval,
            source: LengthSource::Config,
        });
    }
    let mut longest = 0;
    let mut sources = vec![(a.dataset.clone(), Some(a.dataset_split.clone()))];
    match (&a.eval_dataset, &a.eval_split) {
        (Some(p), split) => sources.push((p.clone(), split.clone())),
        (None, Some(split)) => sources.push((a.dataset.clone(), Some(split.clone()))),
        (None, None) => {}
    }
    let template = text.compile_chat_template().ok();
    for (path, split) in sources {
        let ds = load_dataset(&path, split.as_deref())?;
        let format = SftFormat::detect(&ds.columns).map_err(|e| PlanError::Data(e.to_string()))?;
        let mut report = LengthReport::default();
        for (i, row) in ds.iter().enumerate() {
            let ex = build_example(
                text,
                template.as_ref(),
                &format,
                row,
                i,
                a.system_prompt.as_deref(),
            )
            .map_err(|e| PlanError::Data(e.to_string()))?;
            if let Some(ex) = fit_length(ex, cfg.max_length, cfg.truncation, &mut report) {
                longest = longest.max(ex.input_ids.len());
            }
        }
    }
    if longest < 2 {
        return Err(PlanError::Data(format!(
            "{} has no usable example (all dropped for max_length {}?)",
            a.dataset.display(),
            cfg.max_length
        )));
    }
    Ok(SftLengths {
        example_tokens: longest,
        eval,
        source: LengthSource::Dataset,
    })
}

fn tuning(use_peft: bool, lora: &LoraSettings) -> Result<Tuning, PlanError> {
    if !use_peft {
        return Ok(Tuning::Full);
    }
    let modules = resolve_targets(&lora.target_modules)?;
    Ok(Tuning::Lora(LoraShape {
        r: lora.r,
        modules,
        dropout: lora.lora_dropout > 0.0,
    }))
}

/// The settings of the shared [`TrainingArgs`] that memory depends on, around `workload`.
fn run_shape(args: &TrainingArgs, workload: Workload) -> Result<RunShape, PlanError> {
    Ok(RunShape {
        bf16: args.bf16,
        tuning: tuning(args.use_peft, &args.lora)?,
        micro_batch: args.per_device_train_batch_size,
        accumulation: args.gradient_accumulation_steps,
        gradient_checkpointing: args.gradient_checkpointing,
        workload,
    })
}

/// PPO's critic of an online config: none without `value_model`; the policy's shape and files
/// (`policy`) when `value_model` names the policy's `model`, as `grpo::setup::prepare` loads it
/// then; else `value_model`'s own config (a causal LM, or a `*ForSequenceClassification`
/// directory without an LM head).
pub fn critic_shape(
    cfg: &GrpoConfig,
    policy: &ModelMetadata,
) -> Result<Option<CriticShape>, PlanError> {
    let Some(v) = &cfg.estimator.value_model else {
        return Ok(None);
    };
    let shape = |m: &ModelMetadata, headless| CriticShape {
        dims: ModelDims::from_config(&m.config),
        headless,
        source_file_bytes: m.largest_file_bytes,
        decode_block_bytes: m.decode_block_bytes,
    };
    if v.as_os_str() == cfg.args.model.as_str() {
        return Ok(Some(shape(policy, false)));
    }
    if v.join(rlft_model::peft::ADAPTER_CONFIG).is_file() {
        return Err(PlanError::Invalid(format!(
            "value_model {} is a PEFT adapter; plan with its base model as value_model",
            v.display()
        )));
    }
    let headless = rlft_model::score::sequence_classification_arch(v)?.is_some();
    let meta = load_metadata(v)?;
    Ok(Some(shape(&meta, headless)))
}

/// The run shape of an online (GRPO, RLOO, PPO) config with its prompt lengths and, for PPO,
/// its critic ([`critic_shape`]).
pub fn run_shape_grpo(
    cfg: &GrpoConfig,
    lengths: &GrpoLengths,
    critic: Option<CriticShape>,
) -> Result<RunShape, PlanError> {
    let plan = cfg.plan(1);
    let passes = crate::grpo::setup::passes(cfg, &plan);
    let workload = Workload::Grpo(GrpoShape {
        num_generations: cfg.num_generations,
        rollout_prompts: plan.rollout_prompts,
        rollout_completions: plan.rollout_completions,
        prompt_tokens: lengths.prompt_tokens,
        completion_tokens: cfg.max_completion_length,
        reference: passes.reference,
        old_logprobs: passes.old,
        share_prompts: cfg.share_prompts,
        temperature_scaled: cfg.temperature != 1.0,
        eval: lengths.eval.map(|e| EvalPrompts {
            prompts: e.prompts.min(EVAL_BATCH),
            ..e
        }),
        critic,
    });
    run_shape(&cfg.args, workload)
}

/// The run shape of an SFT config with its example lengths.
pub fn run_shape_sft(cfg: &SftConfig, lengths: &SftLengths) -> Result<RunShape, PlanError> {
    let workload = Workload::Sft(SftShape {
        example_tokens: lengths.example_tokens,
        eval: lengths.eval,
    });
    run_shape(&cfg.args, workload)
}
