//! AdamW step time on SmolLM2-135M's parameter shapes (134.5M f32 params in 272 tensors):
//! rlft's reference (tensor ops) and fused kernels, and stock `candle_nn::AdamW` for scale; then
//! the global gradient norm, clipping and accumulation over the same gradients.
//!
//! ```sh
//! flock /tmp/rlft-bench.lock cargo run --release -p rlft-train --example adamw_bench
//! flock /tmp/rlft-bench.lock cargo run --release -p rlft-train --example adamw_bench -- --reps 9 --skip-candle-nn
//! flock /tmp/rlft-bench.lock cargo run --release -p rlft-train --example adamw_bench -- --fused-only
//! ```
//!
//! Same case as `../shared/bench/trl_cpu/bench.py` (adamw): lr 1e-6, weight decay 0, gradients
//! fixed, one untimed warm-up step (it first touches the zeroed moments), then the median and
//! minimum of `--reps` timed steps. PyTorch's fused AdamW on the same shapes, for a side-by-side
//! ratio: `scripts/reference/adamw_bench.py`.

use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use candle_nn::Optimizer;
use rlft_train::{
    clip_grad_norm, global_grad_norm, AdamW, AdamWConfig, AdamWKernel, GradAccumulator, ParamGroup,
};

/// SmolLM2-135M: hidden 576, 30 layers, 9 q heads / 3 kv heads of 64, MLP 1536, vocab 49152.
fn shapes() -> Vec<Vec<usize>> {
    let (h, kv, mlp) = (576, 192, 1536);
    let mut s = vec![vec![49152, h]];
    for _ in 0..30 {
        s.extend([
            vec![h, h],
            vec![kv, h],
            vec![kv, h],
            vec![h, h],
            vec![mlp, h],
            vec![mlp, h],
            vec![h, mlp],
            vec![h],
            vec![h],
        ]);
    }
    s.push(vec![h]);
    s
}

/// Deterministic values in [-scale, scale) (a cheap hash, not a formula LLVM could fold).
fn fill(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let x = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn median_min(mut t: Vec<f64>) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0])
}

fn time_steps(reps: usize, mut step: impl FnMut()) -> (f64, f64) {
    step(); // warm-up: first touch of the moments
    let times = (0..reps)
        .map(|_| {
            let t = Instant::now();
            step();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median_min(times)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5);
    let fused_only = args.iter().any(|a| a == "--fused-only");
    let skip_candle_nn = fused_only || args.iter().any(|a| a == "--skip-candle-nn");

    let dev = Device::Cpu;
    let shapes = shapes();
    let mut vars = Vec::new();
    let mut grads = GradStore::default();
    for (i, s) in shapes.iter().enumerate() {
        let n = s.iter().product();
        let v = Var::from_tensor(&Tensor::from_vec(
            fill(n, i as u64, 0.05),
            s.as_slice(),
            &dev,
        )?)?;
        grads.insert(
            v.as_tensor(),
            Tensor::from_vec(fill(n, 1000 + i as u64, 1e-3), s.as_slice(), &dev)?,
        );
        vars.push(v);
    }
    let n_params: usize = vars.iter().map(|v| v.elem_count()).sum();
    println!(
        "AdamW step, {:.1}M f32 params in {} tensors, {} rayon threads, median [min] of {reps} steps",
        n_params as f64 / 1e6,
        vars.len(),
        rayon::current_num_threads()
    );
    let cfg = AdamWConfig {
        lr: 1e-6,
        weight_decay: 0.0,
        ..Default::default()
    };
    // Bytes the fused kernel must move: read p, g, m, v; write p, m, v.
    let gbytes = n_params as f64 * 28.0 / 1e9;
    for kernel in [AdamWKernel::Reference, AdamWKernel::Fused] {
        if fused_only && kernel == AdamWKernel::Reference {
            continue;
        }
        let group = ParamGroup::new(vars.clone());
        let mut opt = AdamW::new(vec![group], cfg.clone())?.with_kernel(kernel);
        let (med, min) = time_steps(reps, || opt.step(&grads).expect("step"));
        println!(
            "  rlft {:<9} {med:8.1} ms [{min:7.1}]  ({:.1} GB/s of the 28 B/param minimum)",
            format!("{kernel:?}").to_lowercase(),
            gbytes / (med / 1e3)
        );
    }
    if !fused_only {
        let (med, min) = time_steps(reps, || {
            global_grad_norm(&grads, &vars).expect("norm");
        });
        println!("  rlft global_grad_norm {med:6.1} ms [{min:7.1}]");
        // A tiny threshold: every rep scales all gradients in place.
        let (med, min) = time_steps(reps, || {
            clip_grad_norm(&mut grads, &vars, 1e-3).expect("clip");
        });
        println!("  rlft clip_grad_norm   {med:6.1} ms [{min:7.1}]  (norm + in-place scale)");
        let mut acc = GradAccumulator::new(vars.clone());
        acc.add(&grads, 0.5)?;
        let (med, min) = time_steps(reps, || acc.add(&grads, 0.5).expect("add"));
        println!("  rlft accumulate add   {med:6.1} ms [{min:7.1}]  (in place, after the first)");
    }
    if !skip_candle_nn {
        let params = candle_nn::ParamsAdamW {
            lr: 1e-6,
            weight_decay: 0.0,
            ..Default::default()
        };
        let mut opt = candle_nn::AdamW::new(vars.clone(), params)?;
        let (med, min) = time_steps(reps, || opt.step(&grads).expect("step"));
        println!("  candle_nn::AdamW {med:8.1} ms [{min:7.1}]");
    }
    Ok(())
}
