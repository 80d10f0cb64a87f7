//! Forward + backward of the default model (SmolLM2-135M, f32, CPU) with every weight trainable:
//! the `fwd_bwd` case of the reference's `bench/reference/bench.py`. Batch 8 x 128 random ids
//! (fixed seed), loss = -mean log-prob of the 64 "completion" tokens (positions 64..127) of each
//! row.
//!
//! `cargo run --release -p rlft-model --example fwd_bwd_bench [-- MODEL [NAME_SUBSTRING,...]
//! [--trainable NAME_SUBSTRING,...] [--lora TARGETS] [--rank R] [--no-frozen-op] [--no-fused] [--ab]
//! [--reps N]]`
//!
//! MODEL defaults to `RLFT_DEFAULT_MODEL` or the cached default model
//! (`scripts/fetch-default-model.sh`). Name substrings (positional or `--trainable`) select the
//! trainable weights (`q_proj,v_proj`); default all. `--lora q_proj,v_proj` (or `all-linear`)
//! trains LoRA adapters of rank `--rank` (default 16, alpha = 2 * rank) instead, base frozen.
//! `--no-fused` turns the fused training kernels ([`rlft_kernels::fused`]) off (candle's
//! composites instead), to measure what they save.
//! `--no-frozen-op` sends frozen weights, rotary tables and masks through candle's ops (which
//! also compute their gradients), to measure what [`rlft_model::ops::frozen_linear`] and
//! friends save; `--ab` alternates both modes rep by rep in one process. One untimed warm-up
//! (per mode), then `--reps` (default 3) timed reps; prints the medians (wall, and CPU seconds
//! of the backward, which machine noise disturbs less), peak RSS (VmHWM, reset after loading as
//! bench.py does) and what candle's raw gradient store holds beyond the trainable weights.
//!
//! The batch, the timed step and the RSS reset are [`rlft_model::bench`]'s, which `rlft bench
//! fwd_bwd` / `rlft bench lora` run too (one fresh process per case, beside the reference); this
//! example adds the A/B of frozen ops and the look into candle's gradient store. Simplification:
//! the model sees 127 positions (the last token's hidden state predicts nothing), where bench.py
//! runs all 128 and computes logits for every position.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use candle_core::Device;
use rlft_model::bench::{bench_lora_config, fwd_bwd, median, process, BenchBatch};
use rlft_model::load::{load_model, LoadOptions};
use rlft_model::lora::attach_lora;
use rlft_model::trainable::make_trainable;

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

/// As the `rlft` binary: buffers of 1 KiB and more start on a cache line.
#[global_allocator]
static ALLOC: rlft_kernels::alloc::CacheLineAlloc = rlft_kernels::alloc::CacheLineAlloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rlft_kernels::runtime::tune();
    let (mut positional, mut trainable, mut lora, mut rank) = (Vec::new(), None, None, 16usize);
    let (mut ab, mut reps) = (false, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--trainable" => trainable = args.next(),
            "--lora" => lora = args.next(),
            "--rank" => rank = args.next().and_then(|r| r.parse().ok()).expect("--rank N"),
            "--no-frozen-op" => rlft_model::ops::set_frozen_ops(false),
            "--no-fused" => rlft_kernels::fused::set_enabled(false),
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
            let targets = targets.split(',').map(String::from).collect();
            attach_lora(&mut model, &bench_lora_config(rank, targets))?
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
    let batch = BenchBatch::new(model.config.vocab_size, &dev)?;

    let rss_after_load = process::rss_mib().unwrap_or(0.0);
    // Reset VmHWM to the current RSS (as bench.py does), so the peak covers the benchmark only.
    process::reset_peak_rss();
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
        let (t, grads) = fwd_bwd(&model, &batch)?;
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
                "warm-up (frozen ops {}): loss {:.4}; raw gradient store: {} MiB for \
                 trainable weights, {extra_n} other entries holding {} MiB",
                if frozen { "on" } else { "off" },
                t.loss,
                var_bytes >> 20,
                extra_bytes >> 20
            );
        } else {
            times[frozen as usize].push([t.forward_s, t.backward_s, t.total_s(), t.backward_cpu_s]);
            println!(
                "rep {i} (frozen ops {}): forward {:.0} ms, backward {:.0} ms ({:.1} CPU s), \
                 total {:.0} ms",
                if frozen { "on" } else { "off" },
                t.forward_s * 1e3,
                t.backward_s * 1e3,
                t.backward_cpu_s,
                t.total_s() * 1e3
            );
        }
        drop(grads);
    }
    for (frozen, t) in times.iter().enumerate() {
        if t.is_empty() {
            continue;
        }
        let col = |j: usize| median(&t.iter().map(|r| r[j]).collect::<Vec<_>>());
        println!(
            "frozen ops {}: fwd+bwd median {:.0} ms (forward {:.0} ms, backward {:.0} ms, \
             backward CPU {:.1} s) over {} reps; {:.0} tokens/s",
            if frozen == 1 { "on" } else { "off" },
            col(2) * 1e3,
            col(0) * 1e3,
            col(1) * 1e3,
            col(3),
            t.len(),
            batch.tokens() as f64 / col(2)
        );
    }
    println!(
        "RSS after load {rss_after_load:.0} MiB; peak RSS during the benchmark (VmHWM) {:.0} MiB",
        process::peak_rss_mib().unwrap_or(0.0)
    );
    Ok(())
}
