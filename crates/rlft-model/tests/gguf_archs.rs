//! GGUF files of all three supported archs (llama, qwen2, qwen3), written the way llama.cpp's
//! `convert_hf_to_gguf.py` writes them (tensor names, llama q/k row permutation, `rope_freqs`
//! for Llama-3 rope scaling, metadata keys and types, vocabulary padded with `[PAD{i}]`), as F32
//! and as Q8_0, load into the same model as the HF route: same config, same per-token log-probs,
//! same tokenizer ids, chat template and eos; an HF export of a GGUF-loaded model reloads to
//! the same rotary frequencies and log-probs; bad metadata gives errors naming the problem.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value as GValue};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use rlft_gguf::{GgmlType, GgufFile};
use rlft_model::config::{Family, ModelConfig, RopeScaling};
use rlft_model::decoder::{Batch, CausalLm};
use rlft_model::export::{save_hf_dir, ExportOptions};
use rlft_model::gguf_load::hf_name;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::ops::inv_freq;
use rlft_model::tiny::{
    random_weights, tiny_bpe_spec, tiny_config, tiny_text_bundle, TINY_CHAT_TEMPLATE,
};

const SEED: u64 = 11;
const FAMILIES: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Qwen3];
const TEXT: &str = "<|im_start|>user\nHi there, 12 + 345 = wörld? 🦀  [PAD300]\n<|im_end|>\n";

/// llama.cpp's name for an HF weight name (the inverse of `gguf_load::hf_name`).
fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").expect("layer weight");
    let (layer, rest) = rest.split_once('.').unwrap();
    let (module, kind) = rest.rsplit_once('.').unwrap();
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("no GGUF name for {other}"),
    };
    format!("blk.{layer}.{short}.{kind}")
}

/// llama.cpp's `LlamaModel.permute`:
/// `w.reshape(n_head, 2, rows / n_head / 2, *rest).swapaxes(1, 2).reshape(w.shape)`.
fn llama_cpp_permute(w: &Tensor, n_head: usize) -> Tensor {
    let dims = w.dims().to_vec();
    let inner: usize = dims[1..].iter().product();
    w.reshape((n_head, 2, dims[0] / n_head / 2, inner))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(dims)
        .unwrap()
}

