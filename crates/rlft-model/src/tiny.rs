//! Tiny random models for tests: any family, a few layers, a small vocabulary, weights from the
//! deterministic initialiser in [`crate::testing::det_init`] (the same function
//! `scripts/reference/tiny_models.py` uses, so Rust and transformers build identical models).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use crate::config::{Family, ModelConfig, RopeConfig, RopeScaling};
use crate::decoder::CausalLm;
use crate::error::Result;
use crate::testing::det_init::det_tensor;

/// A small config of `family` (vocab 512, hidden 64, 2 layers, GQA 4/2 heads): Llama gets Llama-3
/// rope scaling and untied embeddings, Qwen2 tied embeddings with q/k/v biases, Qwen3 q/k norms
/// and a head_dim different from hidden/heads.
pub fn tiny_config(family: Family) -> ModelConfig {
    let (head_dim, tie, scaling, theta) = match family {
        Family::Llama => (
            16,
            false,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
            10_000.0,
        ),
        Family::Qwen2 => (16, true, RopeScaling::Default, 1_000_000.0),
        Family::Qwen3 => (32, false, RopeScaling::Default, 1_000_000.0),
    };
    ModelConfig {
        family,
        vocab_size: 512,
        hidden_size: 64,
        intermediate_size: 128,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim,
        rms_norm_eps: 1e-6,
        rope: RopeConfig { theta, scaling },
        max_position_embeddings: 512,
        tie_word_embeddings: tie,
        attention_bias: family.default_qkv_bias(),
        mlp_bias: false,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        pad_token_id: Some(2),
    }
}

/// Every weight name and shape the config implies, in HF naming.
pub fn expected_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
    let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![c.vocab_size, h],
    )];
    let o_bias = c.attention_bias && c.family != Family::Qwen2;
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let mut lin = |name: &str, o: usize, inp: usize, bias: bool| {
            out.push((format!("{p}.{name}.weight"), vec![o, inp]));
            if bias {
                out.push((format!("{p}.{name}.bias"), vec![o]));
            }
        };
        lin("self_attn.q_proj", q, h, c.attention_bias);
        lin("self_attn.k_proj", kv, h, c.attention_bias);
        lin("self_attn.v_proj", kv, h, c.attention_bias);
        lin("self_attn.o_proj", h, q, o_bias);
        lin("mlp.gate_proj", i, h, c.mlp_bias);
        lin("mlp.up_proj", i, h, c.mlp_bias);
        lin("mlp.down_proj", h, i, c.mlp_bias);
        out.push((format!("{p}.input_layernorm.weight"), vec![h]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        if c.family.has_qk_norm() {
            out.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
            out.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !c.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![c.vocab_size, h]));
    }
    out
}

/// Deterministic random weights for `config` (same values as the Python reference script).
pub fn random_weights(
    config: &ModelConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    expected_shapes(config)
        .into_iter()
        .map(|(name, shape)| {
            let data = det_tensor(&name, seed, &shape);
            let t = Tensor::from_vec(data, shape.as_slice(), device)?.to_dtype(dtype)?;
            Ok((name, t))
        })
        .collect()
}

/// A tiny random model of `config`.
pub fn random_model(
    config: ModelConfig,
    seed: u64,
    dtype: DType,
    device: &Device,
) -> Result<CausalLm> {
    let w = random_weights(&config, seed, dtype, device)?;
    CausalLm::from_weights(config, w)
}

/// ChatML template used by the tiny test tokenizer (same shape as SmolLM2's and Qwen's).
pub const TINY_CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-unicode table: the printable stand-in character of each byte.
fn byte_chars() -> Vec<char> {
    let mut direct: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut out = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        if direct.contains(&b) {
            out[b as usize] = char::from_u32(b).expect("latin-1");
        } else {
            out[b as usize] = char::from_u32(256 + extra).expect("valid");
            extra += 1;
        }
    }
    direct.clear();
    out
}

/// The tiny tokenizer's vocabulary as a [`rlft_text::BpeSpec`] (what a GGUF file's
/// `tokenizer.ggml.*` keys hold): ids 0-2 are `<|endoftext|>`, `<|im_start|>` (bos),
/// `<|im_end|>` (eos, pad), then the 256 bytes; no merges; `smollm` pre-tokenizer.
pub fn tiny_bpe_spec() -> rlft_text::BpeSpec {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tokens.extend(byte_chars().into_iter().map(String::from));
    let mut token_types = vec![rlft_text::token_type::CONTROL; 3];
    token_types.extend(std::iter::repeat_n(rlft_text::token_type::NORMAL, 256));
    rlft_text::BpeSpec {
        model: Some("gpt2".into()),
        tokens,
        merges: Vec::new(),
        token_types,
        pre: Some("smollm".into()),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        pad_id: Some(2),
        add_bos: false,
    }
}

/// A byte-level tokenizer for tiny models ([`tiny_bpe_spec`] with [`TINY_CHAT_TEMPLATE`]).
/// Any text round-trips.
pub fn tiny_text_bundle() -> Result<rlft_text::TextBundle> {
    Ok(rlft_text::TextBundle::from_bpe_spec(
        &tiny_bpe_spec(),
        Some(TINY_CHAT_TEMPLATE.to_string()),
    )?)
}

/// Writes a tiny random model with the tiny tokenizer as an HF directory.
pub fn save_tiny_hf_dir(config: ModelConfig, seed: u64, dir: &std::path::Path) -> Result<()> {
    let model = random_model(config, seed, DType::F32, &Device::Cpu)?;
    let text = tiny_text_bundle()?;
    let generation = crate::GenerationConfig {
        eos_token_ids: vec![2],
        bos_token_id: Some(1),
        pad_token_id: Some(2),
        ..Default::default()
    };
    crate::export::save_hf_dir(
        &model,
        &text,
        &generation,
        dir,
        &crate::export::ExportOptions::default(),
    )
}
