//! `rlft grpo`, `rlft rloo`, `rlft ppo`: the one online config, [`OnlineConfig`], with TRL's
//! `GRPOConfig` names and meanings; its sections are the estimator ([`estimator`]), rollouts on
//! servers ([`servers`]) and the batch arithmetic with LightRFT's batch aliases ([`batch`]); the
//! commands' defaults over it are in [`commands`].

pub mod aliases;
pub mod batch;
pub mod commands;
pub mod estimator;
pub mod servers;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::args::TrainingArgs;
use super::rollout::RolloutConfig;
use super::{shared_args, ConfigError, TrainerConfig};
use crate::algo::{
    AdvantageConfig, Estimator, ImportanceSamplingLevel, LossConfig, LossType,
    MultiObjectiveAggregation, ScaleRewards,
};
use crate::data::LengthPolicy;
pub use aliases::ALIASES;
pub use batch::BatchPlan;
pub use commands::{GrpoConfig, PpoConfig, RlooConfig};
pub use estimator::EstimatorSettings;
pub use servers::RolloutServers;

/// How eval completions are decoded (`eval_decoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalDecoding {
    /// Greedy: the model's most likely answer.
    #[default]
    Greedy,
    /// pass@1 with the rollout sampling settings.
    Sampled,
}

/// GRPO config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct OnlineConfig {
    /// Model, data, optimiser, batch, cadence, LoRA: the keys every trainer shares
    /// (`per_device_train_batch_size` counts completions).
    #[serde(flatten)]
    pub args: TrainingArgs,
    /// Prompts, sampling, rewards and sample logs (flat keys; shared with Online DPO: see
    /// [`RolloutConfig`]).
    #[serde(flatten)]
    pub rollout: RolloutConfig,
    /// Longest prompt in tokens (after the chat template).
    pub max_prompt_length: usize,
    /// Longer prompts: "drop" or "truncate" (keeps the last tokens); both counted and reported.
    pub prompt_truncation: LengthPolicy,
    /// Most new tokens per completion; a completion that reaches it is "truncated".
    pub max_completion_length: usize,
    /// Completions per prompt (the group size G).
    pub num_generations: usize,
    /// Completions per rollout; 0 = one train batch (per_device x accumulation).
    pub generation_batch_size: usize,
    /// KL coefficient to the reference policy; 0 skips the reference model entirely. With
    /// `group_norm` (GRPO) a k3 term in the loss, with the other estimators a penalty on the
    /// reward (`kl_estimator`; TRL PPO's `kl_coef`, OpenRLHF's `init_kl_coef`).
    pub beta: f64,
    /// Lower clip range of the importance ratio (1 - epsilon).
    pub epsilon: f64,
    /// Upper clip range (1 + epsilon_high); unset = epsilon. DAPO's clip-higher uses 0.28.
    pub epsilon_high: Option<f64>,
    /// Optimisation passes over each rollout (PPO epochs); > 1 keeps old log-probs.
    pub num_iterations: usize,
    /// Loss: "grpo" (token mean per sequence, then mean), "bnpo" (token mean over the
    /// micro-batch), "dr_grpo" (sum / (completions x max_completion_length)), "dapo" (token
    /// mean over the whole optimiser step; TRL's default), "cispo" (MiniMax-M1: the ratio,
    /// capped at epsilon_high and detached, weights -A logp; dapo's mean), "sapo" (a soft
    /// sigmoid gate instead of the hard clip; grpo's mean), "rloo" (RLOO's sequence-level clipped
    /// loss, one term per completion; `rlft rloo`'s default).
    pub loss_type: LossType,
    /// Importance ratio per "token" (TRL's default) or per "sequence" (GSPO: exp of the
    /// completion's mean log-ratio, one per completion; pair it with loss_type = "grpo").
    pub importance_sampling_level: ImportanceSamplingLevel,
    /// Two-sided clipping (INTELLECT-2): the unclipped ratio is also capped at delta (> 1,
    /// recommended above 1 + epsilon_high); unset = off (TRL). Clipped losses only.
    pub delta: Option<f64>,
    /// "sapo": gate temperature of tokens with positive advantage (TRL 1.0).
    pub sapo_temperature_pos: f64,
    /// "sapo": gate temperature of tokens with advantage <= 0 (TRL 1.05).
    pub sapo_temperature_neg: f64,
    /// Only the tokens in the top quantile of entropy of each micro-batch carry the policy
    /// loss (1.0 = every token, TRL's default; the paper uses 0.2).
    pub top_entropy_quantile: f64,
    /// Multiply the KL term by the importance ratio: the unbiased KL gradient of DeepSeek-V3.2
    /// (TRL 1.16's default, true). Only with beta > 0.
    pub use_bias_correction_kl: bool,
    /// Several reward functions: "sum_then_normalize" (weighted sum, then group advantages;
    /// TRL's default) or "normalize_then_sum" (GDPO: each reward standardised in its group,
    /// then summed, then standardised over the rollout).
    pub multi_objective_aggregation: MultiObjectiveAggregation,
    /// Advantage scaling: "group" (divide by the group's std), "batch" (by the rollout's std),
    /// "none" (Dr. GRPO: only subtract the group mean).
    pub scale_rewards: ScaleRewards,
    /// Added to the std before dividing (TRL 1e-4; LightRFT 1e-9).
    pub advantage_epsilon: f64,
    /// Clamp advantages to [-advantage_clip, advantage_clip] (0 = off; LightRFT uses 10).
    pub advantage_clip: f64,
    /// Exclude completions that hit max_completion_length from the loss (DAPO).
    pub mask_truncated_completions: bool,
    /// With `mask_truncated_completions`: a truncated completion's reward also stays out of its
    /// group's mean and std, as an unscored one's. A cut completion then neither is pushed down
    /// nor lifts the finished completions of its prompt above a baseline it dragged down.
    pub mask_truncated_rewards: bool,
    /// Run each prompt once per micro-batch and let its completions attend to its keys and
    /// values (policy, old and reference passes); same log-probs and gradients as recomputing
    /// the prompt per completion, fewer tokens. false = the plain rows (for comparison).
    pub share_prompts: bool,
    /// Eval decoding: "greedy" or "sampled" (pass@1 with the rollout sampling settings).
    pub eval_decoding: EvalDecoding,
    /// Most new tokens per eval completion; 0 = `max_completion_length`. Room for the longest
    /// answers at eval while training keeps the cheaper budget.
    pub eval_max_completion_length: usize,
    /// Warn when the mean k3 KL exceeds this.
    pub kl_warning_threshold: f64,
    /// Warn when this many consecutive steps have reward_std near 0.
    pub zero_std_warning_steps: usize,
    /// Advantage estimator, KL placement, PPO's critic, dynamic sampling (flat keys; see
    /// [`estimator`]).
    #[serde(flatten)]
    pub estimator: EstimatorSettings,
    /// Rollouts on OpenAI-compatible servers and their importance-sampling correction (flat
    /// keys `rollout_servers`, `rollout_is*`; TRL's `use_vllm`, `vllm_*` accepted; see
    /// [`servers`]).
    #[serde(flatten)]
    pub servers: RolloutServers,
}

