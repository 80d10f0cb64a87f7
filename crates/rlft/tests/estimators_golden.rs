//! The online estimators and losses against their anchors transcribed into torch
//! (`scripts/reference/estimators_golden.py` -> `tests/data/estimators_golden.json`, float64):
//! the k1/k2/k3 KL estimates, RLOO advantages (with and without normalisation), REINFORCE++,
//! REINFORCE++-baseline, GAE (with and without `whiten_rewards`), RLOO's sequence loss and
//! PPO's clipped value loss with their gradients, and dynamic sampling's group filter.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::golden::{load, padded, rows, vec1};
use rlft::algo::estimators::{approx_kl, groups_with_signal, token_kl};
use rlft::algo::rloo_loss::{rloo_loss, RlooLossInputs};
use rlft::algo::value_loss::{value_loss, ValueLossInputs};
use rlft::algo::{estimate, Estimate, Estimator, EstimatorConfig, EstimatorInputs, KlEstimator};
use serde_json::Value;

const TOL: f64 = 1e-10;

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < TOL, "{what}[{i}]: {g} vs {w}");
    }
}

fn close_rows(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        close(g, w, &format!("{what} row {i}"));
    }
}

/// The gradient of `loss` with respect to `x` (ragged rows padded: cut back to the lengths of
/// `like`) against the golden rows `want`.
fn close_grad(loss: &Tensor, x: &Var, like: &[Vec<f64>], want: &Value) {
    let grads = loss.backward().unwrap();
    let padded: Vec<Vec<f64>> = grads.get(x).unwrap().to_vec2().unwrap();
    let got: Vec<Vec<f64>> = padded
        .iter()
        .zip(like)
        .map(|(r, l)| r[..l.len()].to_vec())
        .collect();
    close_rows(&got, &rows(want), "grad");
}

#[test]
fn kl_estimators() {
    let g: Value = load("estimators_golden.json");
    let (old, reference) = (rows(&g["old"]), rows(&g["ref"]));
    for (name, est) in [
        ("k1", KlEstimator::K1),
        ("k2", KlEstimator::K2),
        ("k3", KlEstimator::K3),
    ] {
        let got: Vec<Vec<f64>> = old
            .iter()
            .zip(&reference)
            .map(|(o, r)| {
                o.iter()
                    .zip(r)
                    .map(|(a, b)| approx_kl(*a, *b, est))
                    .collect()
            })
            .collect();
        close_rows(&got, &rows(&g["cases"][format!("kl_{name}")]), name);
    }
}

#[test]
fn advantages_of_every_estimator() {
    let g: Value = load("estimators_golden.json");
    let scores = vec1(&g["scores"]);
    let lens: Vec<usize> = vec1(&g["lens"]).iter().map(|&x| x as usize).collect();
    let (old, reference, values) = (rows(&g["old"]), rows(&g["ref"]), rows(&g["values"]));
    let group_size = g["group_size"].as_u64().unwrap() as usize;
    let kl_for = |e: Estimator| -> Vec<Vec<f64>> {
        old.iter()
            .zip(&reference)
            .map(|(o, r)| {
                o.iter()
                    .zip(r)
                    .map(|(a, b)| token_kl(e, KlEstimator::K1, *a, *b))
                    .collect()
            })
            .collect()
    };
    let cfg = |estimator, normalize_advantages, whiten_rewards| EstimatorConfig {
        estimator,
        kl_coef: g["kl_coef"].as_f64().unwrap(),
        gamma: g["gamma"].as_f64().unwrap(),
        lam: g["lam"].as_f64().unwrap(),
        normalize_advantages,
        whiten_rewards,
    };
    for norm in [false, true] {
        let kl = kl_for(Estimator::Rloo);
        let inp = EstimatorInputs {
            rewards: &scores,
            group_size,
            kl: Some(&kl),
            values: None,
            lens: &lens,
        };
        let Estimate::PerSequence(a) = estimate(&inp, &cfg(Estimator::Rloo, norm, false)) else {
            panic!("rloo is per sequence")
        };
        close(
            &a,
            &vec1(&g["cases"][format!("rloo_normalize_{}", py(norm))]),
            "rloo",
        );
    }
    for (est, name, whiten) in [
        (Estimator::Reinforce, "reinforce", false),
        (Estimator::ReinforceBaseline, "reinforce_baseline", false),
        (Estimator::Gae, "gae", false),
        (Estimator::Gae, "gae", true),
    ] {
        let kl = kl_for(est);
        let inp = EstimatorInputs {
            rewards: &scores,
            group_size,
            kl: Some(&kl),
            values: Some(&values),
            lens: &lens,
        };
        let Estimate::PerToken {
            advantages,
            returns,
        } = estimate(&inp, &cfg(est, false, whiten))
        else {
            panic!("{name} is per token")
        };
        let case = &g["cases"][format!("{name}_whiten_rewards_{}", py(whiten))];
        close_rows(
            &advantages,
            &rows(&case["advantages"]),
            &format!("{name} advantages"),
        );
        close_rows(
            &returns,
            &rows(&case["returns"]),
            &format!("{name} returns"),
        );
    }
}

