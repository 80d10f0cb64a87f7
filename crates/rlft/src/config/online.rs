//! The online family's shared settings beyond GRPO's: which advantage estimator, where the KL
//! goes, PPO's critic, dynamic sampling; and the per-command defaults of `rlft rloo` (TRL's
//! `RLOOConfig`) and `rlft ppo` (TRL <= 1.15's `PPOConfig`). One config type serves every
//! online command, so `advantage_estimator` in any of them selects the same code.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::args::TrainingArgs;
use super::grpo::GrpoConfig;
use super::{ConfigError, TrainerConfig};
use crate::algo::{Estimator, EstimatorConfig, KlEstimator, LossType};

/// The estimator settings (flat keys of an online config).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct EstimatorSettings {
    /// Where advantages come from: `group_norm` (GRPO), `rloo`, `reinforce` (REINFORCE++),
    /// `reinforce_baseline`, `gae` (PPO with a critic). See `docs/online-rl.md`.
    pub advantage_estimator: Estimator,
    /// The per-token KL estimate when the KL enters the reward (every estimator but
    /// `group_norm`; RLOO always uses TRL's first-order `logp - ref`): `k1`, `k2`, `k3`.
    pub kl_estimator: KlEstimator,
    /// Discount of the per-token returns (`reinforce`, `gae`); 1.0 for the group estimators.
    pub gamma: f64,
    /// GAE's lambda (`gae`; LightRFT/OpenRLHF `lambd`).
    pub lam: f64,
    /// RLOO: standardise the advantages over the rollout (TRL `normalize_advantages`).
    pub normalize_advantages: bool,
    /// `[low, high]`: clamp each completion's summed reward first (TRL `reward_clip_range`).
    pub reward_clip_range: Option<[f64; 2]>,
    /// Subtracted from the reward of a completion that hit `max_completion_length` without an
    /// end token (TRL `missing_eos_penalty`).
    pub missing_eos_penalty: Option<f64>,
    /// PPO: whiten the per-token rewards before GAE (TRL `whiten_rewards`).
    pub whiten_rewards: bool,
    /// PPO: weight of the value loss in the total loss (TRL `vf_coef`).
    pub vf_coef: f64,
    /// PPO: the critic's values move at most this far from their rollout values before the
    /// clipped loss takes over (TRL `cliprange_value`).
    pub cliprange_value: f64,
    /// PPO: the critic's initial weights: a causal LM (a path or a built-in name such as
    /// `qwen2.5-coder-0.5b`) or a `*ForSequenceClassification` HF directory (a trained reward
    /// model). `rlft ppo` defaults it to `model`.
    pub value_model: Option<PathBuf>,
    /// DAPO's dynamic sampling: drop prompt groups whose rewards are all equal and sample more
    /// prompts until the rollout is full (verl `filter_groups`, OpenRLHF `dynamic_filtering`).
    pub dynamic_sampling: bool,
    /// Dynamic sampling: at most this many generation batches per rollout (verl
    /// `max_num_gen_batches`); the rollout is then topped up with the dropped groups.
    pub max_num_gen_batches: usize,
}

impl Default for EstimatorSettings {
    fn default() -> Self {
        EstimatorSettings {
            advantage_estimator: Estimator::GroupNorm,
            kl_estimator: KlEstimator::K1,
            gamma: 1.0,
            lam: 0.95,
            normalize_advantages: false,
            reward_clip_range: None,
            missing_eos_penalty: None,
            whiten_rewards: false,
            vf_coef: 0.1,
            cliprange_value: 0.2,
            value_model: None,
            dynamic_sampling: false,
            max_num_gen_batches: 4,
        }
    }
}

/// TRL PPO / OpenRLHF names accepted as aliases: (alias, canonical key, meaning).
pub const ONLINE_ALIASES: &[(&str, &str, &str)] = &[
    ("kl_coef", "beta", "KL coefficient"),
    ("cliprange", "epsilon", "policy clip range"),
    (
        "num_ppo_epochs",
        "num_iterations",
        "passes over each rollout",
    ),
    ("response_length", "max_completion_length", "new tokens"),
    ("lambd", "lam", "GAE lambda"),
    ("critic_pretrain", "value_model", "critic initialisation"),
    ("value_clip", "cliprange_value", "value clip range"),
    (
        "dynamic_filtering",
        "dynamic_sampling",
        "drop groups without signal",
    ),
];

impl GrpoConfig {
    /// The estimator settings as [`crate::algo::estimate`] takes them.
    pub fn estimator_config(&self) -> EstimatorConfig {
        let e = &self.estimator;
        EstimatorConfig {
            estimator: e.advantage_estimator,
            kl_coef: self.beta,
            gamma: e.gamma,
            lam: e.lam,
            normalize_advantages: e.normalize_advantages,
            whiten_rewards: e.whiten_rewards,
        }
    }