/// `rope_freqs.weight` as llama.cpp's `LlamaModel.generate_extra_tensors` computes it for
/// `rope_type = "llama3"`: the divisor of each plain frequency (1 for short wavelengths,
/// `factor` for long ones, `1 / ((1 - smooth) / factor + smooth)` between).
///
/// (llama.cpp takes `old_context_len` from the top-level `original_max_position_embeddings`
/// of config.json, defaulting to 8192, not from `rope_scaling`: the two agree for every
/// Llama 3.x release. The tiny model's 64 is what it would write for a config.json with the
/// top-level key.)
fn llama_cpp_rope_freqs(cfg: &ModelConfig) -> Vec<f32> {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    } = cfg.rope.scaling
    else {
        panic!("not llama3 scaling")
    };
    let dim = cfg.head_dim;
    let old = original_max_position_embeddings as f64;
    let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
    (0..dim / 2)
        .map(|i| {
            // torch: 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
            let freq = 1.0 / (cfg.rope.theta as f32).powf((2 * i) as f32 / dim as f32);
            let wavelen = 2.0 * std::f64::consts::PI / freq as f64;
            let d = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth =
                    (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            d as f32
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Quant {
    F32,
    Q8_0,
    /// A Q4_K_M-like mix: Q4_K for most matrices with 256-wide rows, Q6_K for `down_proj` and
    /// the LM head, Q5_0 for `v_proj` and rows of 32-blocks, Q8_0 for the embedding.
    Mixed,
}

/// The type [`Quant::Mixed`] writes HF weight `hf` of shape `w` in.
fn mixed_type(hf: &str, w: &Tensor) -> GgmlDType {
    let cols = if w.rank() == 2 { w.dim(1).unwrap() } else { 0 };
    if w.rank() != 2 || !cols.is_multiple_of(32) {
        GgmlDType::F32
    } else if hf.contains("embed_tokens") {
        GgmlDType::Q8_0
    } else if !cols.is_multiple_of(256) || hf.contains("v_proj") {
        GgmlDType::Q5_0
    } else if hf.contains("down_proj") || hf.contains("lm_head") {
        GgmlDType::Q6K
    } else {
        GgmlDType::Q4K
    }
}

/// What to break in the written metadata.
#[derive(Clone, Copy, Default)]
struct Tweak<'a> {
    arch: Option<&'a str>,
    drop_key: Option<&'a str>,
    short_rope_freqs: bool,
}

/// Writes `weights` (HF names, f32) of `cfg` as llama.cpp would. Returns the GGUF tensor names
/// with their HF shapes.
fn write_gguf(
    path: &Path,
    cfg: &ModelConfig,
    weights: &HashMap<String, Tensor>,
    quant: Quant,
    tweak: Tweak,
) -> Vec<(String, Vec<usize>)> {
    let arch = tweak.arch.unwrap_or(cfg.family.model_type());
    let u32v = |v: usize| GValue::U32(v as u32);
    let mut meta: Vec<(String, GValue)> = vec![
        ("general.architecture".into(), GValue::String(arch.into())),
        ("general.name".into(), GValue::String("Tiny".into())),
        (
            "general.file_type".into(),
            GValue::U32(match quant {
                Quant::F32 => 0,
                Quant::Q8_0 => 7,
                Quant::Mixed => 15,
            }),
        ),
        ("general.quantization_version".into(), GValue::U32(2)),
        (
            format!("{arch}.context_length"),
            u32v(cfg.max_position_embeddings),
        ),
        (format!("{arch}.embedding_length"), u32v(cfg.hidden_size)),
        (
            format!("{arch}.feed_forward_length"),
            u32v(cfg.intermediate_size),
        ),
        (format!("{arch}.block_count"), u32v(cfg.num_hidden_layers)),
        (
            format!("{arch}.attention.head_count"),
            u32v(cfg.num_attention_heads),
        ),
        (
            format!("{arch}.attention.head_count_kv"),
            u32v(cfg.num_key_value_heads),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            GValue::F32(cfg.rms_norm_eps as f32),
        ),
        (
            format!("{arch}.rope.freq_base"),
            GValue::F32(cfg.rope.theta as f32),
        ),
    ];
    match cfg.family {
        // LlamaModel.set_gguf_parameters adds these two.
        Family::Llama => {
            meta.push((format!("{arch}.vocab_size"), u32v(cfg.vocab_size)));
            meta.push((format!("{arch}.rope.dimension_count"), u32v(cfg.head_dim)));
        }
        // Written when config.json has `head_dim`; Qwen3's differs from hidden / heads. (Left
        // out for the others so the hidden / heads fallback is exercised too.)
        Family::Qwen3 => {
            meta.push((format!("{arch}.attention.key_length"), u32v(cfg.head_dim)));
            meta.push((format!("{arch}.attention.value_length"), u32v(cfg.head_dim)));
        }
        Family::Qwen2 => {}
    }
    // get_vocab_base: the vocabulary padded to vocab_size with UNUSED `[PAD{i}]` tokens.
    let spec = tiny_bpe_spec();
    let mut tokens = spec.tokens.clone();
    let mut types = spec.token_types.clone();
    for i in tokens.len()..cfg.vocab_size {
        tokens.push(format!("[PAD{i}]"));
        types.push(rlft_text::token_type::UNUSED);
    }
    let strings = |v: &[String]| GValue::Array(v.iter().cloned().map(GValue::String).collect());
    meta.push((
        "tokenizer.ggml.model".into(),
        GValue::String(spec.model.clone().unwrap()),
    ));
    meta.push((
        "tokenizer.ggml.pre".into(),
        GValue::String(spec.pre.clone().unwrap()),
    ));
    meta.push(("tokenizer.ggml.tokens".into(), strings(&tokens)));
    meta.push((
        "tokenizer.ggml.token_type".into(),
        GValue::Array(types.into_iter().map(GValue::I32).collect()),
    ));
    // gguf-py's SpecialVocab writes merges only when there are some (the tiny vocab has none).
    if !spec.merges.is_empty() {
        meta.push(("tokenizer.ggml.merges".into(), strings(&spec.merges)));
    }
    for (key, id) in [
        ("bos_token_id", spec.bos_id),
        ("eos_token_id", spec.eos_id),
        ("unknown_token_id", spec.unk_id),
        ("padding_token_id", spec.pad_id),
    ] {
        meta.push((format!("tokenizer.ggml.{key}"), GValue::U32(id.unwrap())));
    }
    meta.push((
        "tokenizer.ggml.add_bos_token".into(),
        GValue::Bool(spec.add_bos),
    ));
    meta.push((
        "tokenizer.chat_template".into(),
        GValue::String(TINY_CHAT_TEMPLATE.into()),
    ));
    if let Some(k) = tweak.drop_key {
        meta.retain(|(name, _)| name != k);
    }

    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut shapes = Vec::new();
    if let RopeScaling::Llama3 { .. } = cfg.rope.scaling {
        let mut f = llama_cpp_rope_freqs(cfg);
        if tweak.short_rope_freqs {
            f.pop();
        }
        let n = f.len();
        let t = Tensor::from_vec(f, n, &Device::Cpu).unwrap();
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32).unwrap(),
        ));
        shapes.push(("rope_freqs.weight".into(), vec![n]));
    }
    for hf in names {
        let mut w = weights[hf].clone();
        if cfg.family == Family::Llama {
            // LlamaModel.modify_tensors: q with (n_head, n_head), k with (n_head, n_kv_head).
            if hf.contains("self_attn.q_proj") {
                w = llama_cpp_permute(&w, cfg.num_attention_heads);
            } else if hf.contains("self_attn.k_proj") {
                w = llama_cpp_permute(&w, cfg.num_key_value_heads);
            }
        }
        let name = gguf_name(hf);
        assert_eq!(hf_name(&name).as_deref(), Some(hf.as_str()), "{name}");
        let dtype = match quant {
            Quant::Q8_0 if quantised(&w) => GgmlDType::Q8_0,
            Quant::Mixed => mixed_type(hf, &w),
            _ => GgmlDType::F32,
        };
        shapes.push((name.clone(), w.dims().to_vec()));
        tensors.push((name, QTensor::quantize(&w, dtype).unwrap()));
    }
    let meta_refs: Vec<(&str, &GValue)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
    shapes
}

