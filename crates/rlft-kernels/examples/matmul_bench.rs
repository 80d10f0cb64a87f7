//! Micro-benchmark of the matmul shapes of a SmolLM2-135M step: gemm (candle) for prefill-sized
//! row counts and the streaming kernel for decode-sized ones.
//!
//! `cargo run --release -p rlft-model --example matmul_bench [-- decode | prefill | kernel]`:
//! everything, or only a decode step's products (`decode`), gemm against the streaming kernel
//! at a generation prefill's sizes (`prefill`), or the block kernel alone on one thread with
//! its weights in cache and streamed (`kernel`).

use std::time::Instant;

use candle_core::{Device, Tensor};

use rlft_gguf::GgmlType;
use rlft_kernels::quant::QuantWeight;

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

/// As the `rlft` binary: buffers of 1 KiB and more start on a cache line.
#[global_allocator]
static ALLOC: rlft_kernels::alloc::CacheLineAlloc = rlft_kernels::alloc::CacheLineAlloc;

fn main() -> candle_core::Result<()> {
    if std::env::args().any(|a| a == "decode") {
        // Only the decode step.
        decode_step();
        return Ok(());
    }
    if std::env::args().any(|a| a == "kernel") {
        block_kernel();
        return Ok(());
    }
    if std::env::args().any(|a| a == "prefill") {
        prefill_products();
        return Ok(());
    }
    let dev = Device::Cpu;
    for (m, k, n) in [
        (1016, 576, 1536),
        (1016, 1536, 576),
        (480, 576, 1536),
        (480, 576, 576),
        (480, 1536, 576),
        (8, 576, 192),
        (8, 576, 576),
        (8, 576, 1536),
        (8, 1536, 576),
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
                || drop(rlft_kernels::stream::matmul_wt_small(&x, &w, None).unwrap()),
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
    // The rank-16 LoRA products of one [1536, 576] layer at 1016 rows (forward and backward).
    let (m, k, n, r) = (1016usize, 576usize, 1536usize, 16usize);
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let g = Tensor::randn(0f32, 1.0, (m, n), &dev)?;
    let a = Tensor::randn(0f32, 1.0, (r, k), &dev)?;
    let b = Tensor::randn(0f32, 1.0, (n, r), &dev)?;
    let h = Tensor::randn(0f32, 1.0, (m, r), &dev)?;
    type Case<'a> = (&'a str, Box<dyn Fn() -> Tensor + 'a>, usize);
    let cases: [Case; 5] = [
        (
            "h = x @ A^T       ",
            Box::new(|| x.matmul(&a.t().unwrap()).unwrap()),
            m * k * r,
        ),
        (
            "y += h @ B^T      ",
            Box::new(|| h.matmul(&b.t().unwrap()).unwrap()),
            m * r * n,
        ),
        (
            "dh = dy @ B       ",
            Box::new(|| g.matmul(&b).unwrap()),
            m * n * r,
        ),
        (
            "dA = dh^T @ x     ",
            Box::new(|| h.t().unwrap().matmul(&x).unwrap()),
            m * k * r,
        ),
        (
            "dB = dy^T @ h     ",
            Box::new(|| g.t().unwrap().matmul(&h).unwrap()),
            m * n * r,
        ),
    ];
    for (name, f, macs) in cases.iter() {
        let t = time(|| drop(f()), 15);
        println!(
            "lora {name} {:>7.3} ms {:>6.1} GFLOP/s",
            t * 1e3,
            2.0 * *macs as f64 / t / 1e9
        );
    }
    // The narrow products without gemm: rows of x (or dy) against the rank-16 factor.
    let (xv, gv) = (
        x.flatten_all()?.to_vec1::<f32>()?,
        g.flatten_all()?.to_vec1::<f32>()?,
    );
    let av = a.flatten_all()?.to_vec1::<f32>()?;
    let bt = b.t()?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let mut o = vec![0f32; m * r];
    for (name, xs, kk, w) in [
        ("h = x @ A^T       ", &xv, k, &av),
        ("dh = dy @ B       ", &gv, n, &bt),
    ] {
        let t = time(
            || rlft_kernels::stream::matmul_wt_rows(xs, m, kk, w, r, &mut o),
            15,
        );
        println!(
            "lora {name} {:>7.3} ms {:>6.1} GFLOP/s (rows kernel)",
            t * 1e3,
            2.0 * (m * kk * r) as f64 / t / 1e9
        );
    }
    decode_step();
    split_vs_gemm_threads();
    fma_peak();
    Ok(())
}

/// This CPU's f32 FMA peak, the ceiling for every product above: 12 independent chains of
/// 8-lane FMAs per thread (enough to fill both FMA pipes of a core), on every rayon thread at
/// once.
/// The GGUF bytes of a random `[n, k]` Q4_1 or Q8_0 weight: small f16 scales (0x2000-ish)
/// and random quants, from the LCG state `byte`.
fn random_blocks(ty: GgmlType, n: usize, k: usize, byte: &mut u32) -> Vec<u8> {
    let size = match ty {
        GgmlType::Q4_1 => 20,
        GgmlType::Q8_0 => 34,
        other => panic!("random_blocks: {other:?} is not a block type here"),
    };
    (0..n * k / 32 * size)
        .map(|j| {
            *byte = byte.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            if j % size < 4 && j % 2 == 1 {
                0x20
            } else {
                (*byte >> 24) as u8
            }
        })
        .collect()
}

/// The block kernel alone on one thread, weights in cache: 8 rows of `x` against a Q4_1
/// gate/up-sized and a Q8_0 head-slice-sized matrix, the fastest of many short trials (a
/// shared host's stolen time only ever adds).
fn block_kernel() {
    let mut byte = 7u32;
    for (ty, n, k) in [
        (GgmlType::Q4_1, 1536usize, 576usize),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q8_0, 1536, 576),
    ] {
        let data = random_blocks(ty, n, k, &mut byte);
        let q = QuantWeight::from_gguf(ty, n, k, &data).expect("block sizes");
        let m = 8;
        let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
        let mut out = vec![0f32; m * n];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let best = pool.install(|| {
            (0..300)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..10 {
                        q.matmul_wt(&x, m, &mut out);
                    }
                    t.elapsed().as_secs_f64() / 10.0
                })
                .fold(f64::INFINITY, f64::min)
        });
        println!(
            "{ty:?} {n}x{k} m=8, 1 thread: {:>6.1} us {:>6.1} GFLOP/s",
            best * 1e6,
            2.0 * (m * n * k) as f64 / best / 1e9
        );
        // The same product over 64 copies of the weight in turn (64 x 0.5 MB: read from memory
        // or L3, as a decode step reads its layers).
        let copies: Vec<QuantWeight> = (0..64)
            .map(|_| QuantWeight::from_gguf(ty, n, k, &data).expect("block sizes"))
            .collect();
        let best = pool.install(|| {
            (0..30)
                .map(|_| {
                    let t = Instant::now();
                    for q in &copies {
                        q.matmul_wt(&x, m, &mut out);
                    }
                    t.elapsed().as_secs_f64() / copies.len() as f64
                })
                .fold(f64::INFINITY, f64::min)
        });
        println!(
            "{ty:?} {n}x{k} m=8, 1 thread, 64 copies: {:>6.1} us {:>6.1} GFLOP/s",
            best * 1e6,
            2.0 * (m * n * k) as f64 / best / 1e9
        );
    }
}