    /// Whether the KL to the reference enters the reward rather than the loss.
    pub fn kl_in_reward(&self) -> bool {
        self.beta > 0.0 && self.estimator.advantage_estimator.kl_in_reward()
    }

    /// The checks of the estimator settings and their combinations with the rest.
    pub(super) fn check_estimator(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let e = &self.estimator;
        let est = e.advantage_estimator;
        if (est.needs_groups() || e.dynamic_sampling) && self.num_generations < 2 {
            return bad(format!(
                "{} compares the completions of a prompt, so num_generations must be >= 2 \
                 (got {}); set num_generations = 4, or use advantage_estimator = \"reinforce\" \
                 or \"gae\", which work with one completion per prompt",
                if e.dynamic_sampling {
                    "dynamic_sampling".to_string()
                } else {
                    format!("advantage_estimator = \"{est}\"")
                },
                self.num_generations
            ));
        }
        match (est, &e.value_model) {
            (Estimator::Gae, None) => {
                return bad(
                    "advantage_estimator = \"gae\" learns a value function and has no value \
                     model: set value_model = \"<path>\" (the policy's model, or a trained \
                     reward model), or run `rlft ppo`, which starts the critic from `model`"
                        .into(),
                )
            }
            (est, Some(_)) if est != Estimator::Gae => {
                return bad(format!(
                    "value_model is set but advantage_estimator = \"{est}\" has no critic; \
                     remove value_model, or set advantage_estimator = \"gae\""
                ))
            }
            _ => {}
        }
        if est == Estimator::Rloo && self.loss_type != LossType::default() {
            return bad(format!(
                "loss_type = \"{}\" does not apply to advantage_estimator = \"rloo\", which \
                 trains TRL RLOOTrainer's sequence-level loss; remove loss_type",
                self.loss_type
            ));
        }
        for (k, v) in [("gamma", e.gamma), ("lam", e.lam)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(format!("{k} must be in [0, 1] (got {v})"));
            }
        }
        if let Some([lo, hi]) = e.reward_clip_range {
            if lo.partial_cmp(&hi) != Some(std::cmp::Ordering::Less) {
                return bad(format!(
                    "reward_clip_range = [{lo}, {hi}] must be [low, high] with low < high"
                ));
            }
        }
        if !(e.vf_coef >= 0.0 && e.cliprange_value > 0.0) {
            return bad(format!(
                "vf_coef must be >= 0 and cliprange_value > 0 (got {} and {})",
                e.vf_coef, e.cliprange_value
            ));
        }
        if e.dynamic_sampling && e.max_num_gen_batches == 0 {
            return bad("max_num_gen_batches must be >= 1 (e.g. 4)".into());
        }
        Ok(())
    }
}

impl AsRef<GrpoConfig> for GrpoConfig {
    fn as_ref(&self) -> &GrpoConfig {
        self
    }
}

/// A config under other defaults, for one command of the online family.
macro_rules! online_command {
    ($name:ident, $doc:literal, $defaults:expr, $resolve:expr) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub GrpoConfig);

        impl Default for $name {
            fn default() -> Self {
                $name($defaults)
            }
        }

        impl Deref for $name {
            type Target = GrpoConfig;
            fn deref(&self) -> &GrpoConfig {
                &self.0
            }
        }

        impl AsRef<GrpoConfig> for $name {
            fn as_ref(&self) -> &GrpoConfig {
                &self.0
            }
        }

        impl DerefMut for $name {
            fn deref_mut(&mut self) -> &mut GrpoConfig {
                &mut self.0
            }
        }

        impl TrainerConfig for $name {
            const KEYS: &'static [&'static str] = GrpoConfig::KEYS;

            fn args(&self) -> &TrainingArgs {
                &self.0.args
            }

            fn args_mut(&mut self) -> &mut TrainingArgs {
                &mut self.0.args
            }

            fn alias_keys() -> Vec<&'static str> {
                GrpoConfig::alias_keys()
            }

            fn resolve_aliases(table: &mut toml::Table) -> Result<(), ConfigError> {
                // The batch aliases convert with this command's group size.
                if !table.contains_key("num_generations")
                    && !table.contains_key("n_samples_per_prompt")
                {
                    let g = Self::default().num_generations as i64;
                    table.insert("num_generations".into(), toml::Value::Integer(g));
                }
                GrpoConfig::resolve_aliases(table)?;
                let own: fn(&mut toml::Table) = $resolve;
                own(table);
                Ok(())
            }

            fn validate_own(&self) -> Result<(), ConfigError> {
                self.0.validate_own()
            }
        }
    };
}

