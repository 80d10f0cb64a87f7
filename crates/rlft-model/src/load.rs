//! One entry point for every model source: an HF directory or a GGUF file.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlft_gguf::{GgufFile, Value};
use rlft_text::{load_tokenizer_dir, BpeSpec, TextBundle};

use crate::config::ModelConfig;
use crate::decoder::CausalLm;
use crate::error::{ModelError, Result};
use crate::generation_config::GenerationConfig;
use crate::gguf_load;
use crate::safetensors_io;

/// What a model source holds on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A Hugging Face model directory.
    HfDir,
    /// A GGUF file (dequantised on load).
    Gguf,
}

/// A model with its tokenizer, chat template and generation defaults.
#[derive(Debug, Clone)]
pub struct LoadedModel {
    /// The network.
    pub model: CausalLm,
    /// Tokenizer, special tokens and chat template.
    pub text: TextBundle,
    /// Generation defaults (eos ids and sampling).
    pub generation: GenerationConfig,
    /// Where it came from.
    pub source: PathBuf,
    /// Directory or GGUF.
    pub kind: SourceKind,
    /// Tensor types found in the source file (e.g. `Q4_1 x 121`), for `rlft inspect`.
    pub source_dtypes: Vec<(String, usize)>,
}

/// Options for [`load_model`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Where the weights live.
    pub device: Device,
    /// Weight dtype (`F32` or `BF16`).
    pub dtype: DType,
    /// Keep a GGUF file's matrices (linear layers, embedding, LM head) in their blocks
    /// instead of dequantising them ([`crate::weight::Weight::Quant`]): a frozen base for
    /// LoRA and for inference, about a fifth of the f32 memory. f32 on the CPU only; other
    /// sources ignore it.
    pub keep_quantized: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: Device::Cpu,
            dtype: DType::F32,
            keep_quantized: false,
        }
    }
}

/// Loads a model from an HF directory or a `.gguf` file.
pub fn load_model(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<LoadedModel> {
    let path = path.as_ref();
    if !matches!(opts.dtype, DType::F32 | DType::BF16) {
        return Err(ModelError::Invalid(format!(
            "dtype {:?} is not supported; use f32 or bf16",
            opts.dtype
        )));
    }
    if !path.exists() {
        return Err(ModelError::bad_file(
            path,
            "does not exist; pass an HF model directory, a .gguf file, or `default`",
        ));
    }
    if path.is_dir() {
        load_hf_dir(path, opts)
    } else {
        load_gguf(path, opts)
    }
}

fn load_hf_dir(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    if is_adapter_dir(dir) {
        let base = adapter_base_name(dir)?.unwrap_or_else(|| "its base model".into());
        return Err(ModelError::bad_file(
            dir,
            format!(
                "is a PEFT LoRA adapter (over `{base}`), not a whole model: load it over its base \
                 with load_adapter_merged (the rlft commands do this when --model names an \
                 adapter directory), or use the run's merged `final/` directory"
            ),
        ));
    }
    if let Some(arch) = crate::score::sequence_classification_arch(dir)? {
        return Err(ModelError::bad_file(
            dir.join("config.json"),
            format!(
                "is a `{arch}` (a reward / sequence-classification model with a `score` head, \
                 no LM head): it scores text but does not generate; load it with \
                 rlft_model::score::load_score_model (`rlft score`, a `type = \"model\"` \
                 reward), or pass the causal LM it was trained from"
            ),
        ));
    }
    let (config, weights, source_dtypes) = read_hf_weights(dir, opts)?;
    let model = CausalLm::from_weights(config, weights)?;
    finish_hf_load(dir, model, source_dtypes)
}

/// A model argument as a path: itself when it is a path, the cached file of a built-in model
/// when it names one (`default`, `qwen2.5-coder-0.5b`: fetched and verified once, see
/// `rlft_fetch`). An unknown name is an error that lists the built-in names.
pub fn resolve(model: &str) -> Result<PathBuf> {
    Ok(rlft_fetch::resolve(model)?)
}

/// Whether `dir` is a PEFT adapter directory (`adapter_config.json` and no `config.json`): a
/// LoRA run's `adapter/` or `checkpoint-N/`.
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(crate::peft::ADAPTER_CONFIG).is_file() && !dir.join("config.json").exists()
}

/// The `base_model_name_or_path` of adapter directory `dir` (`None` when it names none); as a
/// run writes it, the config's `model` (a path, or `default`).
pub fn adapter_base_name(dir: &Path) -> Result<Option<String>> {
    let path = dir.join(crate::peft::ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::bad_file(&path, format!("not valid JSON ({e})")))?;
    Ok(v.get("base_model_name_or_path")
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string))
}

/// The LoRA adapter in directory `adapter` loaded over the model at `base` and merged into its
/// weights: a plain model that generates and scores as the trained policy did. A GGUF base's
/// quantised blocks are dropped (the merged weights differ from them); tokenizer and
/// generation defaults come from the base.
pub fn load_adapter_merged(adapter: &Path, base: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let mut loaded = load_model(base, opts)?;
    loaded.model.drop_quantized();
    crate::peft::load_adapter(&mut loaded.model, adapter)?;
    crate::lora::merge_lora(&mut loaded.model)?;
    loaded.source = adapter.to_path_buf();
    Ok(loaded)
}