/// A generation prefill's products (tens to hundreds of rows): gemm (packs both operands on
/// every call) against the streaming kernel (`kernels::matmul_wt`, weights read in place).
fn prefill_products() {
    for (m, k, n) in [
        (35, 576, 576),
        (176, 576, 576),
        (176, 576, 192),
        (176, 576, 1536),
        (176, 1536, 576),
        (256, 576, 1536),
        (256, 1536, 576),
        (352, 576, 1536),
        (480, 576, 1536),
        (480, 1536, 576),
    ] {
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1e3 - 0.5)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5)
            .collect();
        let mut o = vec![0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        let g = time(|| gemm_rayon(m, n, k, &mut o, &x, &w), 15);
        let s = time(
            || rlft_kernels::stream::matmul_wt(&x, m, k, &w, n, None, &mut o),
            15,
        );
        println!(
            "{m:>4}x{k:>4}x{n:>5}  gemm {:>6.3} ms {:>6.1} GFLOP/s | streaming {:>6.3} ms {:>6.1} GFLOP/s",
            g * 1e3,
            flops / g / 1e9,
            s * 1e3,
            flops / s / 1e9
        );
    }
}

fn fma_peak() {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        const ITERS: usize = 50_000_000;
        let threads = rayon::current_num_threads();
        let t = Instant::now();
        let sums: Vec<f32> = rayon::broadcast(|_| {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            unsafe { fma_chains(ITERS) }
        });
        let secs = t.elapsed().as_secs_f64();
        let flops = (threads * ITERS * 12 * 16) as f64;
        println!(
            "f32 FMA peak: {:.1} GFLOP/s on {threads} threads ({:.1} per thread; checksum {:.3})",
            flops / secs / 1e9,
            flops / secs / 1e9 / threads as f64,
            sums.iter().sum::<f32>()
        );
    }
}

