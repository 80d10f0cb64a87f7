//! Typed TOML configs: every field documented, validated once, and errors that give the fix.
//!
//! Unknown keys are errors that name the closest valid key (`lerning_rate` -> `learning_rate`),
//! so a typo never silently falls back to a default. `--set key=value` overrides go through the
//! same path.

pub mod args;
pub mod dpo;
pub mod online;
pub mod online_dpo;
pub mod reward;
pub mod rollout;
pub mod sft;

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use args::{
    lora_keys, training_keys, LoraSettings, LrSchedulerType, Optim, ReportTo, TrainingArgs,
};
pub use rollout::RolloutConfig;

/// Config errors; each message says which key and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// TOML syntax or type errors.
    #[error("{path}: {msg}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser said.
        msg: String,
    },
    /// A key that no field has.
    #[error("unknown key `{key}`{hint}; valid keys: {valid}")]
    UnknownKey {
        /// The key as written (dotted for nested tables).
        key: String,
        /// ", did you mean `x`?" when a close match exists.
        hint: String,
        /// The valid keys at that level.
        valid: String,
    },
    /// A value out of range or inconsistent with another.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// The two accessors of [`TrainerConfig`] for a config whose shared settings are its `args`
/// field (`shared_args!()`, or `shared_args!(0.args)` through a newtype).
macro_rules! shared_args {
    ($($field:tt).+) => {
        fn args(&self) -> &$crate::config::TrainingArgs {
            &self.$($field).+
        }

        fn args_mut(&mut self) -> &mut $crate::config::TrainingArgs {
            &mut self.$($field).+
        }
    };
    () => {
        shared_args!(args);
    };
}
pub(crate) use shared_args;

/// An algorithm's config: one [`TrainingArgs`] (flattened: its keys sit at the top level of the
/// TOML) plus the algorithm's own keys. Loading, key checks, overrides and validation of the
/// shared part live here once; an algorithm declares its keys, defaults and own checks.
pub trait TrainerConfig: Serialize + DeserializeOwned + Default {
    /// The algorithm's own top-level keys (besides [`training_keys`]): every field of its
    /// config, derived from the struct.
    fn keys() -> Vec<String> {
        let shared = training_keys();
        keys_of(&Self::default())
            .into_iter()
            .filter(|k| !shared.contains(k))
            .collect()
    }

    /// The shared settings.
    fn args(&self) -> &TrainingArgs;

    /// The shared settings, to set.
    fn args_mut(&mut self) -> &mut TrainingArgs;

    /// Other names accepted as keys (e.g. LightRFT's), rewritten by [`Self::resolve_aliases`].
    fn alias_keys() -> Vec<&'static str> {
        Vec::new()
    }

    /// Rewrites aliases into the canonical keys, before the table is read.
    fn resolve_aliases(_table: &mut toml::Table) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Checks of the algorithm's own settings (the shared ones are checked before).
    fn validate_own(&self) -> Result<(), ConfigError>;

    /// Range and consistency checks of the whole config; each error says how to fix it.
    fn validate(&self) -> Result<(), ConfigError> {
        self.args().validate()?;
        self.validate_own()
    }

    /// Reads `path`, applies `key=value` overrides, checks keys and values.
    fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table = read_table(path)?;
        apply_overrides(&mut table, overrides)?;
        Self::from_table(table, &path.display().to_string())
    }

    /// Builds from a parsed TOML table (`origin` names it in errors).
    fn from_table(mut table: toml::Table, origin: &str) -> Result<Self, ConfigError> {
        let (shared, own_keys, lora) = (training_keys(), Self::keys(), lora_keys());
        let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
        let mut valid: Vec<&str> = shared.clone();
        valid.extend(own_keys.iter().map(String::as_str));
        valid.extend(Self::alias_keys());
        let lora: Vec<&str> = lora.iter().map(String::as_str).collect();
        check_keys(&table, "", &valid, &[("lora", &lora)])?;
        Self::resolve_aliases(&mut table)?;
        let defaults = Self::default();
        let args = take_section(&mut table, &shared, defaults.args(), origin)?;
        // The algorithm's own keys read over its defaults (several commands share one config
        // type with different defaults, as TRL's RLOOConfig and GRPOConfig do).
        let mut own = toml::Table::try_from(&defaults)
            .map_err(|e| ConfigError::Invalid(format!("defaults of {origin}: {e}")))?;
        for k in &shared {
            own.remove(*k);
        }
        own.extend(table);
        let mut cfg: Self = from_toml(own, origin)?;
        *cfg.args_mut() = args;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// Deserialises `table`, naming `origin` in errors (toml names the key).
fn from_toml<T: DeserializeOwned>(table: toml::Table, origin: &str) -> Result<T, ConfigError> {
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            path: origin.to_string(),
            msg: e.to_string(),
        })
}

