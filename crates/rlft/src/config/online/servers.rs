//! Rollouts on OpenAI-compatible servers (vLLM, SGLang or `rlft serve`): `rollout_servers`
//! (one base URL or a list) sends generation to them, and the sampler / trainer log-prob
//! mismatch is corrected by importance sampling (`rollout_is*`, verl's names). See
//! `docs/grpo.md#rollouts-on-servers`.
//!
//! TRL 1.16's keys (`trl/trainer/grpo_config.py:118-170, 318-345`) are accepted as they are
//! ([`resolve_trl_keys`]): `use_vllm = true` with `vllm_mode = "server"` and
//! `vllm_server_base_url` (or `vllm_server_host` / `vllm_server_port`) is `rollout_servers`;
//! `vllm_server_timeout`, `vllm_importance_sampling_*` are the keys below. Differences from
//! TRL, each on purpose:
//! - a list of URLs is allowed; prompt groups are spread over them and a server that fails is
//!   left for the others;
//! - the timeout is both TRL's "wait this long for the server to be up" and the limit of one
//!   generation request (TRL has no per-request limit);
//! - weights reach the servers as a PEFT adapter through `/v1/load_lora_adapter` (vLLM's
//!   runtime-LoRA API), so `use_peft = true` is required; TRL pushes full weights over NCCL;
//! - `vllm_mode = "colocate"` (TRL's default) is rlft's in-process rollout: generation runs in
//!   the trainer's process on the trainer's weights, as TRL's colocated vLLM does, so a TRL
//!   config with `use_vllm = true` and no `vllm_mode` trains as it is (the server keys are then
//!   unused);
//! - TOML has no null: `rollout_is_threshold = inf` stands for TRL's `None`;
//! - `rollout_server_api_key` (TRL has no key) is sent as `Authorization: Bearer KEY` to servers
//!   started with `--api-key` (rlft serve, vLLM); unset, `RLFT_API_KEY` is used. The key is
//!   never printed: a config echoed or saved (`config.toml`, `run_summary.json`) shows `"***"`.

use serde::{Deserialize, Serialize};

use crate::algo::is_correction::{IsCorrection, IsMode};
use crate::config::ConfigError;

/// `rollout_servers`: one URL or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServerUrls {
    /// One server.
    One(String),
    /// Several servers sharing the rollouts.
    Many(Vec<String>),
}

/// The environment variable `rollout_server_api_key` falls back to (`rlft serve` reads it too).
pub const API_KEY_ENV: &str = "RLFT_API_KEY";

/// What a saved or printed config shows instead of a secret.
pub const MASKED: &str = "***";

/// A secret read from the config: [`MASKED`] whenever the config is printed (`Debug`) or
/// serialised (the run's `config.toml` and `run_summary.json`), so it is never written in clear.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `s`.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(MASKED)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(MASKED)
    }
}

/// Rollouts on servers and their sampler correction (flat keys of an online config).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutServers {
    /// OpenAI-compatible servers that generate the rollouts: a base URL such as
    /// "http://127.0.0.1:8000", or a list of them; unset = generation in the trainer's process.
    /// TRL: `use_vllm = true`, `vllm_mode = "server"`, `vllm_server_base_url`.
    pub rollout_servers: Option<ServerUrls>,
    /// Seconds to wait for each server to be up at start, and the limit of one request; a
    /// server that misses it is dropped and its prompt groups go to the others (TRL
    /// `vllm_server_timeout`).
    pub rollout_server_timeout: f64,
    /// The servers' API key (`rlft serve --api-key`, vLLM `--api-key`), sent as
    /// `Authorization: Bearer KEY`; unset = the `RLFT_API_KEY` environment variable, or none.
    /// Saved and printed configs show `"***"`.
    pub rollout_server_api_key: Option<Secret>,
    /// Importance sampling of server rollouts: weight the policy loss by the trainer/sampler
    /// probability ratio (verl `rollout_is`; TRL `vllm_importance_sampling_correction`).
    pub rollout_is: bool,
    /// "token_truncate", "token_mask", "sequence_truncate" or "sequence_mask" (the default):
    /// per-token or per-sequence ratios, clipped to or masked outside the thresholds (TRL
    /// `vllm_importance_sampling_mode`).
    pub rollout_is_mode: IsMode,
    /// Upper bound of the ratio (verl `rollout_is_threshold`; TRL
    /// `vllm_importance_sampling_clip_max`, or its deprecated `_cap`; `inf` = none).
    pub rollout_is_threshold: f64,
    /// Lower bound of the ratio (verl `rollout_is_threshold_lower`; TRL
    /// `vllm_importance_sampling_clip_min`; unset = none).
    pub rollout_is_threshold_lower: Option<f64>,
}

