//! AdamW's precisions (`AdamWPrecision`): the split master reproduces the f32 master bit for bit
//! over many steps, every precision resumes exactly from its saved state, and `ParamDtype` keeps
//! PyTorch's bf16 state.

use std::collections::HashMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rlft_train::{AdamW, AdamWConfig, AdamWKernel, AdamWPrecision, ParamGroup, TrainError};

/// Sizes across the fused kernel's chunking: one partial chunk, several chunks and a tail.
const SIZES: [usize; 3] = [37, 2 * 16 * 1024 + 5, 300];

fn params(dtype: DType) -> Vec<Var> {
    SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let v: Vec<f32> = (0..n)
                .map(|i| (0.011 * i as f32 + k as f32).sin() * (1.0 + k as f32))
                .collect();
            let t = Tensor::from_vec(v, n, &Device::Cpu).unwrap();
            Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
        })
        .collect()
}

fn optimizer(vars: &[Var], precision: AdamWPrecision, kernel: AdamWKernel) -> AdamW {
    let cfg = AdamWConfig {
        lr: 3e-4,
        weight_decay: 0.01,
        ..Default::default()
    };
    let groups = vec![
        ParamGroup::new(vars[..2].to_vec()),
        ParamGroup::new(vars[2..].to_vec()).with_lr_mult(0.5),
    ];
    AdamW::new(groups, cfg)
        .unwrap()
        .with_kernel(kernel)
        .with_precision(precision)
        .unwrap()
}

/// Step `t`'s gradients (bf16, as a bf16 model's backward gives them); parameter 2 has none
/// on every fifth step.
fn grads(vars: &[Var], t: usize) -> GradStore {
    let mut store = GradStore::default();
    for (k, v) in vars.iter().enumerate() {
        if k == 2 && t % 5 == 4 {
            continue;
        }
        let n = v.elem_count();
        let g: Vec<f32> = (0..n)
            .map(|i| (0.05 * i as f32 + t as f32 * 0.7 + k as f32).sin() * 0.1)
            .collect();
        let g = Tensor::from_vec(g, n, &Device::Cpu).unwrap();
        store.insert(v.as_tensor(), g.to_dtype(DType::BF16).unwrap());
    }
    store
}

