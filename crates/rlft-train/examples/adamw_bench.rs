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
//! Same case as the reference's `bench/reference/bench.py` (adamw): lr 1e-6, weight decay 0,
//! gradients fixed, one untimed warm-up step (it first touches the zeroed moments), then the
//! median and minimum of `--reps` timed steps. PyTorch's fused AdamW on the same shapes, for a
//! side-by-side ratio: `scripts/reference/adamw_bench.py`. The setup is [`rlft_train::bench`]'s; `rlft bench
//! adamw` times the same fused step on the default model's own parameters, beside bench.py.

use candle_core::Device;
use candle_nn::Optimizer;
use rlft_train::bench::{bench_config, smollm2_shapes, synthetic_grads, synthetic_vars, time_reps};
use rlft_train::{
    clip_grad_norm, global_grad_norm, AdamW, AdamWKernel, GradAccumulator, ParamGroup,
};

/// Median and minimum in ms of one untimed warm-up step (first touch of the moments) and `reps`
/// timed ones.
fn time_steps(reps: usize, mut step: impl FnMut()) -> (f64, f64) {
    let mut t = time_reps(1, reps, || {
        step();
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap_or_else(|e| match e {});
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2] * 1e3, t[0] * 1e3)
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
    let vars = synthetic_vars(&smollm2_shapes(), &dev)?;
    let mut grads = synthetic_grads(&vars)?;
    let n_params: usize = vars.iter().map(|v| v.elem_count()).sum();
    println!(
        "AdamW step, {:.1}M f32 params in {} tensors, {} rayon threads, median [min] of {reps} steps",
        n_params as f64 / 1e6,
        vars.len(),
        rayon::current_num_threads()
    );
    let cfg = bench_config();
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
