//! GGUF files (llama, qwen2, qwen3 archs) -> HF-named f32 tensors, config and tokenizer.
//!
//! Tensors are dequantised to f32 (training needs full precision); llama.cpp's q/k row
//! permutation of Llama models is undone so the weights are in HF layout.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rlft_gguf::{GgufFile, Value};

use crate::config::{Family, ModelConfig, RopeConfig, RopeScaling};
use crate::error::{ModelError, Result};
use crate::generation_config::GenerationConfig;
use rlft_kernels::quant::QuantWeight;

/// Maps a llama.cpp tensor name to its HF name (`None` for tensors that are not weights).
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let direct = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = direct {
        return Some(n.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Undoes llama.cpp's rotary row permutation of a Llama q/k weight `[heads * hd, in]` (or bias
/// `[heads * hd]`): `w.reshape(heads, hd/2, 2, in).transpose(1, 2).reshape(out, in)`.
pub fn unpermute_rows(w: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = w.dims().to_vec();
    let out = dims[0];
    let inner: usize = dims[1..].iter().product();
    let hd = out / heads;
    let t = w
        .reshape((heads, hd / 2, 2, inner))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?;
    Ok(t)
}

fn meta<'a>(g: &'a GgufFile, key: &str) -> Option<&'a Value> {
    g.metadata().get(key)
}

fn meta_usize(g: &GgufFile, arch: &str, key: &str) -> Option<usize> {
    meta(g, &format!("{arch}.{key}")).and_then(Value::as_usize)
}

/// A float value; an `f32` (how llama.cpp stores epsilons and rope bases) becomes the `f64` of
/// its shortest decimal form, so `1e-6` reads back as `1e-6`, not `9.99999997e-7`.
fn meta_f64(g: &GgufFile, arch: &str, key: &str) -> Option<f64> {
    match meta(g, &format!("{arch}.{key}"))? {
        Value::F32(v) => v.to_string().parse().ok(),
        other => other.as_f64(),
    }
}

/// Reads the model config from GGUF metadata.
pub fn config_from_gguf(g: &GgufFile, path: &Path) -> Result<ModelConfig> {
    let arch = meta(g, "general.architecture")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::bad_file(path, "no `general.architecture` in GGUF metadata"))?
        .to_string();
    let family = Family::from_name(&arch).ok_or_else(|| {
        ModelError::UnknownArchitecture(format!(
            "`{arch}` in {} (supported GGUF archs: llama, qwen2, qwen3)",
            path.display()
        ))
    })?;
    let need = |key: &str| {
        meta_usize(g, &arch, key).ok_or_else(|| {
            ModelError::bad_file(path, format!("GGUF metadata lacks `{arch}.{key}`"))
        })
    };
    let hidden_size = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let kv_heads = meta_usize(g, &arch, "attention.head_count_kv").unwrap_or(heads);
    let head_dim = meta_usize(g, &arch, "attention.key_length").unwrap_or(hidden_size / heads);
    let tensor_names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    let vocab_size = match meta_usize(g, &arch, "vocab_size") {
        Some(v) => v,
        None => g
            .tensors()
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .map(|t| t.shape()[0])
            .ok_or_else(|| ModelError::bad_file(path, "GGUF has no token_embd.weight"))?,
    };
    let theta = meta_f64(g, &arch, "rope.freq_base").unwrap_or(match family {
        Family::Llama => 10_000.0,
        _ => 1_000_000.0,
    });
    let scaling = if tensor_names.contains(&"rope_freqs.weight") {
        // Per-frequency divisors (llama.cpp's `generate_extra_tensors` for rope_type llama3).
        let (_, f) = g.read_f32("rope_freqs.weight")?;
        if f.len() != head_dim / 2 {
            return Err(ModelError::bad_file(
                path,
                format!(
                    "rope_freqs.weight has {} values; head_dim {head_dim} needs {}",
                    f.len(),
                    head_dim / 2
                ),
            ));
        }
        RopeScaling::Factors(f)
    } else {
        match meta(g, &format!("{arch}.rope.scaling.type")).and_then(Value::as_str) {
            None | Some("none") => RopeScaling::Default,
            Some("linear") => RopeScaling::Linear {
                factor: meta_f64(g, &arch, "rope.scaling.factor").unwrap_or(1.0),
            },
            Some(other) => {
                return Err(ModelError::config(format!(
                    "GGUF rope scaling `{other}` is not supported (linear, llama3 are)"
                )))
            }
        }
    };
    let tok = |k: &str| meta(g, &format!("tokenizer.ggml.{k}")).and_then(Value::as_u32);
    let attention_bias = tensor_names.iter().any(|n| n.ends_with("attn_q.bias"));
    let cfg = ModelConfig {
        family,
        vocab_size,
        hidden_size,
        intermediate_size: need("feed_forward_length")?,
        num_hidden_layers: need("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: meta_f64(g, &arch, "attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        rope: RopeConfig { theta, scaling },
        max_position_embeddings: meta_usize(g, &arch, "context_length").unwrap_or(4096),
        tie_word_embeddings: !tensor_names.contains(&"output.weight"),
        attention_bias,
        mlp_bias: tensor_names.iter().any(|n| n.ends_with("ffn_up.bias")),
        bos_token_id: tok("bos_token_id"),
        eos_token_ids: tok("eos_token_id").into_iter().collect(),
        pad_token_id: tok("padding_token_id"),
    };
    cfg.validate()?;
    Ok(cfg)
}