/// An HF directory's config, weights by name, and `(source dtype, tensor count)`.
pub(crate) type HfWeights = (
    ModelConfig,
    std::collections::HashMap<String, candle_core::Tensor>,
    Vec<(String, usize)>,
);

/// `config.json` and every safetensors tensor of an HF directory (converted to `opts`), with
/// the count of each source dtype.
pub(crate) fn read_hf_weights(dir: &Path, opts: &LoadOptions) -> Result<HfWeights> {
    let config = read_hf_config(dir)?;
    let files = safetensors_io::checkpoint_files(dir)?;
    let mut source_dtypes = std::collections::BTreeMap::new();
    let weights = safetensors_io::load_tensors(&files, opts.dtype, &opts.device, |dt| {
        *source_dtypes.entry(dt).or_insert(0usize) += 1
    })?;
    Ok((config, weights, source_dtypes.into_iter().collect()))
}

/// A [`LoadedModel`] of an HF directory's `model`: its tokenizer and generation defaults.
pub(crate) fn finish_hf_load(
    dir: &Path,
    model: CausalLm,
    source_dtypes: Vec<(String, usize)>,
) -> Result<LoadedModel> {
    let text = load_tokenizer_dir(dir)?;
    let mut generation = GenerationConfig::from_dir(dir)?.unwrap_or_default();
    fill_generation_defaults(&mut generation, &model.config, &text);
    Ok(LoadedModel {
        model,
        text,
        generation,
        source: dir.to_path_buf(),
        kind: SourceKind::HfDir,
        source_dtypes,
    })
}

/// `dir/config.json` as a [`ModelConfig`]; errors name the file.
pub(crate) fn read_hf_config(dir: &Path) -> Result<ModelConfig> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ModelError::bad_file(
                &cfg_path,
                "missing; an HF model directory needs config.json next to its safetensors",
            )
        } else {
            ModelError::io(&cfg_path, e)
        }
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        ModelError::bad_file(
            &cfg_path,
            format!("not valid JSON ({e}); fix or re-download it"),
        )
    })?;
    ModelConfig::from_hf_json(&json).map_err(|e| match e {
        ModelError::Config(m) => ModelError::bad_file(&cfg_path, m),
        ModelError::UnknownArchitecture(m) => {
            ModelError::UnknownArchitecture(format!("{m} in {}", cfg_path.display()))
        }
        other => other,
    })
}

/// What a model source is, read without its weights: `config.json` and the tokenizer files of
/// an HF directory, or the header of a GGUF file (metadata and tensor infos, not the tensor
/// data). For planning a run's memory before loading anything.
#[derive(Debug, Clone)]
pub struct ModelMetadata {
    /// Shape and family.
    pub config: ModelConfig,
    /// Tokenizer, special tokens and chat template.
    pub text: TextBundle,
    /// Generation defaults (eos ids and sampling).
    pub generation: GenerationConfig,
    /// Where it came from.
    pub source: PathBuf,
    /// Directory or GGUF.
    pub kind: SourceKind,
    /// Bytes [`load_model`] holds at once while it reads the weights: the whole GGUF file, or
    /// the largest safetensors file of a directory.
    pub largest_file_bytes: u64,
    /// Bytes of GGUF blocks an f32 CPU load keeps beside the weights for decoding
    /// ([`rlft_kernels::quant`]); 0 for HF directories.
    pub decode_block_bytes: u64,
    /// `(parameters, bytes)` of the matrices a LoRA run keeps in their GGUF blocks instead of
    /// f32 ([`LoadOptions::keep_quantized`]); `(0, 0)` for HF directories.
    pub frozen_blocks: (u64, u64),
}

/// Reads a model's config, tokenizer and generation defaults without loading its weights (see
/// [`ModelMetadata`]). Errors are those [`load_model`] gives for the same source.
pub fn load_metadata(path: impl AsRef<Path>) -> Result<ModelMetadata> {
    let path = path.as_ref();
    if !path.exists() {
        return Err(ModelError::bad_file(
            path,
            "does not exist; pass an HF model directory, a .gguf file, or `default`",
        ));
    }
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    if path.is_dir() {
        let config = read_hf_config(path)?;
        let largest_file_bytes = safetensors_io::checkpoint_files(path)?
            .iter()
            .map(|f| size(f))
            .max()
            .unwrap_or(0);
        let text = load_tokenizer_dir(path)?;
        let mut generation = GenerationConfig::from_dir(path)?.unwrap_or_default();
        fill_generation_defaults(&mut generation, &config, &text);
        return Ok(ModelMetadata {
            config,
            text,
            generation,
            source: path.to_path_buf(),
            kind: SourceKind::HfDir,
            largest_file_bytes,
            decode_block_bytes: 0,
            frozen_blocks: (0, 0),
        });
    }
    let mut g = GgufFile::open_header(path)?;
    if g.tensor("rope_freqs.weight").is_some() {
        // Llama-3 rope factors are a tensor in the data section: read the file after all.
        g = GgufFile::open(path)?;
    }
    let config = gguf_load::config_from_gguf(&g, path)?;
    let template = g
        .metadata()
        .get("tokenizer.chat_template")
        .and_then(Value::as_str)
        .map(str::to_string);
    let text = TextBundle::from_bpe_spec(&bpe_spec(&g, path)?, template)?;
    let mut generation = gguf_load::generation_from_gguf(&config);
    fill_generation_defaults(&mut generation, &config, &text);
    Ok(ModelMetadata {
        config,
        text,
        generation,
        source: path.to_path_buf(),
        kind: SourceKind::Gguf,
        largest_file_bytes: size(path),
        decode_block_bytes: gguf_load::decode_block_bytes(&g),
        frozen_blocks: gguf_load::frozen_blocks(&g),
    })
}