impl Default for OnlineConfig {
    fn default() -> Self {
        OnlineConfig {
            args: TrainingArgs {
                output_dir: PathBuf::from("artifacts/grpo"),
                learning_rate: 1e-6,
                num_train_epochs: 1.0,
                logging_steps: 1,
                ..TrainingArgs::default()
            },
            max_prompt_length: 512,
            prompt_truncation: LengthPolicy::Drop,
            max_completion_length: 256,
            num_generations: 8,
            generation_batch_size: 0,
            beta: 0.0,
            epsilon: 0.2,
            epsilon_high: None,
            num_iterations: 1,
            loss_type: LossType::Dapo,
            importance_sampling_level: ImportanceSamplingLevel::Token,
            delta: None,
            sapo_temperature_pos: 1.0,
            sapo_temperature_neg: 1.05,
            top_entropy_quantile: 1.0,
            use_bias_correction_kl: true,
            multi_objective_aggregation: MultiObjectiveAggregation::SumThenNormalize,
            scale_rewards: ScaleRewards::Group,
            advantage_epsilon: 1e-4,
            advantage_clip: 0.0,
            mask_truncated_completions: false,
            mask_truncated_rewards: false,
            share_prompts: true,
            eval_decoding: EvalDecoding::Greedy,
            eval_max_completion_length: 0,
            kl_warning_threshold: 1.0,
            zero_std_warning_steps: 5,
            estimator: EstimatorSettings::default(),
            servers: RolloutServers::default(),
            rollout: RolloutConfig::default(),
        }
    }
}

