//! The LM head + log-softmax + gather of the training loss, fused
//! ([`rlft_kernels::fused::head::lm_head_logprobs`]) against the composite of
//! `CausalLm::target_logprobs_entropy` (chunks of 256 rows, candle ops), f32 on the CPU.
//!
//! `cargo run --release -p rlft-model --example head_bench [-- [fused|composite|both]
//! [--rows N] [--reps N] [--case lora|full|nograd|all]]`
//!
//! Shapes: `hidden [rows, 576]` (default 512 rows), head `[49152, 576]` (SmolLM2-135M). Cases:
//! `lora` (hidden tracks a graph, head frozen: LoRA), `full` (both track: full fine-tuning with
//! tied embeddings), `nograd` (forward only, with entropy: reference/old log-probs). The loss is
//! `sum(logprobs * c)` with fixed random `c`. One untimed warm-up, then `--reps` (default 5)
//! timed reps; prints the medians of forward, backward and total wall time, and the peak RSS
//! above the RSS before the case (VmHWM reset per case; run one path per process, `fused` or
//! `composite`, for the cleanest peak).

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var, D};
use rlft_kernels::fused::constant;
use rlft_kernels::fused::head::lm_head_logprobs;
use rlft_kernels::stream::matmul_wt_small;

const HIDDEN: usize = 576;
const VOCAB: usize = 49152;
/// `rlft_model::trainable::LOGPROB_CHUNK`.
const CHUNK: usize = 256;

