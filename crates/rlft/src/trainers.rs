//! The one list of trainers: each command's name, what it trains, and the keys its config
//! takes (derived from the config structs, with their aliases). The CLI's `rlft plan`, config
//! detection and the docs read it; a new trainer is one more entry here.

use std::fmt;
use std::str::FromStr;

use crate::config::dpo::DpoConfig;
use crate::config::online::{GrpoConfig, PpoConfig, RlooConfig};
use crate::config::online_dpo::OnlineDpoConfig;
use crate::config::reward::RewardConfig;
use crate::config::sft::SftConfig;
use crate::config::{training_keys, TrainerConfig};

/// A trainer, named as its command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Trainer {
    /// `rlft grpo`: the online trainer with GRPO's defaults.
    Grpo,
    /// `rlft rloo`: the online trainer with RLOO's defaults (beta 0.05, 2 generations).
    Rloo,
    /// `rlft ppo`: the online trainer with PPO's defaults; the critic starts from `model`.
    Ppo,
    /// `rlft sft`: supervised fine-tuning.
    Sft,
    /// `rlft dpo`: DPO and its relatives on preference pairs.
    Dpo,
    /// `rlft reward-model`: a Bradley-Terry reward model on preference pairs.
    RewardModel,
    /// `rlft online-dpo`: DPO on pairs the policy samples and the rewards rank.
    OnlineDpo,
}

impl Trainer {
    /// Every trainer, in the order the CLI lists them.
    pub const ALL: [Trainer; 7] = [
        Trainer::Grpo,
        Trainer::Rloo,
        Trainer::Ppo,
        Trainer::Sft,
        Trainer::Dpo,
        Trainer::RewardModel,
        Trainer::OnlineDpo,
    ];

    /// The command's name (`rlft NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Trainer::Grpo => "grpo",
            Trainer::Rloo => "rloo",
            Trainer::Ppo => "ppo",
            Trainer::Sft => "sft",
            Trainer::Dpo => "dpo",
            Trainer::RewardModel => "reward-model",
            Trainer::OnlineDpo => "online-dpo",
        }
    }

    /// Whether this is one of the online family (one config type, one trainer).
    pub fn is_online(self) -> bool {
        matches!(self, Trainer::Grpo | Trainer::Rloo | Trainer::Ppo)
    }

    /// Every top-level key its config takes: the shared ones, its own and their aliases.
    pub fn keys(self) -> Vec<String> {
        fn of<C: TrainerConfig>() -> Vec<String> {
            let mut keys = training_keys();
            keys.extend(C::keys());
            keys.extend(C::alias_keys().into_iter().map(String::from));
            keys
        }
        match self {
            Trainer::Grpo => of::<GrpoConfig>(),
            Trainer::Rloo => of::<RlooConfig>(),
            Trainer::Ppo => of::<PpoConfig>(),
            Trainer::Sft => of::<SftConfig>(),
            Trainer::Dpo => of::<DpoConfig>(),
            Trainer::RewardModel => of::<RewardConfig>(),
            Trainer::OnlineDpo => of::<OnlineDpoConfig>(),
        }
    }
}

impl fmt::Display for Trainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Trainer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let want = s.replace('_', "-");
        Trainer::ALL
            .into_iter()
            .find(|t| t.name() == want)
            .ok_or_else(|| {
                let names: Vec<&str> = Trainer::ALL.iter().map(|t| t.name()).collect();
                format!("unknown trainer `{s}`; one of {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_keys_come_from_the_configs() {
        for t in Trainer::ALL {
            assert_eq!(t.name().parse::<Trainer>(), Ok(t));
            let keys = t.keys();
            assert!(keys.iter().any(|k| k == "learning_rate"), "{t}");
        }
        assert_eq!("reward_model".parse::<Trainer>(), Ok(Trainer::RewardModel));
        assert!("grop".parse::<Trainer>().unwrap_err().contains("grpo"));
        // Optional fields that are unset by default are keys too; aliases are.
        let online = Trainer::Grpo.keys();
        for k in [
            "epsilon_high",
            "value_model",
            "rollout_batch_size",
            "kl_coef",
        ] {
            assert!(online.iter().any(|x| x == k), "{k}");
        }
        assert_eq!(online, Trainer::Ppo.keys());
        assert!(Trainer::Sft.keys().iter().any(|k| k == "packing"));
        assert!(!Trainer::Sft.keys().iter().any(|k| k == "num_generations"));
    }
}
