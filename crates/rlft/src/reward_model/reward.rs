//! A reward model as a reward of the online trainers (`[[rewards]] type = "model"`): loaded
//! once, without a graph, it scores each rollout batch, `batch_size` sequences per forward
//! pass, and enters the total with its `weight` like any other reward function.
//!
//! The reward model reads the text with its own tokenizer and chat template (the policy's
//! completion ids are decoded to text first, so the two tokenizers need not match), built by
//! [`super::score::row_item`], the function `rlft score` scores a `prompt` + `completion` row
//! with: the sample becomes the row `{"prompt": <the dataset row's prompt column>,
//! "completion": <completion text>}`, so
//!
//! - a conversational prompt (a list of messages) is rendered with the reward model's chat
//!   template as `prompt + [{"role": "assistant", "content": completion}]`, the trainer's
//!   `system_prompt` first when the conversation has none, as the policy saw it (TRL's
//!   `GRPOTrainer._calculate_rewards`, `trl/trainer/grpo_trainer.py` lines 1604-1612:
//!   `apply_chat_template({"messages": p + c})`, tokenized without special tokens);
//! - a string prompt is read as `prompt + completion` plus the EOS token, with the tokenizer's
//!   special tokens: the standard format preference training uses (TRL's GRPO joins the
//!   strings without the EOS; rlft scores what its reward models were trained on).
//!
//! Each sequence's score is read at its last non-pad token, as transformers'
//! `*ForSequenceClassification` does.

use std::path::Path;

use rlft_model::load::LoadOptions;
use rlft_model::score::{load_score_model, ScoreModel};
use rlft_rewards::{ModelSpec, Reward, RewardError, RewardOutput, Sample};
use rlft_text::ChatTemplate;
use serde_json::{json, Value};

use super::score::{row_item, ScoreItem};

/// Where the trainer's prompts come from, so that the reward model reads the conversation the
/// policy answered.
#[derive(Debug, Clone, Copy)]
pub struct PromptSource<'a> {
    /// The dataset column holding the prompt (`prompt_column`).
    pub column: &'a str,
    /// The trainer's `system_prompt`.
    pub system_prompt: Option<&'a str>,
}

/// The policy's `model` as the config writes it and the path it resolved to: a `base` equal
/// to the config string means the resolved path (as `value_model` does).
#[derive(Debug, Clone, Copy)]
pub struct PolicyModel<'a> {
    /// The config's `model` string (e.g. `default`).
    pub name: &'a str,
    /// What it resolved to.
    pub path: &'a Path,
}

/// `type = "model"`: a loaded reward model and how it reads samples.
pub struct ModelReward {
    name: String,
    model: ScoreModel,
    template: Option<ChatTemplate>,
    column: String,
    system_prompt: Option<String>,
    batch_size: usize,
    max_length: usize,
}

impl ModelReward {
    /// Loads the reward model of `spec` (named `name` in logs) with `opts` (device, dtype).
    /// Errors name the path and how to fix it: a missing directory, a causal LM without a
    /// score head, an adapter without a base.
    pub fn load(
        name: &str,
        spec: &ModelSpec,
        prompts: PromptSource<'_>,
        policy: PolicyModel<'_>,
        opts: &LoadOptions,
    ) -> Result<Self, RewardError> {
        let config = |message: String| RewardError::Config {
            reward: name.to_string(),
            message,
        };
        if spec.batch_size == 0 {
            return Err(config("`batch_size` must be at least 1".into()));
        }
        let path = Path::new(&spec.path);
        if !path.exists() {
            return Err(config(format!(
                "`path` {} does not exist; give the reward model's directory (`rlft \
                 reward-model` writes OUTPUT/final, and OUTPUT/adapter with LoRA)",
                path.display()
            )));
        }
        // `base` naming the policy's `model` reads what it resolved to; another built-in name
        // (`default`, `qwen2.5-coder-0.5b`) is fetched.
        let base = match spec.base.as_deref() {
            Some(b) if b == policy.name => Some(policy.path.to_path_buf()),
            Some(b) => {
                Some(rlft_model::load::resolve(b).map_err(|e| config(format!("`base` {b}: {e}")))?)
            }
            None => None,
        };
        let model = load_score_model(path, base.as_deref(), opts)
            .map_err(|e| config(format!("cannot load the reward model: {e}")))?;
        let template = model.text.compile_chat_template().ok();
        Ok(ModelReward {
            name: name.to_string(),
            model,
            template,
            column: prompts.column.to_string(),
            system_prompt: prompts.system_prompt.map(str::to_string),
            batch_size: spec.batch_size,
            max_length: spec.max_length,
        })
    }

    /// The loaded reward model.
    pub fn model(&self) -> &ScoreModel {
        &self.model
    }

    /// The reward model's token ids of sample `i` of a batch (see the module docs), cut to
    /// the last `max_length` tokens.
    pub fn sequence(&self, s: &Sample<'_>, i: usize) -> Result<Vec<u32>, RewardError> {
        let row_err = |message: String| RewardError::Row {
            reward: self.name.clone(),
            sample: i,
            message,
        };
        let prompt = s
            .row
            .get(&self.column)
            .filter(|v| !v.is_null())
            .cloned()
            .ok_or_else(|| row_err(format!("the row has no `{}` column", self.column)))?;
        let row: Value = json!({"prompt": prompt, "completion": s.completion});
        let item = row_item(
            &self.model,
            self.template.as_ref(),
            &row,
            i,
            self.system_prompt.as_deref(),
        )
        .map_err(|e| row_err(e.to_string()))?;
        let ScoreItem::Single(mut ids) = item else {
            unreachable!("a prompt + completion row is one sequence")
        };
        if self.max_length > 0 && ids.len() > self.max_length {
            ids.drain(..ids.len() - self.max_length);
        }
        Ok(ids)
    }

    /// Scores of `batch`, `batch_size` sequences per forward pass; the sequences are taken
    /// longest first so that each pass pads little.
    pub fn scores(&self, batch: &[Sample<'_>]) -> Result<Vec<f32>, RewardError> {
        let seqs = batch
            .iter()
            .enumerate()
            .map(|(i, s)| self.sequence(s, i))
            .collect::<Result<Vec<_>, _>>()?;
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].len()));
        let sorted: Vec<Vec<u32>> = order.iter().map(|&i| seqs[i].clone()).collect();
        let got = self
            .model
            .score_rows(&sorted, self.batch_size)
            .map_err(|e| RewardError::Output {
                reward: self.name.clone(),
                message: format!("the reward model failed to score a batch: {e}"),
            })?;
        let mut out = vec![0f32; seqs.len()];
        for (&i, s) in order.iter().zip(got) {
            out[i] = s;
        }
        Ok(out)
    }
}

impl Reward for ModelReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        let scores = self.scores(batch)?;
        Ok(RewardOutput::from_scores(
            scores.into_iter().map(f64::from).collect(),
        ))
    }
}