impl Default for RolloutServers {
    /// TRL 1.16's defaults.
    fn default() -> Self {
        RolloutServers {
            rollout_servers: None,
            rollout_server_timeout: 240.0,
            rollout_server_api_key: None,
            rollout_is: true,
            rollout_is_mode: IsMode::SequenceMask,
            rollout_is_threshold: 3.0,
            rollout_is_threshold_lower: None,
        }
    }
}

/// TRL's keys that are ours under another name: (TRL key, rlft key).
const TRL_RENAMES: &[(&str, &str)] = &[
    ("vllm_server_timeout", "rollout_server_timeout"),
    ("vllm_server_api_key", "rollout_server_api_key"),
    ("vllm_importance_sampling_correction", "rollout_is"),
    ("vllm_importance_sampling_mode", "rollout_is_mode"),
    ("vllm_importance_sampling_clip_max", "rollout_is_threshold"),
    (
        "vllm_importance_sampling_clip_min",
        "rollout_is_threshold_lower",
    ),
];

/// TRL's keys that say where generation runs, folded into `rollout_servers`.
const TRL_PLACEMENT: &[&str] = &[
    "use_vllm",
    "vllm_mode",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_importance_sampling_cap",
];

/// Every TRL key [`resolve_trl_keys`] accepts.
pub fn trl_keys() -> Vec<&'static str> {
    TRL_RENAMES
        .iter()
        .map(|(k, _)| *k)
        .chain(TRL_PLACEMENT.iter().copied())
        .collect()
}

/// Rewrites TRL's `use_vllm` / `vllm_*` keys of `table` into this struct's keys: `use_vllm`
/// with `vllm_mode = "server"` becomes `rollout_servers` (`vllm_server_base_url`, else
/// `http://{vllm_server_host}:{vllm_server_port}`, TRL's defaults 0.0.0.0 and 8000);
/// `vllm_mode = "colocate"` (TRL's default) or `use_vllm = false` leaves generation in process
/// and the server keys unused; `vllm_importance_sampling_cap` (deprecated in TRL) wins over
/// `_clip_max`, as in TRL.
pub fn resolve_trl_keys(table: &mut toml::Table) -> Result<(), ConfigError> {
    let bad = |m: String| Err(ConfigError::Invalid(m));
    for (trl, ours) in TRL_RENAMES {
        if let Some(v) = table.remove(*trl) {
            if table.contains_key(*ours) {
                return bad(format!(
                    "both `{trl}` (TRL's name) and `{ours}` are set; keep one"
                ));
            }
            table.insert(ours.to_string(), v);
        }
    }
    if let Some(cap) = table.remove("vllm_importance_sampling_cap") {
        table.insert("rollout_is_threshold".into(), cap);
    }
    let use_vllm = match table.remove("use_vllm") {
        None => false,
        Some(toml::Value::Boolean(b)) => b,
        Some(v) => return bad(format!("use_vllm must be true or false (got {v})")),
    };
    let server = match table.remove("vllm_mode") {
        None => false,
        Some(toml::Value::String(m)) if m == "server" => true,
        Some(toml::Value::String(m)) if m == "colocate" => false,
        Some(v) => {
            return bad(format!(
                "vllm_mode must be \"server\" (generate on vllm_server_base_url) or \"colocate\" \
                 (in the trainer's process; got {v})"
            ))
        }
    };
    let base = table.remove("vllm_server_base_url");
    let host = table.remove("vllm_server_host");
    let port = table.remove("vllm_server_port");
    if !(use_vllm && server) {
        return Ok(());
    }
    if table.contains_key("rollout_servers") {
        return bad(
            "both `use_vllm` with `vllm_mode = \"server\"` (TRL's names) and `rollout_servers` \
             are set; keep `rollout_servers`"
                .into(),
        );
    }
    let urls = match base {
        Some(urls) => urls,
        None => {
            let host = match &host {
                None => "0.0.0.0",
                Some(toml::Value::String(h)) if !h.trim().is_empty() => h.trim(),
                Some(v) => return bad(format!("vllm_server_host must be a host name (got {v})")),
            };
            let port = match port {
                None => 8000,
                Some(toml::Value::Integer(p)) if (1..=65535).contains(&p) => p,
                Some(v) => return bad(format!("vllm_server_port must be a port number (got {v})")),
            };
            toml::Value::String(format!("http://{host}:{port}"))
        }
    };
    table.insert("rollout_servers".into(), urls);
    Ok(())
}

