//! Writing a model as a Hugging Face directory that transformers loads: `config.json`,
//! `model.safetensors` (sharded with an index above `shard_bytes`), `generation_config.json`,
//! `tokenizer.json`, `tokenizer_config.json` (with the chat template).
//!
//! The directory is assembled under a temporary name next to the target and renamed into
//! place, so an interrupted export never leaves a half-written model under the final name.

use std::path::Path;

use candle_core::DType;
use rlft_text::{save_tokenizer_dir, TextBundle};

use crate::config::ModelConfig;
use crate::decoder::CausalLm;
use crate::error::{ModelError, Result};
use crate::generation_config::GenerationConfig;
use crate::safetensors_io::save_lazy;
use crate::util::write_json_atomic;
use crate::weight::LazyWeight;

/// Options of [`save_hf_dir`].
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Dtype of the written weights (`F32`, `BF16` or `F16`).
    pub dtype: DType,
    /// Largest shard in bytes before splitting into `model-0000N-of-0000M.safetensors`.
    pub shard_bytes: usize,
    /// Replace an existing directory at the target path.
    pub overwrite: bool,
    /// Merge the model's attached LoRA adapters into the written weights, one tensor at a time
    /// (the model itself keeps them): a LoRA run's merged export without a merged copy.
    pub merge_adapters: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            dtype: DType::F32,
            shard_bytes: 4 << 30,
            overwrite: false,
            merge_adapters: false,
        }
    }
}

pub(crate) fn dtype_name(d: DType) -> Result<&'static str> {
    match d {
        DType::F32 => Ok("float32"),
        DType::BF16 => Ok("bfloat16"),
        DType::F16 => Ok("float16"),
        other => Err(ModelError::Invalid(format!(
            "cannot export weights as {other:?}; use f32, bf16 or f16"
        ))),
    }
}

/// Writes `model` with its tokenizer and generation defaults as an HF directory at `dir`.
pub fn save_hf_dir(
    model: &CausalLm,
    text: &TextBundle,
    generation: &GenerationConfig,
    dir: &Path,
    opts: &ExportOptions,
) -> Result<()> {
    let dtype_str = dtype_name(opts.dtype)?;
    model.require_lm_head()?;
    let config = filled_config(model, generation).to_hf_json(dtype_str)?;
    save_dir(model, text, generation, dir, opts, &config, &[])
}

/// The model's config with the generation defaults' special ids filled in where it has none.
pub(crate) fn filled_config(model: &CausalLm, generation: &GenerationConfig) -> ModelConfig {
    let mut cfg = model.config.clone();
    if cfg.eos_token_ids.is_empty() {
        cfg.eos_token_ids = generation.eos_token_ids.clone();
    }
    cfg.bos_token_id = cfg.bos_token_id.or(generation.bos_token_id);
    cfg.pad_token_id = cfg.pad_token_id.or(generation.pad_token_id);
    cfg
}

/// Writes an HF directory: `config` as `config.json`, the model's weights (without `lm_head`
/// when `extra` is not empty: a head of another kind replaces it) plus `extra`, the generation
/// defaults and the tokenizer, assembled under a temporary name and renamed into place.
pub(crate) fn save_dir(
    model: &CausalLm,
    text: &TextBundle,
    generation: &GenerationConfig,
    dir: &Path,
    opts: &ExportOptions,
    config: &serde_json::Value,
    extra: &[(String, candle_core::Tensor)],
) -> Result<()> {
    dtype_name(opts.dtype)?;
    if model.has_adapters() && !opts.merge_adapters {
        return Err(ModelError::Invalid(
            "the model has LoRA adapters, which an HF directory cannot hold; merge them first \
             (rlft_model::lora::merge_lora, or `rlft merge`), or save them with \
             peft::save_adapter"
                .into(),
        ));
    }
    if dir.exists() && !opts.overwrite {
        return Err(ModelError::bad_file(
            dir,
            "already exists; choose another output directory or pass --overwrite",
        ));
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ModelError::io(parent, e))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    let result = (|| {
        write_json_atomic(&tmp.join("config.json"), config)?;
        write_json_atomic(&tmp.join("generation_config.json"), &generation.to_json())?;
        let mut weights = model.lazy_weights(opts.merge_adapters)?;
        if !extra.is_empty() {
            weights.retain(|w| w.name != "lm_head.weight");
            weights.extend(
                extra
                    .iter()
                    .map(|(n, t)| LazyWeight::from_tensor(n.clone(), t.clone())),
            );
        }
        save_lazy(&tmp, &weights, opts.dtype, opts.shard_bytes)?;
        save_tokenizer_dir(&tmp, text)?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| ModelError::io(dir, e))
}
