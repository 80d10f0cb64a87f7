//! `rlft bench`: measured, never guessed. Each case prints median time, spread and peak RSS;
//! `--against-reference` runs the PyTorch/transformers reference
//! (`../shared/bench/trl_cpu/bench.py`) for the same case in the same sitting and prints the ratio.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rlft_model::{generate, GenerateRequest, SamplingParams};
use rlft_text::Message;
use serde_json::{json, Value};

use crate::common::{chat_prompt_ids, load, peak_rss_mib, reset_peak_rss, rss_mib, ModelArgs};

/// Benchmark cases.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Batch of chat prompts (~60 tokens), exactly N new tokens each, pure sampling at T=1.
    Generate,
    /// GRPO steps in the configuration of the reference's grpo.py (2 prompts x 4 generations,
    /// <= 32 new tokens, beta 0.001, full fine-tune, f32); `--reps` timed steps after one
    /// warm-up step; with --against-reference grpo.py runs the same number of steps.
    Grpo,
}

/// `rlft bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Which case to run.
    #[arg(value_enum, default_value = "generate")]
    pub case: Case,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompts per batch.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// New tokens per sequence (end-of-sequence is ignored so every row makes exactly this many).
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Timed repetitions.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Untimed warm-up repetitions.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Also run the reference (bench.py in ../shared/bench/trl_cpu, with its venv) for this
    /// case, interleaved in the same sitting, and print the ratio.
    #[arg(long)]
    pub against_reference: bool,
    /// Directory of the reference scripts.
    #[arg(long, default_value = "../shared/bench/trl_cpu")]
    pub reference_dir: PathBuf,
    /// Python of the reference venv.
    #[arg(long, default_value = "~/.cache/rlft-baseline/venv/bin/python")]
    pub reference_python: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The reference's arithmetic prompts (bench.py `make_prompts`).
const EXPRS: [&str; 10] = [
    "3 + 4 * 2",
    "17 - 5 * 3",
    "(8 + 2) * 7",
    "45 // 4 + 6",
    "9 * 9 - 40",
    "2 ** 5 - 11",
    "(13 - 6) * (2 + 3)",
    "100 % 7 * 3",
    "6 * 7 + 8",
    "(5 + 5) ** 2 // 4",
];

fn stats(ts: &[f64]) -> Value {
    let mut s = ts.to_vec();
    s.sort_by(f64::total_cmp);
    let med = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    json!({"median_ms": med * 1e3, "min_ms": s[0] * 1e3, "max_ms": s[s.len() - 1] * 1e3,
           "reps_ms": ts.iter().map(|t| t * 1e3).collect::<Vec<_>>()})
}

fn bench_generate(a: &BenchArgs) -> Result<Value> {
    let m = load(&a.model)?;
    let prompts: Vec<Vec<u32>> = (0..a.batch)
        .map(|i| {
            let msg = format!(
                "Compute the value of the Python expression `{}`. Put the final answer in \\boxed{{}}.",
                EXPRS[i % EXPRS.len()]
            );
            chat_prompt_ids(&m, &[Message::user(msg)])
        })
        .collect::<Result<_>>()?;
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let req = GenerateRequest {
        prompts,
        n: 1,
        max_new_tokens: a.new_tokens,
        sampling: SamplingParams::default(),
        seed: 0,
        eos_token_ids: Vec::new(),
        stop_strings: Vec::new(),
        pad_token_id: m.generation.pad_token_id.unwrap_or(0),
    };
    let rss_after_load = rss_mib();
    reset_peak_rss();
    let detok = |ids: &[u32]| m.text.decode(ids, false).unwrap_or_default();
    let mut times = Vec::new();
    let mut sample = String::new();
    for rep in 0..a.warmup + a.reps {
        let t0 = Instant::now();
        let out = generate(&m.model, &req, &detok)?;
        let dt = t0.elapsed().as_secs_f64();
        if out.iter().any(|c| c.token_ids.len() != a.new_tokens) {
            bail!(
                "a row stopped early; the benchmark needs exactly {} new tokens",
                a.new_tokens
            );
        }
        if rep >= a.warmup {
            times.push(dt);
        }
        sample = out[0].text.clone();
    }
    let st = stats(&times);
    let med = st["median_ms"].as_f64().unwrap_or(0.0) / 1e3;
    let best = st["min_ms"].as_f64().unwrap_or(0.0) / 1e3;
    let toks = (a.batch * a.new_tokens) as f64;
    Ok(json!({
        "case": "generate", "batch": a.batch, "new_tokens_per_seq": a.new_tokens,
        "prompt_lens": lens, "generate": st,
        "new_tokens_per_s_median": toks / med, "new_tokens_per_s_best": toks / best,
        "rss_after_load_mib": rss_after_load, "peak_rss_bench_mib": peak_rss_mib(),
        "threads": rayon_threads(), "sample_completion": sample,
    }))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(h)) => PathBuf::from(h).join(rest),
        _ => PathBuf::from(p),
    }
}

