//! The online config's aliases: other frameworks' names for its keys, and the batch sizes
//! that convert ([`resolve_aliases`]).
//!
//! LightRFT aliases: `rollout_batch_size` (prompts per rollout) sets `generation_batch_size =
//! rollout_batch_size x num_generations`; `n_samples_per_prompt` = `num_generations`;
//! `train_batch_size` (completions per optimiser step) sets `gradient_accumulation_steps =
//! train_batch_size / per_device_train_batch_size`; `micro_train_batch_size` =
//! `per_device_train_batch_size`; `init_kl_coef` = `beta`; `prompt_max_len` /
//! `generate_max_len` = `max_prompt_length` / `max_completion_length`; `actor_learning_rate` =
//! `learning_rate`; `num_episodes` = `num_train_epochs`; `max_epochs` = `num_iterations`.
//! TRL PPO's and OpenRLHF's: `kl_coef` = `beta`, `cliprange` = `epsilon`, `num_ppo_epochs` =
//! `num_iterations`, `num_mini_batches` (train batches per rollout), and the rest of [`ALIASES`].

use super::{servers, OnlineConfig};
use crate::config::ConfigError;

/// Other frameworks' names accepted as aliases: (alias, canonical key, meaning). LightRFT's and
/// OpenRLHF's, then TRL PPO's.
#[rustfmt::skip]
pub const ALIASES: &[(&str, &str, &str)] = &[
    ("n_samples_per_prompt",   "num_generations",             "completions per prompt"),
    ("micro_train_batch_size", "per_device_train_batch_size", "completions per micro-batch"),
    ("init_kl_coef",           "beta",                        "KL coefficient"),
    ("prompt_max_len",         "max_prompt_length",           "prompt tokens"),
    ("generate_max_len",       "max_completion_length",       "new tokens"),
    ("actor_learning_rate",    "learning_rate",               "learning rate"),
    ("num_episodes",           "num_train_epochs",            "passes over the prompts"),
    ("max_epochs",             "num_iterations",              "passes over each rollout"),
    ("eps_clip",               "epsilon",                     "clip range"),
    ("advantage_clamp",        "advantage_clip",              "advantage clamp"),
    ("kl_coef",                "beta",                        "KL coefficient"),
    ("cliprange",              "epsilon",                     "policy clip range"),
    ("num_ppo_epochs",         "num_iterations",              "passes over each rollout"),
    ("response_length",        "max_completion_length",       "new tokens"),
    ("lambd",                  "lam",                         "GAE lambda"),
    ("critic_pretrain",        "value_model",                 "critic initialisation"),
    ("value_clip",             "cliprange_value",             "value clip range"),
    ("dynamic_filtering",      "dynamic_sampling",            "drop groups without signal"),
];

/// Aliases whose value converts: (alias, what it sets).
pub(super) const DERIVED_ALIASES: &[&str] =
    &["rollout_batch_size", "train_batch_size", "num_mini_batches"];

/// Rewrites every alias of `table` into its canonical key (TRL's server keys, LightRFT's and
/// OpenRLHF's names, the batch sizes that convert).
pub(crate) fn resolve_aliases(table: &mut toml::Table) -> Result<(), ConfigError> {
    servers::resolve_trl_keys(table)?;
    for (alias, key, _) in ALIASES {
        if let Some(v) = table.remove(*alias) {
            if table.contains_key(*key) {
                return Err(ConfigError::Invalid(format!(
                    "both `{alias}` and `{key}` are set; `{alias}` is an alias of `{key}`, keep one"
                )));
            }
            table.insert(key.to_string(), v);
        }
    }
    // `advantage_estimator = "rloo"` alone trains RLOO's own loss, as it always has (and as
    // `rlft rloo` does); a `loss_type` beside it picks another.
    if table
        .get("advantage_estimator")
        .and_then(|v| v.as_str())
        .is_some_and(|e| e.trim().eq_ignore_ascii_case("rloo"))
        && !table.contains_key("loss_type")
    {
        table.insert("loss_type".into(), "rloo".into());
    }
    let int = |t: &toml::Table, k: &str| -> Result<Option<usize>, ConfigError> {
        match t.get(k) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) if *i > 0 => Ok(Some(*i as usize)),
            Some(v) => Err(ConfigError::Invalid(format!(
                "`{k}` must be a positive integer (got {v})"
            ))),
        }
    };
    let defaults = OnlineConfig::default();
    let g = int(table, "num_generations")?.unwrap_or(defaults.num_generations);
    let micro = int(table, "per_device_train_batch_size")?
        .unwrap_or(defaults.args.per_device_train_batch_size);
    if let Some(prompts) = int(table, "rollout_batch_size")? {
        only_one(
            table,
            "`rollout_batch_size` (prompts)",
            "generation_batch_size",
        )?;
        table.remove("rollout_batch_size");
        table.insert(
            "generation_batch_size".into(),
            toml::Value::Integer((prompts * g) as i64),
        );
    }
    if let Some(minis) = int(table, "num_mini_batches")? {
        // TRL PPO: a rollout is `num_mini_batches` train batches.
        only_one(table, "`num_mini_batches`", "generation_batch_size")?;
        table.remove("num_mini_batches");
        let accumulation = int(table, "gradient_accumulation_steps")?.unwrap_or(1);
        let train = int(table, "train_batch_size")?.unwrap_or(micro * accumulation);
        table.insert(
            "generation_batch_size".into(),
            toml::Value::Integer((minis * train) as i64),
        );
    }
    if let Some(train) = int(table, "train_batch_size")? {
        only_one(table, "`train_batch_size`", "gradient_accumulation_steps")?;
        if train % micro != 0 {
            return Err(ConfigError::Invalid(format!(
                "train_batch_size {train} is not a multiple of per_device_train_batch_size \
                 {micro}; make it {} or {}",
                (train / micro).max(1) * micro,
                (train / micro + 1) * micro
            )));
        }
        table.remove("train_batch_size");
        table.insert(
            "gradient_accumulation_steps".into(),
            toml::Value::Integer((train / micro) as i64),
        );
    }
    Ok(())
}

/// Errors when `key` is set beside `alias` (named as the user wrote it).
fn only_one(table: &toml::Table, alias: &str, key: &str) -> Result<(), ConfigError> {
    if table.contains_key(key) {
        return Err(ConfigError::Invalid(format!(
            "both {alias} and `{key}` are set; keep one"
        )));
    }
    Ok(())
}