/// Generation defaults implied by the GGUF's tokenizer metadata.
pub fn generation_from_gguf(cfg: &ModelConfig) -> GenerationConfig {
    GenerationConfig {
        eos_token_ids: cfg.eos_token_ids.clone(),
        bos_token_id: cfg.bos_token_id,
        pad_token_id: cfg.pad_token_id,
        ..GenerationConfig::default()
    }
}

/// Dequantises every weight to f32, renames to HF and converts to `dtype` on `device`.
pub fn load_gguf_weights(
    g: &GgufFile,
    cfg: &ModelConfig,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    load_gguf_weights_except(g, cfg, dtype, device, &HashMap::new())
}

/// [`load_gguf_weights`] for the weights not in `kept` (HF names of matrices kept in GGUF
/// blocks, [`load_gguf_blocks`]): those are never dequantised.
pub fn load_gguf_weights_except(
    g: &GgufFile,
    cfg: &ModelConfig,
    dtype: DType,
    device: &Device,
    kept: &HashMap<String, QuantWeight>,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for info in g.tensors() {
        let Some(name) = hf_name(&info.name) else {
            continue;
        };
        if kept.contains_key(&name) {
            continue;
        }
        let (shape, data) = g.read_f32(&info.name)?;
        let mut t = Tensor::from_vec(data, shape.as_slice(), &Device::Cpu)?;
        if cfg.family == Family::Llama {
            if name.contains("q_proj") {
                t = unpermute_rows(&t, cfg.num_attention_heads)?;
            } else if name.contains("k_proj") {
                t = unpermute_rows(&t, cfg.num_key_value_heads)?;
            }
        }
        out.insert(name, t.to_dtype(dtype)?.to_device(device)?);
    }
    Ok(out)
}

/// Whether the decode path reads weight `name` of `shape` in `g`: linear weights and the LM
/// head (the embedding when the file has no separate head: tied).
fn decodes_from_blocks(g: &GgufFile, name: &str, shape: &[usize]) -> bool {
    let tied = g.tensor("output.weight").is_none();
    let used = name.ends_with("_proj.weight")
        || name == "lm_head.weight"
        || (tied && name == "model.embed_tokens.weight");
    used && shape.len() == 2
}

/// Bytes [`load_gguf_quantized`] keeps for the file's tensors (from the header alone).
pub fn decode_block_bytes(g: &GgufFile) -> u64 {
    g.tensors()
        .iter()
        .filter_map(|info| {
            let name = hf_name(&info.name)?;
            let shape = info.shape();
            if !decodes_from_blocks(g, &name, &shape) {
                return None;
            }
            QuantWeight::bytes_for(info.ggml_type, shape[0], shape[1]).map(|b| b as u64)
        })
        .sum()
}

/// The blocks of the model's linear weights and LM head that have a decode kernel (Q4_1,
/// Q8_0), by HF name and in HF row order, for [`CausalLm::attach_quantized`](crate::decoder::CausalLm::attach_quantized).
pub fn load_gguf_quantized(
    g: &GgufFile,
    cfg: &ModelConfig,
) -> Result<HashMap<String, QuantWeight>> {
    read_blocks(g, cfg, false)
}