fn run(opt: &mut AdamW, vars: &[Var], steps: std::ops::Range<usize>) {
    for t in steps {
        opt.set_lr(3e-4 * (1.0 - t as f64 / 400.0));
        opt.step(&grads(vars, t)).unwrap();
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    match t.dtype() {
        DType::BF16 => t
            .to_vec1::<half::bf16>()
            .unwrap()
            .iter()
            .map(|x| u32::from(x.to_bits()))
            .collect(),
        _ => t
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
    }
}

/// The f32 masters of a state: `master`, or `master_low` joined with the parameter (the
/// documented format: bits(master) = bits(param) << 16 + the low half as a signed 16-bit value).
fn masters(opt: &AdamW, vars: &[Var]) -> Vec<Vec<u32>> {
    let state: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
    vars.iter()
        .enumerate()
        .map(|(i, v)| {
            if let Some(w) = state.get(&format!("state.{i}.master")) {
                return bits(w);
            }
            let lo = bits(&state[&format!("state.{i}.master_low")]);
            let hi = bits(v.as_tensor());
            hi.iter()
                .zip(&lo)
                .map(|(&h, &l)| (h << 16).wrapping_add(l as u16 as i16 as i32 as u32))
                .collect()
        })
        .collect()
}

/// Panics with the count and the first of the elements where `a` and `b` differ.
fn assert_same(a: &[Vec<u32>], b: &[Vec<u32>], what: &str) {
    let (a, b): (Vec<u32>, Vec<u32>) = (a.concat(), b.concat());
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    if let Some(&i) = diff.first() {
        panic!(
            "{what}: {} of {} elements differ; the first, {i}: {:#010x} vs {:#010x}",
            diff.len(),
            a.len(),
            a[i],
            b[i]
        );
    }
}

fn param_bits(vars: &[Var]) -> Vec<Vec<u32>> {
    vars.iter().map(|v| bits(v.as_tensor())).collect()
}

/// Over 300 steps, on either kernel, the split master holds the f32 master's values bit for bit.
/// The fused kernel writes both modes' bf16 weights the same way, so they match too; the tensor
/// path rounds the f32 master's weights to nearest even, so they may differ on exact ties.
#[test]
fn split_master_equals_f32_master_bit_for_bit() {
    for kernel in [AdamWKernel::Fused, AdamWKernel::Reference] {
        let (a, b) = (params(DType::BF16), params(DType::BF16));
        let mut f32_master = optimizer(&a, AdamWPrecision::F32Master, kernel);
        let mut split = optimizer(&b, AdamWPrecision::SplitMaster, kernel);
        for chunk in 0..6 {
            let steps = chunk * 50..(chunk + 1) * 50;
            run(&mut f32_master, &a, steps.clone());
            run(&mut split, &b, steps);
            let what = format!("{kernel:?}, after step {}", (chunk + 1) * 50);
            let (wa, wb) = (masters(&f32_master, &a), masters(&split, &b));
            assert_same(&wa, &wb, &format!("masters, {what}"));
            if kernel == AdamWKernel::Fused {
                assert_same(&param_bits(&a), &param_bits(&b), &format!("params, {what}"));
            }
        }
        let state: HashMap<String, Tensor> = split.state_tensors().unwrap().into_iter().collect();
        assert_eq!(state["state.1.master_low"].dtype(), DType::BF16);
        assert_eq!(state["state.1.exp_avg"].dtype(), DType::F32);
        assert!(!state.contains_key("state.1.master"));
    }
}

#[test]
fn every_precision_resumes_exactly() {
    for precision in [
        AdamWPrecision::F32Master,
        AdamWPrecision::SplitMaster,
        AdamWPrecision::ParamDtype,
    ] {
        for dtype in [DType::BF16, DType::F32] {
            let vars = params(dtype);
            let mut opt = optimizer(&vars, precision, AdamWKernel::Fused);
            run(&mut opt, &vars, 0..7);
            let saved: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
            let copies: Vec<Var> = vars
                .iter()
                .map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap())
                .collect();
            let mut resumed = optimizer(&copies, precision, AdamWKernel::Fused);
            resumed.load_state_tensors(&saved).unwrap();
            run(&mut opt, &vars, 7..20);
            run(&mut resumed, &copies, 7..20);
            let what = format!("{precision:?} {dtype:?}");
            assert_same(&param_bits(&vars), &param_bits(&copies), &what);
            let state = |o: &AdamW| -> Vec<(String, Vec<u32>)> {
                let mut s: Vec<_> = o
                    .state_tensors()
                    .unwrap()
                    .into_iter()
                    .map(|(k, t)| {
                        (
                            k,
                            bits(&t.flatten_all().unwrap().to_dtype(DType::F32).unwrap()),
                        )
                    })
                    .collect();
                s.sort();
                s
            };
            assert_eq!(state(&opt), state(&resumed), "{what}");
        }
    }
}

/// A state saved under one precision resumes under another: the f32 master and the split
/// master convert both ways, and a run switched midway ends where the unswitched one does.
#[test]
fn master_state_converts_between_precisions() {
    let pairs = [
        (AdamWPrecision::F32Master, AdamWPrecision::SplitMaster),
        (AdamWPrecision::SplitMaster, AdamWPrecision::F32Master),
    ];
    for (from, to) in pairs {
        let (a, b) = (params(DType::BF16), params(DType::BF16));
        let mut whole = optimizer(&a, to, AdamWKernel::Fused);
        let mut first = optimizer(&b, from, AdamWKernel::Fused);
        run(&mut whole, &a, 0..9);
        run(&mut first, &b, 0..9);
        let saved: HashMap<String, Tensor> = first.state_tensors().unwrap().into_iter().collect();
        let mut second = optimizer(&b, to, AdamWKernel::Fused);
        second.load_state_tensors(&saved).unwrap();
        run(&mut whole, &a, 9..30);
        run(&mut second, &b, 9..30);
        assert_eq!(param_bits(&a), param_bits(&b), "{from:?} -> {to:?}");
        assert_eq!(
            masters(&whole, &a),
            masters(&second, &b),
            "{from:?} -> {to:?}"
        );
    }
}

