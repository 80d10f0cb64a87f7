//! From configs (and their datasets) to what the memory plan (`rlft_plan`) reads besides the
//! trainer's declaration (`crate::plan_shapes`): the model's dimensions and files, the lengths
//! a run will see (the dataset's longest prompt, example or pair, read by the trainers' own
//! code), and the value and reward models' shapes.

use std::path::Path;

use rlft_data::load_dataset;
use rlft_model::load::{load_metadata, ModelMetadata};
use rlft_model::ModelConfig;
use rlft_plan::{Model, ModelDims};
use rlft_text::TextBundle;
use serde::Serialize;

use crate::config::dpo::DpoConfig;
use crate::config::online::OnlineConfig;
use crate::config::reward::RewardConfig;
use crate::config::sft::SftConfig;
use crate::config::TrainingArgs;
use crate::data::sft::{build_example, fit_length, LengthReport, SftFormat};
pub use crate::online::setup::EVAL_BATCH;

/// Why a plan's inputs cannot be read; each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum PlanInputError {
    /// Config problems.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Model metadata problems.
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
    /// Dataset files.
    #[error(transparent)]
    Dataset(#[from] rlft_data::DataError),
    /// Dataset contents (prompts, columns, examples).
    #[error("{0}")]
    Data(String),
    /// A run the plan cannot describe.
    #[error("cannot plan this run: {0}")]
    Invalid(String),
}

impl PlanInputError {
    /// A dataset-contents error from any error's message.
    fn data(e: impl std::fmt::Display) -> Self {
        PlanInputError::Data(e.to_string())
    }

    /// `a`'s dataset left nothing to plan from: no `what`.
    fn nothing_left(a: &TrainingArgs, what: &str) -> Self {
        PlanInputError::Data(format!("{} has no {what}", a.dataset.display()))
    }
}

/// `max_length` as the worst case of a run without a dataset read; 0 (no limit) gives none.
fn worst_case(max_length: usize) -> Result<usize, PlanInputError> {
    if max_length == 0 {
        return Err(PlanInputError::Invalid(
            "max_length = 0 (no limit) gives no worst case; plan from the dataset (drop \
             --worst-case) or set max_length"
                .into(),
        ));
    }
    Ok(max_length)
}

/// Whether a config has eval data: `eval_dataset`, `eval_split`, or an `eval_size` split.
fn has_eval(a: &TrainingArgs, eval_size: f64) -> bool {
    a.eval_dataset.is_some() || a.eval_split.is_some() || eval_size > 0.0
}

/// The dimensions of `c` that memory depends on.
pub fn model_dims(c: &ModelConfig) -> ModelDims {
    ModelDims {
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        intermediate: c.intermediate_size,
        layers: c.num_hidden_layers,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        tied_embeddings: c.tie_word_embeddings,
        qkv_bias: c.attention_bias,
        o_bias: c.attention_bias && c.family != rlft_model::Family::Qwen2,
        mlp_bias: c.mlp_bias,
        qk_norm: c.family.has_qk_norm(),
    }
}

/// The model of `meta` as the plan sees it: its shape and files; `score_head` for a score
/// model, `headless` without an LM head.
pub fn model(meta: &ModelMetadata, score_head: bool, headless: bool) -> Model {
    Model {
        dims: model_dims(&meta.config),
        score_head,
        headless,
        source_file_bytes: meta.largest_file_bytes,
        decode_block_bytes: meta.decode_block_bytes,
        frozen_blocks: meta.frozen_blocks,
    }
}

/// The lengths of a run, by trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Lengths {
    /// The online trainers.
    Grpo(GrpoLengths),
    /// SFT.
    Sft(SftLengths),
    /// DPO.
    Dpo(DpoLengths),
    /// The reward model.
    RewardModel(RewardModelLengths),
}

/// Where the lengths of a plan come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthSource {
    /// The dataset's longest prompt / example (after the length policy).
    Dataset,
    /// The config's limits (`max_prompt_length`, `max_length`): the worst case.
    Config,
}

/// Eval prompts of an online run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EvalPrompts {
    /// Prompts (a run generates for up to [`EVAL_BATCH`] at once).
    pub prompts: usize,
    /// Tokens of the longest.
    pub prompt_tokens: usize,
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
    cfg: &OnlineConfig,
    text: &TextBundle,
    path: &std::path::Path,
    split: Option<&str>,
) -> Result<(usize, usize), PlanInputError> {
    let ds = load_dataset(path, split)?;
    let (items, _) = crate::online::setup::prompts(cfg, &ds, text).map_err(PlanInputError::data)?;
    let longest = items.iter().map(|i| i.ids.len()).max().unwrap_or(0);
    Ok((items.len(), longest))
}

