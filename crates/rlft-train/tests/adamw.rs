//! AdamW against torch.optim.AdamW (`tests/golden/adamw.json`, from
//! `scripts/reference/adamw_golden.py`), fused == reference, state round trips, bf16 masters.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rlft_train::{AdamW, AdamWConfig, AdamWKernel, ParamGroup, TrainError};
use serde_json::Value;

const NAMES: [&str; 3] = ["w1", "b1", "w2"];

struct Golden(Value);

impl Golden {
    fn load() -> Self {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/adamw.json");
        Golden(serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
    }
    fn floats(v: &Value) -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    }
    fn shape(&self, name: &str) -> Vec<usize> {
        let s = self.0["shapes"][name].as_array().unwrap();
        s.iter().map(|d| d.as_u64().unwrap() as usize).collect()
    }
    fn tensor(&self, name: &str, values: &Value) -> Tensor {
        Tensor::from_vec(Self::floats(values), self.shape(name), &Device::Cpu).unwrap()
    }
    fn steps(&self) -> &Vec<Value> {
        self.0["steps"].as_array().unwrap()
    }
    fn config(&self) -> AdamWConfig {
        AdamWConfig {
            lr: self.steps()[0]["lr"].as_f64().unwrap(),
            beta1: self.0["betas"][0].as_f64().unwrap(),
            beta2: self.0["betas"][1].as_f64().unwrap(),
            eps: self.0["eps"].as_f64().unwrap(),
            weight_decay: 0.0,
        }
    }
    /// Fresh vars holding the initial values.
    fn vars(&self) -> HashMap<&'static str, Var> {
        NAMES
            .iter()
            .map(|&n| {
                (
                    n,
                    Var::from_tensor(&self.tensor(n, &self.0["init"][n])).unwrap(),
                )
            })
            .collect()
    }
    /// The script's two groups: [w1, w2] with weight decay 0.1, [b1] with 0 and lr x 0.5.
    fn optimizer(&self, vars: &HashMap<&str, Var>, kernel: AdamWKernel) -> AdamW {
        let groups = self.0["groups"].as_array().unwrap();
        let groups = groups
            .iter()
            .map(|g| {
                let vs = g["params"].as_array().unwrap();
                let vs = vs
                    .iter()
                    .map(|n| vars[n.as_str().unwrap()].clone())
                    .collect();
                ParamGroup::new(vs)
                    .with_weight_decay(g["weight_decay"].as_f64().unwrap())
                    .with_lr_mult(g["lr_mult"].as_f64().unwrap())
            })
            .collect();
        AdamW::new(groups, self.config())
            .unwrap()
            .with_kernel(kernel)
    }
    fn grads(&self, t: usize, vars: &HashMap<&str, Var>) -> GradStore {
        let mut store = GradStore::default();
        for n in NAMES {
            let g = &self.steps()[t]["grads"][n];
            if !g.is_null() {
                store.insert(vars[n].as_tensor(), self.tensor(n, g));
            }
        }
        store
    }
    fn run(&self, opt: &mut AdamW, vars: &HashMap<&str, Var>, steps: std::ops::Range<usize>) {
        for t in steps {
            opt.set_lr(self.steps()[t]["lr"].as_f64().unwrap());
            opt.step(&self.grads(t, vars)).unwrap();
        }
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// `w` rounded to bf16 half away from zero, as an f32.
fn round_half_away(w: f32) -> f32 {
    f32::from_bits((w.to_bits().wrapping_add(0x8000) >> 16) << 16)
}

/// Largest `|a - b| / max(|b|, 1e-2)`: relative error, absolute below 1e-2.
fn max_rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).abs() / (y as f64).abs().max(1e-2))
        .fold(0.0, f64::max)
}

#[test]
fn matches_torch_every_step_both_kernels() {
    let gold = Golden::load();
    for kernel in [AdamWKernel::Reference, AdamWKernel::Fused] {
        let vars = gold.vars();
        let mut opt = gold.optimizer(&vars, kernel);
        let mut worst = 0f64;
        for t in 0..gold.steps().len() {
            gold.run(&mut opt, &vars, t..t + 1);
            for n in NAMES {
                let want = Golden::floats(&gold.steps()[t]["params"][n]);
                let err = max_rel_err(&values(vars[n].as_tensor()), &want);
                assert!(err < 1e-6, "{kernel:?} step {t} {n}: rel err {err:e}");
                worst = worst.max(err);
            }
        }
        eprintln!("{kernel:?}: max relative error vs torch over 6 steps: {worst:.2e}");
        // b1 had no gradient at step 3: PyTorch did not count that step for it.
        assert_eq!(opt.param_step(0), Some(6)); // w1
        assert_eq!(opt.param_step(2), Some(5)); // b1 (group 1 comes after w1, w2)
    }
}

