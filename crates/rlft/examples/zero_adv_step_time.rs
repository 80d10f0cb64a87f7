//! The step time of GRPO with and without leaving zero-advantage completions out of the
//! training pass, on one config: the same seed trained twice in one process, once with
//! `grpo::train` (skipping) and once with `grpo::train_scoring_every_row` (every row scored).
//! The two runs sample the same rollouts and reach the same weights (tests/grpo_zero_adv_skip.rs),
//! so their `time/update` differ only by the work skipped.
//!
//! ```text
//! cargo run --release -p rlft --example zero_adv_step_time -- \
//!     CONFIG.toml MODEL OUT.json [key=value ...]
//! ```
//! MODEL is a path (a GGUF file or an HF directory); overrides are the CLI's `--set` values.
//! Writes per-step and total `time/update` and `time/generate` of both runs, and how many rows
//! and micro-batches the skipping run left out, to OUT.json (docs/benchmarks/zero_adv_skip.json).

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::Device;
use rlft::config::online::OnlineConfig;
use rlft::config::TrainerConfig;
use rlft::online::{prepare, train, train_scoring_every_row};
use rlft::run::RunOptions;
use serde_json::{json, Value};

/// One run's per-step figures read back from its `metrics.jsonl`.
fn step_rows(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).expect("metrics.jsonl");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("time/update").is_some())
        .collect()
}

fn sum(rows: &[Value], key: &str) -> f64 {
    rows.iter().filter_map(|r| r[key].as_f64()).sum()
}

fn run(cfg: &OnlineConfig, model: &Path, skip: bool) -> (Vec<Value>, f64) {
    let opts = RunOptions {
        resume: false,
        stop_after: None,
        shutdown: None,
        progress: true,
    };
    let mut p = prepare(cfg, model, &Device::Cpu).expect("prepare");
    // Only the training steps are compared.
    p.eval.clear();
    let t = Instant::now();
    let s = if skip {
        train(cfg, &mut p, &opts)
    } else {
        train_scoring_every_row(cfg, &mut p, &opts)
    }
    .expect("train");
    let wall = t.elapsed().as_secs_f64();
    eprintln!("{} steps in {wall:.1} s", s.global_step);
    (step_rows(&cfg.args.output_dir), wall)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, model, out, overrides @ ..] = args.as_slice() else {
        eprintln!("usage: zero_adv_step_time CONFIG.toml MODEL OUT.json [key=value ...]");
        std::process::exit(2);
    };
    let base = PathBuf::from(format!("{out}.runs"));
    let mut results = serde_json::Map::new();
    for (name, skip) in [("skipping", true), ("scoring_every_row", false)] {
        let mut sets = overrides.to_vec();
        sets.push(format!("output_dir={}", base.join(name).display()));
        let cfg = OnlineConfig::load(Path::new(config), &sets).expect("config");
        let (rows, wall) = run(&cfg, Path::new(model), skip);
        let col =
            |k: &str| -> Vec<f64> { rows.iter().map(|r| r[k].as_f64().unwrap_or(0.0)).collect() };
        results.insert(
            name.into(),
            json!({
                "steps": rows.len(),
                "wall_s": wall,
                "update_s": sum(&rows, "time/update"),
                "generate_s": sum(&rows, "time/generate"),
                "skipped_zero_adv_rows": sum(&rows, "skipped_zero_adv_rows"),
                "skipped_zero_adv_micro_batches": sum(&rows, "skipped_zero_adv_micro_batches"),
                "update_s_per_step": col("time/update"),
                "loss_per_step": col("loss"),
            }),
        );
    }
    let update = |n: &str| results[n]["update_s"].as_f64().unwrap_or(f64::NAN);
    let report = json!({
        "config": config,
        "model": model,
        "overrides": overrides,
        "update_time_ratio_skipping_over_every_row": update("skipping") / update("scoring_every_row"),
        "runs": results,
    });
    std::fs::write(out, serde_json::to_string_pretty(&report).unwrap() + "\n").expect("write");
    println!(
        "{}",
        serde_json::to_string_pretty(&report["runs"]["skipping"]["update_s"]).unwrap()
    );
}
