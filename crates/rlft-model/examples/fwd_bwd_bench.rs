//! Forward + backward of the default model (SmolLM2-135M, f32, CPU) with every weight trainable:
//! the `fwd_bwd` case of `../shared/bench/trl_cpu/bench.py`. Batch 8 x 128 random ids (fixed
//! seed), loss = -mean log-prob of the 64 "completion" tokens (positions 64..127) of each row.
//!
//! `cargo run --release -p rlft-model --example fwd_bwd_bench [-- MODEL [NAME_SUBSTRING,...]
//! [--trainable NAME_SUBSTRING,...] [--lora TARGETS] [--rank R] [--no-frozen-op] [--ab]
//! [--reps N]]`
//!
//! MODEL defaults to `RLFT_DEFAULT_MODEL` or the cached default model
//! (`scripts/fetch-default-model.sh`). Name substrings (positional or `--trainable`) select the
//! trainable weights (`q_proj,v_proj`); default all. `--lora q_proj,v_proj` (or `all-linear`)
//! trains LoRA adapters of rank `--rank` (default 16, alpha = 2 * rank) instead, base frozen.
//! `--no-frozen-op` sends frozen weights, rotary tables and masks through candle's ops (which
//! also compute their gradients), to measure what [`rlft_model::ops::frozen_linear`] and
//! friends save; `--ab` alternates both modes rep by rep in one process. One untimed warm-up
//! (per mode), then `--reps` (default 3) timed reps; prints the medians (wall, and CPU seconds
//! of the backward, which machine noise disturbs less), peak RSS (VmHWM, reset after loading as
//! bench.py does) and what candle's raw gradient store holds beyond the trainable weights.
//!
//! Simplification: the model sees 127 positions (the last token's hidden state predicts
//! nothing), where bench.py runs all 128 and computes logits for every position.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use candle_core::{Device, Tensor};
use rlft_model::decoder::Batch;
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::trainable::{make_trainable, masked_mean_nll, sequence_logprobs};

const BATCH: usize = 8;
const SEQ: usize = 128;
const PROMPT: usize = 64;