impl RolloutServers {
    /// Whether rollouts go to servers.
    pub fn on_servers(&self) -> bool {
        self.rollout_servers.is_some()
    }

    /// The servers' base URLs (no trailing `/` or `/v1`).
    pub fn urls(&self) -> Vec<String> {
        let raw = match &self.rollout_servers {
            Some(ServerUrls::One(u)) => vec![u.clone()],
            Some(ServerUrls::Many(v)) => v.clone(),
            None => Vec::new(),
        };
        raw.iter()
            .map(|u| {
                let u = u.trim().trim_end_matches('/');
                u.strip_suffix("/v1").unwrap_or(u).to_string()
            })
            .collect()
    }

    /// The key to send the servers: `rollout_server_api_key`, else `RLFT_API_KEY` (unset or
    /// empty: none), checked to fit an HTTP header.
    pub fn api_key(&self) -> Result<Option<String>, ConfigError> {
        if let Some(k) = &self.rollout_server_api_key {
            check_api_key(k.expose(), "rollout_server_api_key")?;
            return Ok(Some(k.expose().to_string()));
        }
        match std::env::var(API_KEY_ENV) {
            Ok(k) if !k.is_empty() => {
                check_api_key(&k, API_KEY_ENV)?;
                Ok(Some(k))
            }
            _ => Ok(None),
        }
    }

    /// The importance-sampling correction, when rollouts come from servers and it is on.
    pub fn correction(&self) -> Option<IsCorrection> {
        (self.on_servers() && self.rollout_is).then_some(IsCorrection {
            mode: self.rollout_is_mode,
            clip_min: self.rollout_is_threshold_lower,
            clip_max: self.rollout_is_threshold,
        })
    }

    /// The checks; `use_peft` is the run's LoRA switch.
    pub fn check(&self, use_peft: bool) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if !self.on_servers() {
            return Ok(());
        }
        if !use_peft {
            return bad(
                "rollout_servers (TRL: use_vllm with vllm_mode = \"server\") needs use_peft = \
                 true: rlft sends the trained weights to the servers as a LoRA adapter \
                 (/v1/load_lora_adapter) after each step; full fine-tuning would need TRL's NCCL \
                 weight sync, which rlft does not have. Set use_peft = true, or remove \
                 rollout_servers to generate in process"
                    .into(),
            );
        }
        let urls = self.urls();
        if urls.is_empty() {
            return bad("rollout_servers is an empty list; give at least one URL".into());
        }
        for u in &urls {
            if let Err(m) = rlft_rewards::http_client::parse_url(u) {
                return bad(format!("rollout_servers: {m}"));
            }
        }
        let timeout = self.rollout_server_timeout;
        if !(timeout > 0.0 && timeout.is_finite()) {
            return bad(format!(
                "rollout_server_timeout must be a positive number of seconds (got {timeout})"
            ));
        }
        if let Some(c) = self.correction() {
            c.check().map_err(ConfigError::Invalid)?;
        }
        if let Some(k) = &self.rollout_server_api_key {
            check_api_key(k.expose(), "rollout_server_api_key")?;
        }
        Ok(())
    }
}