/// Which weights the Q8_0 file quantises: 2-D ones whose rows are whole 32-blocks.
fn quantised(w: &Tensor) -> bool {
    w.rank() == 2 && w.dim(1).unwrap().is_multiple_of(32)
}

/// The f32 model with every quantised weight replaced by candle's Q8_0 round trip of it.
fn q8_reference(cfg: &ModelConfig, weights: &HashMap<String, Tensor>) -> CausalLm {
    let w = weights
        .iter()
        .map(|(k, w)| {
            let w = if quantised(w) {
                QTensor::quantize(w, GgmlDType::Q8_0)
                    .unwrap()
                    .dequantize(&Device::Cpu)
                    .unwrap()
            } else {
                w.clone()
            };
            (k.clone(), w)
        })
        .collect();
    CausalLm::from_weights(cfg.clone(), w).unwrap()
}

/// Fused decoding of `a` and `b` samples the same tokens with log-probs within 1e-4.
fn assert_same_decoding(a: &CausalLm, b: &CausalLm, what: &str) {
    use rlft_model::generate::generate_with;
    use rlft_model::{GenerateRequest, SamplingParams};
    let none = |_: &[u32]| String::new();
    let req = GenerateRequest {
        prompts: vec![
            vec![5u32, 6, 7, 8, 9, 10],
            vec![5u32, 6, 7, 300],
            vec![41u32],
        ],
        n: 2,
        max_new_tokens: 12,
        sampling: SamplingParams::default(),
        seed: 7,
        eos_token_ids: vec![],
        stop_strings: vec![],
        pad_token_id: 2,
    };
    let (x, y) = (
        generate_with(a, &req, &none, true).unwrap(),
        generate_with(b, &req, &none, true).unwrap(),
    );
    for (x, y) in x.iter().zip(&y) {
        assert_eq!(x.token_ids, y.token_ids, "{what}");
        let d = max_diff(&x.logprobs, &y.logprobs);
        assert!(d < 1e-4, "{what}: log-probs differ by {d}");
    }
}

