//! One benchmark case in this process (`rlft bench --run-case CASE`): load the model, reset the
//! peak-RSS counter (as bench.py does after loading), run the warm-up and timed repetitions,
//! print one `RESULT_JSON {...}` line.
//!
//! Every case's JSON has the same keys: `case`, `time` (`median_ms`, `min_ms`, `max_ms`,
//! `reps_ms` of the timed repetitions), `load_s`, `rss_after_load_mib`, `peak_rss_mib` (VmHWM
//! since the reset), `peak_rss_reset` (false where the reset is unsupported: then the peak covers
//! the whole process), `interference` (CPU other processes took meanwhile), `threads`, and
//! `detail` (case-specific figures).

use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::Var;
use rlft_kernels::op_time;
use rlft_kernels::pool::on_pool;
use rlft_model::bench::process::{self, CpuSnapshot};
use rlft_model::bench::{bench_lora_config, fwd_bwd, median, ref_pass, BenchBatch};
use rlft_model::lora::{attach_lora, ALL_LINEAR};
use rlft_model::trainable::make_trainable;
use rlft_model::{generate, GenerateRequest, LoadedModel, SamplingParams};
use rlft_text::Message;
use rlft_train::bench::{bench_config, synthetic_grads, time_reps};
use rlft_train::{AdamW, AdamWKernel, ParamGroup};
use serde_json::{json, Value};

use super::{report::stats_ms, BenchArgs, Case};
use crate::common::{chat_prompt_ids, load};

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

/// Memory and CPU measurement from the end of loading to the end of the timed repetitions.
pub struct Meter {
    rss_after_load: Option<f64>,
    reset: bool,
    cpu: CpuSnapshot,
}

impl Meter {
    /// Starts measuring: records the RSS after loading and resets the peak counter.
    pub fn start() -> Self {
        let rss_after_load = process::rss_mib();
        let reset = process::reset_peak_rss();
        Meter {
            rss_after_load,
            reset,
            cpu: CpuSnapshot::now(),
        }
    }

    /// The case's result JSON from its timed repetitions (seconds).
    pub fn finish(self, case: Case, times_s: &[f64], load_s: f64, detail: Value) -> Value {
        json!({
            "case": case.name(),
            "time": stats_ms(times_s),
            "load_s": load_s,
            "rss_after_load_mib": self.rss_after_load,
            "peak_rss_mib": process::peak_rss_mib(),
            "peak_rss_reset": self.reset,
            "interference": self.cpu.interference_since(),
            "threads": threads(),
            "detail": detail,
        })
    }
}

/// Worker threads available to this process.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `case` in this process and prints its `RESULT_JSON` line.
pub fn run_case(case: Case, a: &BenchArgs) -> Result<()> {
    if a.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let v = match case {
        Case::All => bail!("--run-case takes one case, not `all`"),
        Case::Generate => bench_generate(a)?,
        Case::FwdBwd => bench_fwd_bwd(a, false)?,
        Case::Lora => bench_fwd_bwd(a, true)?,
        Case::Adamw => bench_adamw(a)?,
        Case::RefPass => bench_ref_pass(a)?,
        Case::Grpo | Case::Rloo | Case::Ppo => {
            let model = crate::models::resolve(&a.model.model)?;
            let device = crate::common::parse_device(&a.model.device)?;
            super::grpo::bench_online(case, &model, a.reps + 1, &a.grpo_set, &device)?
        }
        Case::Dpo | Case::RewardModel => {
            let model = crate::models::resolve(&a.model.model)?;
            super::offline::bench_offline(case, &model, a.reps + 1, &a.grpo_set)?
        }
    };
    println!("RESULT_JSON {v}");
    Ok(())
}

fn load_timed(a: &BenchArgs) -> Result<(LoadedModel, Instant)> {
    let t0 = Instant::now();
    Ok((load(&a.model)?, t0))
}

