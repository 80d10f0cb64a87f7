//! The online trainers' test harness: a tiny random model, 16 sum prompts, a reward that
//! varies within groups, and the helpers the GRPO and online-family tests share.
#![allow(dead_code)]

use std::path::Path;

use candle_core::Device;
use rlft::config::online::OnlineConfig;
use rlft::config::TrainerConfig;
use rlft::online::{prepare, train, OnlineSummary};
use rlft::run::RunOptions;
use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};

/// A config over a tiny model; the reward (a digit anywhere) varies within groups of random
/// byte completions, so advantages are not all zero.
pub fn config<C: TrainerConfig>(dir: &Path, extra: &str) -> C {
    let model = dir.join("model");
    if !model.exists() {
        save_tiny_hf_dir(tiny_config(Family::Qwen2), 1, &model).unwrap();
    }
    let data = dir.join("prompts.jsonl");
    if !data.exists() {
        super::write_sums(&data, 16, "answer");
    }
    let text = format!(
        r#"
model = "{}"
output_dir = "{}"
dataset = "{}"
max_prompt_length = 64
max_completion_length = 8
num_generations = 4
per_device_train_batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 3e-3
lr_scheduler_type = "constant"
max_steps = 3
report_to = ["jsonl"]
seed = 5
temperature = 30.0

[[rewards]]
type = "regex_format"
name = "digit"
pattern = "[a-z]"
"#,
        model.display(),
        dir.join("out").display(),
        data.display()
    );
    // `extra` (TOML) overrides the base keys.
    let mut table: toml::Table = text.parse().unwrap();
    for (k, v) in extra.parse::<toml::Table>().unwrap() {
        table.insert(k, v);
    }
    C::from_table(table, "test.toml").unwrap()
}

pub fn run(cfg: &OnlineConfig, opts: &RunOptions) -> (OnlineSummary, Vec<(String, Vec<f32>)>) {
    let mut p = prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let s = train(cfg, &mut p, opts).unwrap();
    let w = super::weights(&p.policy);
    (s, w)
}

pub fn metric(s: &OnlineSummary, step: usize, key: &str) -> f64 {
    s.steps[step]
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {key} at step {step}"))
}

/// The largest absolute difference between two runs' weights (infinite where a NaN appears).
pub fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|((_, x), (_, y))| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        // A NaN on either side is a difference (`f32::max` would drop it).
        .fold(
            0.0,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        )
}