fn py(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

#[test]
fn rloo_sequence_loss_and_gradient() {
    let g: Value = load("estimators_golden.json");
    let c = &g["rloo_loss"];
    let logp_rows = rows(&c["logp"]);
    let (logp, mask) = padded(&logp_rows, DType::F64);
    let (old, _) = padded(&rows(&g["old"]), DType::F64);
    let adv = Tensor::new(vec1(&c["advantages"]), &Device::Cpu).unwrap();
    let v = Var::from_tensor(&logp).unwrap();
    let out = rloo_loss(&RlooLossInputs {
        logp: v.as_tensor(),
        old_logp: Some(&old),
        advantages: &adv,
        mask: &mask,
        epsilon_low: c["eps_low"].as_f64().unwrap(),
        epsilon_high: c["eps_high"].as_f64().unwrap(),
        accumulation_steps: c["k"].as_u64().unwrap() as usize,
        micro_batch_rows: None,
    })
    .unwrap();
    close(
        &[out.loss.to_scalar::<f64>().unwrap()],
        &[c["loss"].as_f64().unwrap()],
        "loss",
    );
    close(
        &[out.clip_low, out.clip_high],
        &[
            c["clip_low"].as_f64().unwrap(),
            c["clip_high"].as_f64().unwrap(),
        ],
        "clip",
    );
    close_grad(&out.loss, &v, &logp_rows, &c["grad"]);
}

#[test]
fn clipped_value_loss_and_gradient() {
    let g: Value = load("estimators_golden.json");
    let c = &g["value_loss"];
    let v_rows = rows(&c["values"]);
    let (v, mask) = padded(&v_rows, DType::F64);
    let (old, _) = padded(&rows(&g["values"]), DType::F64);
    let (ret, _) = padded(&rows(&c["returns"]), DType::F64);
    let var = Var::from_tensor(&v).unwrap();
    let out = value_loss(&ValueLossInputs {
        values: var.as_tensor(),
        old_values: &old,
        returns: &ret,
        mask: &mask,
        clip: Some(c["clip"].as_f64().unwrap()),
        accumulation_steps: c["k"].as_u64().unwrap() as usize,
    })
    .unwrap();
    close(
        &[out.loss.to_scalar::<f64>().unwrap(), out.clipfrac],
        &[c["loss"].as_f64().unwrap(), c["clipfrac"].as_f64().unwrap()],
        "value loss",
    );
    close_grad(&out.loss, &var, &v_rows, &c["grad"]);
}

#[test]
fn dynamic_sampling_filter() {
    let g: Value = load("estimators_golden.json");
    let keep: Vec<bool> = g["filter_groups"]["keep"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_bool().unwrap())
        .collect();
    assert_eq!(groups_with_signal(&vec1(&g["scores"]), 4), keep);
    assert!(keep.contains(&false), "the case has a group without signal");
}