/// The prompt lengths of a GRPO config: with `read_data`, its datasets' longest prompts as the
/// chat template renders them (the trainer's own code); else `max_prompt_length`. Eval prompts
/// follow the trainer's rule (`eval_dataset`, else `eval_split`, else a `test` split).
pub fn grpo_lengths(
    cfg: &OnlineConfig,
    text: &TextBundle,
    read_data: bool,
) -> Result<GrpoLengths, PlanInputError> {
    let eval_source = crate::online::setup::eval_source(cfg);
    let cap = |n: usize| {
        if cfg.rollout.eval_max_prompts > 0 {
            n.min(cfg.rollout.eval_max_prompts)
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
        return Err(PlanInputError::Data(format!(
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
) -> Result<SftLengths, PlanInputError> {
    let a = &cfg.args;
    let eval = has_eval(a, cfg.eval_size);
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
        let format = SftFormat::detect(&ds.columns).map_err(PlanInputError::data)?;
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
            .map_err(PlanInputError::data)?;
            if let Some(ex) = fit_length(ex, cfg.max_length, cfg.truncation, &mut report) {
                longest = longest.max(ex.input_ids.len());
            }
        }
    }
    if longest < 2 {
        let what = format!(
            "usable example (all dropped for max_length {}?)",
            cfg.max_length
        );
        return Err(PlanInputError::nothing_left(a, &what));
    }
    Ok(SftLengths {
        example_tokens: longest,
        eval,
        source: LengthSource::Dataset,
    })
}

/// Pair lengths of a DPO run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DpoLengths {
    /// Longest prompt in tokens (after `max_prompt_length`).
    pub prompt_tokens: usize,
    /// Longest chosen or rejected completion in tokens (after `max_length`).
    pub completion_tokens: usize,
    /// 2 when `keep_end` truncation left some pair's sides different prompts, else 1.
    pub prompts_per_pair: usize,
    /// Eval pairs exist.
    pub eval: bool,
    /// Where they come from.
    pub source: LengthSource,
}

/// The pair lengths of a DPO config: with `read_data`, the longest prompt and the longest
/// completion over its train and eval pairs after the length limits (the trainer's own
/// `data::dpo::dpo_pairs`); else the longest the limits allow: a prompt of `max_prompt_length`
/// (else `max_length - 1`) and a completion of `max_length - 1` (a micro-batch pads each part
/// to its longest).
pub fn dpo_lengths(
    cfg: &DpoConfig,
    text: &TextBundle,
    read_data: bool,
) -> Result<DpoLengths, PlanInputError> {
    let a = &cfg.args;
    let eval = has_eval(a, cfg.eval_size);
    if !read_data {
        let limit = worst_case(cfg.max_length)? - 1;
        let prompt = if cfg.max_prompt_length > 0 {
            cfg.max_prompt_length.min(limit)
        } else {
            limit
        };
        return Ok(DpoLengths {
            prompt_tokens: prompt,
            completion_tokens: limit,
            prompts_per_pair: match cfg.truncation_mode {
                crate::config::dpo::TruncationMode::KeepEnd => 2,
                crate::config::dpo::TruncationMode::KeepStart => 1,
            },
            eval,
            source: LengthSource::Config,
        });
    }
    let (train, eval_ds) =
        crate::data::train_eval_datasets(a, cfg.eval_size).map_err(PlanInputError::data)?;
    let lim = crate::data::dpo::DpoLimits {
        max_length: cfg.max_length,
        max_prompt_length: cfg.max_prompt_length,
        truncation_mode: cfg.truncation_mode,
    };
    let mut l = DpoLengths {
        prompt_tokens: 0,
        completion_tokens: 0,
        prompts_per_pair: 1,
        eval: eval_ds.as_ref().is_some_and(|d| !d.is_empty()),
        source: LengthSource::Dataset,
    };
    for ds in std::iter::once(&train).chain(eval_ds.as_ref()) {
        let (pairs, _) = crate::data::dpo::dpo_pairs(ds, text, a.system_prompt.as_deref(), &lim)
            .map_err(PlanInputError::data)?;
        for p in &pairs {
            l.prompt_tokens = l.prompt_tokens.max(p.prompt_ids.len());
            l.prompt_tokens = l.prompt_tokens.max(p.rejected_prompt().len());
            l.completion_tokens = l
                .completion_tokens
                .max(p.chosen_ids.len())
                .max(p.rejected_ids.len());
            if p.rejected_prompt_ids.is_some() {
                l.prompts_per_pair = 2;
            }
        }
    }
    if l.completion_tokens == 0 {
        return Err(PlanInputError::nothing_left(a, "preference pair"));
    }
    Ok(l)
}

/// Sequence lengths of a reward-model run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RewardModelLengths {
    /// Longest chosen or rejected sequence (prompt included) kept by `max_length`.
    pub sequence_tokens: usize,
    /// Eval pairs exist.
    pub eval: bool,
    /// Where they come from.
    pub source: LengthSource,
}

/// The sequence lengths of a reward-model config: with `read_data`, the longest side of the
/// pairs its train and eval data keep (`data::preferences::reward_pairs`, which drops pairs
/// over `max_length`); else `max_length`.
pub fn reward_model_lengths(
    cfg: &RewardConfig,
    text: &TextBundle,
    read_data: bool,
) -> Result<RewardModelLengths, PlanInputError> {
    let a = &cfg.args;
    if !read_data {
        return Ok(RewardModelLengths {
            sequence_tokens: worst_case(cfg.max_length)?,
            eval: has_eval(a, cfg.eval_size),
            source: LengthSource::Config,
        });
    }
    let (train, eval_ds) =
        crate::data::train_eval_datasets(a, cfg.eval_size).map_err(PlanInputError::data)?;
    let mut longest = 0;
    for ds in std::iter::once(&train).chain(eval_ds.as_ref()) {
        let system = a.system_prompt.as_deref();
        let (pairs, _, _) =
            crate::data::preferences::reward_pairs(ds, text, system, cfg.length_limit())
                .map_err(PlanInputError::data)?;
        for p in &pairs {
            longest = longest.max(p.chosen_ids.len()).max(p.rejected_ids.len());
        }
    }
    if longest == 0 {
        let what = format!("preference pair within max_length {}", cfg.max_length);
        return Err(PlanInputError::nothing_left(a, &what));
    }
    Ok(RewardModelLengths {
        sequence_tokens: longest,
        eval: eval_ds.as_ref().is_some_and(|d| !d.is_empty()),
        source: LengthSource::Dataset,
    })
}

/// A `[[rewards]] type = "model"` reward of an online config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelReward {
    /// Its name.
    pub name: String,
    /// The reward model (a score head).
    pub model: Model,
    /// Sequences per forward pass.
    pub batch_size: usize,
    /// Its `max_length` (0: none).
    pub max_length: usize,
}