/// The blocks of every matrix a frozen base keeps in its GGUF format (linear layers,
/// embedding, LM head; every quantised or 16-bit type, [`QuantWeight::from_gguf_any`]), by HF
/// name and in HF row order, for
/// [`CausalLm::from_weights_and_blocks`](crate::decoder::CausalLm::from_weights_and_blocks).
/// Matrices stored as f32 are not kept (no smaller than their tensor).
pub fn load_gguf_blocks(g: &GgufFile, cfg: &ModelConfig) -> Result<HashMap<String, QuantWeight>> {
    read_blocks(g, cfg, true)
}

/// `(parameters, bytes)` of the matrices [`load_gguf_blocks`] keeps (from the header alone).
pub fn frozen_blocks(g: &GgufFile) -> (u64, u64) {
    g.tensors()
        .iter()
        .filter_map(|info| {
            let name = hf_name(&info.name)?;
            let shape = info.shape();
            if !is_matrix(&name, &shape) {
                return None;
            }
            let bytes = QuantWeight::bytes_for_any(info.ggml_type, shape[0], shape[1])?;
            Some(((shape[0] * shape[1]) as u64, bytes as u64))
        })
        .fold((0, 0), |(p, b), (p1, b1)| (p + p1, b + b1))
}

/// Linear layers, the embedding and the LM head.
fn is_matrix(name: &str, shape: &[usize]) -> bool {
    let used = name.ends_with("_proj.weight")
        || name == "lm_head.weight"
        || name == "model.embed_tokens.weight";
    used && shape.len() == 2
}

fn read_blocks(
    g: &GgufFile,
    cfg: &ModelConfig,
    every_matrix: bool,
) -> Result<HashMap<String, QuantWeight>> {
    let mut out = HashMap::new();
    for info in g.tensors() {
        let Some(name) = hf_name(&info.name) else {
            continue;
        };
        let shape = info.shape();
        let wanted = if every_matrix {
            is_matrix(&name, &shape)
        } else {
            decodes_from_blocks(g, &name, &shape)
        };
        if !wanted {
            continue;
        }
        let data = g.tensor_data(&info.name)?;
        let (ty, rows, cols) = (info.ggml_type, shape[0], shape[1]);
        let q = if every_matrix {
            QuantWeight::from_gguf_any(ty, rows, cols, data)
        } else {
            QuantWeight::from_gguf(ty, rows, cols, data)
        };
        let Some(mut q) = q else {
            continue;
        };
        if cfg.family == Family::Llama {
            let heads = if name.contains("q_proj") {
                Some(cfg.num_attention_heads)
            } else if name.contains("k_proj") {
                Some(cfg.num_key_value_heads)
            } else {
                None
            };
            if let Some(heads) = heads {
                // The permutation the f32 weights went through, applied to row indices.
                let idx: Vec<f32> = (0..shape[0]).map(|i| i as f32).collect();
                let idx = Tensor::from_vec(idx, (shape[0], 1), &Device::Cpu)?;
                let perm: Vec<usize> = unpermute_rows(&idx, heads)?
                    .flatten_all()?
                    .to_vec1::<f32>()?
                    .into_iter()
                    .map(|v| v as usize)
                    .collect();
                q = q.permute_rows(&perm);
            }
        }
        out.insert(name, q);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hf() {
        assert_eq!(
            hf_name("blk.3.attn_q.weight").as_deref(),
            Some("model.layers.3.self_attn.q_proj.weight")
        );
        assert_eq!(
            hf_name("blk.0.attn_k_norm.weight").as_deref(),
            Some("model.layers.0.self_attn.k_norm.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, hd/2, in).swapaxes(1, 2).reshape(out, in)
        let (heads, hd, inp) = (2, 4, 3);
        let w = Tensor::arange(0f32, (heads * hd * inp) as f32, &Device::Cpu)
            .unwrap()
            .reshape((heads * hd, inp))
            .unwrap();
        let permuted = w
            .reshape((heads, 2, hd / 2, inp))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .reshape((heads * hd, inp))
            .unwrap();
        let back = unpermute_rows(&permuted, heads).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
    }
}
