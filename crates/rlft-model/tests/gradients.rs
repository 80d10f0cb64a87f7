//! Gradients through the model, for every family:
//! - the default model's loss and per-weight gradient norms against transformers
//!   (`tests/fixtures/smollm2/golden.json`, key `gradient`);
//! - analytic vs central finite-difference gradients on tiny random f64 models;
//! - every trainable tensor gets a non-zero gradient (catches ops that drop it silently);
//! - frozen weights stay plain tensors and get no gradient;
//! - the differentiable forward (`grad = true`, weights as `Var`s) equals the inference one.

mod common;

use std::collections::HashSet;

use candle_core::{DType, Device, Tensor};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::tiny::{random_model, tiny_config};
use rlft_model::trainable::{
    backward, detached, make_trainable, masked_mean_nll, next_token_batch, sequence_logprobs,
    NextTokenBatch,
};
use rlft_model::{CausalLm, Family};

const FAMILIES: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Qwen3];

/// Two rows of different lengths (so one is left-padded); the second row's loss starts at its
/// third token, so the mask is not just "not padding".
fn tiny_rows() -> (Vec<Vec<u32>>, Vec<usize>) {
    (
        vec![
            vec![1, 5, 9, 300, 42, 17, 250, 77, 2],
            vec![1, 88, 7, 300, 9, 2],
        ],
        vec![1, 2],
    )
}

fn tiny_batch() -> NextTokenBatch {
    let (rows, starts) = tiny_rows();
    next_token_batch(&rows, &starts, 2, &Device::Cpu).unwrap()
}

fn loss(model: &CausalLm, nt: &NextTokenBatch) -> Tensor {
    let lp = sequence_logprobs(model, &nt.batch, &nt.targets, true).unwrap();
    masked_mean_nll(&lp, &nt.mask).unwrap()
}