#[test]
fn state_matches_torch_state_dict() {
    let gold = Golden::load();
    let vars = gold.vars();
    let mut opt = gold.optimizer(&vars, AdamWKernel::Fused);
    gold.run(&mut opt, &vars, 0..gold.steps().len());
    let state: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
    assert_eq!(state.len(), 9, "step, exp_avg, exp_avg_sq for 3 f32 params");
    for (i, s) in gold.0["final_state"].as_object().unwrap() {
        let step = state[&format!("state.{i}.step")]
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(step, s["step"].as_f64().unwrap(), "param {i} step");
        for field in ["exp_avg", "exp_avg_sq"] {
            let got = values(&state[&format!("state.{i}.{field}")]);
            let err = max_rel_err(&got, &Golden::floats(&s[field]));
            assert!(err < 1e-6, "param {i} {field}: rel err {err:e}");
        }
    }
}

#[test]
fn fused_equals_reference_on_large_tensors() {
    // Several chunks (parallel path), odd length (loop tails), weight decay on.
    let n = 3 * 16 * 1024 + 77;
    let init: Vec<f32> = (0..n).map(|i| (0.013 * i as f32).sin()).collect();
    let mut results = Vec::new();
    for kernel in [AdamWKernel::Reference, AdamWKernel::Fused] {
        let var = Var::from_vec(init.clone(), n, &Device::Cpu).unwrap();
        let cfg = AdamWConfig {
            lr: 3e-3,
            weight_decay: 0.05,
            ..Default::default()
        };
        let group = ParamGroup::new(vec![var.clone()]);
        let mut opt = AdamW::new(vec![group], cfg).unwrap().with_kernel(kernel);
        for t in 0..5 {
            let g: Vec<f32> = (0..n)
                .map(|i| (0.07 * i as f32 + t as f32).cos() * 0.1)
                .collect();
            let mut store = GradStore::default();
            store.insert(
                var.as_tensor(),
                Tensor::from_vec(g, n, &Device::Cpu).unwrap(),
            );
            opt.step(&store).unwrap();
        }
        results.push(values(var.as_tensor()));
    }
    let err = max_rel_err(&results[1], &results[0]);
    assert!(err < 1e-6, "fused vs reference: rel err {err:e}");
}

#[test]
fn state_round_trip_resumes_exactly() {
    let gold = Golden::load();
    let vars = gold.vars();
    let mut opt = gold.optimizer(&vars, AdamWKernel::Fused);
    gold.run(&mut opt, &vars, 0..3);
    let saved: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
    // A fresh optimizer on copies of the params after step 3, as a checkpoint would restore.
    let resumed_vars: HashMap<&str, Var> = NAMES
        .iter()
        .map(|&n| {
            (
                n,
                Var::from_tensor(&vars[n].as_tensor().copy().unwrap()).unwrap(),
            )
        })
        .collect();
    let mut resumed = gold.optimizer(&resumed_vars, AdamWKernel::Fused);
    resumed.load_state_tensors(&saved).unwrap();
    gold.run(&mut opt, &vars, 3..6);
    gold.run(&mut resumed, &resumed_vars, 3..6);
    for n in NAMES {
        assert_eq!(
            values(vars[n].as_tensor()),
            values(resumed_vars[n].as_tensor()),
            "{n}"
        );
    }
}

#[test]
fn load_state_rejects_mismatches_with_a_fix() {
    let gold = Golden::load();
    let vars = gold.vars();
    let mut opt = gold.optimizer(&vars, AdamWKernel::Fused);
    gold.run(&mut opt, &vars, 0..1);
    let saved: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
    // Same vars, groups in another order: w1's state lands on b1.
    let swapped = AdamW::new(
        vec![
            ParamGroup::new(vec![vars["b1"].clone()]),
            ParamGroup::new(vec![vars["w1"].clone()]),
        ],
        gold.config(),
    );
    let err = swapped
        .unwrap()
        .load_state_tensors(&saved)
        .unwrap_err()
        .to_string();
    assert!(err.contains("same vars, in the same order"), "{err}");
    let mut bad = saved.clone();
    bad.insert(
        "state.0.momentum".into(),
        Tensor::new(1f32, &Device::Cpu).unwrap(),
    );
    let err = opt.load_state_tensors(&bad).unwrap_err().to_string();
    assert!(
        err.contains("state.<index>.<step|exp_avg|exp_avg_sq|master|master_low>"),
        "{err}"
    );
}