/// A key must be printable ASCII (an `Authorization` header carries it) and not the mask a saved
/// config holds. The error never shows the key.
fn check_api_key(key: &str, from: &str) -> Result<(), ConfigError> {
    let why = if key == MASKED {
        "is the mask a saved config.toml holds in place of the key (the key itself is never \
         saved): set the real key, or leave the key out and set RLFT_API_KEY"
    } else if key.is_empty() {
        "is empty: set the key the servers were started with, or leave the key out"
    } else if !key.bytes().all(|b| b.is_ascii_graphic()) {
        "has a character other than printable ASCII (spaces and line breaks included), which an \
         Authorization header cannot carry"
    } else {
        return Ok(());
    };
    Err(ConfigError::Invalid(format!("{from} {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(urls: ServerUrls) -> RolloutServers {
        RolloutServers {
            rollout_servers: Some(urls),
            ..Default::default()
        }
    }

    fn resolved(text: &str) -> Result<toml::Table, ConfigError> {
        let mut t: toml::Table = text.parse().unwrap();
        resolve_trl_keys(&mut t).map(|_| t)
    }

    #[test]
    fn urls_and_checks() {
        let mut v = servers(ServerUrls::Many(vec![
            "http://127.0.0.1:1/".into(),
            "http://127.0.0.1:2/v1".into(),
        ]));
        assert_eq!(v.urls(), vec!["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert!(v.check(true).is_ok());
        let e = v.check(false).unwrap_err().to_string();
        assert!(e.contains("use_peft = true"), "{e}");
        v.rollout_is_threshold_lower = Some(5.0);
        assert!(v
            .check(true)
            .unwrap_err()
            .to_string()
            .contains("rollout_is_threshold"));
        v.rollout_is_threshold = 8.0;
        assert!(v.check(true).is_ok());
        assert_eq!(v.correction().unwrap().clip_max, 8.0);
        // In process: nothing of the servers checked or used.
        let local = RolloutServers::default();
        assert!(local.check(false).is_ok());
        assert!(!local.on_servers() && local.correction().is_none());
        let e = servers(ServerUrls::Many(vec![])).check(true).unwrap_err();
        assert!(e.to_string().contains("empty list"), "{e}");
    }

    #[test]
    fn trl_keys_are_accepted_as_they_are() {
        // use_vllm + server mode: the base URL, or host and port, become rollout_servers.
        let t = resolved(
            "use_vllm = true\nvllm_mode = \"server\"\nvllm_server_base_url = [\"http://a:1\"]\n\
             vllm_server_timeout = 60\nvllm_importance_sampling_clip_min = 0.5",
        )
        .unwrap();
        assert_eq!(
            t["rollout_servers"],
            toml::Value::Array(vec!["http://a:1".into()])
        );
        assert_eq!(t["rollout_server_timeout"], toml::Value::Integer(60));
        assert_eq!(t["rollout_is_threshold_lower"], toml::Value::Float(0.5));
        assert!(!t.keys().any(|k| k.starts_with("vllm") || k == "use_vllm"));
        let t =
            resolved("use_vllm = true\nvllm_mode = \"server\"\nvllm_server_port = 8001").unwrap();
        assert_eq!(t["rollout_servers"].as_str(), Some("http://0.0.0.0:8001"));
        // TRL's default mode, colocate, and use_vllm = false: generation stays in process.
        for text in [
            "use_vllm = true\nvllm_server_base_url = \"http://a:1\"",
            "vllm_mode = \"server\"\nvllm_server_host = \"a\"",
        ] {
            let t = resolved(text).unwrap();
            assert!(t.is_empty(), "{text}: {t:?}");
        }
        // The deprecated cap wins over clip_max, as in TRL.
        let t =
            resolved("vllm_importance_sampling_clip_max = 2.0\nvllm_importance_sampling_cap = 8.0")
                .unwrap();
        assert_eq!(t["rollout_is_threshold"], toml::Value::Float(8.0));
        // Conflicts and bad values say what to change.
        let e = |text: &str| resolved(text).unwrap_err().to_string();
        assert!(e("vllm_server_timeout = 1\nrollout_server_timeout = 2").contains("keep one"));
        assert!(
            e("use_vllm = true\nvllm_mode = \"server\"\nrollout_servers = \"http://a:1\"")
                .contains("keep `rollout_servers`")
        );
        assert!(e("vllm_mode = \"remote\"").contains("\"colocate\""));
        assert!(e("use_vllm = 1").contains("true or false"));
        assert!(
            e("use_vllm = true\nvllm_mode = \"server\"\nvllm_server_host = 1")
                .contains("host name")
        );
        assert_eq!(trl_keys().len(), 12);
    }

    #[test]
    fn the_api_key_is_checked_and_never_shown() {
        let mut v = RolloutServers {
            rollout_server_api_key: Some(Secret::new("sk-top-secret")),
            ..servers(ServerUrls::One("http://a:1".into()))
        };
        assert!(v.check(true).is_ok());
        assert_eq!(v.api_key().unwrap().as_deref(), Some("sk-top-secret"));
        let shown = [
            format!("{v:?}"),
            serde_json::to_string(&v).unwrap(),
            toml::to_string(&v).unwrap(),
        ];
        for s in &shown {
            assert!(!s.contains("top-secret") && s.contains(MASKED), "{s}");
        }
        // A saved config read back holds the mask, which is refused with the fix.
        let back: RolloutServers = toml::from_str(&shown[2]).unwrap();
        let e = back.check(true).unwrap_err().to_string();
        assert!(
            e.contains("rollout_server_api_key") && e.contains("RLFT_API_KEY"),
            "{e}"
        );
        for bad in ["", "two words", "line\nbreak"] {
            v.rollout_server_api_key = Some(Secret::new(bad));
            let e = v.check(true).unwrap_err().to_string();
            assert!(e.contains("rollout_server_api_key"), "{e}");
            assert!(bad.is_empty() || !e.contains(bad), "{e}");
        }
    }
}
