//! Typed TOML configs: every field documented, validated once, and errors that give the fix.
//!
//! Unknown keys are errors that name the closest valid key (`lerning_rate` -> `learning_rate`),
//! so a typo never silently falls back to a default. `--set key=value` overrides go through the
//! same path.

pub mod grpo;
pub mod sft;

use std::path::Path;

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

/// Levenshtein distance (small strings).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The valid key closest to `key`, if it is close enough to be a likely typo.
pub fn closest<'a>(key: &str, valid: &[&'a str]) -> Option<&'a str> {
    valid
        .iter()
        .map(|v| (edit_distance(key, v), *v))
        .filter(|(d, v)| *d <= 3.max(v.len() / 3))
        .min()
        .map(|(_, v)| v)
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
                hint: closest(k, valid)
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

/// Applies `key=value` overrides (dotted keys reach nested tables; the value is parsed as TOML,
/// falling back to a plain string).
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
        let parts: Vec<&str> = key.trim().split('.').collect();
        let mut cur = &mut *table;
        for p in &parts[..parts.len() - 1] {
            cur = cur
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| ConfigError::Invalid(format!("`{p}` in `{key}` is not a table")))?;
        }
        cur.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