/// The `type = "model"` rewards of an online config, read as `reward_model::reward` loads
/// them: a `*ForSequenceClassification` directory's own config (no LM head), or a SEQ_CLS
/// adapter's base (`base`, the policy's `model` string meaning `policy`, else the adapter's
/// `base_model_name_or_path`) with its LM head.
pub fn model_rewards(
    cfg: &OnlineConfig,
    policy: &Path,
) -> Result<Vec<ModelReward>, PlanInputError> {
    let mut out = Vec::new();
    for spec in &cfg.rollout.rewards {
        let rlft_rewards::RewardKind::Model(m) = &spec.kind else {
            continue;
        };
        let path = Path::new(&m.path);
        let adapter = path.join(rlft_model::peft::ADAPTER_CONFIG);
        let (meta, headless) = if adapter.is_file() {
            let base = match &m.base {
                Some(b) if b == &cfg.args.model => policy.to_path_buf(),
                Some(b) => rlft_model::load::resolve(b)?,
                None => rlft_model::load::adapter_base_name(path)?
                    .map(|name| rlft_model::load::resolve(&name))
                    .transpose()?
                    .ok_or_else(|| {
                        PlanInputError::Invalid(format!(
                            "{}: names no base model (base_model_name_or_path); give the \
                             reward's `base`",
                            adapter.display()
                        ))
                    })?,
            };
            (load_metadata(&base)?, false)
        } else {
            (load_metadata(path)?, true)
        };
        out.push(ModelReward {
            name: spec.display_name().to_string(),
            model: model(&meta, true, headless),
            batch_size: m.batch_size,
            max_length: m.max_length,
        });
    }
    Ok(out)
}

/// PPO's critic of an online config: none without `value_model`; the policy's shape and files
/// (`policy`) when `value_model` names the policy's `model`, as `grpo::setup::prepare` loads it
/// then; else `value_model`'s own config (a causal LM, or a `*ForSequenceClassification`
/// directory without an LM head).
pub fn critic_model(
    cfg: &OnlineConfig,
    policy: &ModelMetadata,
) -> Result<Option<Model>, PlanInputError> {
    let Some(v) = &cfg.estimator.value_model else {
        return Ok(None);
    };
    if v.as_os_str() == cfg.args.model.as_str() {
        return Ok(Some(model(policy, true, false)));
    }
    if v.join(rlft_model::peft::ADAPTER_CONFIG).is_file() {
        return Err(PlanInputError::Invalid(format!(
            "value_model {} is a PEFT adapter; plan with its base model as value_model",
            v.display()
        )));
    }
    let v = &rlft_model::load::resolve(&v.to_string_lossy())?;
    let headless = rlft_model::score::sequence_classification_arch(v)?.is_some();
    Ok(Some(model(&load_metadata(v)?, true, headless)))
}