impl TrainerConfig for OnlineConfig {
    shared_args!();

    fn alias_keys() -> Vec<&'static str> {
        let mut keys: Vec<&str> = ALIASES.iter().map(|a| a.0).collect();
        keys.extend(aliases::DERIVED_ALIASES);
        keys.extend(servers::trl_keys());
        keys
    }

    fn resolve_aliases(table: &mut toml::Table) -> Result<(), ConfigError> {
        aliases::resolve_aliases(table)
    }

    fn validate_own(&self) -> Result<(), ConfigError> {
        self.check()
    }
}

impl OnlineConfig {
    /// The advantage settings (`scale_rewards`, `advantage_epsilon`, `advantage_clip`).
    pub fn advantage_config(&self) -> AdvantageConfig {
        AdvantageConfig {
            scale: self.scale_rewards,
            epsilon: self.advantage_epsilon,
            clamp: (self.advantage_clip > 0.0).then_some(self.advantage_clip),
        }
    }

    /// The loss settings (`loss_type`, `epsilon`, `epsilon_high`, `beta` and TRL 1.16's
    /// `importance_sampling_level`, `delta`, `sapo_temperature_*`, `top_entropy_quantile`,
    /// `use_bias_correction_kl`).
    pub fn loss_config(&self) -> LossConfig {
        LossConfig {
            loss_type: self.loss_type,
            epsilon_low: self.epsilon,
            epsilon_high: self.epsilon_high(),
            delta: self.delta,
            importance_sampling_level: self.importance_sampling_level,
            sapo_temperature_pos: self.sapo_temperature_pos,
            sapo_temperature_neg: self.sapo_temperature_neg,
            top_entropy_quantile: self.top_entropy_quantile,
            // The other estimators put the KL into the reward instead.
            beta: if self.kl_in_reward() { 0.0 } else { self.beta },
            use_bias_correction_kl: self.use_bias_correction_kl,
            max_completion_length: self.max_completion_length,
        }
    }

    /// Settings that run but are likely not what was meant, for the trainer to print (TRL
    /// warns about the same).
    pub fn warnings(&self) -> Vec<String> {
        self.loss_config().warnings()
    }

    /// Upper clip range.
    pub fn epsilon_high(&self) -> f64 {
        self.epsilon_high.unwrap_or(self.epsilon)
    }

    /// Most new tokens per eval completion.
    pub fn eval_completion_length(&self) -> usize {
        match self.eval_max_completion_length {
            0 => self.max_completion_length,
            n => n,
        }
    }