fn fill_generation_defaults(g: &mut GenerationConfig, c: &ModelConfig, text: &TextBundle) {
    if g.eos_token_ids.is_empty() {
        g.eos_token_ids = c.eos_token_ids.clone();
    }
    if g.eos_token_ids.is_empty() {
        g.eos_token_ids.extend(text.eos_id());
    }
    g.bos_token_id = g.bos_token_id.or(c.bos_token_id).or(text.bos_id());
    g.pad_token_id = g.pad_token_id.or(c.pad_token_id).or(text.pad_id());
}

fn bpe_spec(g: &GgufFile, path: &Path) -> Result<BpeSpec> {
    let m = g.metadata();
    let strings = |k: &str| -> Vec<String> {
        m.get(k)
            .and_then(Value::as_array)
            .and_then(|a| a.as_strings())
            .map(<[String]>::to_vec)
            .unwrap_or_default()
    };
    let tokens = strings("tokenizer.ggml.tokens");
    if tokens.is_empty() {
        return Err(ModelError::bad_file(
            path,
            "GGUF has no tokenizer (tokenizer.ggml.tokens); use a GGUF with an embedded \
             tokenizer or an HF directory with tokenizer.json",
        ));
    }
    let id = |k: &str| m.get(k).and_then(Value::as_u32);
    Ok(BpeSpec {
        model: m
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .map(str::to_string),
        tokens,
        merges: strings("tokenizer.ggml.merges"),
        token_types: m
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .and_then(|a| a.to_ints::<i32>())
            .unwrap_or_default(),
        pre: m
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .map(str::to_string),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: m
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let g = GgufFile::open(path)?;
    let config = gguf_load::config_from_gguf(&g, path)?;
    let mut source_dtypes = std::collections::BTreeMap::new();
    for t in g.tensors() {
        *source_dtypes
            .entry(format!("{:?}", t.ggml_type))
            .or_insert(0usize) += 1;
    }
    let f32_cpu = opts.dtype == DType::F32 && matches!(opts.device, Device::Cpu);
    let blocks = if opts.keep_quantized && f32_cpu {
        gguf_load::load_gguf_blocks(&g, &config)?
    } else {
        Default::default()
    };
    let weights =
        gguf_load::load_gguf_weights_except(&g, &config, opts.dtype, &opts.device, &blocks)?;
    let kept = !blocks.is_empty();
    let mut model = CausalLm::from_weights_and_blocks(config, weights, blocks)?;
    if f32_cpu && !kept {
        // Frozen weights decode from their blocks (5-8.5 bits per weight instead of 32).
        model.attach_quantized(gguf_load::load_gguf_quantized(&g, &model.config)?);
    }
    let template = g
        .metadata()
        .get("tokenizer.chat_template")
        .and_then(Value::as_str)
        .map(str::to_string);
    let text = TextBundle::from_bpe_spec(&bpe_spec(&g, path)?, template)?;
    let mut generation = gguf_load::generation_from_gguf(&model.config);
    fill_generation_defaults(&mut generation, &model.config, &text);
    Ok(LoadedModel {
        model,
        text,
        generation,
        source: path.to_path_buf(),
        kind: SourceKind::Gguf,
        source_dtypes: source_dtypes.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::tiny::{save_tiny_hf_dir, tiny_config};

    #[test]
    fn metadata_of_an_hf_dir_matches_the_loaded_model() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m");
        save_tiny_hf_dir(tiny_config(Family::Qwen3), 3, &path).unwrap();
        let meta = load_metadata(&path).unwrap();
        let loaded = load_model(&path, &LoadOptions::default()).unwrap();
        assert_eq!(meta.config, loaded.model.config);
        assert_eq!(meta.generation, loaded.generation);
        assert_eq!(meta.kind, SourceKind::HfDir);
        let st = std::fs::metadata(path.join("model.safetensors")).unwrap();
        assert_eq!(meta.largest_file_bytes, st.len());
        let e = load_metadata(dir.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }
}
