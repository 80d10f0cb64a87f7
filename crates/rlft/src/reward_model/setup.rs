//! Everything before the first reward-model step: the backbone with its `score` head (trainable
//! beside the LoRA adapters, or with every weight), the preference pairs, the step arithmetic.

use std::path::Path;

use candle_core::{DType, Device};
use rlft_data::Dataset;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::score::{
    from_causal_lm, load_score_model, score_adapter_name, sequence_classification_arch, HeadInit,
    ScoreHead, ScoreModel, SCORE_WEIGHT,
};
use rlft_text::TextBundle;

use crate::config::reward::{RewardConfig, ScoreInit};
use crate::data::preferences::{reward_pairs, RewardPair};
use crate::error::{Result, TrainerError};
use crate::run::{setup, Policy};

/// A reward model and pairs ready to train.
pub struct Prepared {
    /// The backbone being trained (LoRA adapters or every weight, and the head, in `vars`).
    pub policy: Policy,
    /// The score head (its weight is the `Var` named `score.weight` in `policy.vars`).
    pub head: ScoreHead,
    /// Training pairs.
    pub train: Vec<RewardPair>,
    /// Held-out pairs.
    pub eval: Vec<RewardPair>,
    /// Whether the data has a `margin` column.
    pub has_margin: bool,
    /// Optimiser steps of the whole run.
    pub total_steps: usize,
}

/// The model `cfg` names as a reward model: a reward-model directory keeps its head; a causal
/// LM gets a new one (`score_init`), its LM head freed.
fn load(cfg: &RewardConfig, model_path: &Path, device: &Device) -> Result<ScoreModel> {
    let a = &cfg.args;
    let opts = LoadOptions {
        device: device.clone(),
        dtype: if a.bf16 { DType::BF16 } else { DType::F32 },
        ..Default::default()
    };
    if model_path.is_dir() && sequence_classification_arch(model_path)?.is_some() {
        eprintln!("continuing the reward model {}", model_path.display());
        return Ok(load_score_model(model_path, None, &opts)?);
    }
    let mut loaded = load_model(model_path, &opts)?;
    loaded.model.drop_quantized();
    loaded.model.drop_lm_head();
    let init = match cfg.score_init {
        ScoreInit::Normal => HeadInit::Normal {
            std: cfg.initializer_range,
            seed: a.seed,
        },
        ScoreInit::Zeros => HeadInit::Zeros,
    };
    Ok(from_causal_lm(loaded, init)?)
}

/// The trainable policy of a reward model: LoRA adapters (dropout off when `disable_dropout`)
/// or every weight, plus the head, named as PEFT names it beside adapters
/// (`base_model.model.score.weight`) or as transformers does (`score.weight`).
fn policy(cfg: &RewardConfig, sm: ScoreModel) -> Result<(Policy, ScoreHead)> {
    let a = &cfg.args;
    let ScoreModel {
        mut model,
        mut head,
        text,
        generation,
        pad_id,
        ..
    } = sm;
    let (mut vars, lora, mut adapter_config) = if a.use_peft {
        setup::trainable(&mut model, true, &a.lora, a.seed, &a.model)?
    } else {
        let vars = rlft_model::trainable::make_trainable(&mut model, |_| true)?;
        (vars, None, None)
    };
    if a.use_peft && cfg.disable_dropout {
        setup::disable_lora_dropout(&mut model);
    }
    if let Some(ac) = &mut adapter_config {
        ac["task_type"] = "SEQ_CLS".into();
        ac["modules_to_save"] = serde_json::json!(["score"]);
    }
    let name = if a.use_peft {
        score_adapter_name()
    } else {
        SCORE_WEIGHT.to_string()
    };
    vars.push((name, head.make_trainable()?));
    let policy = Policy {
        model,
        vars,
        lora,
        adapter_config,
        text,
        generation,
        pad_id,
    };
    Ok((policy, head))
}

fn pairs(
    cfg: &RewardConfig,
    text: &TextBundle,
    ds: &Dataset,
    what: &str,
) -> Result<(Vec<RewardPair>, bool)> {
    if ds.is_empty() {
        return Err(TrainerError::Data(format!(
            "the {what} dataset is empty; point `dataset` at preference rows (prompt, chosen, \
             rejected)"
        )));
    }
    let system = cfg.args.system_prompt.as_deref();
    let (pairs, has_margin, rep) = reward_pairs(ds, text, system, cfg.length_limit())?;
    eprintln!(
        "{what}: {} pairs ({} dropped for max_length {}; longest sequence {} tokens){}",
        rep.kept,
        rep.too_long,
        cfg.max_length,
        rep.longest,
        if has_margin { "; margin column" } else { "" }
    );
    if pairs.is_empty() {
        return Err(TrainerError::Data(format!(
            "no {what} pair is left after the length filter; raise max_length (longest: {})",
            rep.longest
        )));
    }
    Ok((pairs, has_margin))
}

/// Loads the model and the pairs and derives the step arithmetic (printed).
pub fn prepare(cfg: &RewardConfig, model_path: &Path, device: &Device) -> Result<Prepared> {
    let a = &cfg.args;
    let (policy, head) = policy(cfg, load(cfg, model_path, device)?)?;
    let (train_ds, eval_ds) = crate::data::train_eval_datasets(a, cfg.eval_size)?;
    let (train, has_margin) = pairs(cfg, &policy.text, &train_ds, "train")?;
    let eval = match &eval_ds {
        Some(d) => {
            let (eval, eval_margin) = pairs(cfg, &policy.text, d, "eval")?;
            if eval_margin != has_margin {
                return Err(TrainerError::Data(
                    "the train and eval data disagree on the `margin` column; give both or \
                     neither one"
                        .into(),
                ));
            }
            eval
        }
        None => Vec::new(),
    };
    let per_step = a.train_batch();
    let steps_per_epoch = train.len().div_ceil(per_step);
    let total_steps = crate::run::offline::total_steps(a, train.len());
    eprintln!(
        "batch: {} pairs/micro-batch ({} sequences) x {} accumulation = {per_step} pairs per \
         step; {steps_per_epoch} steps/epoch; {total_steps} steps; {} (score head included)",
        a.per_device_train_batch_size,
        2 * a.per_device_train_batch_size,
        a.gradient_accumulation_steps,
        setup::trainable_summary(&policy)
    );
    Ok(Prepared {
        policy,
        head,
        train,
        eval,
        has_margin,
        total_steps,
    })
}
