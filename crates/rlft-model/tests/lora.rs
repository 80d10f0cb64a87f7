//! LoRA adapters and the frozen-linear op, on tiny random models of every family:
//! - the frozen-linear op: same values and input gradients as candle's matmul, no weight
//!   gradient in the store;
//! - a fresh adapter (B = 0) and disabled adapters leave the base logits bit-identical;
//! - merged weights compute what the adapter model computes; PEFT save -> load is exact;
//! - only adapters get gradients, and they match f64 central finite differences;
//! - rsLoRA scaling, `all-linear`, dropout, KV-cache decoding, load errors.
//!
//! `write_peft_check_fixtures` (ignored) writes the inputs of `scripts/reference/check_peft.py`.

use std::collections::HashSet;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use rlft_model::decoder::Batch;
use rlft_model::lora::{
    attach_lora, lora_parameters, merge_lora, remove_lora, set_dropout_seed, LoraConfig,
    LORA_MODULES,
};
use rlft_model::ops::{add_const, frozen_linear, mul_const};
use rlft_model::peft::{
    adapter_config_json, load_adapter, save_adapter, ADAPTER_CONFIG, ADAPTER_WEIGHTS,
};
use rlft_model::tiny::{random_model, tiny_config};
use rlft_model::trainable::{
    backward, detached, masked_mean_nll, next_token_batch, sequence_logprobs, NextTokenBatch,
};
use rlft_model::{CausalLm, Family, KvCache};

const FAMILIES: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Qwen3];

fn model(family: Family, dtype: DType) -> CausalLm {
    random_model(tiny_config(family), 0, dtype, &Device::Cpu).unwrap()
}

/// An adapter config with random `B` too (so the adapter changes the model).
fn lora_cfg(targets: &[&str], seed: u64) -> LoraConfig {
    LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
        init_lora_weights: false,
        seed,
        ..LoraConfig::default()
    }
}

fn tiny_batch() -> NextTokenBatch {
    let rows = vec![
        vec![1, 5, 9, 300, 42, 17, 250, 77, 2],
        vec![1, 88, 7, 300, 9, 2],
    ];
    next_token_batch(&rows, &[1, 2], 2, &Device::Cpu).unwrap()
}