/// PyTorch's AdamW on bf16 weights: bf16 moments, no master, and updates below half a bf16 ulp
/// are lost (the weights of a slow learning rate do not move), where the masters keep them.
#[test]
fn param_dtype_keeps_torch_bf16_state() {
    let slow = AdamWConfig {
        lr: 1e-6,
        ..Default::default()
    };
    let mut moved = Vec::new();
    for precision in [AdamWPrecision::ParamDtype, AdamWPrecision::F32Master] {
        let vars = params(DType::BF16);
        let before = param_bits(&vars).concat();
        let mut opt = AdamW::new(vec![ParamGroup::new(vars.clone())], slow.clone())
            .unwrap()
            .with_precision(precision)
            .unwrap();
        for t in 0..200 {
            opt.step(&grads(&vars, t)).unwrap();
        }
        let state: HashMap<String, Tensor> = opt.state_tensors().unwrap().into_iter().collect();
        if precision == AdamWPrecision::ParamDtype {
            assert_eq!(state["state.1.exp_avg"].dtype(), DType::BF16);
            assert_eq!(state["state.1.exp_avg_sq"].dtype(), DType::BF16);
            assert!(!state.keys().any(|k| k.contains("master")));
        }
        // Where the weights are: the parameters, or the f32 masters (as bf16-aligned bits).
        let after: Vec<u32> = match precision {
            AdamWPrecision::F32Master => masters(&opt, &vars).concat(),
            _ => param_bits(&vars).concat().iter().map(|b| b << 16).collect(),
        };
        let before = before.iter().map(|b| b << 16);
        let changed = before.zip(&after).filter(|(x, y)| x != *y).count();
        moved.push(changed as f64 / after.len() as f64);
    }
    // 200 steps of 1e-6 is 2e-4: below half a bf16 ulp of weights above ~0.05 in magnitude.
    assert!(
        moved[0] < 0.2,
        "ParamDtype moved {:.2} of the weights",
        moved[0]
    );
    assert!(
        moved[1] > 0.9,
        "F32Master moved {:.2} of the weights",
        moved[1]
    );
}

/// The fused kernel and the tensor path agree for `ParamDtype` (both compute each element in
/// f32 and round into bf16) to one bf16 rounding.
#[test]
fn param_dtype_kernels_agree() {
    let mut finals = Vec::new();
    for kernel in [AdamWKernel::Fused, AdamWKernel::Reference] {
        let vars = params(DType::BF16);
        let mut opt = optimizer(&vars, AdamWPrecision::ParamDtype, kernel);
        run(&mut opt, &vars, 0..20);
        finals.push(
            vars.iter()
                .map(|v| {
                    v.as_tensor()
                        .to_dtype(DType::F32)
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                })
                .collect::<Vec<_>>(),
        );
    }
    for (a, b) in finals[0].iter().flatten().zip(finals[1].iter().flatten()) {
        // One bf16 ulp: 2^-7 relative.
        assert!(
            (a - b).abs() <= a.abs().max(b.abs()) / 128.0 + 1e-30,
            "{a} vs {b}"
        );
    }
}

#[test]
fn precision_is_chosen_before_the_first_step() {
    let vars = params(DType::F32);
    let mut opt = AdamW::new(vec![ParamGroup::new(vars.clone())], AdamWConfig::default()).unwrap();
    opt.step(&grads(&vars, 0)).unwrap();
    let err = opt.with_precision(AdamWPrecision::SplitMaster).unwrap_err();
    assert!(matches!(err, TrainError::Precision(_)), "{err}");
    assert!(err.to_string().contains("before the first step"), "{err}");
}