/// 12 independent chains of 8-lane FMAs, `iters` rounds: the CPU's f32 FMA peak.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(0.001); 12];
    let (b, c) = (_mm256_set1_ps(0.9999), _mm256_set1_ps(0.0001));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, b, c);
        }
    }
    let mut out = [0f32; 8];
    // SAFETY: `out` holds the 8 f32 stored.
    unsafe {
        _mm256_storeu_ps(
            out.as_mut_ptr(),
            acc.iter()
                .fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a)),
        )
    };
    std::hint::black_box(out[0])
}

/// Columns `j0..j0 + nj` of `dst [m, n] = a [m, k] @ w [n, k]^T` on `par`.
///
/// # Safety
/// `dst`, `a`, `w` hold `m * n`, `m * k`, `n * k` floats and `j0 + nj <= n`; calls running at
/// once write disjoint column ranges.
unsafe fn gemm_cols(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    a: *const f32,
    w: *const f32,
    (j0, nj): (usize, usize),
    par: gemm::Parallelism,
) {
    // SAFETY: the operands as this function's contract gives them.
    unsafe {
        gemm::gemm(
            m,
            nj,
            k,
            dst.add(j0),
            1,
            n as isize,
            false,
            a,
            1,
            k as isize,
            w.add(j0 * k),
            k as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// `dst [m, n] = a [m, k] @ w [n, k]^T`, the columns split into two halves, each half a
/// single-threaded gemm on its own thread.
fn gemm_split2(m: usize, n: usize, k: usize, dst: &mut [f32], a: &[f32], w: &[f32]) {
    let half = n / 2;
    // Addresses, so the closures can be sent to the other thread.
    let (d, a, w) = (
        dst.as_mut_ptr() as usize,
        a.as_ptr() as usize,
        w.as_ptr() as usize,
    );
    let part = |cols: (usize, usize)| unsafe {
        gemm_cols(
            (m, n, k),
            d as *mut f32,
            a as *const f32,
            w as *const f32,
            cols,
            gemm::Parallelism::None,
        )
    };
    rayon::join(|| part((0, half)), || part((half, n - half)));
}

/// The same product with gemm's own two-thread split.
fn gemm_rayon(m: usize, n: usize, k: usize, dst: &mut [f32], a: &[f32], w: &[f32]) {
    unsafe {
        gemm_cols(
            (m, n, k),
            dst.as_mut_ptr(),
            a.as_ptr(),
            w.as_ptr(),
            (0, n),
            gemm::Parallelism::Rayon(2),
        )
    }
}

/// gemm's own two-thread split against two single-threaded halves.
fn split_vs_gemm_threads() {
    for (m, k, n) in [
        (1016, 576, 1536),
        (1016, 1536, 576),
        (1016, 576, 576),
        (376, 576, 1536),
        (1016, 576, 49152),
    ] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut d = vec![0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        for _ in 0..3 {
            let r = time(|| gemm_rayon(m, n, k, &mut d, &a, &w), 9);
            let s = time(|| gemm_split2(m, n, k, &mut d, &a, &w), 9);
            println!(
                "{m:>4}x{k:>4}x{n:>6}  gemm Rayon(2) {:>6.1} GFLOP/s | two halves {:>6.1} GFLOP/s",
                flops / r / 1e9,
                flops / s / 1e9
            );
        }
    }
}

/// The linear layers of one decoding step of SmolLM2-135M (30 layers + the tied head, 538 MB
/// of f32 weights: more than the caches, so weights stream from memory) at batch 1 and 8.
fn decode_step() {
    let (h, kv, f, vocab, layers) = (576usize, 192usize, 1536usize, 49152usize, 30);
    let mut shapes = Vec::new();
    for _ in 0..layers {
        shapes.extend([(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f)]);
    }
    shapes.push((vocab, h));
    let mut seed = 1u32;
    let mut rnd = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 9) as f32 / (1u32 << 23) as f32 - 0.5
            })
            .collect()
    };
    let weights: Vec<Vec<f32>> = shapes.iter().map(|&(n, k)| rnd(n * k)).collect();
    let bytes: usize = shapes.iter().map(|&(n, k)| n * k * 4).sum();
    // The same step from GGUF blocks (Q4_1 linears, Q8_0 head, as the default model's file):
    // random blocks, dequantised per tile ([`rlft_kernels::quant::QuantWeight::matmul_wt`]).
    let mut byte = 7u32;
    let quant: Vec<QuantWeight> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(n, k))| {
            let ty = if i + 1 == shapes.len() {
                GgmlType::Q8_0
            } else {
                GgmlType::Q4_1
            };
            QuantWeight::from_gguf(ty, n, k, &random_blocks(ty, n, k, &mut byte))
                .expect("block sizes")
        })
        .collect();
    let qbytes: usize = quant.iter().map(QuantWeight::size_in_bytes).sum();
    // The kernel alone, weights in cache: one q_proj-sized and one down_proj-sized matrix,
    // called over and over (what is left when memory is not the limit).
    for (idx, name) in [(0usize, "576x576 Q4_1"), (6, "576x1536 Q4_1")] {
        let q = &quant[idx];
        let (n, k) = q.dims();
        for m in [1usize, 8] {
            let x = rnd(m * k);
            let mut out = vec![0f32; m * n];
            let calls = if std::env::var_os("IN_CACHE_ONLY").is_some() {
                5000
            } else {
                200
            };
            // From a pool worker, as generation runs (no hand-over from the main thread).
            let t = rlft_kernels::pool::on_pool(|| {
                time(
                    || {
                        for _ in 0..calls {
                            q.matmul_wt(&x, m, &mut out);
                        }
                    },
                    5,
                )
            }) / calls as f64;
            let wf = &weights[idx];
            let tf = rlft_kernels::pool::on_pool(|| {
                time(
                    || {
                        for _ in 0..calls {
                            rlft_kernels::stream::matmul_wt(&x, m, k, wf, n, None, &mut out);
                        }
                    },
                    5,
                )
            }) / calls as f64;
            println!(
                "in cache {name:>13} m={m}: f32 {:>7.1} us, {:>5.1} GFLOP/s",
                tf * 1e6,
                2.0 * (m * n * k) as f64 / tf / 1e9
            );
            println!(
                "in cache {name:>13} m={m}: {:>7.1} us, {:>5.1} GFLOP/s",
                t * 1e6,
                2.0 * (m * n * k) as f64 / t / 1e9
            );
        }
    }
    if std::env::var_os("IN_CACHE_ONLY").is_some() {
        return;
    }
    {
        // Where a batch-8 step's time goes: the layers' products, then the head alone.
        let m = 8;
        let x = rnd(m * f);
        let mut out = vec![0f32; m * vocab];
        let nl = quant.len() - 1;
        let (mut tl, mut th) = (Vec::new(), Vec::new());
        for _ in 0..25 {
            tl.push(rlft_kernels::pool::on_pool(|| {
                time(
                    || {
                        quant[..nl]
                            .iter()
                            .for_each(|q| q.matmul_wt(&x, m, &mut out))
                    },
                    1,
                )
            }));
            th.push(rlft_kernels::pool::on_pool(|| {
                time(|| quant[nl].matmul_wt(&x, m, &mut out), 1)
            }));
        }
        tl.sort_by(f64::total_cmp);
        th.sort_by(f64::total_cmp);
        let fl = |n: usize, k: usize| 2.0 * (m * n * k) as f64;
        let layers: f64 = shapes[..nl].iter().map(|&(n, k)| fl(n, k)).sum();
        let head = fl(shapes[nl].0, shapes[nl].1);
        // Median, and the fastest trial (a shared host's stolen time only ever adds).
        println!(
            "blocks m=8: layers {:.2} ms ({:.1} GFLOP/s; best {:.2} ms), head {:.2} ms ({:.1} \
             GFLOP/s; best {:.2} ms)",
            tl[12] * 1e3,
            layers / tl[12] / 1e9,
            tl[0] * 1e3,
            th[12] * 1e3,
            head / th[12] / 1e9,
            th[0] * 1e3
        );
    }
    for m in [1usize, 8] {
        let x = rnd(m * f);
        let mut out = vec![0f32; m * vocab];
        // Interleaved, so both variants see the same machine state.
        let (mut tf, mut tp, mut tq) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..7 {
            tf.push(time(
                || {
                    for (&(n, k), w) in shapes.iter().zip(&weights) {
                        rlft_kernels::stream::matmul_wt(&x, m, k, w, n, None, &mut out);
                    }
                },
                1,
            ));
            tp.push(rlft_kernels::pool::on_pool(|| {
                time(
                    || {
                        for (&(n, k), w) in shapes.iter().zip(&weights) {
                            rlft_kernels::stream::matmul_wt(&x, m, k, w, n, None, &mut out);
                        }
                    },
                    1,
                )
            }));
            tq.push(time(
                || {
                    for q in &quant {
                        q.matmul_wt(&x, m, &mut out);
                    }
                },
                1,
            ));
        }
        for (name, ts, b) in [
            ("f32", &mut tf, bytes),
            ("f32 in pool", &mut tp, bytes),
            ("blocks", &mut tq, qbytes),
        ] {
            ts.sort_by(f64::total_cmp);
            let t = ts[ts.len() / 2];
            println!(
                "decode step m={m} {name:>6}: {:>6.2} ms, {:>5.1} GB/s of weights, {:>5.1} GFLOP/s",
                t * 1e3,
                b as f64 / t / 1e9,
                2.0 * (m * bytes / 4) as f64 / t / 1e9
            );
        }
    }
}
