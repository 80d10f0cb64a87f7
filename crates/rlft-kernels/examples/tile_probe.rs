//! Micro-benchmark of the streaming `x @ W^T` kernel (`kernels::matmul_wt`) in a pool of a
//! chosen size, weights in cache: the fastest of `reps` calls per shape.
//!
//! `cargo run --release -p rlft-model --example tile_probe -- [threads] [reps] [m k n]`
//! (default: 1 thread, 200 reps, the decode and prefill shapes of SmolLM2-135M).
//! `ALIGN=<0-60, a multiple of 4>` places `x` and `w` that many bytes past a cache line
//! (without it they start on one, as the `rlft` binary allocates them): what unaligned
//! operands cost.

use std::time::Instant;

/// As the `rlft` binary: buffers of 1 KiB and more start on a cache line.
#[global_allocator]
static ALLOC: rlft_kernels::alloc::CacheLineAlloc = rlft_kernels::alloc::CacheLineAlloc;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| {
            s.parse()
                .expect("arguments are numbers: [threads] [reps] [m k n]")
        })
        .collect();
    let threads = a.first().copied().unwrap_or(1);
    let reps = a.get(1).copied().unwrap_or(200).max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let shapes: Vec<(usize, usize, usize)> = if a.len() >= 5 {
        vec![(a[2], a[3], a[4])]
    } else {
        vec![
            (8, 576, 576),
            (35, 576, 576),
            (176, 576, 576),
            (176, 576, 192),
            (176, 576, 1536),
            (176, 1536, 576),
        ]
    };
    for (m, k, n) in shapes {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7) % 29) as f32 / 7.0 - 2.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 11) % 31) as f32 / 9.0 - 1.5)
            .collect();
        // ALIGN=<bytes, a multiple of 4 below 64> places x and w that far past a cache line.
        let off: Option<usize> = std::env::var("ALIGN").ok().map(|v| {
            v.parse()
                .ok()
                .filter(|o: &usize| *o < 64 && o.is_multiple_of(4))
                .expect("ALIGN is a multiple of 4 below 64 (bytes past a cache line)")
        });
        let place = |v: Vec<f32>| -> (Vec<f32>, usize) {
            let Some(off) = off else { return (v, 0) };
            let mut b = vec![0f32; v.len() + 32];
            let a = b.as_ptr() as usize;
            let s = ((64 - a % 64) % 64 + off) / 4;
            b[s..s + v.len()].copy_from_slice(&v);
            (b, s)
        };
        let (xb, xs) = place(x);
        let (wb, ws) = place(w);
        let x = &xb[xs..xs + m * k];
        let w = &wb[ws..ws + n * k];
        eprintln!(
            "x at {} mod 64, w at {} mod 64",
            x.as_ptr() as usize % 64,
            w.as_ptr() as usize % 64
        );
        let mut out = vec![0f32; m * n];
        let best = pool.install(|| {
            let mut best = f64::INFINITY;
            for _ in 0..reps {
                let t = Instant::now();
                rlft_kernels::stream::matmul_wt(x, m, k, w, n, None, &mut out);
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        });
        println!(
            "{m:>4}x{k:>4}x{n:>5} on {threads} thread(s): {:>8.1} us, {:>6.1} GFLOP/s",
            best * 1e6,
            2.0 * (m * n * k) as f64 / best / 1e9
        );
    }
}