/// Per-position next-token log-probs of one unpadded row.
fn logprobs(model: &CausalLm, ids: &[u32]) -> Vec<f32> {
    let batch = Batch::left_padded(&[ids.to_vec()], &[0], 0, 0, &Device::Cpu).unwrap();
    let hidden = model.forward(&batch, None, false).unwrap();
    let t = ids.len();
    let h = hidden.dim(2).unwrap();
    let rows = hidden.reshape((t, h)).unwrap().narrow(0, 0, t - 1).unwrap();
    let targets = Tensor::new(&ids[1..], &Device::Cpu).unwrap();
    model
        .target_logprobs(&rows, &targets, 5)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn assert_inv_freq_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * y.abs(),
            "{what}: inv_freq[{i}] {x} vs {y}"
        );
    }
}

#[test]
fn gguf_of_every_arch_loads_like_the_hf_model() {
    let dir = tempfile::tempdir().unwrap();
    let tiny_text = tiny_text_bundle().unwrap();
    let text_ids = tiny_text.encode(TEXT, false).unwrap();
    // A fixed sequence exercising the whole vocabulary range and ~40 positions.
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 512).collect();
    for family in FAMILIES {
        let name = family.model_type();
        let cfg = tiny_config(family);
        let weights = random_weights(&cfg, SEED, DType::F32, &Device::Cpu).unwrap();
        let reference = CausalLm::from_weights(cfg.clone(), weights.clone()).unwrap();
        let want = logprobs(&reference, &seq);

        let f32_path = dir.path().join(format!("{name}-f32.gguf"));
        let q8_path = dir.path().join(format!("{name}-q8_0.gguf"));
        let shapes = write_gguf(&f32_path, &cfg, &weights, Quant::F32, Tweak::default());
        write_gguf(&q8_path, &cfg, &weights, Quant::Q8_0, Tweak::default());

        // candle writes dims reversed (ggml order); rlft-gguf's shape() reverses them back.
        for (path, quant) in [(&f32_path, Quant::F32), (&q8_path, Quant::Q8_0)] {
            let g = GgufFile::open(path).unwrap();
            assert_eq!(g.tensors().len(), shapes.len(), "{name}");
            assert_eq!(g.architecture(), Some(name));
            for (tname, shape) in &shapes {
                let info = g.tensor(tname).unwrap_or_else(|| panic!("{name}: {tname}"));
                assert_eq!(&info.shape(), shape, "{name}: {tname}");
                let ggml_dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
                assert_eq!(info.dims, ggml_dims, "{name}: {tname}");
                let want_type = if quant == Quant::Q8_0 && shape.len() == 2 {
                    GgmlType::Q8_0
                } else {
                    GgmlType::F32
                };
                assert_eq!(info.ggml_type, want_type, "{name}: {tname}");
            }
            assert_eq!(
                g.tensor("output.weight").is_some(),
                !cfg.tie_word_embeddings,
                "{name}"
            );
            assert_eq!(
                g.tensor("rope_freqs.weight").is_some(),
                family == Family::Llama
            );
        }

        let f32_model = load_model(&f32_path, &LoadOptions::default()).unwrap();
        let q8_model = load_model(&q8_path, &LoadOptions::default()).unwrap();
        // The metadata-only path (header, no tensor data) reads the same config and tokenizer.
        for (path, loaded) in [(&f32_path, &f32_model), (&q8_path, &q8_model)] {
            let meta = rlft_model::load::load_metadata(path).unwrap();
            assert_eq!(meta.config, loaded.model.config, "{name}: metadata config");
            assert_eq!(meta.generation, loaded.generation, "{name}");
            assert_eq!(
                meta.text.encode(TEXT, false).unwrap(),
                loaded.text.encode(TEXT, false).unwrap()
            );
            assert_eq!(
                meta.largest_file_bytes,
                std::fs::metadata(path).unwrap().len()
            );
            assert_eq!(
                meta.decode_block_bytes,
                loaded.model.quantized_bytes() as u64,
                "{name}: blocks predicted from the header"
            );
        }

        // Config: identical to the HF one, except that llama's rope scaling arrives as
        // llama.cpp's per-frequency divisors, which must give the same frequencies.
        let got_cfg = f32_model.model.config.clone();
        assert_eq!(q8_model.model.config, got_cfg, "{name}: Q8_0 config");
        let mut same_rope = got_cfg.clone();
        if family == Family::Llama {
            let RopeScaling::Factors(f) = &got_cfg.rope.scaling else {
                panic!("{name}: rope_freqs not read: {:?}", got_cfg.rope.scaling)
            };
            assert_eq!(f, &llama_cpp_rope_freqs(&cfg));
            assert_inv_freq_close(
                &inv_freq(&got_cfg.rope, got_cfg.head_dim),
                &inv_freq(&cfg.rope, cfg.head_dim),
                "llama GGUF rope_freqs vs HF llama3",
            );
            same_rope.rope.scaling = cfg.rope.scaling.clone();
        }
        assert_eq!(same_rope, cfg, "{name}: config");

        // Log-probs: F32 GGUF == HF model. Q8_0 GGUF == the HF model with candle's Q8_0
        // round trip of the same weights (rows are quantised independently, so llama's row
        // permutation commutes with it), and close to the f32 model (log-probs here are about
        // -10, and Q8_0 moves them by ~0.04).
        let got = logprobs(&f32_model.model, &seq);
        let d = max_diff(&got, &want);
        assert!(d < 1e-5, "{name}: F32 GGUF log-probs differ by {d}");
        let got8 = logprobs(&q8_model.model, &seq);
        let d8 = max_diff(&got8, &logprobs(&q8_reference(&cfg, &weights), &seq));
        assert!(d8 < 1e-5, "{name}: Q8_0 GGUF vs dequantised weights: {d8}");
        let d8 = max_diff(&got8, &want);
        assert!(d8 < 0.15, "{name}: Q8_0 GGUF log-probs differ by {d8}");
        assert!(
            q8_model.source_dtypes.iter().any(|(t, _)| t == "Q8_0"),
            "{:?}",
            q8_model.source_dtypes
        );

        // The Q8_0 blocks stay beside the f32 weights for decoding (every linear and the LM
        // head; none for the F32 file), and decoding from them gives what the f32 weights give.
        assert!(q8_model.model.head_quant.is_some(), "{name}");
        let lins = q8_model.model.linears();
        assert!(lins.iter().all(|(_, l)| l.quant.is_some()), "{name}");
        assert_eq!(f32_model.model.quantized_bytes(), 0, "{name}");
        let mut unquantised = q8_model.model.clone();
        unquantised.head_quant = None;
        for (_, l) in unquantised.linears_mut() {
            l.quant = None;
        }
        assert_same_decoding(&q8_model.model, &unquantised, name);
        // Any other dtype or device (bf16 here, as a CUDA load would be): the blocks are
        // dequantised to that dtype on load and none is kept.
        let bf16_opts = LoadOptions {
            dtype: DType::BF16,
            ..LoadOptions::default()
        };
        let bf16 = load_model(&q8_path, &bf16_opts).unwrap().model;
        assert!(
            bf16.named_weights()
                .iter()
                .all(|(_, w)| w.dtype() == DType::BF16),
            "{name}: bf16 load"
        );
        assert_eq!(bf16.quantized_bytes(), 0, "{name}: blocks kept off f32/CPU");
        let d = max_diff(&logprobs(&bf16, &seq), &got8);
        assert!(
            d < 0.3,
            "{name}: bf16 load of the Q8_0 GGUF: log-probs differ by {d}"
        );
        // Weights made trainable no longer decode from (or keep) their blocks.
        let mut trained = q8_model.model.clone();
        rlft_model::trainable::make_trainable(&mut trained, |n| n.contains("mlp.")).unwrap();
        let trained_lins = trained.linears();
        for (n, l) in &trained_lins {
            assert_eq!(l.quant.is_some(), !n.contains("mlp."), "{name}: {n}");
        }

        // Tokenizer, chat template and eos.
        for loaded in [&f32_model, &q8_model] {
            assert_eq!(loaded.text.encode(TEXT, false).unwrap(), text_ids, "{name}");
            assert_eq!(loaded.text.tokenizer.get_vocab_size(true), cfg.vocab_size);
            assert_eq!(
                loaded.text.chat_template.as_deref(),
                Some(TINY_CHAT_TEMPLATE),
                "{name}"
            );
            assert_eq!(loaded.generation.eos_token_ids, vec![2], "{name}");
            assert_eq!(loaded.generation.bos_token_id, Some(1), "{name}");
            assert_eq!(loaded.generation.pad_token_id, Some(2), "{name}");
            assert_eq!(loaded.text.eos_id(), Some(2), "{name}");
        }

        // GGUF -> HF directory -> reload: same rotary frequencies (llama: the divisors are
        // fitted back to llama3 parameters), same log-probs.
        let hf_dir = dir.path().join(format!("{name}-hf"));
        save_hf_dir(
            &f32_model.model,
            &f32_model.text,
            &f32_model.generation,
            &hf_dir,
            &ExportOptions::default(),
        )
        .unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(hf_dir.join("config.json")).unwrap())
                .unwrap();
        let exported = ModelConfig::from_hf_json(&json).unwrap();
        if family == Family::Llama {
            assert!(
                matches!(exported.rope.scaling, RopeScaling::Llama3 { .. }),
                "{:?}",
                exported.rope.scaling
            );
        }
        assert_inv_freq_close(
            &inv_freq(&exported.rope, exported.head_dim),
            &inv_freq(&got_cfg.rope, got_cfg.head_dim),
            &format!("{name}: exported config.json vs GGUF"),
        );
        let reloaded = load_model(&hf_dir, &LoadOptions::default()).unwrap();
        let mut exported_same = reloaded.model.config.clone();
        exported_same.rope.scaling = same_rope.rope.scaling.clone();
        assert_eq!(exported_same, same_rope, "{name}: exported config");
        let d = max_diff(&logprobs(&reloaded.model, &seq), &got);
        assert!(d < 1e-5, "{name}: HF export of the GGUF differs by {d}");
        assert_eq!(reloaded.text.encode(TEXT, false).unwrap(), text_ids);

        if family == Family::Llama {
            // The test can see a rope mistake: plain RoPE gives other log-probs.
            let mut plain = cfg.clone();
            plain.rope.scaling = RopeScaling::Default;
            let plain = CausalLm::from_weights(plain, weights.clone()).unwrap();
            let d = max_diff(&logprobs(&plain, &seq), &want);
            assert!(d > 1e-3, "llama3 scaling changes log-probs by only {d}");
        }
    }
}