#[test]
fn bf16_params_keep_f32_masters_and_kernels_agree() {
    let n = 2 * 16 * 1024 + 5;
    let init: Vec<f32> = (0..n).map(|i| (0.011 * i as f32).sin()).collect();
    let mut finals = Vec::new();
    for kernel in [AdamWKernel::Reference, AdamWKernel::Fused] {
        let t = Tensor::from_vec(init.clone(), n, &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16);
        let var = Var::from_tensor(&t.unwrap()).unwrap();
        let cfg = AdamWConfig {
            lr: 1e-4, // updates far below a bf16 ulp of the weights: only a master keeps them
            ..Default::default()
        };
        let group = ParamGroup::new(vec![var.clone()]);
        let mut opt = AdamW::new(vec![group], cfg).unwrap().with_kernel(kernel);
        for t in 0..4 {
            let g: Vec<f32> = (0..n).map(|i| (0.05 * i as f32 + t as f32).sin()).collect();
            let g = Tensor::from_vec(g, n, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let mut store = GradStore::default();
            store.insert(var.as_tensor(), g);
            opt.step(&store).unwrap();
        }
        let state: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
        let master = &state["state.0.master"];
        assert_eq!(master.dtype(), DType::F32);
        assert_eq!(state["state.0.exp_avg"].dtype(), DType::F32);
        // The bf16 weights are the rounded masters: half away from zero in the fused kernel
        // (what the split master needs), to nearest even on the tensor path.
        let rounded: Vec<f32> = match kernel {
            AdamWKernel::Fused => values(master).iter().map(|&w| round_half_away(w)).collect(),
            AdamWKernel::Reference => values(&master.to_dtype(DType::BF16).unwrap()),
        };
        assert_eq!(rounded, values(var.as_tensor()), "{kernel:?}");
        // The master moved by ~4 lr from the start even where bf16 could not show it.
        let moved = values(master)
            .iter()
            .zip(&init)
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            moved > n * 9 / 10,
            "{kernel:?}: only {moved} of {n} master weights moved"
        );
        finals.push(values(master));
    }
    let err = max_rel_err(&finals[1], &finals[0]);
    assert!(
        err < 1e-6,
        "bf16 fused vs reference masters: rel err {err:e}"
    );
}

#[test]
fn config_and_group_errors_say_how_to_fix() {
    let v = Var::zeros(3, DType::F32, &Device::Cpu).unwrap();
    let bad_beta = AdamWConfig {
        beta2: 1.0,
        ..Default::default()
    };
    let err = AdamW::new(vec![ParamGroup::new(vec![v.clone()])], bad_beta).unwrap_err();
    assert!(
        matches!(err, TrainError::Hyperparameter { what: "beta2", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("[0, 1)"), "{err}");
    let dup = vec![
        ParamGroup::new(vec![v.clone()]),
        ParamGroup::new(vec![v.clone()]),
    ];
    let err = AdamW::new(dup, Default::default()).unwrap_err().to_string();
    assert!(err.contains("list each var once"), "{err}");
}

#[test]
fn split_decay_puts_vectors_in_a_no_decay_group() {
    let dev = Device::Cpu;
    let w = Var::zeros((4, 3), DType::F32, &dev).unwrap();
    let b = Var::zeros(4, DType::F32, &dev).unwrap();
    let groups = ParamGroup::split_decay(vec![w.clone(), b.clone()]);
    assert_eq!(groups[0].vars[0].id(), w.id());
    assert_eq!(groups[0].weight_decay, None);
    assert_eq!(groups[1].vars[0].id(), b.id());
    assert_eq!(groups[1].weight_decay, Some(0.0));
}

#[test]
fn works_as_a_candle_nn_optimizer() {
    use candle_nn::Optimizer;
    let dev = Device::Cpu;
    let w = Var::from_vec(vec![1f32, -2.0, 3.0], 3, &dev).unwrap();
    let cfg = AdamWConfig {
        lr: 0.1,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = <AdamW as Optimizer>::new(vec![w.clone()], cfg).unwrap();
    for _ in 0..50 {
        let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
        opt.backward_step(&loss).unwrap();
    }
    let norm = values(w.as_tensor())
        .iter()
        .map(|x| x.abs())
        .fold(0f32, f32::max);
    assert!(
        norm < 0.5,
        "AdamW should shrink |w| towards 0, got max {norm}"
    );
}
