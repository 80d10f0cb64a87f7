//! `rlft bench dpo` and `rlft bench reward_model`: optimiser steps of the offline preference
//! trainers in the configuration of the reference's `bench/reference/offline.py`
//! (SmolLM2-135M-Instruct, f32, full fine-tune, 8 pairs per step, lr 1e-6, each trainer's
//! defaults otherwise; DPO: beta 0.1, sigmoid loss, a frozen reference copy whose pass runs in
//! every step), on the same 64 conversational pairs: grpo.py's `prompts(64, 0)` with `chosen`
//! "The value is \boxed{ANSWER}." and `rejected` the same with ANSWER + 1.
//!
//! A step's time is the sum of its timed phases (`time/ref_logprobs`, `time/update`); the first
//! step warms up and is excluded.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use candle_core::Device;
use rlft::config::dpo::DpoConfig;
use rlft::config::reward::RewardConfig;
use rlft::config::TrainerConfig;
use rlft::run::{RunOptions, RunSummary};
use rlft_model::bench::median;
use serde_json::{json, Value};

use super::cases::Meter;
use super::grpo::reference_prompts;
use super::Case;

/// The timed phases of an offline step.
const PHASES: [&str; 2] = ["ref_logprobs", "update"];

/// offline.py's `preference_rows(n, 0)`.
pub fn preference_rows(n: usize) -> Vec<Value> {
    let say = |v: &str| json!([{"role": "assistant", "content": format!("The value is \\boxed{{{v}}}.")}]);
    reference_prompts(n, 0)
        .into_iter()
        .map(|r| {
            let answer = r["answer"].as_str().unwrap_or("0").to_string();
            let wrong = (answer.parse::<i64>().unwrap_or(0) + 1).to_string();
            json!({"prompt": r["prompt"], "chosen": say(&answer), "rejected": say(&wrong)})
        })
        .collect()
}

/// The case's config: the shared settings of offline.py.
fn config_text(case: Case, model: &Path, out: &Path, data: &Path, steps: usize) -> String {
    let own = if case == Case::Dpo {
        "beta = 0.1\n"
    } else {
        ""
    };
    format!(
        "model = \"{}\"\noutput_dir = \"{}\"\ndataset = \"{}\"\n{own}\
         per_device_train_batch_size = 8\nlearning_rate = 1e-6\nmax_steps = {steps}\n\
         report_to = [\"jsonl\"]\nseed = 0\nlogging_steps = 1\n",
        model.display(),
        out.display(),
        data.display(),
    )
}

/// Loads and trains `case`; the meter starts after loading. Returns the run, the load seconds
/// and the meter.
fn train(
    case: Case,
    cfg_path: &Path,
    model: &Path,
    sets: &[String],
) -> Result<(RunSummary, f64, Meter)> {
    let t0 = Instant::now();
    let opts = RunOptions::default();
    Ok(if case == Case::Dpo {
        let cfg = DpoConfig::load(cfg_path, sets)?;
        let mut p = rlft::dpo::prepare(&cfg, model, &Device::Cpu)?;
        let (load_s, meter) = (t0.elapsed().as_secs_f64(), Meter::start());
        (rlft::dpo::train(&cfg, &mut p, &opts)?, load_s, meter)
    } else {
        let cfg = RewardConfig::load(cfg_path, sets)?;
        let mut p = rlft::reward_model::prepare(&cfg, model, &Device::Cpu)?;
        let (load_s, meter) = (t0.elapsed().as_secs_f64(), Meter::start());
        (
            rlft::reward_model::train(&cfg, &mut p, &opts)?,
            load_s,
            meter,
        )
    })
}

/// Runs `steps` steps of the offline `case` (dpo or reward_model; the first step warms up) and
/// returns the case's result JSON (see [`super::cases`]). `sets` override config keys.
pub fn bench_offline(case: Case, model: &Path, steps: usize, sets: &[String]) -> Result<Value> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("pairs.jsonl");
    let text: String = preference_rows(64)
        .iter()
        .map(|r| format!("{r}\n"))
        .collect();
    std::fs::write(&data, text)?;
    let cfg_path = dir.path().join(format!("{}.toml", case.name()));
    let out = dir.path().join("out");
    std::fs::write(&cfg_path, config_text(case, model, &out, &data, steps))?;
    let (s, load_s, meter) = train(case, &cfg_path, model, sets)?;
    let get = |m: &[(String, f64)], k: &str| {
        m.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| *v)
            .unwrap_or(0.0)
    };
    let step_s: Vec<f64> = s
        .steps
        .iter()
        .map(|m| PHASES.iter().map(|ph| get(m, &format!("time/{ph}"))).sum())
        .collect();
    let timed = &s.steps[1.min(s.steps.len())..];
    let mut phases = serde_json::Map::new();
    for ph in PHASES {
        let v: Vec<f64> = timed
            .iter()
            .map(|m| get(m, &format!("time/{ph}")))
            .collect();
        phases.insert(ph.into(), json!(median(&v)));
    }
    let detail = json!({"step_s": step_s, "phase_s_median": phases});
    Ok(meter.finish(case, &step_s[1.min(step_s.len())..], load_s, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_case_loads_in_the_reference_shape() {
        let dir = tempfile::tempdir().unwrap();
        let (m, out, data) = (Path::new("m.gguf"), dir.path(), dir.path().join("d.jsonl"));
        let path = dir.path().join("c.toml");
        std::fs::write(&path, config_text(Case::Dpo, m, out, &data, 3)).unwrap();
        let c = DpoConfig::load(&path, &[]).unwrap();
        assert_eq!((c.beta, c.args.per_device_train_batch_size), (0.1, 8));
        assert!(!c.args.use_peft && !c.precompute_ref_log_probs);
        std::fs::write(&path, config_text(Case::RewardModel, m, out, &data, 3)).unwrap();
        let c = RewardConfig::load(&path, &[]).unwrap();
        assert_eq!((c.args.learning_rate, c.args.max_steps), (1e-6, 3));
        let rows = preference_rows(64);
        assert_eq!(rows.len(), 64);
        assert_eq!(
            rows[1]["rejected"][0]["content"],
            "The value is \\boxed{-66}."
        );
    }
}
