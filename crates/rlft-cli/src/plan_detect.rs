//! Which trainer a config is for, told by its keys when only one trainer takes them all
//! (`rlft plan --config X.toml` without a trainer).
//!
//! Every trainer rejects keys it does not know, so a config fits the trainers whose keys
//! ([`Trainer::keys`], from the registry) include all of its own; a key no trainer knows is left
//! to the config loader's "did you mean" error. Values narrow further: a `loss_type` that
//! names a DPO loss ("sigmoid", "ipo"...) is DPO's or Online DPO's, any other the online
//! trainers'; Online DPO needs `[[rewards]]` or `reward_model_path`. Within the online family (GRPO, RLOO, PPO, one
//! key set) the estimator decides. When more than one trainer is left (an SFT config with
//! only `max_length` fits DPO and the reward model too), the error lists them and asks for
//! the trainer.

use anyhow::{bail, Result};
use rlft::algo::dpo_loss::DpoLossType;
use rlft::trainers::Trainer;

/// Keys only PPO's critic reads (canonical and aliases): a config with one is for `rlft ppo`.
const CRITIC_KEYS: &[&str] = &[
    "value_model",
    "critic_pretrain",
    "vf_coef",
    "cliprange_value",
    "value_clip",
    "whiten_rewards",
    "lam",
    "lambd",
];

/// One trainer per key set: GRPO stands for the online family (GRPO, RLOO and PPO share one).
const FAMILIES: [Trainer; 5] = [
    Trainer::Grpo,
    Trainer::Sft,
    Trainer::Dpo,
    Trainer::RewardModel,
    Trainer::OnlineDpo,
];

/// How the error names a family.
fn command(t: Trainer) -> String {
    if t.is_online() {
        "grpo (or rloo, ppo)".into()
    } else {
        t.name().into()
    }
}

/// Whether `v` (a name or a list of names) names DPO losses only.
fn dpo_losses(v: &toml::Value) -> bool {
    let one = |v: &toml::Value| v.as_str().is_some_and(|s| s.parse::<DpoLossType>().is_ok());
    match v {
        toml::Value::Array(a) => !a.is_empty() && a.iter().all(one),
        other => one(other),
    }
}