fn l2(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .sqrt()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

#[test]
fn default_model_gradients_match_transformers() {
    let g = &common::golden()["gradient"];
    let mut model = load_model(common::default_model_path(), &LoadOptions::default())
        .unwrap()
        .model;
    let vars = make_trainable(&mut model, |_| true).unwrap();
    assert_eq!(vars.len(), model.named_weights().len());
    // As transformers computed it (`note`): mean over all positions t of
    // -log p(ids[t + 1] | ids[..=t]); one row, no padding, so mask = 1 everywhere.
    let ids = common::ids(&g["ids"]);
    let nt = next_token_batch(std::slice::from_ref(&ids), &[1], 0, &Device::Cpu).unwrap();
    assert_eq!(nt.targets.dims(), &[1, ids.len() - 1]);
    let loss = loss(&model, &nt);
    let got = loss.to_scalar::<f32>().unwrap() as f64;
    let want = g["loss_mean_nll"].as_f64().unwrap();
    assert!(
        (got - want).abs() < 1e-4,
        "loss: rlft {got} vs transformers {want}"
    );
    let grads = backward(&loss, &vars).unwrap();
    for (name, want) in g["grad_l2_norm"].as_object().unwrap() {
        let want = want.as_f64().unwrap();
        let var = &vars.iter().find(|(n, _)| n == name).expect(name).1;
        let got = l2(grads.get(var.as_tensor()).expect(name));
        assert!(
            (got - want).abs() <= 1e-3 * want,
            "{name}: gradient L2 norm rlft {got} vs transformers {want}"
        );
    }
    // And no weight of the real model lost its gradient.
    for (name, var) in &vars {
        let n = l2(grads.get(var.as_tensor()).expect(name));
        assert!(n.is_finite() && n > 0.0, "{name}: gradient norm {n}");
    }
}

/// Central differences on f64 models: a few entries of every weight (an entry in a used row for
/// the embedding) against the analytic gradient.
fn finite_differences(family: Family) {
    let mut model = random_model(tiny_config(family), 0, DType::F64, &Device::Cpu).unwrap();
    let vars = make_trainable(&mut model, |_| true).unwrap();
    let nt = tiny_batch();
    let l = loss(&model, &nt);
    assert_eq!(l.dtype(), DType::F64);
    let grads = backward(&l, &vars).unwrap();
    let hidden = model.config.hidden_size;
    let eval = |model: &CausalLm| loss(model, &nt).to_scalar::<f64>().unwrap();
    let eps = 1e-5;
    let mut checked = 0;
    for (name, var) in &vars {
        let shape = var.as_tensor().shape().clone();
        let orig: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let grad: Vec<f64> = grads
            .get(var.as_tensor())
            .expect(name)
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let n = orig.len();
        let mut picks = vec![(7919 + 13) % n, (2 * 7919 + 13) % n];
        if name == "model.embed_tokens.weight" {
            // Rows of tokens the input uses (others have an exactly-zero gradient when untied).
            picks = vec![300 * hidden + 3, 88 * hidden + 40];
        }
        for idx in picks {
            let at = |delta: f64| {
                let mut v = orig.clone();
                v[idx] += delta;
                var.set(&Tensor::from_vec(v, &shape, &Device::Cpu).unwrap())
                    .unwrap();
                eval(&model)
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(orig.clone(), &shape, &Device::Cpu).unwrap())
                .unwrap();
            let analytic = grad[idx];
            let err = (analytic - numeric).abs();
            assert!(
                err <= 1e-6 * analytic.abs().max(numeric.abs()) + 1e-9,
                "{family:?} {name}[{idx}]: analytic {analytic:e} vs numeric {numeric:e} \
                 (error {err:e})"
            );
            checked += 1;
        }
    }
    // Per-family weights that must be among the checked ones.
    let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
    let must: &[&str] = match family {
        Family::Llama => &["lm_head.weight"],
        Family::Qwen2 => &[
            "model.layers.0.self_attn.q_proj.bias",
            "model.layers.1.self_attn.k_proj.bias",
            "model.layers.1.self_attn.v_proj.bias",
        ],
        Family::Qwen3 => &[
            "lm_head.weight",
            "model.layers.0.self_attn.q_norm.weight",
            "model.layers.1.self_attn.k_norm.weight",
        ],
    };
    for m in must
        .iter()
        .chain(&["model.norm.weight", "model.embed_tokens.weight"])
    {
        assert!(names.contains(m), "{family:?}: {m} not trainable");
    }
    assert_eq!(checked, 2 * vars.len());
}

#[test]
fn finite_differences_llama() {
    finite_differences(Family::Llama);
}

#[test]
fn finite_differences_qwen2() {
    finite_differences(Family::Qwen2);
}

#[test]
fn finite_differences_qwen3() {
    finite_differences(Family::Qwen3);
}

#[test]
fn every_trainable_tensor_gets_a_nonzero_gradient() {
    for family in FAMILIES {
        let mut model = random_model(tiny_config(family), 0, DType::F32, &Device::Cpu).unwrap();
        let vars = make_trainable(&mut model, |_| true).unwrap();
        assert_eq!(vars.len(), model.named_weights().len());
        // The raw candle store, not the pruned one: nothing may depend on `backward`'s pruning.
        let grads = loss(&model, &tiny_batch()).backward().unwrap();
        for (name, var) in &vars {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{family:?} {name}: no gradient"));
            let n = l2(g);
            assert!(
                n.is_finite() && n > 0.0,
                "{family:?} {name}: gradient norm {n}"
            );
        }
    }
}

#[test]
fn frozen_weights_get_no_gradient() {
    for family in FAMILIES {
        let mut model = random_model(tiny_config(family), 0, DType::F32, &Device::Cpu).unwrap();
        let qv = |n: &str| n.contains(".q_proj.") || n.contains(".v_proj.");
        let vars = make_trainable(&mut model, qv).unwrap();
        let per_layer = if family == Family::Qwen2 { 4 } else { 2 }; // + biases
        assert_eq!(vars.len(), per_layer * model.config.num_hidden_layers);
        // Only the selected weights are Vars; calling again hands back the same Vars.
        for (name, w) in model.named_weights() {
            assert_eq!(w.is_variable(), qv(&name), "{family:?} {name}");
        }
        let again = make_trainable(&mut model, qv).unwrap();
        for ((n1, v1), (n2, v2)) in vars.iter().zip(&again) {
            assert_eq!((n1, v1.as_tensor().id()), (n2, v2.as_tensor().id()));
        }
        let l = loss(&model, &tiny_batch());
        let raw = l.backward().unwrap();
        for (name, w) in model.named_weights() {
            if !qv(&name) {
                assert!(
                    raw.get(&w).is_none(),
                    "{family:?} {name}: frozen, has a grad"
                );
            }
        }
        let grads = backward(&l, &vars).unwrap();
        let got: HashSet<_> = grads.get_ids().copied().collect();
        let want: HashSet<_> = vars.iter().map(|(_, v)| v.as_tensor().id()).collect();
        assert_eq!(
            got, want,
            "{family:?}: the store holds exactly the trainable weights"
        );
    }
    let mut model = random_model(tiny_config(Family::Llama), 0, DType::F32, &Device::Cpu).unwrap();
    let err = make_trainable(&mut model, |n| n.contains("qproj")).unwrap_err();
    assert!(err.to_string().contains("no weight matches"), "{err}");
}

#[test]
fn differentiable_forward_equals_inference_forward() {
    for family in FAMILIES {
        let base = random_model(tiny_config(family), 0, DType::F32, &Device::Cpu).unwrap();
        let nt = tiny_batch();
        let plain = sequence_logprobs(&base, &nt.batch, &nt.targets, false).unwrap();
        let mut trained = base.clone();
        let vars = make_trainable(&mut trained, |_| true).unwrap();
        let with_graph = sequence_logprobs(&trained, &nt.batch, &nt.targets, true).unwrap();
        assert!(with_graph.track_op());
        let diff = |a: &Tensor, b: &Tensor| -> f32 {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        let d = diff(&plain, &with_graph);
        assert!(
            d < 1e-5,
            "{family:?}: grad=true vs grad=false differ by {d}"
        );
        // Only the last n positions: the same values as the matching columns of the full run.
        let n = 3;
        let t = nt.targets.dim(1).unwrap();
        let tail = nt.targets.narrow(1, t - n, n).unwrap();
        let part = sequence_logprobs(&trained, &nt.batch, &tail, true).unwrap();
        let d = diff(&part, &with_graph.narrow(1, t - n, n).unwrap());
        assert!(d < 1e-6, "{family:?}: last-{n} log-probs differ by {d}");
        // A detached view shares the (trainable) weights but records no graph.
        let view = detached(&trained);
        assert!(view.named_weights().iter().all(|(_, w)| !w.is_variable()));
        let nograd = sequence_logprobs(&view, &nt.batch, &nt.targets, false).unwrap();
        assert!(!nograd.track_op());
        assert!(
            diff(&plain, &nograd) == 0.0,
            "{family:?}: detached view differs"
        );
        // An update through the Var is seen by the detached view.
        let (_, emb) = &vars[0];
        emb.set(&emb.as_tensor().affine(1.5, 0.0).unwrap()).unwrap();
        let moved = sequence_logprobs(&view, &nt.batch, &nt.targets, false).unwrap();
        assert!(
            diff(&plain, &moved) > 1e-3,
            "{family:?}: view missed the update"
        );
    }
}

#[test]
fn weights_mut_mirrors_named_weights() {
    for family in FAMILIES {
        let mut model = random_model(tiny_config(family), 0, DType::F32, &Device::Cpu).unwrap();
        let names: Vec<String> = model.named_weights().into_iter().map(|(n, _)| n).collect();
        let ids: Vec<_> = model
            .named_weights()
            .into_iter()
            .map(|(_, t)| t.id())
            .collect();
        let muts = model.weights_mut();
        let mut_names: Vec<&String> = muts.iter().map(|(n, _)| n).collect();
        assert_eq!(mut_names.len(), names.len());
        for ((a, b), ((_, t), id)) in names.iter().zip(&mut_names).zip(muts.iter().zip(&ids)) {
            assert_eq!(a, *b);
            assert_eq!(t.id(), *id, "{family:?} {a}");
        }
    }
}
