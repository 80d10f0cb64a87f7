//! The online commands, each TRL's defaults over the one [`OnlineConfig`]: `rlft grpo` (TRL's
//! `GRPOConfig`: the base's own defaults), `rlft rloo` (TRL's `RLOOConfig`) and `rlft ppo` (TRL
//! <= 1.15's `PPOConfig`). Every key means the same in all three, so `advantage_estimator` in
//! any of them selects the same code.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{EstimatorSettings, OnlineConfig};
use crate::algo::{Estimator, LossType};
use crate::config::args::TrainingArgs;
use crate::config::{shared_args, ConfigError, TrainerConfig};

impl AsRef<OnlineConfig> for OnlineConfig {
    fn as_ref(&self) -> &OnlineConfig {
        self
    }
}

/// A config under other defaults, for one command of the online family.
macro_rules! online_command {
    ($name:ident, $doc:literal, $defaults:expr, $resolve:expr) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub OnlineConfig);

        impl Default for $name {
            fn default() -> Self {
                $name($defaults)
            }
        }

        impl Deref for $name {
            type Target = OnlineConfig;
            fn deref(&self) -> &OnlineConfig {
                &self.0
            }
        }

        impl AsRef<OnlineConfig> for $name {
            fn as_ref(&self) -> &OnlineConfig {
                &self.0
            }
        }

        impl DerefMut for $name {
            fn deref_mut(&mut self) -> &mut OnlineConfig {
                &mut self.0
            }
        }

        impl TrainerConfig for $name {
            shared_args!(0.args);

            fn alias_keys() -> Vec<&'static str> {
                OnlineConfig::alias_keys()
            }

            fn resolve_aliases(table: &mut toml::Table) -> Result<(), ConfigError> {
                // The batch aliases convert with this command's group size.
                if !table.contains_key("num_generations")
                    && !table.contains_key("n_samples_per_prompt")
                {
                    let g = Self::default().num_generations as i64;
                    table.insert("num_generations".into(), toml::Value::Integer(g));
                }
                OnlineConfig::resolve_aliases(table)?;
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
    GrpoConfig,
    "`rlft grpo`: TRL 1.16 `GRPOConfig`'s defaults, those of the online config itself.",
    OnlineConfig::default(),
    |_| {}
);

online_command!(
    RlooConfig,
    "`rlft rloo`: TRL 1.16 `RLOOConfig`'s defaults (`beta = 0.05`, `num_generations = 2`, \
     `max_completion_length = 512`, RLOO's advantages and sequence loss) over the online \
     config.",
    OnlineConfig {
        args: TrainingArgs {
            output_dir: PathBuf::from("artifacts/rloo"),
            ..OnlineConfig::default().args
        },
        beta: 0.05,
        num_generations: 2,
        max_completion_length: 512,
        loss_type: LossType::Rloo,
        estimator: EstimatorSettings {
            advantage_estimator: Estimator::Rloo,
            ..Default::default()
        },
        ..OnlineConfig::default()
    },
    |_| {}
);

online_command!(
    PpoConfig,
    "`rlft ppo`: PPO with a critic, TRL <= 1.15 `PPOConfig`'s defaults (`kl_coef = 0.05`, \
     `num_ppo_epochs = 4`, `vf_coef = 0.1`, `cliprange_value = 0.2`, `gamma = 1`, \
     `lam = 0.95`, one completion per prompt, the loss a token mean per micro-batch) over the \
     online config; the critic starts from `model` unless `value_model` says otherwise.",
    OnlineConfig {
        args: TrainingArgs {
            output_dir: PathBuf::from("artifacts/ppo"),
            ..OnlineConfig::default().args
        },
        beta: 0.05,
        num_generations: 1,
        num_iterations: 4,
        loss_type: LossType::Bnpo,
        estimator: EstimatorSettings {
            advantage_estimator: Estimator::Gae,
            ..Default::default()
        },
        ..OnlineConfig::default()
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
        .unwrap_or_else(|| toml::Value::String(OnlineConfig::default().args.model));
    table.insert("value_model".into(), model);
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::online::tests::parse_as as parse;

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
        let g: OnlineConfig = parse("advantage_estimator = \"reinforce_baseline\"").unwrap();
        assert_eq!(
            g.estimator.advantage_estimator,
            Estimator::ReinforceBaseline
        );
        assert_eq!(g.num_generations, 8);
    }

    #[test]
    fn the_loss_is_its_own_setting() {
        // `rlft rloo` trains RLOO's loss; the estimator alone keeps meaning RLOO's loss too.
        let r: RlooConfig = parse("").unwrap();
        assert_eq!(r.loss_type, LossType::Rloo);
        let g: OnlineConfig = parse("advantage_estimator = \"rloo\"").unwrap();
        assert_eq!(g.loss_type, LossType::Rloo);
        // A loss_type beside it is taken as given: RLOO's advantages, DAPO's loss.
        let g: OnlineConfig =
            parse("advantage_estimator = \"rloo\"\nloss_type = \"dapo\"").unwrap();
        assert_eq!(
            (g.estimator.advantage_estimator, g.loss_type),
            (Estimator::Rloo, LossType::Dapo)
        );
        let r: RlooConfig = parse("loss_type = \"grpo\"").unwrap();
        assert_eq!(r.loss_type, LossType::Grpo);
        // And RLOO's loss on GRPO's group-normalised advantages, without a KL.
        let g: OnlineConfig = parse("loss_type = \"rloo\"").unwrap();
        assert_eq!(g.estimator.advantage_estimator, Estimator::GroupNorm);
    }
}
