//! Arguments and helpers shared by the subcommands.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::Args;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::LoadedModel;
use rlft_text::Message;

use crate::models;

/// Where and how `convert` and `merge` write an HF directory.
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Output HF directory.
    #[arg(long, short = 'o')]
    pub output: std::path::PathBuf,
    /// Dtype of the written weights: f32, bf16 or f16.
    #[arg(long = "save-dtype", default_value = "f32")]
    pub save_dtype: String,
    /// Shard size limit in MiB.
    #[arg(long, default_value_t = 4096)]
    pub shard_mib: usize,
    /// Replace the output directory if it exists.
    #[arg(long)]
    pub overwrite: bool,
}

impl ExportArgs {
    /// The export options these arguments ask for.
    pub fn options(&self) -> Result<rlft_model::export::ExportOptions> {
        Ok(rlft_model::export::ExportOptions {
            dtype: parse_dtype(&self.save_dtype)?,
            shard_bytes: self.shard_mib << 20,
            overwrite: self.overwrite,
            merge_adapters: false,
        })
    }
}

/// Which model to load and how.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// HF model directory, .gguf file, a built-in name (`default` = `smollm2-135m`,
    /// `qwen2.5-coder-0.5b`: `rlft fetch-model --list`), or a LoRA adapter directory (a run's
    /// `adapter/` or `checkpoint-N/`), loaded over its base and merged.
    #[arg(long, short = 'm', default_value = "default")]
    pub model: String,
    /// The base model of a LoRA adapter given as --model (default: the adapter's
    /// `base_model_name_or_path`, which a run sets to its config's `model`).
    #[arg(long)]
    pub base: Option<String>,
    /// Weight dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Parses `--dtype`.
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" => Ok(DType::F16),
        other => bail!("unknown dtype `{other}`; use f32 or bf16"),
    }
}

/// Parses `--device`.
pub fn parse_device(s: &str) -> Result<Device> {
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match s.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("bad device `{s}`; use cpu, cuda or cuda:N"))?,
        None => bail!("unknown device `{s}`; use cpu, cuda or cuda:N"),
    };
    if !candle_core::utils::cuda_is_available() {
        bail!("device `{s}` needs rlft built with CUDA: cargo build --release --features cuda");
    }
    let device = Device::new_cuda(ordinal)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = &device {
        // rlft runs every op on the device's one stream, where cudarc's per-buffer events only
        // cost (a record and a wait around each kernel launch; mistral.rs turns them off too).
        // SAFETY: with a single stream there is no cross-stream use for the events to order.
        unsafe { cuda.disable_event_tracking() };
    }
    Ok(device)
}

/// Loads the model named by the arguments, reporting the time on stderr.
pub fn load(args: &ModelArgs) -> Result<LoadedModel> {
    let path = models::resolve(&args.model)?;
    let opts = LoadOptions {
        device: parse_device(&args.device)?,
        dtype: parse_dtype(&args.dtype)?,
        ..Default::default()
    };
    let t0 = Instant::now();
    let m = load_any(&path, args.base.as_deref(), &opts)?;
    eprintln!(
        "loaded {} ({}, {:.1}M params) in {:.1}s",
        path.display(),
        m.model.config.family.architecture(),
        m.model.config.num_parameters() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(m)
}

/// Loads `path`: an HF directory or .gguf file, or a LoRA adapter directory over `base`
/// (default: the adapter's `base_model_name_or_path`; a built-in name such as `default` is
/// fetched), merged.
pub fn load_any(path: &Path, base: Option<&str>, opts: &LoadOptions) -> Result<LoadedModel> {
    if !rlft_model::load::is_adapter_dir(path) {
        if let Some(b) = base {
            bail!(
                "--base {b} is for a LoRA adapter directory, and {} is not one (it has no \
                 adapter_config.json, or has its own config.json); drop --base",
                path.display()
            );
        }
        return Ok(load_model(path, opts)?);
    }
    let name = match base {
        Some(b) => b.to_string(),
        None => rlft_model::load::adapter_base_name(path)?.with_context(|| {
            format!(
                "{} is a LoRA adapter whose adapter_config.json names no base model \
                 (base_model_name_or_path); pass --base MODEL",
                path.display()
            )
        })?,
    };
    let base_path = models::resolve(&name).with_context(|| {
        format!(
            "{} is a LoRA adapter over `{name}`; pass --base MODEL",
            path.display()
        )
    })?;
    if !base_path.exists() {
        bail!(
            "{} is a LoRA adapter over `{name}`, which is not on this machine (relative paths \
             are read from the current directory); pass --base MODEL",
            path.display()
        );
    }
    let m = rlft_model::load::load_adapter_merged(path, &base_path, opts)?;
    eprintln!(
        "LoRA adapter {} merged over {}",
        path.display(),
        base_path.display()
    );
    Ok(m)
}

/// Renders `messages` with the model's chat template into prompt token ids.
pub fn chat_prompt_ids(m: &LoadedModel, messages: &[Message]) -> Result<Vec<u32>> {
    let tpl = m
        .text
        .compile_chat_template()
        .context("this model has no chat template; drop --chat to use raw prompts")?;
    let text = tpl.render(messages, &m.text.render_options(true))?;
    Ok(m.text.encode(&text, false)?)
}