/// Moves the `keys` of a shared section out of `table` and reads them over the section's
/// `defaults` (which differ per algorithm, as TRL's do), so a key the user leaves out keeps the
/// algorithm's default and a bad value's error names its key.
pub fn take_section<S: Serialize + DeserializeOwned>(
    table: &mut toml::Table,
    keys: &[&str],
    defaults: &S,
    origin: &str,
) -> Result<S, ConfigError> {
    let mut section = toml::Table::try_from(defaults)
        .map_err(|e| ConfigError::Invalid(format!("defaults of {origin}: {e}")))?;
    for k in keys {
        if let Some(v) = table.remove(*k) {
            section.insert(k.to_string(), v);
        }
    }
    from_toml(section, origin)
}

/// Checks the keys of `table` (and of the nested tables named in `nested`) against `valid`.
pub fn check_keys(
    table: &toml::Table,
    prefix: &str,
    valid: &[&str],
    nested: &[(&str, &[&str])],
) -> Result<(), ConfigError> {
    for (k, v) in table {
        let full = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if !valid.contains(&k.as_str()) {
            return Err(ConfigError::UnknownKey {
                hint: rlft_suggest::closest(k, valid)
                    .map(|c| format!(", did you mean `{c}`?"))
                    .unwrap_or_default(),
                key: full,
                valid: valid.join(", "),
            });
        }
        if let (Some((_, sub)), toml::Value::Table(t)) =
            (nested.iter().find(|(n, _)| *n == k.as_str()), v)
        {
            check_keys(t, &full, sub, &[])?;
        }
    }
    Ok(())
}

/// Applies `key=value` overrides (dotted keys reach nested tables, and a number picks an entry
/// of an array, as Hydra's `rewards.0.path`; the value is parsed as TOML, falling back to a
/// plain string).
pub fn apply_overrides(table: &mut toml::Table, sets: &[String]) -> Result<(), ConfigError> {
    for s in sets {
        let (key, raw) = s.split_once('=').ok_or_else(|| {
            ConfigError::Invalid(format!("override `{s}` must look like key=value"))
        })?;
        let value: toml::Value = format!("v = {raw}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_string()));
        let key = key.trim();
        let parts: Vec<&str> = key.split('.').collect();
        let (last, path) = parts.split_last().expect("split yields one part at least");
        if last.parse::<usize>().is_ok() {
            return Err(ConfigError::Invalid(format!(
                "override `{key}` ends in an index; set a key of the entry instead, e.g. \
                 `{key}.weight=0.5`"
            )));
        }
        let mut cur = &mut *table;
        let mut i = 0;
        while i < path.len() {
            let indices: Vec<usize> = path[i + 1..].iter().map_while(|n| n.parse().ok()).collect();
            let empty = match indices.is_empty() {
                true => toml::Value::Table(toml::Table::new()),
                false => toml::Value::Array(Vec::new()),
            };
            let slot = cur.entry(path[i].to_string()).or_insert(empty);
            cur = step_into(slot, &path[..=i], &indices, key)?;
            i += 1 + indices.len();
        }
        cur.insert(last.to_string(), value);
    }
    Ok(())
}

/// Walks from `slot` (the value at `at`) through `indices` (array positions) and returns the
/// table the next key goes into: an error names the part of `key` that is not a table or not
/// an array, or an index past the array's end.
fn step_into<'a>(
    mut slot: &'a mut toml::Value,
    at: &[&str],
    indices: &[usize],
    key: &str,
) -> Result<&'a mut toml::Table, ConfigError> {
    let mut at = at.join(".");
    for &i in indices {
        let toml::Value::Array(a) = slot else {
            return Err(ConfigError::Invalid(format!(
                "`{at}` in `{key}` is not an array, so `{i}` cannot index it"
            )));
        };
        let n = a.len();
        slot = a.get_mut(i).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "`{at}.{i}` in `{key}`: `{at}` has {n} {} (indices from 0); add the entry \
                 to the config file",
                if n == 1 { "entry" } else { "entries" }
            ))
        })?;
        at = format!("{at}.{i}");
    }
    slot.as_table_mut()
        .ok_or_else(|| ConfigError::Invalid(format!("`{at}` in `{key}` is not a table")))
}