fn bench_generate(a: &BenchArgs) -> Result<Value> {
    let (m, t0) = load_timed(a)?;
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
    let load_s = t0.elapsed().as_secs_f64();
    let meter = Meter::start();
    let detok = |ids: &[u32]| m.text.decode(ids, false).unwrap_or_default();
    let mut times = Vec::new();
    let mut sample = String::new();
    for rep in 0..a.warmup + a.reps {
        if rep == a.warmup {
            op_time::take(); // the timed reps only
        }
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
    let toks = (a.batch * a.new_tokens) as f64;
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let detail = json!({
        "batch": a.batch, "new_tokens_per_seq": a.new_tokens, "prompt_lens": lens,
        "new_tokens_per_s_median": toks / median(&times), "new_tokens_per_s_best": toks / best,
        "sample_completion": sample,
    });
    if op_time::enabled() {
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        eprint!("{}", op_time::table(&op_time::take(), times.len(), mean));
    }
    Ok(meter.finish(Case::Generate, &times, load_s, detail))
}

fn bench_fwd_bwd(a: &BenchArgs, lora: bool) -> Result<Value> {
    let (mut m, t0) = load_timed(a)?;
    let vars = if lora {
        let cfg = bench_lora_config(16, vec![ALL_LINEAR.into()]);
        attach_lora(&mut m.model, &cfg)?
    } else {
        make_trainable(&mut m.model, |_| true)?
    };
    let trainable: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
    let batch = BenchBatch::new(m.model.config.vocab_size, m.model.device())?;
    let load_s = t0.elapsed().as_secs_f64();
    let meter = Meter::start();
    let (mut total, mut fwd, mut bwd, mut bwd_cpu) = (vec![], vec![], vec![], vec![]);
    let mut loss = f32::NAN;
    for rep in 0..a.warmup + a.reps {
        if rep == a.warmup {
            op_time::take(); // the timed reps only
        }
        let (t, grads) = on_pool(|| fwd_bwd(&m.model, &batch))?;
        drop(grads);
        loss = t.loss;
        if rep >= a.warmup {
            total.push(t.total_s());
            fwd.push(t.forward_s);
            bwd.push(t.backward_s);
            bwd_cpu.push(t.backward_cpu_s);
        }
    }
    let detail = json!({
        "shape": [rlft_model::bench::BATCH, rlft_model::bench::SEQ],
        "completion_tokens": batch.targets.elem_count(),
        "trainable_params": trainable, "trainable_tensors": vars.len(),
        "of_which_forward": stats_ms(&fwd), "of_which_backward": stats_ms(&bwd),
        "backward_cpu_s_median": median(&bwd_cpu),
        "tokens_per_s_median": batch.tokens() as f64 / median(&total), "loss": loss,
    });
    if op_time::enabled() {
        let mean = total.iter().sum::<f64>() / total.len().max(1) as f64;
        eprint!("{}", op_time::table(&op_time::take(), total.len(), mean));
    }
    let case = if lora { Case::Lora } else { Case::FwdBwd };
    Ok(meter.finish(case, &total, load_s, detail))
}

fn bench_adamw(a: &BenchArgs) -> Result<Value> {
    let (mut m, t0) = load_timed(a)?;
    let vars: Vec<Var> = make_trainable(&mut m.model, |_| true)?
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    let params: usize = vars.iter().map(|v| v.elem_count()).sum();
    let load_s = t0.elapsed().as_secs_f64();
    // As bench.py: the peak covers the gradients, the optimizer state and the steps.
    let meter = Meter::start();
    let grads = synthetic_grads(&vars)?;
    let mut opt = AdamW::new(vec![ParamGroup::new(vars.clone())], bench_config())?
        .with_kernel(AdamWKernel::Fused);
    let times = time_reps(a.warmup, a.reps, || on_pool(|| opt.step(&grads)))?;
    let detail = json!({
        "n_params": params, "n_tensors": vars.len(), "kernel": "fused",
        "gb_per_s_median": params as f64 * 28.0 / 1e9 / median(&times),
    });
    Ok(meter.finish(Case::Adamw, &times, load_s, detail))
}

fn bench_ref_pass(a: &BenchArgs) -> Result<Value> {
    let (m, t0) = load_timed(a)?;
    let batch = BenchBatch::new(m.model.config.vocab_size, m.model.device())?;
    let load_s = t0.elapsed().as_secs_f64();
    let meter = Meter::start();
    let times = time_reps(a.warmup, a.reps, || {
        on_pool(|| ref_pass(&m.model, &batch)).map(|_| ())
    })?;
    let detail = json!({
        "shape": [rlft_model::bench::BATCH, rlft_model::bench::SEQ],
        "completion_tokens": batch.targets.elem_count(),
        "tokens_per_s_median": batch.tokens() as f64 / median(&times),
    });
    Ok(meter.finish(Case::RefPass, &times, load_s, detail))
}
