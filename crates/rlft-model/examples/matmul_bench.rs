//! Micro-benchmark of the matmul shapes of a SmolLM2-135M step: gemm (candle) for prefill-sized
//! row counts and the streaming kernel for decode-sized ones.
//!
//! `cargo run --release -p rlft-model --example matmul_bench`

use std::time::Instant;

use candle_core::{Device, Tensor};

fn time<F: FnMut()>(mut f: F, reps: usize) -> f64 {
    f();
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[reps / 2]
}

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    for (m, k, n) in [
        (1016, 576, 1536),
        (1016, 1536, 576),
        (480, 576, 1536),
        (480, 576, 576),
        (480, 1536, 576),
        (8, 576, 1536),
        (8, 576, 49152),
    ] {
        let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let flops = 2.0 * (m * k * n) as f64;
        let wt = w.t()?;
        let g = time(|| drop(x.matmul(&wt).unwrap()), 9);
        let line = format!(
            "{m:>4}x{k:>4}x{n:>6}  gemm {:>7.2} ms {:>6.1} GFLOP/s",
            g * 1e3,
            flops / g / 1e9
        );
        if m <= 16 {
            let s = time(
                || drop(rlft_model::kernels::matmul_wt_small(&x, &w, None).unwrap()),
                9,
            );
            let gbs = (n * k * 4) as f64 / s / 1e9;
            println!(
                "{line}  | streaming {:>7.2} ms {:>6.1} GB/s of weights",
                s * 1e3,
                gbs
            );
        } else {
            println!("{line}");
        }
    }
    Ok(())
}