    /// The GRPO checks (the shared ones are [`TrainingArgs::validate`]); each error says how to
    /// fix it.
    fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.rollout.check()?;
        if self.num_generations == 0 {
            return bad("num_generations must be >= 1".into());
        }
        self.check_estimator()?;
        self.check_batches()?;
        self.servers.check(self.args.use_peft)?;
        if self.servers.on_servers() && self.rollout.multi_turn() {
            return bad(
                "[[tools]] and [environment] run in rlft's own rollouts, not on rollout_servers \
                 yet; remove rollout_servers (or the tools and the environment)"
                    .into(),
            );
        }
        if self.max_prompt_length == 0 || self.max_completion_length == 0 {
            return bad("max_prompt_length and max_completion_length must be >= 1".into());
        }
        if self.beta < 0.0 || self.epsilon < 0.0 || self.epsilon_high() < 0.0 {
            return bad("beta, epsilon and epsilon_high must be >= 0".into());
        }
        if self.epsilon >= 1.0 {
            return bad(format!(
                "epsilon must be < 1 (got {}): the ratio is clipped to [1 - epsilon, ...]",
                self.epsilon
            ));
        }
        if self.num_iterations == 0 {
            return bad("num_iterations must be >= 1".into());
        }
        if self.advantage_epsilon < 0.0 || self.advantage_clip < 0.0 {
            return bad("advantage_epsilon and advantage_clip must be >= 0".into());
        }
        self.check_truncated_rewards()?;
        self.check_loss_options()
    }

    /// Whether a completion (truncated or not) enters the loss: `mask_truncated_completions`
    /// leaves the truncated ones out.
    pub fn in_loss(&self, truncated: bool) -> bool {
        !(self.mask_truncated_completions && truncated)
    }

    /// Whether a completion's reward enters its group's baseline: `mask_truncated_rewards`
    /// leaves the truncated ones out.
    pub fn in_baseline(&self, truncated: bool) -> bool {
        !(self.mask_truncated_rewards && truncated)
    }

    /// `mask_truncated_rewards` needs the completions masked too and group advantages from the
    /// reward functions' own scores.
    fn check_truncated_rewards(&self) -> Result<(), ConfigError> {
        if !self.mask_truncated_rewards {
            return Ok(());
        }
        let e = &self.estimator;
        let why = if !self.mask_truncated_completions {
            "needs mask_truncated_completions = true (a truncated completion left in the loss \
             would get advantage 0)"
        } else if e.advantage_estimator != Estimator::GroupNorm {
            "works with advantage_estimator = \"group_norm\" (GRPO's group baselines) only"
        } else if e.missing_eos_penalty.is_some() || e.reward_clip_range.is_some() {
            "leaves truncated completions out of the baseline, which missing_eos_penalty and \
             reward_clip_range would shape; remove those two"
        } else {
            return Ok(());
        };
        Err(ConfigError::Invalid(format!(
            "mask_truncated_rewards = true {why}; or set mask_truncated_rewards = false"
        )))
    }

    /// TRL 1.16's loss and reward-aggregation options ([`LossConfig::validate`]).
    fn check_loss_options(&self) -> Result<(), ConfigError> {
        if self.multi_objective_aggregation == MultiObjectiveAggregation::NormalizeThenSum
            && self.scale_rewards != ScaleRewards::Group
        {
            return Err(ConfigError::Invalid(format!(
                "scale_rewards = \"{}\" has no effect with multi_objective_aggregation = \
                 \"normalize_then_sum\", which standardises each reward in its group and the sum \
                 over the rollout (TRL ignores scale_rewards there); remove scale_rewards, or use \
                 multi_objective_aggregation = \"sum_then_normalize\"",
                self.scale_rewards
            )));
        }
        self.loss_config().validate()
    }

    /// The rollout must be a whole number of groups and of train batches.
    fn check_batches(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let (train, rollout, g) = (
            self.train_batch(),
            self.rollout_completions(),
            self.num_generations,
        );
        if rollout % g != 0 {
            return bad(format!(
                "the rollout of {rollout} completions ({}) is not a multiple of num_generations \
                 = {g}: {rollout} % {g} = {}; use a rollout of {} or {} completions, or \
                 num_generations that divides {rollout}",
                if self.generation_batch_size == 0 {
                    format!(
                        "per_device_train_batch_size {} x gradient_accumulation_steps {}",
                        self.args.per_device_train_batch_size,
                        self.args.gradient_accumulation_steps
                    )
                } else {
                    "generation_batch_size".into()
                },
                rollout % g,
                (rollout / g).max(1) * g,
                (rollout / g + 1) * g
            ));
        }
        if rollout % train != 0 {
            return bad(format!(
                "generation_batch_size {rollout} is not a multiple of the train batch {train} \
                 (per_device_train_batch_size x gradient_accumulation_steps); use {} or {}",
                (rollout / train).max(1) * train,
                (rollout / train + 1) * train
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) use crate::config::tests::parse_online as parse_as;

    fn parse(extra: &str) -> Result<OnlineConfig, ConfigError> {
        parse_as(extra)
    }

    #[test]
    fn plan_follows_trl_arithmetic() {
        let c = parse("per_device_train_batch_size = 4\ngradient_accumulation_steps = 2\nnum_generations = 4\nmax_steps = 10").unwrap();
        let p = c.plan(100);
        assert_eq!(
            (p.train_batch, p.rollout_completions, p.rollout_prompts),
            (8, 8, 2)
        );
        assert_eq!(
            (p.steps_per_rollout, p.total_steps, p.rollouts),
            (1, 10, 10)
        );
        // Epoch-based: 100 prompts / 2 per rollout = 50 rollouts.
        let c = parse("per_device_train_batch_size = 4\ngradient_accumulation_steps = 2\nnum_generations = 4\nnum_train_epochs = 1").unwrap();
        assert_eq!(c.plan(100).total_steps, 50);
    }

    #[test]
    fn eval_budget_defaults_to_the_training_one() {
        let c = parse("max_completion_length = 128").unwrap();
        assert_eq!(c.eval_completion_length(), 128);
        let c = parse("max_completion_length = 128\neval_max_completion_length = 192").unwrap();
        assert_eq!(c.eval_completion_length(), 192);
        let s = crate::online::eval_settings(&c, &[0], 0);
        assert_eq!(s.max_new_tokens, 192);
        assert_eq!(
            crate::online::setup::sampling_settings(&c, &[0], 0, 1).max_new_tokens,
            128
        );
    }

    #[test]
    fn lightrft_aliases_resolve() {
        // The seed's defaults: 16 prompts x 4 samples per rollout, train batch 16, micro 1.
        let c = parse(
            "n_samples_per_prompt = 4\nrollout_batch_size = 16\ntrain_batch_size = 16\n\
             micro_train_batch_size = 1\ninit_kl_coef = 0.001\nmax_steps = 8",
        )
        .unwrap();
        assert_eq!(c.num_generations, 4);
        assert_eq!(c.generation_batch_size, 64);
        assert_eq!(c.args.gradient_accumulation_steps, 16);
        assert_eq!(c.beta, 0.001);
        let p = c.plan(128);
        assert_eq!((p.rollout_prompts, p.steps_per_rollout), (16, 4));
        let e = parse("init_kl_coef = 0.1\nbeta = 0.2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("alias"), "{e}");
    }

    #[test]
    fn errors_give_the_fix() {
        let e = parse("num_generation = 4").unwrap_err().to_string();
        assert!(e.contains("did you mean `num_generations`"), "{e}");
        let e = parse("per_device_train_batch_size = 6\nnum_generations = 4")
            .unwrap_err()
            .to_string();
        assert!(e.contains("6 % 4 = 2") && e.contains("4 or 8"), "{e}");
        let e = OnlineConfig::from_table("dataset = \"d\"".parse().unwrap(), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[[rewards]]"), "{e}");
        let e = parse("reward_weights = [1.0, 2.0]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 entries"), "{e}");
        let e = parse("loss_type = \"ppo\"").unwrap_err().to_string();
        assert!(e.contains("loss_type") || e.contains("grpo"), "{e}");
    }
}