/// Logits of every position of [`tiny_batch`] as f64 values.
fn logits(model: &CausalLm, grad: bool) -> Vec<f64> {
    let nt = tiny_batch();
    let hidden = model.forward(&nt.batch, None, grad).unwrap();
    let (b, t, h) = hidden.dims3().unwrap();
    let l = model.logits(&hidden.reshape((b * t, h)).unwrap()).unwrap();
    l.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Bit-identical logits, reporting the largest difference otherwise.
fn assert_same(a: &[f64], b: &[f64], what: &str) {
    let d = max_diff(a, b);
    assert!(a == b, "{what}: logits differ by up to {d:e}");
}

fn loss(model: &CausalLm, nt: &NextTokenBatch) -> Tensor {
    let lp = sequence_logprobs(model, &nt.batch, &nt.targets, true).unwrap();
    masked_mean_nll(&lp, &nt.mask).unwrap()
}

fn rand(shape: (usize, usize), seed: u64) -> Tensor {
    let mut s = seed;
    let v: Vec<f32> = (0..shape.0 * shape.1)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

#[test]
fn frozen_linear_matches_matmul_and_skips_weight_gradient() {
    for bias in [false, true] {
        let x = Var::from_tensor(&rand((37, 24), 1)).unwrap();
        let w = rand((19, 24), 2);
        let b = bias.then(|| rand((1, 19), 3).squeeze(0).unwrap());
        // Upstream weighting so dy is not all ones.
        let dy = rand((37, 19), 4);
        let plain = {
            let y = x.matmul(&w.t().unwrap()).unwrap();
            match &b {
                Some(b) => y.broadcast_add(b).unwrap(),
                None => y,
            }
        };
        let frozen = frozen_linear(x.as_tensor(), &w, b.as_ref()).unwrap();
        assert!(frozen.track_op());
        let v = |t: &Tensor| -> Vec<Vec<f32>> { t.to_vec2().unwrap() };
        assert_eq!(v(&plain), v(&frozen), "forward differs (bias {bias})");
        let gp = (plain * &dy)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gf = (frozen * &dy)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(
            v(gp.get(x.as_tensor()).unwrap()),
            v(gf.get(x.as_tensor()).unwrap()),
            "dx differs (bias {bias})"
        );
        // candle's matmul also stores a gradient for w (via its transposed view) and the bias;
        // the frozen op stores only x's (and dy's, an untracked operand of the product).
        let ids: HashSet<_> = gf.get_ids().copied().collect();
        assert_eq!(ids, HashSet::from([x.as_tensor().id(), dy.id()]));
        assert!(gp.get_ids().count() > ids.len());
    }
}

#[test]
fn constant_operand_ops_match_broadcast_ops() {
    let x = Var::from_tensor(&rand((6, 20), 5).reshape((2, 3, 4, 5)).unwrap()).unwrap();
    let dy = rand((6, 20), 6).reshape((2, 3, 4, 5)).unwrap();
    // A row vector (norm weight), a [b, 1, t, d] table (rope), a [b, 1, 1, d] mask.
    for c in [
        rand((1, 5), 7).squeeze(0).unwrap(),
        rand((8, 5), 8).reshape((2, 1, 4, 5)).unwrap(),
        rand((2, 5), 9).reshape((2, 1, 1, 5)).unwrap(),
    ] {
        for mul in [true, false] {
            let (plain, ours) = if mul {
                (x.broadcast_mul(&c).unwrap(), mul_const(&x, &c).unwrap())
            } else {
                (x.broadcast_add(&c).unwrap(), add_const(&x, &c).unwrap())
            };
            let v = |t: &Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
            assert_eq!(v(&plain), v(&ours), "forward, mul {mul}, c {:?}", c.dims());
            let gp = (plain * &dy)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let go = (ours * &dy).unwrap().sum_all().unwrap().backward().unwrap();
            assert_eq!(
                v(gp.get(&x).unwrap()),
                v(go.get(&x).unwrap()),
                "dx, mul {mul}"
            );
            let ids: HashSet<_> = go.get_ids().copied().collect();
            assert_eq!(ids, HashSet::from([x.id(), dy.id()]), "mul {mul}");
        }
    }
}

#[test]
fn fresh_adapter_and_disabled_adapters_give_base_logits() {
    for family in FAMILIES {
        let base = model(family, DType::F32);
        let want = logits(&base, false);
        // PEFT init: B = 0, so the update is exactly zero.
        let mut m = base.clone();
        let params = attach_lora(&mut m, &LoraConfig::default()).unwrap();
        assert_eq!(params.len(), 2 * 2 * base.config.num_hidden_layers);
        assert_same(&logits(&m, false), &want, &format!("{family:?}: B = 0"));
        // With a graph through the adapters, the head's product may take gemm where the base
        // model's takes the streaming kernel: same values up to summation order.
        let d = max_diff(&logits(&m, true), &logits(&base, true));
        assert!(d < 1e-5, "{family:?}: B = 0, grad: {d}");
        // Random B: the model moves; disabled, it is the base model bit for bit.
        let mut m = base.clone();
        attach_lora(&mut m, &lora_cfg(&["all-linear"], 1)).unwrap();
        let adapted = logits(&m, false);
        assert!(
            max_diff(&adapted, &want) > 1e-3,
            "{family:?}: adapter inert"
        );
        let reference = m.adapters_disabled();
        assert!(m.has_active_adapters() && !reference.has_active_adapters());
        assert_same(
            &logits(&reference, false),
            &want,
            &format!("{family:?}: reference"),
        );
        assert_same(
            &logits(&reference, true),
            &logits(&base, true),
            "reference, grad",
        );
        m.disable_adapters();
        assert_same(&logits(&m, false), &want, &format!("{family:?}: disabled"));
        m.enable_adapters();
        assert_same(
            &logits(&m, false),
            &adapted,
            &format!("{family:?}: re-enabled"),
        );
        // The fused decode path adds enabled adapters itself (checked against the tensor path in
        // `fused_decode_with_adapters_equals_tensor_and_merged_decode`).
        assert!(rlft_model::decode_fast::supported(&m));
        assert!(rlft_model::decode_fast::supported(&reference));
        assert!(rlft_model::decode_fast::supported(&base));
    }
}

#[test]
fn bf16_base_keeps_f32_adapters() {
    let base = model(Family::Qwen2, DType::BF16);
    let want = logits(&base, false);
    let mut m = base.clone();
    let params = attach_lora(&mut m, &LoraConfig::default()).unwrap();
    assert!(params.iter().all(|(_, v)| v.dtype() == DType::F32));
    assert_same(&logits(&m, false), &want, "B = 0 on a bf16 base");
    let mut m = base.clone();
    attach_lora(&mut m, &lora_cfg(&["q_proj", "down_proj"], 2)).unwrap();
    let adapted = logits(&m, false);
    let mut merged = m.clone();
    merge_lora(&mut merged).unwrap();
    // bf16 rounding of the merged weights (logits of magnitude ~5; bf16 vs f32 models differ
    // by as much).
    let d = max_diff(&logits(&merged, false), &adapted);
    assert!(d < 0.15, "bf16 merge differs by {d}");
}

#[test]
fn merged_model_equals_adapter_model() {
    for family in FAMILIES {
        let mut m = model(family, DType::F32);
        attach_lora(&mut m, &lora_cfg(&["all-linear"], 3)).unwrap();
        let adapted = logits(&m, false);
        let adapted_grad = logits(&m, true);
        let mut merged = m.clone();
        assert_eq!(merge_lora(&mut merged).unwrap(), 7 * m.layers.len());
        assert!(!merged.has_adapters());
        assert!(merged.named_weights().iter().all(|(_, w)| !w.is_variable()));
        let d = max_diff(&logits(&merged, false), &adapted);
        assert!(d < 1e-5, "{family:?}: merged differs by {d}");
        let d = max_diff(&adapted_grad, &adapted);
        assert!(d < 1e-5, "{family:?}: grad=true differs by {d}");
        // The adapter model itself is untouched by merging a clone.
        assert_same(
            &logits(&m, false),
            &adapted,
            "adapter model after merging a clone",
        );
        // An export that merges as it writes equals merging first, byte for byte.
        let dir = tempfile::tempdir().unwrap();
        let text = rlft_model::tiny::tiny_text_bundle().unwrap();
        let gen = rlft_model::generation_config::GenerationConfig::default();
        let save = |model: &CausalLm, merge_adapters: bool, name: &str| {
            let opts = rlft_model::export::ExportOptions {
                merge_adapters,
                ..Default::default()
            };
            let out = dir.path().join(name);
            rlft_model::export::save_hf_dir(model, &text, &gen, &out, &opts).unwrap();
            std::fs::read(out.join("model.safetensors")).unwrap()
        };
        assert_eq!(
            save(&m, true, "streamed"),
            save(&merged, false, "merged"),
            "{family:?}: merged on the way"
        );
        let unmerged = rlft_model::export::save_hf_dir(
            &m,
            &text,
            &gen,
            &dir.path().join("refused"),
            &Default::default(),
        );
        assert!(unmerged.is_err(), "adapters are merged only when asked");
        // remove_lora drops adapters without merging: back to the base.
        let mut removed = m.clone();
        assert_eq!(remove_lora(&mut removed), 7 * m.layers.len());
        let base = logits(&model(family, DType::F32), false);
        assert_same(&logits(&removed, false), &base, "removed");
    }
}

#[test]
fn peft_save_load_round_trip() {
    for family in FAMILIES {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LoraConfig {
            lora_dropout: 0.1,
            use_rslora: true,
            ..lora_cfg(&["q_proj", "k_proj", "o_proj", "up_proj"], 4)
        };
        let mut m = model(family, DType::F32);
        attach_lora(&mut m, &cfg).unwrap();
        save_adapter(&m, &cfg, dir.path(), Some("tiny-base")).unwrap();
        let j: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(ADAPTER_CONFIG)).unwrap(),
        )
        .unwrap();
        assert_eq!(j["peft_type"], "LORA");
        assert_eq!(j["task_type"], "CAUSAL_LM");
        assert_eq!(j["r"], 4);
        assert_eq!(j["lora_alpha"], 8.0);
        assert_eq!(j["use_rslora"], true);
        assert_eq!(j["bias"], "none");
        assert_eq!(j["base_model_name_or_path"], "tiny-base");
        assert_eq!(
            j["target_modules"],
            serde_json::json!(["q_proj", "k_proj", "o_proj", "up_proj"])
        );
        // What a trainer writes up front from the config says the same.
        let targets = cfg.resolve_targets().unwrap();
        let up_front = adapter_config_json(&cfg, &targets, Some("tiny-base"));
        assert_eq!(up_front, j);
        // PEFT names and shapes.
        let bytes = std::fs::read(dir.path().join(ADAPTER_WEIGHTS)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let a = st
            .tensor("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight")
            .unwrap();
        let b = st
            .tensor("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight")
            .unwrap();
        let c = &m.config;
        assert_eq!(a.shape(), [4, c.hidden_size]);
        assert_eq!(b.shape(), [c.intermediate_size, 4]);
        assert_eq!(st.len(), 2 * 4 * c.num_hidden_layers);
        // No temporary files left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");

        let mut loaded = model(family, DType::F32);
        let got = load_adapter(&mut loaded, dir.path()).unwrap();
        assert_eq!(got.r, 4);
        assert_eq!(got.lora_alpha, 8.0);
        assert_eq!(got.lora_dropout, 0.1);
        assert!(got.use_rslora);
        assert_eq!(
            got.target_modules,
            ["q_proj", "k_proj", "o_proj", "up_proj"]
        );
        assert_same(
            &logits(&loaded, false),
            &logits(&m, false),
            &format!("{family:?}: loaded"),
        );
        for ((n1, l1), (n2, l2)) in m.linears().iter().zip(loaded.linears()) {
            assert_eq!(n1, &n2);
            match (&l1.lora, &l2.lora) {
                (Some(x), Some(y)) => {
                    assert_eq!(x.scaling, y.scaling);
                    assert_eq!(x.key, y.key);
                    let v = |t: &Tensor| -> Vec<Vec<f32>> { t.to_vec2().unwrap() };
                    assert_eq!(v(&x.a), v(&y.a));
                    assert_eq!(v(&x.b), v(&y.b));
                }
                (None, None) => {}
                _ => panic!("{n1}: adapter presence differs"),
            }
        }
        // Loaded adapters are plain tensors until made trainable; then the Vars are stable.
        assert!(loaded
            .linears()
            .iter()
            .filter_map(|(_, l)| l.lora.as_ref())
            .all(|l| !l.a.is_variable()));
        let p1 = lora_parameters(&mut loaded).unwrap();
        let p2 = lora_parameters(&mut loaded).unwrap();
        assert_eq!(p1.len(), 2 * 4 * c.num_hidden_layers);
        for ((n1, v1), (n2, v2)) in p1.iter().zip(&p2) {
            assert_eq!((n1, v1.id()), (n2, v2.id()));
        }
        // Loading twice onto one model is refused and leaves the model as it was.
        let e = load_adapter(&mut loaded, dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("already has a LoRA adapter"), "{e}");
    }
}

#[test]
fn peft_load_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = lora_cfg(&["q_proj"], 5);
    let mut m = model(Family::Llama, DType::F32);
    attach_lora(&mut m, &cfg).unwrap();
    save_adapter(&m, &cfg, dir.path(), None).unwrap();
    // A base with another shape.
    let mut other_cfg = tiny_config(Family::Llama);
    other_cfg.hidden_size = 32;
    other_cfg.head_dim = 8;
    let mut other = random_model(other_cfg, 0, DType::F32, &Device::Cpu).unwrap();
    let e = load_adapter(&mut other, dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expected [4, 32]") && e.contains("wrong base model"),
        "{e}"
    );
    assert!(
        !other.has_adapters(),
        "a failed load must leave the model alone"
    );
    // Fewer layers.
    let mut short_cfg = tiny_config(Family::Llama);
    short_cfg.num_hidden_layers = 1;
    let mut short = random_model(short_cfg, 0, DType::F32, &Device::Cpu).unwrap();
    let e = load_adapter(&mut short, dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.1.self_attn.q_proj"), "{e}");
    // Unsupported PEFT features.
    let path = dir.path().join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut j: serde_json::Value = serde_json::from_str(&text).unwrap();
    j["use_dora"] = true.into();
    std::fs::write(&path, j.to_string()).unwrap();
    let e = load_adapter(&mut model(Family::Llama, DType::F32), dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("use_dora"), "{e}");
    j["use_dora"] = false.into();
    j["peft_type"] = "IA3".into();
    std::fs::write(&path, j.to_string()).unwrap();
    let e = load_adapter(&mut model(Family::Llama, DType::F32), dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("LoRA adapters only"), "{e}");
    // Not an adapter directory.
    let empty = tempfile::tempdir().unwrap();
    let e = load_adapter(&mut model(Family::Llama, DType::F32), empty.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains(ADAPTER_CONFIG), "{e}");
    // Saving with a config the adapters were not made with.
    let wrong = LoraConfig { r: 8, ..cfg };
    assert!(save_adapter(&m, &wrong, dir.path(), None).is_err());
}

#[test]
fn only_adapters_get_gradients() {
    for family in FAMILIES {
        let mut m = model(family, DType::F32);
        let params = attach_lora(&mut m, &lora_cfg(&["q_proj", "v_proj", "down_proj"], 6)).unwrap();
        let l = loss(&m, &tiny_batch());
        let raw = l.backward().unwrap();
        // Every adapter tensor has a non-zero gradient.
        for (name, v) in &params {
            let g = raw
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no grad"));
            let n = g
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(n.is_finite() && n > 0.0, "{family:?} {name}: |g|^2 = {n}");
        }
        // No model weight has one, not even through a transposed view: no entry of the raw
        // store has a weight's shape or is a weight.
        let weight_ids: HashSet<_> = m.named_weights().iter().map(|(_, w)| w.id()).collect();
        let weight_shapes: HashSet<Vec<usize>> = m
            .named_weights()
            .iter()
            .filter(|(_, w)| w.rank() == 2)
            .flat_map(|(_, w)| {
                let d = w.dims().to_vec();
                [d.clone(), vec![d[1], d[0]]]
            })
            .collect();
        for id in raw.get_ids() {
            assert!(
                !weight_ids.contains(id),
                "{family:?}: a weight has a gradient"
            );
            let g = raw.get_id(*id).unwrap();
            assert!(
                !weight_shapes.contains(g.dims()),
                "{family:?}: a gradient of weight shape {:?}",
                g.dims()
            );
        }
        // The pruned store: exactly the adapter tensors.
        let grads = backward(&l, &params).unwrap();
        let got: HashSet<_> = grads.get_ids().copied().collect();
        let want: HashSet<_> = params.iter().map(|(_, v)| v.id()).collect();
        assert_eq!(got, want);
        // A detached view records no graph through the adapters.
        let view = detached(&m);
        let nt = tiny_batch();
        assert!(!sequence_logprobs(&view, &nt.batch, &nt.targets, false)
            .unwrap()
            .track_op());
    }
}

/// Central differences on an f64 model for one entry of one `A` and one `B` per family.
#[test]
fn adapter_gradients_match_finite_differences() {
    for family in FAMILIES {
        let mut m = model(family, DType::F64);
        let cfg = LoraConfig {
            use_rslora: true,
            ..lora_cfg(&["all-linear"], 7)
        };
        let params = attach_lora(&mut m, &cfg).unwrap();
        assert!(params.iter().all(|(_, v)| v.dtype() == DType::F64));
        let nt = tiny_batch();
        let l = loss(&m, &nt);
        let grads = backward(&l, &params).unwrap();
        let picks = [
            ("model.layers.0.self_attn.k_proj.lora_A.weight", 37),
            ("model.layers.1.mlp.gate_proj.lora_B.weight", 101),
            ("model.layers.0.mlp.down_proj.lora_A.weight", 300),
            ("model.layers.1.self_attn.o_proj.lora_B.weight", 5),
        ];
        for (suffix, idx) in picks {
            let (name, var) = params.iter().find(|(n, _)| n.ends_with(suffix)).unwrap();
            let shape = var.shape().clone();
            let orig: Vec<f64> = var.flatten_all().unwrap().to_vec1().unwrap();
            let analytic: f64 = grads
                .get(var.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()[idx];
            let at = |delta: f64| {
                let mut v = orig.clone();
                v[idx] += delta;
                var.set(&Tensor::from_vec(v, &shape, &Device::Cpu).unwrap())
                    .unwrap();
                loss(&m, &nt).to_scalar::<f64>().unwrap()
            };
            let eps = 1e-5;
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(orig, &shape, &Device::Cpu).unwrap())
                .unwrap();
            let err = (analytic - numeric).abs();
            assert!(
                analytic != 0.0 && err <= 1e-6 * analytic.abs().max(numeric.abs()) + 1e-10,
                "{family:?} {name}[{idx}]: analytic {analytic:e} vs numeric {numeric:e}"
            );
        }
    }
}

#[test]
fn rslora_scaling() {
    let base = model(Family::Llama, DType::F32);
    let r = 16;
    let rs = LoraConfig {
        r,
        lora_alpha: 8.0,
        use_rslora: true,
        ..lora_cfg(&["q_proj"], 8)
    };
    assert_eq!(rs.scaling(), 8.0 / 4.0);
    let plain = LoraConfig {
        use_rslora: false,
        ..rs.clone()
    };
    assert_eq!(plain.scaling(), 8.0 / 16.0);
    let mut m = base.clone();
    attach_lora(&mut m, &rs).unwrap();
    let l = m.layers[0].self_attn.q_proj.lora.as_ref().unwrap();
    assert_eq!((l.scaling, l.rank()), (2.0, r));
    // Same adapters with alpha chosen so alpha / r equals alpha_rs / sqrt(r): same model.
    let same = LoraConfig {
        lora_alpha: 8.0 * 4.0,
        ..plain
    };
    let mut m2 = base.clone();
    attach_lora(&mut m2, &same).unwrap();
    assert_same(&logits(&m, false), &logits(&m2, false), "rslora");
}

#[test]
fn all_linear_covers_every_decoder_linear() {
    for family in FAMILIES {
        let mut m = model(family, DType::F32);
        let params = attach_lora(&mut m, &lora_cfg(&["all-linear"], 9)).unwrap();
        let layers = m.config.num_hidden_layers;
        assert_eq!(params.len(), 2 * 7 * layers);
        for (name, lin) in m.linears() {
            assert!(lin.lora.is_some(), "{family:?} {name}: no adapter");
        }
        for i in 0..layers {
            for module in LORA_MODULES {
                for w in ['A', 'B'] {
                    let n = format!("base_model.model.model.layers.{i}.{module}.lora_{w}.weight");
                    assert!(params.iter().any(|(p, _)| *p == n), "{n} missing");
                }
            }
        }
        // lm_head is never adapted: the head stays a plain tensor.
        assert!(!m.lm_head_weight().dense().unwrap().is_variable());
        let e = attach_lora(&mut m, &lora_cfg(&["q_proj"], 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("already has a LoRA adapter"), "{e}");
    }
}

#[test]
fn unknown_target_module_lists_valid_names() {
    let mut m = model(Family::Qwen3, DType::F32);
    for bad in ["qkv_proj", "lm_head", "q_norm"] {
        let e = attach_lora(&mut m, &lora_cfg(&["q_proj", bad], 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("`{bad}`")), "{e}");
        for valid in [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "all-linear",
        ] {
            assert!(e.contains(valid), "{e} lacks {valid}");
        }
    }
    assert!(!m.has_adapters());
    let bad = LoraConfig {
        r: 0,
        ..LoraConfig::default()
    };
    assert!(attach_lora(&mut m, &bad).is_err());
    let bad = LoraConfig {
        lora_dropout: 1.0,
        ..LoraConfig::default()
    };
    assert!(attach_lora(&mut m, &bad).is_err());
}

#[test]
fn dropout_in_training_forwards_only_and_seeded() {
    let mut m = model(Family::Llama, DType::F32);
    let cfg = LoraConfig {
        lora_dropout: 0.5,
        ..lora_cfg(&["all-linear"], 10)
    };
    attach_lora(&mut m, &cfg).unwrap();
    // Inference forwards never drop out (PEFT's eval mode).
    let eval = logits(&m, false);
    assert_same(&logits(&m, false), &eval, "inference is deterministic");
    // Training forwards drop out from the start (seed = cfg.seed), a fresh mask per call.
    let t1 = logits(&m, true);
    let t2 = logits(&m, true);
    assert!(max_diff(&t1, &eval) > 1e-3, "dropout had no effect");
    assert!(
        max_diff(&t1, &t2) > 1e-3,
        "two training forwards drew one mask"
    );
    // Reseeding replays the stream; another seed gives other masks.
    set_dropout_seed(&mut m, Some(cfg.seed));
    assert_same(&logits(&m, true), &t1, "replay, first draw");
    assert_same(&logits(&m, true), &t2, "replay, second draw");
    set_dropout_seed(&mut m, Some(99));
    assert!(
        max_diff(&logits(&m, true), &t1) > 1e-3,
        "another seed, same masks"
    );
    // No seed: no dropout, even with a graph (fused vs composite ops differ by ~1e-6).
    set_dropout_seed(&mut m, None);
    assert!(max_diff(&logits(&m, true), &eval) < 1e-5);
    // A fresh model with the same config draws the same masks: runs are reproducible.
    let mut again = model(Family::Llama, DType::F32);
    attach_lora(&mut again, &cfg).unwrap();
    assert_same(&logits(&again, true), &t1, "same config, same first mask");
}

#[test]
fn kv_cache_decoding_with_adapters_equals_full_recompute() {
    let ids: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 259).collect();
    for family in FAMILIES {
        let mut m = model(family, DType::F32);
        attach_lora(&mut m, &lora_cfg(&["all-linear"], 11)).unwrap();
        let row = |ids: &[u32], past: usize| {
            Batch::left_padded(&[ids.to_vec()], &[0], past, 0, &Device::Cpu).unwrap()
        };
        let full = m.forward(&row(&ids, 0), None, false).unwrap();
        let mut cache = KvCache::new(m.layers.len(), ids.len());
        m.forward(&row(&ids[..5], 0), Some(&mut cache), false)
            .unwrap();
        for p in 5..ids.len() {
            // One row per step: the base products take the streaming kernel, plus the adapter.
            let h = m
                .forward(&row(&ids[p..=p], p), Some(&mut cache), false)
                .unwrap();
            let got: Vec<f32> = m
                .logits_at(&h, &[0])
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let want: Vec<f32> = m
                .logits_at(&full, &[p])
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let d = got
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(d < 1e-4, "{family:?} position {p}: {d}");
        }
    }
}

#[test]
fn fused_decode_with_adapters_equals_tensor_and_merged_decode() {
    use rlft_model::generate::generate_with;
    use rlft_model::{GenerateRequest, SamplingParams};
    let none = |_: &[u32]| String::new();
    for family in FAMILIES {
        let mut m = model(family, DType::F32);
        attach_lora(&mut m, &lora_cfg(&["all-linear"], 5)).unwrap();
        assert!(rlft_model::decode_fast::supported(&m), "{family:?}");
        let req = GenerateRequest {
            prompts: vec![
                vec![5u32, 6, 7, 8, 9],
                vec![5u32, 6, 7, 30],
                vec![40u32, 2, 9],
            ],
            n: 2,
            max_new_tokens: 10,
            sampling: SamplingParams::default(),
            seed: 3,
            eos_token_ids: vec![],
            stop_strings: vec![],
            pad_token_id: 2,
        };
        let fused = generate_with(&m, &req, &none, true).unwrap();
        let tensor = generate_with(&m, &req, &none, false).unwrap();
        let mut merged = m.clone();
        merge_lora(&mut merged).unwrap();
        let merged = generate_with(&merged, &req, &none, true).unwrap();
        let mut base = m.clone();
        remove_lora(&mut base);
        let base = generate_with(&base, &req, &none, true).unwrap();
        let mut differs_from_base = false;
        for ((a, b), (c, d)) in fused.iter().zip(&tensor).zip(merged.iter().zip(&base)) {
            assert_eq!(a.token_ids, b.token_ids, "{family:?}: fused vs tensor");
            assert_eq!(a.token_ids, c.token_ids, "{family:?}: fused vs merged");
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "{family:?}: {x} vs {y}");
            }
            differs_from_base |= a.logprobs != d.logprobs;
        }
        assert!(
            differs_from_base,
            "{family:?}: the adapters must change the output"
        );
    }
}