/// Reads a TOML file into a table.
pub fn read_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        msg: e.to_string(),
    })
}

/// The top-level keys `value` serialises to, in the order its struct declares them (flattened
/// sections in place, `None` fields included): every key list of the configs comes from here, so
/// none is kept by hand.
pub fn keys_of<T: Serialize>(value: &T) -> Vec<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        other => unreachable!("a config serialises to a map, not {other:?}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A config of type `C` from TOML text `s` (the config tests' one loader).
    pub(crate) fn parse<C: TrainerConfig>(s: &str) -> Result<C, ConfigError> {
        C::from_table(s.parse().unwrap(), "test.toml")
    }

    /// `extra` over a minimal valid online config (a dataset, one reward), loaded as `C`.
    pub(crate) fn parse_online<C: TrainerConfig>(extra: &str) -> Result<C, ConfigError> {
        parse(&format!(
            "{extra}\ndataset = \"d.jsonl\"\n[[rewards]]\ntype = \"boxed_accuracy\"\n"
        ))
    }

    #[test]
    fn typos_get_the_closest_key() {
        let t: toml::Table = "lerning_rate = 1e-5".parse().unwrap();
        let e = check_keys(&t, "", &["learning_rate", "seed"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`lerning_rate`") && e.contains("did you mean `learning_rate`"),
            "{e}"
        );
        let t: toml::Table = "[lora]\nrank = 8".parse().unwrap();
        let e = check_keys(&t, "", &["lora"], &[("lora", &["r", "lora_alpha"])])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lora.rank"), "{e}");
    }

    #[test]
    fn overrides_parse_values() {
        let mut t = toml::Table::new();
        apply_overrides(
            &mut t,
            &[
                "learning_rate=2e-5".into(),
                "lora.r=8".into(),
                "model=default".into(),
            ],
        )
        .unwrap();
        assert_eq!(t["learning_rate"].as_float(), Some(2e-5));
        assert_eq!(t["lora"]["r"].as_integer(), Some(8));
        assert_eq!(t["model"].as_str(), Some("default"));
        assert!(apply_overrides(&mut t, &["nokey".into()]).is_err());
    }

    #[test]
    fn overrides_index_arrays_of_tables() {
        let mut t: toml::Table = "[[rewards]]\ntype = \"rule\"\n[[rewards]]\ntype = \"model\"\n\
                                  path = \"a\"\n[lora]\nr = 4"
            .parse()
            .unwrap();
        let set = |t: &mut toml::Table, s: &str| apply_overrides(t, &[s.into()]);
        set(&mut t, "rewards.1.path=b/final").unwrap();
        set(&mut t, "rewards.0.weight=0.5").unwrap();
        assert_eq!(t["rewards"][1]["path"].as_str(), Some("b/final"));
        assert_eq!(t["rewards"][1]["type"].as_str(), Some("model"));
        assert_eq!(t["rewards"][0]["weight"].as_float(), Some(0.5));
        let err = |t: &mut toml::Table, s: &str| set(t, s).unwrap_err().to_string();
        let e = err(&mut t, "rewards.2.path=c");
        assert!(e.contains("`rewards` has 2 entries"), "{e}");
        let e = err(&mut t, "lora.0.r=8");
        assert!(e.contains("`lora` in `lora.0.r` is not an array"), "{e}");
        let e = err(&mut t, "rewards.1=x");
        assert!(e.contains("ends in an index"), "{e}");
        let e = err(&mut t, "rewards.path=x");
        assert!(
            e.contains("`rewards` in `rewards.path` is not a table"),
            "{e}"
        );
        // A missing array: no entries to index.
        let e = err(&mut t, "judges.0.name=x");
        assert!(e.contains("`judges` has 0 entries"), "{e}");
    }
}
