//! The composite path against the fused CPU kernels, on the CPU.
//!
//! [`rlft_kernels::fused`] runs only on the CPU in f32/f64; every other device and dtype (a CUDA
//! device above all) takes candle's composite ops instead ([`rlft_kernels::fused::enabled_for`]).
//! No GPU is needed to check that path's maths: `fused::set_enabled(false)` sends CPU tensors
//! down it too. Here, for each family, with full fine-tuning and with LoRA, the log-probs (with
//! and without a graph), the loss and every trainable tensor's gradient agree between the two
//! paths.
//!
//! The switch is process-wide, so this file is its own test binary with one test function.

use candle_core::{DType, Device, Tensor};
use rlft_kernels::fused;
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::tiny::{random_model, tiny_config};
use rlft_model::trainable::{
    backward, make_trainable, masked_mean_nll, next_token_batch, sequence_logprobs,
};
use rlft_model::{CausalLm, Family};

/// Log-probs without a graph, log-probs with one, the loss and the gradients (in `vars`'
/// order), of two rows of different lengths (one left-padded) on the path `fused` selects.
fn run(
    model: &CausalLm,
    vars: &[(String, candle_core::Var)],
    fused_on: bool,
) -> (Tensor, Tensor, f64, Vec<Tensor>) {
    fused::set_enabled(fused_on);
    let rows = vec![
        vec![1, 5, 9, 300, 42, 17, 250, 77, 2, 61, 33, 90],
        vec![1, 88, 7, 300, 9, 2, 14],
    ];
    let nt = next_token_batch(&rows, &[1, 2], 2, &Device::Cpu).unwrap();
    let lp_nograd = sequence_logprobs(model, &nt.batch, &nt.targets, false).unwrap();
    let lp = sequence_logprobs(model, &nt.batch, &nt.targets, true).unwrap();
    let loss = masked_mean_nll(&lp, &nt.mask).unwrap();
    let grads = backward(&loss, vars).unwrap();
    let g = vars
        .iter()
        .map(|(name, v)| {
            grads
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no gradient"))
                .clone()
        })
        .collect();
    fused::set_enabled(true);
    let loss = loss
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    (lp_nograd.detach(), lp.detach(), loss, g)
}

/// Largest |a - b| relative to the largest |b| (at least 1e-3, so all-tiny tensors compare
/// absolutely).
fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let a: Vec<f64> = a
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f64> = b
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

fn compare(what: &str, model: &CausalLm, vars: &[(String, candle_core::Var)]) {
    let (f_nograd, f_lp, f_loss, f_g) = run(model, vars, true);
    let (c_nograd, c_lp, c_loss, c_g) = run(model, vars, false);
    let d = rel_diff(&c_nograd, &f_nograd);
    assert!(d < 1e-5, "{what}: no-grad log-probs differ by {d:e}");
    let d = rel_diff(&c_lp, &f_lp);
    assert!(d < 1e-5, "{what}: log-probs differ by {d:e}");
    assert!(
        (c_loss - f_loss).abs() < 1e-5 * f_loss.abs().max(1.0),
        "{what}: loss {c_loss} (composite) vs {f_loss} (fused)"
    );
    let mut largest = rel_diff(&c_lp, &f_lp);
    for ((name, _), (c, f)) in vars.iter().zip(c_g.iter().zip(&f_g)) {
        let d = rel_diff(c, f);
        assert!(d < 1e-4, "{what}: gradient of {name} differs by {d:e}");
        largest = largest.max(d);
    }
    // The two paths sum in different orders: identical bits everywhere would mean the switch
    // did not take effect and one path was compared with itself.
    assert!(
        largest > 0.0,
        "{what}: fused and composite runs are bit-identical"
    );
}

#[test]
fn composite_path_equals_fused_kernels() {
    for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        let base = random_model(tiny_config(family), 7, DType::F32, &Device::Cpu).unwrap();

        let mut full = base.clone();
        let vars = make_trainable(&mut full, |_| true).unwrap();
        compare(&format!("{family:?} full fine-tune"), &full, &vars);

        let mut lora = base.clone();
        let cfg = LoraConfig {
            r: 4,
            lora_alpha: 8.0,
            target_modules: vec!["all-linear".into()],
            init_lora_weights: false,
            seed: 3,
            ..LoraConfig::default()
        };
        let vars = attach_lora(&mut lora, &cfg).unwrap();
        compare(&format!("{family:?} LoRA"), &lora, &vars);
    }
}
