//! The rollout settings every online trainer shares (`rlft grpo`, `rloo`, `ppo` and
//! `online-dpo`): which prompts, how completions are sampled, how they are rewarded and logged.
//! Both [`OnlineConfig`](super::online::OnlineConfig) and
//! [`OnlineDpoConfig`](super::online_dpo::OnlineDpoConfig) hold one, flattened: its keys sit at
//! the top level of the TOML, under TRL's names.

use rlft_model::sampling::SamplingParams;
use rlft_rewards::RewardSpec;
use rlft_tools::{EnvironmentSpec, ToolSpec};
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Prompts, sampling, rewards and sample logs of the rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutConfig {
    /// Column holding the prompt: a string (sent as one user message) or a list of messages.
    pub prompt_column: String,
    /// Sampling temperature of the rollouts (log-probs are taken at this temperature by GRPO
    /// and at 1 by Online DPO, as TRL takes them).
    pub temperature: f64,
    /// Nucleus sampling of the rollouts (1.0 = off).
    pub top_p: f64,
    /// Top-k sampling of the rollouts (0 = off).
    pub top_k: usize,
    /// Min-p sampling of the rollouts (0 = off; TRL's `None`).
    pub min_p: f64,
    /// Repetition penalty of the rollouts (1.0 = off).
    pub repetition_penalty: f64,
    /// Reward functions, in order (`[[rewards]]` tables; see `docs/rewards.md`).
    pub rewards: Vec<RewardSpec>,
    /// Weights of the reward functions, in order; unset = each reward's own `weight`.
    pub reward_weights: Option<Vec<f64>>,
    /// Completions (Online DPO: pairs) written to `samples.jsonl` per logging step.
    pub num_completions_to_log: usize,
    /// Evaluate at most this many eval prompts (0 = all).
    pub eval_max_prompts: usize,
    /// Tools the model may call inside a completion (`[[tools]]` tables; see `docs/tools.md`).
    pub tools: Vec<ToolSpec>,
    /// Most tool-calling rounds per completion (TRL's name); unset: until the completion budget.
    pub max_tool_calling_iterations: Option<usize>,
    /// An environment that plays episodes of several turns with the model (`[environment]`;
    /// see `docs/tools.md`).
    pub environment: Option<EnvironmentSpec>,
}

impl Default for RolloutConfig {
    /// TRL's `GRPOConfig` defaults.
    fn default() -> Self {
        RolloutConfig {
            prompt_column: "prompt".into(),
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            rewards: Vec::new(),
            reward_weights: None,
            num_completions_to_log: 4,
            eval_max_prompts: 0,
            tools: Vec::new(),
            max_tool_calling_iterations: None,
            environment: None,
        }
    }
}

impl RolloutConfig {
    /// The rollouts' sampling settings.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature as f32,
            top_k: self.top_k,
            top_p: self.top_p as f32,
            min_p: self.min_p as f32,
            repetition_penalty: self.repetition_penalty as f32,
        }
    }

    /// Whether completions may have several turns (tools or an environment).
    pub fn multi_turn(&self) -> bool {
        !self.tools.is_empty() || self.environment.is_some()
    }

    /// Checks the rewards and the sampling; each error says how to fix it.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.rewards.is_empty() {
            return bad(
                "no reward functions: add at least one [[rewards]] table, e.g.\n  [[rewards]]\n  \
                 type = \"boxed_accuracy\"\n  answer_field = \"answer\""
                    .into(),
            );
        }
        if let Some(w) = &self.reward_weights {
            if w.len() != self.rewards.len() {
                return bad(format!(
                    "reward_weights has {} entries but there are {} reward functions; give one \
                     weight per [[rewards]] table, in order",
                    w.len(),
                    self.rewards.len()
                ));
            }
        }
        if self.temperature.is_nan() || self.temperature <= 0.0 {
            return bad(format!(
                "temperature must be > 0 for rollouts (got {}); the group needs varied samples",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1] (got {})", self.top_p));
        }
        if self.max_tool_calling_iterations == Some(0) {
            return bad(
                "max_tool_calling_iterations = 0 allows no tool call; set it to 1 or more, or \
                 remove the [[tools]] tables"
                    .into(),
            );
        }
        if self.tools.is_empty() && self.max_tool_calling_iterations.is_some() {
            return bad(
                "max_tool_calling_iterations is set but there are no [[tools]]; add a tool \
                 (e.g. [[tools]] type = \"calculator\") or remove the key"
                    .into(),
            );
        }
        rlft_tools::ToolBox::new(&self.tools).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if let Some(env) = &self.environment {
            rlft_tools::Environment::new(env).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        let env_reward = self
            .rewards
            .iter()
            .any(|r| matches!(r.kind, rlft_rewards::RewardKind::Environment(_)));
        if env_reward && self.environment.is_none() {
            return bad(
                "a [[rewards]] table has type = \"environment\" but there is no [environment] \
                 to give that reward; add an [environment] table (docs/tools.md) or remove the \
                 reward"
                    .into(),
            );
        }
        Ok(())
    }
}