fn model_path(arg: Option<String>) -> PathBuf {
    if let Some(p) = arg.or_else(|| std::env::var("RLFT_DEFAULT_MODEL").ok()) {
        return PathBuf::from(p);
    }
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-default-model.sh");
    let out = Command::new("bash")
        .arg(script)
        .output()
        .expect("run scripts/fetch-default-model.sh");
    assert!(out.status.success(), "fetching the default model failed");
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds (user + system, all threads) this process has used: `/proc/self/stat` fields 14
/// and 15, in clock ticks of 1/100 s (Linux on x86).
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // `after` starts at field 3 (state), so fields 14/15 are at indices 11/12.
    (f.get(11).unwrap_or(&0) + f.get(12).unwrap_or(&0)) as f64 / 100.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rlft_model::alloc::tune_malloc();
    let (mut positional, mut trainable, mut lora, mut rank) = (Vec::new(), None, None, 16usize);
    let (mut ab, mut reps) = (false, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--trainable" => trainable = args.next(),
            "--lora" => lora = args.next(),
            "--rank" => rank = args.next().and_then(|r| r.parse().ok()).expect("--rank N"),
            "--no-frozen-op" => rlft_model::ops::set_frozen_ops(false),
            "--ab" => ab = true,
            "--reps" => reps = args.next().and_then(|r| r.parse().ok()).expect("--reps N"),
            _ => positional.push(a),
        }
    }
    let mut positional = positional.into_iter();
    let path = model_path(positional.next());
    let filter: Vec<String> = trainable
        .or(positional.next())
        .map(|s| s.split(',').map(String::from).collect())
        .unwrap_or_default();
    let dev = Device::Cpu;
    let t0 = Instant::now();
    let mut model = load_model(&path, &LoadOptions::default())?.model;
    let vars = match &lora {
        Some(targets) => {
            let cfg = LoraConfig {
                r: rank,
                lora_alpha: 2.0 * rank as f64,
                target_modules: targets.split(',').map(String::from).collect(),
                ..LoraConfig::default()
            };
            attach_lora(&mut model, &cfg)?
        }
        None => make_trainable(&mut model, |n| {
            filter.is_empty() || filter.iter().any(|f| n.contains(f.as_str()))
        })?,
    };
    let trainable: usize = vars.iter().map(|(_, v)| v.as_tensor().elem_count()).sum();
    println!(
        "loaded {} in {:.1} s; {} trainable tensors, {trainable} parameters",
        path.display(),
        t0.elapsed().as_secs_f64(),
        vars.len()
    );

    // Random ids from a fixed LCG (bench.py uses torch.randint; any fixed ids do).
    let vocab = model.config.vocab_size as u64;
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let ids: Vec<u32> = (0..BATCH * SEQ)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab) as u32
        })
        .collect();
    let ids = Tensor::from_vec(ids, (BATCH, SEQ), &dev)?;
    let inputs: Vec<Vec<u32>> = ids.narrow(1, 0, SEQ - 1)?.to_vec2()?;
    let batch = Batch::left_padded(&inputs, &[0; BATCH], 0, 0, &dev)?;
    // Targets: tokens PROMPT..SEQ-1, predicted from the last SEQ-PROMPT input positions.
    let targets = ids.narrow(1, PROMPT, SEQ - PROMPT)?.contiguous()?;
    let mask = Tensor::ones((BATCH, SEQ - PROMPT), candle_core::DType::F32, &dev)?;

    let rss_after_load = status_kib("VmRSS");
    // Reset VmHWM to the current RSS (as bench.py does), so the peak covers the benchmark only.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    // Per mode (frozen ops on / off): forward, backward, total wall seconds, backward CPU seconds.
    let mut times: [Vec<[f64; 4]>; 2] = [Vec::new(), Vec::new()];
    let var_ids: std::collections::HashSet<_> =
        vars.iter().map(|(_, v)| v.as_tensor().id()).collect();
    // With --ab the modes alternate rep by rep in one process (after one warm-up each), so
    // machine noise and allocator state hit both alike.
    let modes: Vec<bool> = if ab {
        (0..2 * (reps + 1)).map(|i| i % 2 == 1).collect()
    } else {
        vec![rlft_model::ops::frozen_ops_enabled(); reps + 1]
    };
    for (i, &frozen) in modes.iter().enumerate() {
        rlft_model::ops::set_frozen_ops(frozen);
        let warm_up = i < if ab { 2 } else { 1 };
        let t0 = Instant::now();
        let lp = sequence_logprobs(&model, &batch, &targets, true)?;
        let loss = masked_mean_nll(&lp, &mask)?;
        let loss_v = loss.to_scalar::<f32>()?;
        let t1 = Instant::now();
        let c1 = cpu_seconds();
        let grads = loss.backward()?;
        let t2 = Instant::now();
        let bwd_cpu = cpu_seconds() - c1;
        if warm_up {
            let (mut extra_n, mut extra_bytes, mut var_bytes) = (0usize, 0usize, 0usize);
            let mut shapes = std::collections::BTreeMap::<Vec<usize>, (usize, usize)>::new();
            for id in grads.get_ids() {
                let g = grads.get_id(*id).expect("listed id");
                let bytes = g.elem_count() * g.dtype().size_in_bytes();
                if var_ids.contains(id) {
                    var_bytes += bytes;
                } else {
                    extra_n += 1;
                    extra_bytes += bytes;
                    let e = shapes.entry(g.dims().to_vec()).or_default();
                    e.0 += 1;
                    e.1 += bytes;
                }
            }
            let mut shapes: Vec<_> = shapes.into_iter().collect();
            shapes.sort_by_key(|(_, (_, b))| std::cmp::Reverse(*b));
            for (dims, (n, bytes)) in shapes.iter().take(6) {
                println!(
                    "  other gradients of shape {dims:?}: {n} x, {} KiB",
                    bytes >> 10
                );
            }
            println!(
                "warm-up (frozen ops {}): loss {loss_v:.4}; raw gradient store: {} MiB for \
                 trainable weights, {extra_n} other entries holding {} MiB",
                if frozen { "on" } else { "off" },
                var_bytes >> 20,
                extra_bytes >> 20
            );
        } else {
            let (f, b) = ((t1 - t0).as_secs_f64(), (t2 - t1).as_secs_f64());
            times[frozen as usize].push([f, b, f + b, bwd_cpu]);
            println!(
                "rep {i} (frozen ops {}): forward {:.0} ms, backward {:.0} ms ({:.1} CPU s), \
                 total {:.0} ms",
                if frozen { "on" } else { "off" },
                f * 1e3,
                b * 1e3,
                bwd_cpu,
                (f + b) * 1e3
            );
        }
        drop(grads);
    }
    for (frozen, t) in times.iter().enumerate() {
        if t.is_empty() {
            continue;
        }
        let col = |j: usize| median(t.iter().map(|r| r[j]).collect());
        println!(
            "frozen ops {}: fwd+bwd median {:.0} ms (forward {:.0} ms, backward {:.0} ms, \
             backward CPU {:.1} s) over {} reps; {:.0} tokens/s",
            if frozen == 1 { "on" } else { "off" },
            col(2) * 1e3,
            col(0) * 1e3,
            col(1) * 1e3,
            col(3),
            t.len(),
            (BATCH * SEQ) as f64 / col(2)
        );
    }
    let peak = status_kib("VmHWM");
    println!(
        "RSS after load {} MiB; peak RSS during the benchmark (VmHWM) {} MiB",
        rss_after_load >> 10,
        peak >> 10
    );
    Ok(())
}
