//! Rollouts on OpenAI-compatible servers (vLLM, SGLang or `rlft serve`) with TRL 1.16's names
//! (`trl/trainer/grpo_config.py:118-170, 318-345`): `use_vllm = true` and `vllm_mode =
//! "server"` send generation to `vllm_server_base_url` (one URL or a list), and the sampler /
//! trainer log-prob mismatch is corrected by importance sampling
//! (`vllm_importance_sampling_*`). See `docs/grpo.md#rollouts-on-servers`.
//!
//! Differences from TRL, each on purpose:
//! - `vllm_server_base_url` also takes a list of URLs; prompt groups are spread over them and a
//!   server that fails is left for the others.
//! - `vllm_server_timeout` is both TRL's "wait this long for the server to be up" and the limit
//!   of one generation request (TRL has no per-request limit).
//! - Weights reach the servers as a PEFT adapter through `/v1/load_lora_adapter` (vLLM's
//!   runtime-LoRA API), so `use_peft = true` is required; TRL pushes full weights over NCCL.
//! - `vllm_mode = "colocate"` (TRL's default) is rlft's in-process rollout: generation runs in
//!   the trainer's process on the trainer's weights, as TRL's colocated vLLM does, so a TRL
//!   config with `use_vllm = true` and no `vllm_mode` trains as it is. The server keys are
//!   then unused.
//! - TOML has no null: `vllm_importance_sampling_clip_max = inf` stands for TRL's `None`.
//! - `vllm_server_api_key` (rlft's; TRL has no key) is sent as `Authorization: Bearer KEY` to
//!   servers started with `--api-key` (rlft serve, vLLM); unset, `RLFT_API_KEY` is used. The
//!   key is never printed: a config echoed or saved (`config.toml`, `run_summary.json`) shows
//!   `"***"` in its place.

use serde::{Deserialize, Serialize};

use crate::algo::is_correction::{IsCorrection, IsMode};
use crate::config::ConfigError;

/// Where vLLM runs (`vllm_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VllmMode {
    /// A separate server the trainer talks to over HTTP.
    Server,
    /// Generation in the trainer's process (TRL's default): rlft's own rollout.
    #[default]
    Colocate,
}

/// `vllm_server_base_url`: one URL or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServerUrls {
    /// One server.
    One(String),
    /// Several servers sharing the rollouts.
    Many(Vec<String>),
}

/// The environment variable `vllm_server_api_key` falls back to (`rlft serve` reads it too).
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

/// The rollout-server keys (flat keys of an online config).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct VllmSettings {
    /// Generate on OpenAI-compatible servers instead of in process (TRL `use_vllm`).
    pub use_vllm: bool,
    /// "server" (generate on `vllm_server_base_url`) or "colocate" (TRL's default: in process,
    /// as with `use_vllm = false`).
    pub vllm_mode: VllmMode,
    /// Base URL of the server, e.g. "http://127.0.0.1:8000", or a list of them; unset =
    /// `http://{vllm_server_host}:{vllm_server_port}`.
    pub vllm_server_base_url: Option<ServerUrls>,
    /// Host of the server when `vllm_server_base_url` is unset.
    pub vllm_server_host: String,
    /// Port of the server when `vllm_server_base_url` is unset.
    pub vllm_server_port: u16,
    /// Seconds to wait for each server to be up at start, and the limit of one request; a
    /// server that misses it is dropped and its prompt groups go to the others.
    pub vllm_server_timeout: f64,
    /// The servers' API key (`rlft serve --api-key`, vLLM `--api-key`), sent as
    /// `Authorization: Bearer KEY`; unset = the `RLFT_API_KEY` environment variable, or none.
    /// Saved and printed configs show `"***"`.
    pub vllm_server_api_key: Option<Secret>,
    /// Weight the policy loss by the trainer/sampler probability ratio (TRL
    /// `vllm_importance_sampling_correction`).
    pub vllm_importance_sampling_correction: bool,
    /// "token_truncate", "token_mask", "sequence_truncate" or "sequence_mask" (TRL's default):
    /// per-token or per-sequence ratios, clipped to or masked outside [clip_min, clip_max].
    pub vllm_importance_sampling_mode: IsMode,
    /// Upper bound C_max of the ratio (TRL 3.0; `inf` = none).
    pub vllm_importance_sampling_clip_max: f64,
    /// Lower bound C_min of the ratio (unset = none).
    pub vllm_importance_sampling_clip_min: Option<f64>,
    /// Deprecated TRL name of `vllm_importance_sampling_clip_max`; when set it wins.
    pub vllm_importance_sampling_cap: Option<f64>,
}

impl Default for VllmSettings {
    fn default() -> Self {
        VllmSettings {
            use_vllm: false,
            vllm_mode: VllmMode::Colocate,
            vllm_server_base_url: None,
            vllm_server_host: "0.0.0.0".into(),
            vllm_server_port: 8000,
            vllm_server_timeout: 240.0,
            vllm_server_api_key: None,
            vllm_importance_sampling_correction: true,
            vllm_importance_sampling_mode: IsMode::SequenceMask,
            vllm_importance_sampling_clip_max: 3.0,
            vllm_importance_sampling_clip_min: None,
            vllm_importance_sampling_cap: None,
        }
    }
}