fn run_reference(a: &BenchArgs) -> Result<Value> {
    let py = expand_home(&a.reference_python);
    let script = a.reference_dir.join("bench.py");
    if !py.exists() || !script.exists() {
        bail!(
            "reference not found ({} / {}); build it with `bash {}/setup.sh`",
            py.display(),
            script.display(),
            a.reference_dir.display()
        );
    }
    let out = std::process::Command::new(&py)
        .arg(&script)
        .args([
            "--run-case",
            "generate",
            "--reps",
            &a.reps.to_string(),
            "--warmup",
            &a.warmup.to_string(),
        ])
        .env("OMP_NUM_THREADS", "2")
        .env("TOKENIZERS_PARALLELISM", "false")
        .output()
        .context("run the reference bench.py")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT_JSON "))
        .with_context(|| format!("reference failed: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok(serde_json::from_str(line)?)
}

/// Runs `rlft bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    if a.case == Case::Grpo {
        return run_grpo(&a);
    }
    let ours = match a.case {
        Case::Generate => bench_generate(&a)?,
        Case::Grpo => unreachable!("handled above"),
    };
    let mut result = json!({"rlft": ours});
    if a.against_reference {
        let r = run_reference(&a)?;
        let b = &r[format!("batch_{}", a.batch)];
        let ref_tps = b["new_tokens_per_s_median"].as_f64().unwrap_or(f64::NAN);
        let ours_tps = ours["new_tokens_per_s_median"].as_f64().unwrap_or(f64::NAN);
        result["reference"] = json!({
            "new_tokens_per_s_median": ref_tps,
            "generate": b["generate"],
            "peak_rss_bench_mib": r["peak_rss_bench_mib"],
            "peak_rss_process_mib": r["peak_rss_process_mib"],
        });
        result["speedup"] = json!(ours_tps / ref_tps);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    let o = &result["rlft"];
    println!("case       batch  new/seq  median_ms  min_ms  max_ms  tokens/s  peak_rss_MiB");
    let row = |name: &str, tps: f64, g: &Value, rss: &Value| {
        println!(
            "{name:<10} {:>5}  {:>7}  {:>9.1}  {:>6.1}  {:>6.1}  {:>8.1}  {:>12}",
            a.batch,
            a.new_tokens,
            g["median_ms"].as_f64().unwrap_or(f64::NAN),
            g["min_ms"].as_f64().unwrap_or(f64::NAN),
            g["max_ms"].as_f64().unwrap_or(f64::NAN),
            tps,
            rss.as_f64()
                .map(|x| format!("{x:.0}"))
                .unwrap_or("-".into())
        )
    };
    row(
        "rlft",
        o["new_tokens_per_s_median"].as_f64().unwrap_or(f64::NAN),
        &o["generate"],
        &o["peak_rss_bench_mib"],
    );
    if let Some(r) = result.get("reference") {
        row(
            "reference",
            r["new_tokens_per_s_median"].as_f64().unwrap_or(f64::NAN),
            &r["generate"],
            &r["peak_rss_process_mib"],
        );
        println!(
            "speedup (tokens/s, rlft / reference): {:.2}x",
            result["speedup"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

fn run_grpo(a: &BenchArgs) -> Result<()> {
    let model = crate::default_model::resolve(&a.model.model)?;
    let steps = a.reps + 1;
    let ours = crate::bench_grpo::bench_grpo(&model, steps)?;
    let mut result = json!({"rlft": ours});
    if a.against_reference {
        let hf = expand_home("~/.cache/rlft-baseline/smollm2-135m-hf");
        let r = crate::bench_grpo::run_reference(
            &expand_home(&a.reference_python),
            &a.reference_dir,
            &hf,
            steps,
        )?;
        let ratio = r["step_s_median_excl_first"].as_f64().unwrap_or(f64::NAN)
            / result["rlft"]["step_s_median_excl_first"]
                .as_f64()
                .unwrap_or(f64::NAN);
        result["reference"] = json!({
            "step_s": r["step_s"],
            "step_s_median_excl_first": r["step_s_median_excl_first"],
            "step_phase_s_median": r["step_phase_s_median"],
            "peak_rss_process_mib": r["peak_rss_process_mib"],
        });
        result["speedup"] = json!(ratio);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    let o = &result["rlft"];
    println!(
        "rlft:      median {:.2} s/step (steps {}), peak RSS {:.0} MiB, phases {}",
        o["step_s_median_excl_first"].as_f64().unwrap_or(f64::NAN),
        o["step_s"],
        o["peak_rss_mib"].as_f64().unwrap_or(f64::NAN),
        o["phase_s_median"]
    );
    if let Some(r) = result.get("reference") {
        println!(
            "reference: median {:.2} s/step (steps {}), peak RSS {:.0} MiB, phases {}",
            r["step_s_median_excl_first"].as_f64().unwrap_or(f64::NAN),
            r["step_s"],
            r["peak_rss_process_mib"].as_f64().unwrap_or(f64::NAN),
            r["step_phase_s_median"]
        );
        println!(
            "speedup (reference s/step / rlft s/step): {:.2}x",
            result["speedup"].as_f64().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}