#[test]
fn gguf_metadata_errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    for family in FAMILIES {
        let cfg = tiny_config(family);
        let weights = random_weights(&cfg, SEED, DType::F32, &Device::Cpu).unwrap();
        let arch = family.model_type();

        let path = dir.path().join(format!("{arch}-gpt2.gguf"));
        let tweak = Tweak {
            arch: Some("gpt2"),
            ..Tweak::default()
        };
        write_gguf(&path, &cfg, &weights, Quant::F32, tweak);
        let e = load_model(&path, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gpt2") && e.contains("llama, qwen2, qwen3"),
            "{e}"
        );

        let key = format!("{arch}.block_count");
        let path = dir.path().join(format!("{arch}-no-blocks.gguf"));
        let tweak = Tweak {
            drop_key: Some(key.as_str()),
            ..Tweak::default()
        };
        write_gguf(&path, &cfg, &weights, Quant::F32, tweak);
        let e = load_model(&path, &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("`{key}`")), "{e}");
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    let cfg = tiny_config(Family::Llama);
    let weights = random_weights(&cfg, SEED, DType::F32, &Device::Cpu).unwrap();
    let path = dir.path().join("llama-short-rope-freqs.gguf");
    let tweak = Tweak {
        short_rope_freqs: true,
        ..Tweak::default()
    };
    write_gguf(&path, &cfg, &weights, Quant::F32, tweak);
    let e = load_model(&path, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rope_freqs.weight has 7 values; head_dim 16 needs 8"),
        "{e}"
    );
}