online_command!(
    RlooConfig,
    "`rlft rloo`: TRL 1.16 `RLOOConfig`'s defaults (`beta = 0.05`, `num_generations = 2`, \
     `max_completion_length = 512`) over the online config.",
    GrpoConfig {
        args: TrainingArgs {
            output_dir: PathBuf::from("artifacts/rloo"),
            ..GrpoConfig::default().args
        },
        beta: 0.05,
        num_generations: 2,
        max_completion_length: 512,
        estimator: EstimatorSettings {
            advantage_estimator: Estimator::Rloo,
            ..Default::default()
        },
        ..GrpoConfig::default()
    },
    |_| {}
);

online_command!(
    PpoConfig,
    "`rlft ppo`: PPO with a critic, TRL <= 1.15 `PPOConfig`'s defaults (`kl_coef = 0.05`, \
     `num_ppo_epochs = 4`, `vf_coef = 0.1`, `cliprange_value = 0.2`, `gamma = 1`, \
     `lam = 0.95`, one completion per prompt, the loss a token mean per micro-batch) over the \
     online config; the critic starts from `model` unless `value_model` says otherwise.",
    GrpoConfig {
        args: TrainingArgs {
            output_dir: PathBuf::from("artifacts/ppo"),
            ..GrpoConfig::default().args
        },
        beta: 0.05,
        num_generations: 1,
        num_iterations: 4,
        loss_type: LossType::Bnpo,
        estimator: EstimatorSettings {
            advantage_estimator: Estimator::Gae,
            ..Default::default()
        },
        ..GrpoConfig::default()
    },
    default_critic
);

/// `rlft ppo`'s critic starts from the policy's `model` unless `value_model` is given.
fn default_critic(table: &mut toml::Table) {
    if table.contains_key("value_model")
        || table
            .get("advantage_estimator")
            .is_some_and(|v| v.as_str() != Some("gae"))
    {
        return;
    }
    let model = table
        .get("model")
        .cloned()
        .unwrap_or_else(|| toml::Value::String(GrpoConfig::default().args.model));
    table.insert("value_model".into(), model);
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "dataset = \"d.jsonl\"\n[[rewards]]\ntype = \"boxed_accuracy\"\n";

    fn parse<C: TrainerConfig>(extra: &str) -> Result<C, ConfigError> {
        C::from_table(format!("{extra}\n{BASE}").parse().unwrap(), "test.toml")
    }

    #[test]
    fn each_command_has_its_defaults() {
        let r: RlooConfig = parse("").unwrap();
        assert_eq!(r.estimator.advantage_estimator, Estimator::Rloo);
        assert_eq!((r.beta, r.num_generations), (0.05, 2));
        // A batch alias converts with the command's group size.
        let r: RlooConfig = parse("rollout_batch_size = 4").unwrap();
        assert_eq!(r.generation_batch_size, 8);
        let p: PpoConfig = parse("model = \"m.gguf\"\nkl_coef = 0.02\nnum_ppo_epochs = 2").unwrap();
        assert_eq!(p.estimator.value_model, Some(PathBuf::from("m.gguf")));
        assert_eq!((p.beta, p.num_iterations, p.num_generations), (0.02, 2, 1));
        let p: PpoConfig =
            parse("per_device_train_batch_size = 2\ngradient_accumulation_steps = 2\nnum_mini_batches = 3")
                .unwrap();
        assert_eq!(p.generation_batch_size, 12);
        let g: GrpoConfig = parse("advantage_estimator = \"reinforce_baseline\"").unwrap();
        assert_eq!(
            g.estimator.advantage_estimator,
            Estimator::ReinforceBaseline
        );
        assert_eq!(g.num_generations, 8);
    }

    #[test]
    fn conflicts_name_the_fix() {
        let e = parse::<GrpoConfig>("advantage_estimator = \"gae\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("value_model") && e.contains("rlft ppo"), "{e}");
        let e = parse::<GrpoConfig>("num_generations = 1\nper_device_train_batch_size = 2")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("num_generations must be >= 2") && e.contains("reinforce"),
            "{e}"
        );
        let e = parse::<RlooConfig>("loss_type = \"grpo\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sequence-level"), "{e}");
        let e = parse::<GrpoConfig>("value_model = \"x\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no critic"), "{e}");
        let e = parse::<GrpoConfig>("advantage_estimator = \"rlo\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`rlo`") && e.contains("`rloo`"), "{e}");
        let e = parse::<PpoConfig>("num_generations = 1\ndynamic_sampling = true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dynamic_sampling"), "{e}");
        assert!(parse::<GrpoConfig>("reward_clip_range = [1.0, 0.0]").is_err());
    }
}