/// Writes the inputs of `scripts/reference/check_peft.py` under `RLFT_PEFT_CHECK_DIR` (default
/// `/tmp/rlft-peft-check`): per family a base HF dir, a PEFT adapter (non-zero B, rsLoRA for
/// Qwen3, dropout recorded), the merged model as an HF dir, and `expected.json` with rlft's
/// logits of the adapter model on a few rows.
#[test]
#[ignore = "writes fixtures for scripts/reference/check_peft.py"]
fn write_peft_check_fixtures() {
    use rlft_model::export::{save_hf_dir, ExportOptions};
    let root = std::env::var("RLFT_PEFT_CHECK_DIR").unwrap_or("/tmp/rlft-peft-check".into());
    let root = Path::new(&root);
    if root.exists() {
        std::fs::remove_dir_all(root).unwrap();
    }
    let text = rlft_model::tiny::tiny_text_bundle().unwrap();
    let generation = rlft_model::GenerationConfig {
        eos_token_ids: vec![2],
        bos_token_id: Some(1),
        pad_token_id: Some(2),
        ..Default::default()
    };
    let rows: Vec<Vec<u32>> = vec![
        vec![1, 5, 9, 300, 42, 17, 250, 77, 2, 64, 65, 66],
        (0..20).map(|i| (i * 37 + 5) % 259).collect(),
    ];
    let mut cases = serde_json::Map::new();
    for (family, targets, rslora) in [
        (Family::Llama, vec!["q_proj", "v_proj"], false),
        (Family::Qwen2, vec!["all-linear"], false),
        (Family::Qwen3, vec!["all-linear"], true),
    ] {
        let fam = format!("{family:?}").to_lowercase();
        let base_dir = root.join(format!("{fam}-base"));
        rlft_model::tiny::save_tiny_hf_dir(tiny_config(family), 0, &base_dir).unwrap();
        let mut m = model(family, DType::F32);
        let cfg = LoraConfig {
            r: 8,
            lora_alpha: 16.0,
            lora_dropout: 0.05,
            use_rslora: rslora,
            ..lora_cfg(&targets, 12)
        };
        attach_lora(&mut m, &cfg).unwrap();
        let adapter_dir = root.join(format!("{fam}-adapter"));
        save_adapter(&m, &cfg, &adapter_dir, Some(base_dir.to_str().unwrap())).unwrap();
        let mut merged = m.clone();
        merge_lora(&mut merged).unwrap();
        save_hf_dir(
            &merged,
            &text,
            &generation,
            &root.join(format!("{fam}-merged")),
            &ExportOptions::default(),
        )
        .unwrap();
        let per_row: Vec<Vec<Vec<f32>>> = rows
            .iter()
            .map(|ids| {
                let b = Batch::left_padded(std::slice::from_ref(ids), &[0], 0, 0, &Device::Cpu)
                    .unwrap();
                let h = m.forward(&b, None, false).unwrap().squeeze(0).unwrap();
                m.logits(&h).unwrap().to_vec2().unwrap()
            })
            .collect();
        cases.insert(fam, serde_json::json!({ "rows": rows, "logits": per_row }));
    }
    std::fs::write(
        root.join("expected.json"),
        serde_json::Value::Object(cases).to_string(),
    )
    .unwrap();
    eprintln!("wrote {}", root.display());
}