fn status_mib(key: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Deterministic f32 values uniform in `[-scale, scale)` (the same in every process, so the
/// checksums of separate runs compare).
fn uniform(shape: &[usize], seed: u64, scale: f64) -> candle_core::Result<Tensor> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale) as f32
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The composite path of `CausalLm::target_logprobs_entropy` (with `CausalLm::logits`).
fn composite(
    hidden: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    entropy: bool,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let n = hidden.dim(0)?;
    let (mut parts, mut ents) = (Vec::new(), Vec::new());
    let mut start = 0;
    while start < n {
        let len = CHUNK.min(n - start);
        let x = hidden.narrow(0, start, len)?;
        // As `rlft_model::ops::inference_small_matmul`: the streaming kernel without a graph.
        let small = if x.track_op() || w.track_op() {
            None
        } else {
            matmul_wt_small(&x, w, None)?
        };
        let logits = match small {
            Some(y) => y,
            None if x.track_op() && !w.track_op() && constant::frozen_ops_enabled() => {
                constant::frozen_linear(&x.contiguous()?, w, None)?
            }
            None => x.matmul(&w.t()?)?,
        };
        let lse = logits.log_sum_exp(D::Minus1)?;
        if entropy {
            let (l, m) = (logits.detach(), lse.detach());
            let p = l.broadcast_sub(&m.unsqueeze(1)?)?.exp()?;
            ents.push((m - (p * &l)?.sum(D::Minus1)?)?);
        }
        let tgt = targets.narrow(0, start, len)?.unsqueeze(1)?;
        parts.push((logits.gather(&tgt, 1)?.squeeze(1)? - lse)?);
        start += len;
    }
    let ent = if entropy {
        Some(Tensor::cat(&ents, 0)?)
    } else {
        None
    };
    Ok((Tensor::cat(&parts, 0)?, ent))
}

/// As the `rlft` binary: buffers of 1 KiB and more start on a cache line.
#[global_allocator]
static ALLOC: rlft_kernels::alloc::CacheLineAlloc = rlft_kernels::alloc::CacheLineAlloc;

fn main() -> candle_core::Result<()> {
    rlft_kernels::runtime::tune();
    let mut args = std::env::args().skip(1);
    let (mut which, mut rows, mut reps, mut case) = ("both".to_string(), 512, 5, "all".to_string());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rows" => rows = args.next().and_then(|v| v.parse().ok()).expect("--rows N"),
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--case" => case = args.next().expect("--case lora|full|nograd|all"),
            _ => which = a,
        }
    }
    let dev = Device::Cpu;
    // Values like a trained head: logits of a few units.
    let hidden0 = uniform(&[rows, HIDDEN], 1, 1.0)?;
    let w0 = uniform(&[VOCAB, HIDDEN], 2, 0.2)?;
    let targets: Vec<u32> = (0..rows as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % VOCAB as u32)
        .collect();
    let targets = Tensor::from_vec(targets, rows, &dev)?;
    let coef = uniform(&[rows], 3, 1.0)?;
    let paths: Vec<&str> = match which.as_str() {
        "both" => vec!["composite", "fused"],
        "fused" | "composite" => vec![which.as_str()],
        other => panic!("unknown path {other}: fused, composite or both"),
    };
    let cases: Vec<&str> = match case.as_str() {
        "all" => vec!["lora", "full", "nograd"],
        c => vec![c],
    };
    println!(
        "hidden [{rows}, {HIDDEN}], head [{VOCAB}, {HIDDEN}], f32, {} threads",
        rayon::current_num_threads()
    );
    let mut results = Vec::new();
    for case in &cases {
        for path in &paths {
            let (train_x, train_w) = match *case {
                "lora" => (true, false),
                "full" => (true, true),
                "nograd" => (false, false),
                other => panic!("unknown case {other}"),
            };
            let xv = Var::from_tensor(&hidden0)?;
            let wv = Var::from_tensor(&w0)?;
            let x = if train_x {
                xv.as_tensor().clone()
            } else {
                hidden0.clone()
            };
            let w = if train_w {
                wv.as_tensor().clone()
            } else {
                w0.clone()
            };
            let rss0 = status_mib("VmRSS");
            // Resets VmHWM to the current RSS.
            let _ = std::fs::write("/proc/self/clear_refs", "5");
            let (mut fwd, mut bwd, mut tot) = (Vec::new(), Vec::new(), Vec::new());
            let mut check = 0f64;
            for rep in 0..=reps {
                let t0 = Instant::now();
                let entropy = *case == "nograd";
                let (lp, ent) = if *path == "fused" {
                    lm_head_logprobs(&x, &w, &targets, entropy)?
                } else {
                    composite(&x, &w, &targets, entropy)?
                };
                let loss = (lp * &coef)?.sum_all()?;
                let l = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                let t1 = Instant::now();
                if train_x || train_w {
                    let g = loss.backward()?;
                    let gx = if train_x {
                        g.get(&xv).map(|t| t.sum_all())
                    } else {
                        None
                    };
                    let gw = if train_w {
                        g.get(&wv).map(|t| t.sum_all())
                    } else {
                        None
                    };
                    for s in [gx, gw].into_iter().flatten() {
                        check += s?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                    }
                }
                if let Some(e) = ent {
                    check += e.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                }
                let t2 = Instant::now();
                check += l;
                if rep > 0 {
                    fwd.push((t1 - t0).as_secs_f64() * 1e3);
                    bwd.push((t2 - t1).as_secs_f64() * 1e3);
                    tot.push((t2 - t0).as_secs_f64() * 1e3);
                }
            }
            let peak = status_mib("VmHWM") - rss0;
            let (f, b, t) = (median(&mut fwd), median(&mut bwd), median(&mut tot));
            println!(
                "{case:>6} {path:>9}: forward {f:7.1} ms, backward {b:7.1} ms, total {t:7.1} ms; \
                 peak RSS +{peak:.0} MiB (checksum {:.6e})",
                check / (reps + 1) as f64
            );
            results.push((case.to_string(), path.to_string(), t));
        }
    }
    for case in &cases {
        let t = |p: &str| {
            results
                .iter()
                .find(|r| r.0 == *case && r.1 == p)
                .map(|r| r.2)
        };
        if let (Some(c), Some(f)) = (t("composite"), t("fused")) {
            println!("{case:>6}: fused is {:.2}x the composite's speed", c / f);
        }
    }
    Ok(())
}
