//! PPO's critic: a value model (the decoder with a scalar `score` head, transformers'
//! `*ForSequenceClassification` with one label, as TRL's `PPOTrainer` made its value model)
//! that predicts, at every completion position, the return of the rest of the completion.
//!
//! It starts from `value_model`: a causal LM gets a fresh head (`normal(0, 0.02)` seeded, as
//! transformers initialises one), a trained reward model keeps its head. It trains beside the
//! policy in the same AdamW (TRL's `PolicyAndValueWrapper`: one optimiser over both, the loss
//! `pg_loss + vf_coef * vf_loss`), full or with its own LoRA adapters as the policy is, is
//! checkpointed and resumed with the policy (tensor names prefixed `critic.`), and is exported
//! at the end as `critic/` (an HF directory `AutoModelForSequenceClassification` loads; with
//! LoRA also `critic_adapter/`, a PEFT `SEQ_CLS` adapter).
//!
//! Values are read where the policy's log-probs are: the hidden state before each completion
//! token (TRL: `full_value[:, context_length - 1 : -1]`).

use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use rlft_model::export::ExportOptions;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::LoraConfig;
use rlft_model::score::{
    from_causal_lm, load_score_model, save_score_adapter, save_score_model,
    sequence_classification_arch, HeadInit, ScoreModel, DEFAULT_INITIALIZER_RANGE,
};

use crate::config::TrainingArgs;
use crate::data::prompts::PromptItem;
use crate::error::Result;
use crate::rollout::{token_batch, Sample};
use crate::run::setup::trainable;

/// Prefix of the critic's tensors in checkpoints.
pub const CRITIC_PREFIX: &str = "critic.";

/// The value model being trained.
pub struct Critic {
    /// Backbone, head, tokenizer (its trainable weights are `Var`s inside).
    pub model: ScoreModel,
    /// Trainable parameters, names prefixed [`CRITIC_PREFIX`].
    pub vars: Vec<(String, Var)>,
    /// LoRA settings when the critic trains adapters.
    pub lora: Option<LoraConfig>,
}

/// Loads the critic from `path` (a causal LM or a reward model) in the run's dtype and makes
/// its parameters trainable as the policy's are (`use_peft`, `lora`); the head always trains.
pub fn load_critic(args: &TrainingArgs, path: &Path, device: &Device) -> Result<Critic> {
    let dtype = if args.bf16 { DType::BF16 } else { DType::F32 };
    let opts = LoadOptions {
        device: device.clone(),
        dtype,
        ..Default::default()
    };
    let mut model = if sequence_classification_arch(path)?.is_some()
        || path.join(rlft_model::peft::ADAPTER_CONFIG).is_file()
    {
        load_score_model(path, None, &opts)?
    } else {
        let init = HeadInit::Normal {
            std: DEFAULT_INITIALIZER_RANGE,
            seed: args.seed ^ 0xC817,
        };
        from_causal_lm(load_model(path, &opts)?, init)?
    };
    model.model.drop_quantized();
    let name = path.display().to_string();
    let (vars, lora, _) = trainable(
        &mut model.model,
        args.use_peft,
        &args.lora,
        args.seed ^ 0xC817,
        &name,
    )?;
    let mut vars: Vec<(String, Var)> = vars
        .into_iter()
        .map(|(n, v)| (format!("{CRITIC_PREFIX}{n}"), v))
        .collect();
    let head = model.head.make_trainable()?;
    vars.push((format!("{CRITIC_PREFIX}score.weight"), head));
    Ok(Critic { model, vars, lora })
}

impl Critic {
    /// Values `[n, Tc]` (f32) at the completion positions of `samples`: row `i`, column `j`
    /// predicts the return from completion token `j` on. Zero-padded past each completion (the
    /// loss masks them). `grad`: with a graph through the critic's trainable weights.
    pub fn values(&self, items: &[PromptItem], samples: &[&Sample], grad: bool) -> Result<Tensor> {
        let m = &self.model;
        let prompts: Vec<&[u32]> = samples
            .iter()
            .map(|s| &s.prompt_item(items).ids[..])
            .collect();
        let comps: Vec<&[u32]> = samples.iter().map(|s| &s.completion_ids[..]).collect();
        let tb = token_batch(&prompts, &comps, m.pad_id, m.model.device())?;
        let tc = tb.mask.dim(1)?;
        let (model, head) = if grad {
            (m.model.clone(), m.head.clone())
        } else {
            (rlft_model::trainable::detached(&m.model), m.head.detached())
        };
        let hidden = model.forward(&tb.batch, None, grad)?;
        let len = hidden.dim(1)?;
        let at = hidden.narrow(1, len - tc, tc)?;
        let v = head.scores(&at)?.to_dtype(DType::F32)?;
        Ok(v.mul(&tb.mask)?)
    }

    /// Values of every sample without a graph, `batch` rows at a time: one row per sample of
    /// its completion length.
    pub fn values_no_grad(
        &self,
        items: &[PromptItem],
        samples: &[Sample],
        batch: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(samples.len());
        for chunk in samples.chunks(batch.max(1)) {
            let refs: Vec<&Sample> = chunk.iter().collect();
            let v: Vec<Vec<f32>> = self.values(items, &refs, false)?.to_vec2()?;
            for (row, s) in v.into_iter().zip(chunk) {
                out.push(row[..s.completion_ids.len()].to_vec());
            }
        }
        Ok(out)
    }

    /// Writes `out_dir/critic` (merged HF directory) and, with LoRA, `out_dir/critic_adapter`.
    pub fn export(&self, out_dir: &Path) -> Result<()> {
        let m = &self.model;
        let plain = rlft_model::trainable::detached(&m.model);
        let head = m.head.detached();
        let opts = ExportOptions {
            overwrite: true,
            ..Default::default()
        };
        let mut merged = plain.clone();
        if let Some(l) = &self.lora {
            let dir = out_dir.join("critic_adapter");
            let base = m.source.display().to_string();
            save_score_adapter(&plain, &head, l, &dir, Some(&base))?;
            rlft_model::lora::merge_lora(&mut merged)?;
        }
        let dir = out_dir.join("critic");
        save_score_model(
            &merged,
            &head,
            &m.text,
            &m.generation,
            m.pad_id,
            &dir,
            &opts,
        )?;
        eprintln!("wrote critic {}", dir.display());
        Ok(())
    }
}