/// The trainer of `table` (see the module docs).
pub fn detect(table: &toml::Table) -> Result<Trainer> {
    let taken: Vec<Vec<String>> = FAMILIES.iter().map(|f| f.keys()).collect();
    let takes = |f: usize, k: &str| taken[f].iter().any(|t| t == k);
    let keys: Vec<&str> = table
        .keys()
        .map(String::as_str)
        .filter(|k| (0..FAMILIES.len()).any(|f| takes(f, k)))
        .collect();
    let dpo_loss = table.get("loss_type").map(dpo_losses);
    let fits: Vec<Trainer> = (0..FAMILIES.len())
        .filter(|&f| keys.iter().all(|k| takes(f, k)))
        .map(|f| FAMILIES[f])
        .filter(|f| {
            !matches!(
                (f, dpo_loss),
                (Trainer::Grpo, Some(true)) | (Trainer::Dpo | Trainer::OnlineDpo, Some(false))
            )
        })
        .filter(|f| {
            *f != Trainer::OnlineDpo
                || table.contains_key("rewards")
                || table.contains_key("reward_model_path")
        })
        .collect();
    match fits.as_slice() {
        [Trainer::Grpo] => Ok(online(table, &keys)),
        [one] => Ok(*one),
        [] => bail!(
            "no trainer takes all of this config's keys ({}); say which trainer it is for: \
             `rlft plan grpo --config ...` (or rloo, ppo, sft, dpo, reward-model, online-dpo), \
             and its loader names the key that does not belong",
            keys.join(", ")
        ),
        many => bail!(
            "cannot tell which trainer this config is for: its keys fit {}; say which: {}",
            many.iter()
                .map(|f| command(*f))
                .collect::<Vec<_>>()
                .join(", "),
            many.iter()
                .map(|f| format!("`rlft plan {} --config ...`", f.name()))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// GRPO, RLOO or PPO by the estimator (`advantage_estimator`, else a critic key for PPO,
/// `normalize_advantages` for RLOO).
fn online(table: &toml::Table, keys: &[&str]) -> Trainer {
    match table.get("advantage_estimator").and_then(|v| v.as_str()) {
        Some("gae") => Trainer::Ppo,
        Some("rloo") => Trainer::Rloo,
        Some(_) => Trainer::Grpo,
        None if keys.iter().any(|k| CRITIC_KEYS.contains(k)) => Trainer::Ppo,
        None if keys.contains(&"normalize_advantages") => Trainer::Rloo,
        None => Trainer::Grpo,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlft::config::read_table;

    fn t(text: &str) -> Result<Trainer> {
        detect(&text.parse().unwrap())
    }

    #[test]
    fn detects_the_trainer_from_keys() {
        assert_eq!(
            t("num_generations = 4\ndataset = 'd'").unwrap(),
            Trainer::Grpo
        );
        assert_eq!(t("rollout_batch_size = 2").unwrap(), Trainer::Grpo);
        assert_eq!(t("max_length = 64\npacking = false").unwrap(), Trainer::Sft);
        // Keys every trainer takes: the error names the commands.
        let e = t("dataset = 'd'\nlearning_rate = 1e-5").unwrap_err();
        assert!(e.to_string().contains("rlft plan grpo"), "{e}");
        // max_length alone fits SFT, DPO and the reward model.
        let e = t("max_length = 64\nuse_peft = true")
            .unwrap_err()
            .to_string();
        for c in [
            "`rlft plan sft ",
            "`rlft plan dpo ",
            "`rlft plan reward-model ",
        ] {
            assert!(e.contains(c), "{e}");
        }
        assert!(!e.contains("online-dpo"), "no rewards: {e}");
        // The online family: the estimator, else a critic key (ppo) or RLOO's own key.
        assert_eq!(t("advantage_estimator = 'gae'").unwrap(), Trainer::Ppo);
        assert_eq!(t("advantage_estimator = 'rloo'").unwrap(), Trainer::Rloo);
        assert_eq!(
            t("advantage_estimator = 'reinforce_baseline'\nvf_coef = 0.1").unwrap(),
            Trainer::Grpo
        );
        assert_eq!(t("kl_coef = 0.0\nvf_coef = 0.1").unwrap(), Trainer::Ppo);
        assert_eq!(t("normalize_advantages = false").unwrap(), Trainer::Rloo);
        assert_eq!(
            t("kl_coef = 0.05\nnum_generations = 4").unwrap(),
            Trainer::Grpo
        );
    }

    #[test]
    fn detects_the_preference_trainers() {
        // beta + max_length: only DPO takes both (Online DPO would need rewards).
        assert_eq!(t("max_length = 64\nbeta = 0.1").unwrap(), Trainer::Dpo);
        assert_eq!(t("precompute_ref_log_probs = true").unwrap(), Trainer::Dpo);
        // A DPO loss name is not GRPO's: beta alone is ambiguous, with loss_type it is DPO.
        assert!(t("beta = 0.1").is_err());
        assert_eq!(t("beta = 0.1\nloss_type = 'ipo'").unwrap(), Trainer::Dpo);
        assert_eq!(
            t("loss_type = ['sigmoid', 'sft']\nloss_weights = [1.0, 0.1]").unwrap(),
            Trainer::Dpo
        );
        assert_eq!(t("beta = 0.1\nloss_type = 'dapo'").unwrap(), Trainer::Grpo);
        assert_eq!(
            t("center_rewards_coefficient = 0.01").unwrap(),
            Trainer::RewardModel
        );
        assert_eq!(t("score_init = 'zeros'").unwrap(), Trainer::RewardModel);
        let rewards = "\n[[rewards]]\ntype = 'boxed_accuracy'\n";
        // missing_eos_penalty is GRPO's key too: with rewards alone, either.
        let e = t(&format!("missing_eos_penalty = 1.0{rewards}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`rlft plan grpo") && e.contains("`rlft plan online-dpo "),
            "{e}"
        );
        assert_eq!(
            t(&format!("max_new_tokens = 32\nbeta = 0.1{rewards}")).unwrap(),
            Trainer::OnlineDpo
        );
        // With num_generations it is an online (GRPO) config.
        assert_eq!(
            t(&format!("num_generations = 4\nbeta = 0.1{rewards}")).unwrap(),
            Trainer::Grpo
        ); // TRL's reward_model_path is Online DPO's reward without [[rewards]].
        assert_eq!(
            t("max_new_tokens = 32\nreward_model_path = 'rm/final'").unwrap(),
            Trainer::OnlineDpo
        );
    }

    #[test]
    fn detects_the_example_configs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        for (file, want) in [
            ("tiny_python_expr/cpu.toml", Some(Trainer::Grpo)),
            ("tiny_python_expr/cpu_rloo.toml", Some(Trainer::Rloo)),
            ("tiny_python_expr/cpu_ppo.toml", Some(Trainer::Ppo)),
            (
                "tiny_python_expr/cpu_reinforce_baseline.toml",
                Some(Trainer::Grpo),
            ),
            ("tiny_python_expr/cpu_dpo.toml", Some(Trainer::Dpo)),
            (
                "tiny_python_expr/cpu_online_dpo.toml",
                Some(Trainer::OnlineDpo),
            ),
            ("preference/rm.toml", Some(Trainer::RewardModel)),
            ("preference/grpo_rm.toml", Some(Trainer::Grpo)),
            // A loss_type list of DPO losses.
            ("preference/dpo.toml", Some(Trainer::Dpo)),
            // max_length and shared keys only: SFT, DPO or the reward model.
            ("sft/sft.toml", None),
        ] {
            let got = detect(&read_table(&root.join(file)).unwrap());
            match want {
                Some(w) => assert_eq!(got.unwrap(), w, "{file}"),
                None => assert!(got.is_err(), "{file}: {got:?}"),
            }
        }
    }
}
