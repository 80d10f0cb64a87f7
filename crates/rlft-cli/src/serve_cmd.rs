//! `rlft serve`: an OpenAI-compatible HTTP server (see the rlft-serve crate and docs/serve.md).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rlft_serve::{AdapterDir, ApiKey, EngineConfig, Registry, ServeOptions};

use crate::common::{load, ModelArgs};

/// `rlft serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A LoRA adapter (PEFT directory) served as model NAME (repeatable): `--lora NAME=PATH`.
    #[arg(long = "lora", value_name = "NAME=PATH")]
    pub lora: Vec<String>,
    /// Address to listen on (an address other machines reach, e.g. 0.0.0.0, wants --api-key).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The base model's name in requests (`model`); default: the --model argument as given.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most sequences decoding at once (a request takes n per prompt).
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Most requests waiting for room; more get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Most prompt tokens prefilled between two decode steps.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Largest request body in MiB; larger ones get 413.
    #[arg(long, default_value_t = 4)]
    pub max_body_mb: usize,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health (401 otherwise);
    /// default: the RLFT_API_KEY environment variable (which keeps the key out of `ps`).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Turn on /v1/load_lora_adapter and /v1/unload_lora_adapter (off by default), loading only
    /// adapters under DIR (`..` and symlinks out of it are refused); for a trainer's rollouts,
    /// its <output_dir>/rollout_adapters.
    #[arg(long, value_name = "DIR")]
    pub allow_runtime_lora: Option<PathBuf>,
}

/// The environment variable `--api-key` falls back to.
pub const API_KEY_ENV: &str = "RLFT_API_KEY";

/// The key from `--api-key`, else from `RLFT_API_KEY` (unset or empty: none).
fn api_key(flag: Option<&str>) -> Result<Option<ApiKey>> {
    let env = std::env::var(API_KEY_ENV).ok();
    let (key, from) = match (flag, env.as_deref()) {
        (Some(k), _) => (k, "--api-key"),
        (None, Some(k)) if !k.is_empty() => (k, API_KEY_ENV),
        _ => return Ok(None),
    };
    Ok(Some(ApiKey::new(key).with_context(|| from.to_string())?))
}

/// Parses `NAME=PATH`.
fn parse_lora(s: &str) -> Result<(String, PathBuf)> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => bail!("--lora takes NAME=PATH (a PEFT adapter directory), got `{s}`"),
    }
}

/// Runs `rlft serve`.
pub fn run(a: ServeArgs) -> Result<()> {
    let loras = a
        .lora
        .iter()
        .map(|s| parse_lora(s))
        .collect::<Result<Vec<_>>>()?;
    if a.max_num_seqs == 0 || a.max_body_mb == 0 {
        bail!("--max-num-seqs and --max-body-mb must be at least 1");
    }
    let api_key = api_key(a.api_key.as_deref())?;
    let runtime_lora = a
        .allow_runtime_lora
        .as_deref()
        .map(AdapterDir::new)
        .transpose()
        .context("--allow-runtime-lora")?;
    let m = load(&a.model)?;
    let name = a.served_model_name.clone().unwrap_or(a.model.model.clone());
    let registry = Registry::new(m, &name)?;
    for (n, p) in &loras {
        registry
            .load_adapter(n, p, false)
            .with_context(|| format!("--lora {n}={}", p.display()))?;
        eprintln!("loaded LoRA adapter `{n}` from {}", p.display());
    }
    let opts = ServeOptions {
        host: a.host,
        port: a.port,
        engine: EngineConfig {
            max_num_seqs: a.max_num_seqs,
            max_queue: a.max_queue,
            max_num_batched_tokens: a.max_num_batched_tokens,
        },
        max_body_bytes: a.max_body_mb << 20,
        api_key,
        runtime_lora,
    };
    rlft_serve::serve(registry, opts)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_arguments_need_a_name_and_a_path() {
        assert_eq!(
            parse_lora("math=out/adapter").unwrap(),
            ("math".to_string(), PathBuf::from("out/adapter"))
        );
        assert!(parse_lora("out/adapter").is_err());
        assert!(parse_lora("=out").is_err());
        assert!(parse_lora("math=").is_err());
    }
}