impl VllmSettings {
    /// Whether rollouts go to servers.
    pub fn on_servers(&self) -> bool {
        self.use_vllm && self.vllm_mode == VllmMode::Server
    }

    /// The servers' base URLs (no trailing `/` or `/v1`).
    pub fn urls(&self) -> Vec<String> {
        let raw = match &self.vllm_server_base_url {
            Some(ServerUrls::One(u)) => vec![u.clone()],
            Some(ServerUrls::Many(v)) => v.clone(),
            None => vec![format!(
                "http://{}:{}",
                self.vllm_server_host, self.vllm_server_port
            )],
        };
        raw.iter()
            .map(|u| {
                let u = u.trim().trim_end_matches('/');
                u.strip_suffix("/v1").unwrap_or(u).to_string()
            })
            .collect()
    }

    /// The key to send the servers: `vllm_server_api_key`, else `RLFT_API_KEY` (unset or
    /// empty: none), checked to fit an HTTP header.
    pub fn api_key(&self) -> Result<Option<String>, ConfigError> {
        if let Some(k) = &self.vllm_server_api_key {
            check_api_key(k.expose(), "vllm_server_api_key")?;
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
        (self.on_servers() && self.vllm_importance_sampling_correction).then(|| IsCorrection {
            mode: self.vllm_importance_sampling_mode,
            clip_min: self.vllm_importance_sampling_clip_min,
            clip_max: self
                .vllm_importance_sampling_cap
                .unwrap_or(self.vllm_importance_sampling_clip_max),
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
                "use_vllm = true needs use_peft = true: rlft sends the trained weights to the \
                 servers as a LoRA adapter (/v1/load_lora_adapter) after each step; full \
                 fine-tuning would need TRL's NCCL weight sync, which rlft does not have. Set \
                 use_peft = true, or use_vllm = false"
                    .into(),
            );
        }
        let urls = self.urls();
        if urls.is_empty() {
            return bad("vllm_server_base_url is an empty list; give at least one URL".into());
        }
        for u in &urls {
            if let Err(m) = rlft_rewards::http_client::parse_url(u) {
                return bad(format!("vllm_server_base_url: {m}"));
            }
        }
        if !(self.vllm_server_timeout > 0.0 && self.vllm_server_timeout.is_finite()) {
            return bad(format!(
                "vllm_server_timeout must be a positive number of seconds (got {})",
                self.vllm_server_timeout
            ));
        }
        if let Some(c) = self.correction() {
            c.check().map_err(ConfigError::Invalid)?;
        }
        if let Some(k) = &self.vllm_server_api_key {
            check_api_key(k.expose(), "vllm_server_api_key")?;
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

    #[test]
    fn urls_and_checks() {
        let mut v = VllmSettings {
            use_vllm: true,
            vllm_mode: VllmMode::Server,
            ..Default::default()
        };
        assert_eq!(v.urls(), vec!["http://0.0.0.0:8000"]);
        v.vllm_server_base_url = Some(ServerUrls::Many(vec![
            "http://127.0.0.1:1/".into(),
            "http://127.0.0.1:2/v1".into(),
        ]));
        assert_eq!(v.urls(), vec!["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert!(v.check(true).is_ok());
        let e = v.check(false).unwrap_err().to_string();
        assert!(e.contains("use_peft = true"), "{e}");
        // Colocated: the in-process rollout, with nothing of the servers checked or used.
        v.vllm_mode = VllmMode::Colocate;
        assert!(v.check(false).is_ok());
        assert!(!v.on_servers() && v.correction().is_none());
        v.vllm_mode = VllmMode::Server;
        v.vllm_importance_sampling_clip_min = Some(5.0);
        assert!(v.check(true).unwrap_err().to_string().contains("clip_min"));
        v.vllm_importance_sampling_cap = Some(8.0);
        assert!(v.check(true).is_ok());
        assert_eq!(v.correction().unwrap().clip_max, 8.0);
    }

    #[test]
    fn the_api_key_is_checked_and_never_shown() {
        let mut v = VllmSettings {
            use_vllm: true,
            vllm_mode: VllmMode::Server,
            vllm_server_api_key: Some(Secret::new("sk-top-secret")),
            ..Default::default()
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
        let back: VllmSettings = toml::from_str(&shown[2]).unwrap();
        let e = back.check(true).unwrap_err().to_string();
        assert!(
            e.contains("vllm_server_api_key") && e.contains("RLFT_API_KEY"),
            "{e}"
        );
        for bad in ["", "two words", "line\nbreak"] {
            v.vllm_server_api_key = Some(Secret::new(bad));
            let e = v.check(true).unwrap_err().to_string();
            assert!(e.contains("vllm_server_api_key"), "{e}");
            assert!(bad.is_empty() || !e.contains(bad), "{e}");
        }
    }
}