/// Under LoRA a GGUF base can stay in its blocks (`LoadOptions::keep_quantized`): the linear
/// layers, embedding and LM head of a Q4_K/Q6_K/Q5_0/Q8_0 file serve the forward pass, the
/// backward pass to the adapters and decoding without an f32 copy. Against the same file loaded
/// dequantised: the same weights bit for bit, log-probs and adapter gradients within 1e-4
/// (the chunked products sum in another order), and the same greedy tokens.
#[test]
fn a_quantised_base_serves_lora_like_its_dequantised_weights() {
    use rlft_model::lora::{attach_lora, LoraConfig};
    use rlft_model::weight::Weight;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(Family::Qwen2);
    // Rows of 256 for the k-quants; an untied head so the head has its own blocks.
    (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim) = (256, 512, 64);
    cfg.tie_word_embeddings = false;
    let weights = random_weights(&cfg, SEED, DType::F32, &Device::Cpu).unwrap();
    let path = dir.path().join("mixed.gguf");
    write_gguf(&path, &cfg, &weights, Quant::Mixed, Tweak::default());
    let dense = load_model(&path, &LoadOptions::default()).unwrap().model;
    let kept_opts = LoadOptions {
        keep_quantized: true,
        ..LoadOptions::default()
    };
    let kept = load_model(&path, &kept_opts).unwrap().model;
    // Every matrix stays in blocks: the mix holds all four types.
    let types = GgufFile::open(&path).unwrap();
    let mut seen: Vec<GgmlType> = types.tensors().iter().map(|t| t.ggml_type).collect();
    seen.sort_by_key(|t| t.id());
    seen.dedup();
    for t in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
    ] {
        assert!(seen.contains(&t), "{t:?} missing from {seen:?}");
    }
    assert!(matches!(kept.embed_tokens, Weight::Quant(_)));
    assert!(matches!(kept.lm_head, Some(Weight::Quant(_))));
    assert!(kept
        .linears()
        .iter()
        .all(|(_, l)| l.weight.quant().is_some()));
    let bytes = |m: &CausalLm| -> usize {
        m.linears()
            .iter()
            .map(|(_, l)| l.weight.size_in_bytes())
            .sum::<usize>()
            + m.embed_tokens.size_in_bytes()
            + m.lm_head.as_ref().map_or(0, Weight::size_in_bytes)
    };
    assert!(
        bytes(&kept) * 3 < bytes(&dense),
        "blocks {} vs f32 {}",
        bytes(&kept),
        bytes(&dense)
    );
    // The blocks dequantise to the very tensors the dense load holds.
    for ((n, a), (_, b)) in dense.named_weights().iter().zip(kept.named_weights()) {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.flatten_all().unwrap().to_vec1().unwrap(),
            b.flatten_all().unwrap().to_vec1().unwrap(),
        );
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{n}"
        );
    }
    let seq: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 512).collect();
    let d = max_diff(&logprobs(&kept, &seq), &logprobs(&dense, &seq));
    assert!(d < 1e-4, "log-probs differ by {d}");
    assert_same_decoding(&kept, &dense, "quantised base");

    // LoRA on every linear layer, B made non-zero so every factor gets a gradient.
    let lora = LoraConfig {
        target_modules: vec!["all-linear".into()],
        init_lora_weights: false,
        ..LoraConfig::default()
    };
    let grads = |mut m: CausalLm| -> Vec<(String, Vec<f32>)> {
        let vars = attach_lora(&mut m, &lora).unwrap();
        let batch =
            Batch::left_padded(std::slice::from_ref(&seq), &[0], 0, 0, &Device::Cpu).unwrap();
        let hidden = m.forward(&batch, None, true).unwrap();
        let t = seq.len();
        let rows = hidden
            .reshape((t, cfg.hidden_size))
            .unwrap()
            .narrow(0, 0, t - 1)
            .unwrap();
        let targets = Tensor::new(&seq[1..], &Device::Cpu).unwrap();
        let loss = m
            .target_logprobs(&rows, &targets, 8)
            .unwrap()
            .sum_all()
            .unwrap();
        let g = loss.backward().unwrap();
        vars.iter()
            .map(|(n, v)| {
                let gv = g
                    .get(v.as_tensor())
                    .expect("every adapter factor has a gradient");
                (n.clone(), gv.flatten_all().unwrap().to_vec1().unwrap())
            })
            .collect()
    };
    let (gk, gd) = (grads(kept.clone()), grads(dense.clone()));
    assert_eq!(gk.len(), 2 * 7 * cfg.num_hidden_layers);
    for ((n, a), (_, b)) in gk.iter().zip(&gd) {
        let scale = b.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        let d = max_diff(a, b) / scale;
        assert!(d < 1e-4, "{n}: gradients differ by {d} (relative)");
    }
    // Full fine-tuning on it dequantises what trains, and only that.
    let mut full = kept.clone();
    rlft_model::trainable::make_trainable(&mut full, |n| n.contains("mlp.")).unwrap();
    for (n, l) in full.linears() {
        assert_eq!(l.weight.quant().is_none(), n.contains("mlp."), "{n}");
    }
}
