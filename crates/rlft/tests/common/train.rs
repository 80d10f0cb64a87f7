//! One way to run every trainer in the tests ([`run`]), the offline trainers' tiny config
//! ([`offline_config`]) and what the end-to-end tests compare: one batch or micro-batches
//! ([`batch_and_split`]), a run in two legs ([`two_legs`]) that must equal an uninterrupted one
//! ([`assert_resumes_exactly`]), the metrics without the wall-clock ones ([`timeless`]).

use std::path::Path;

use candle_core::Device;
use rlft::config::dpo::DpoConfig;
use rlft::config::online::OnlineConfig;
use rlft::config::online_dpo::OnlineDpoConfig;
use rlft::config::reward::RewardConfig;
use rlft::config::sft::SftConfig;
use rlft::config::{TrainerConfig, TrainingArgs};
use rlft::run::{RunOptions, RunSummary};

use super::Weights;

/// A trainer config the tests can train end to end on the CPU.
pub trait Trainer {
    /// Prepares and trains `self`: the summary and the trained policy's weights.
    fn train_cpu(&self, opts: &RunOptions) -> (RunSummary, Weights);
}

/// Implements [`Trainer`] for a config whose trainer module has `prepare` and `train`.
macro_rules! trainer {
    ($config:ty, $module:ident) => {
        impl Trainer for $config {
            fn train_cpu(&self, opts: &RunOptions) -> (RunSummary, Weights) {
                let model = Path::new(&self.args.model);
                let mut p = rlft::$module::prepare(self, model, &Device::Cpu).unwrap();
                let s = rlft::$module::train(self, &mut p, opts).unwrap();
                (s, super::weights(&p.policy))
            }
        }
    };
}

trainer!(SftConfig, sft);
trainer!(DpoConfig, dpo);
trainer!(RewardConfig, reward_model);
trainer!(OnlineDpoConfig, online_dpo);
trainer!(OnlineConfig, online);

/// Trains `cfg` on the CPU: the summary and the trained weights.
pub fn run<C: Trainer>(cfg: &C, opts: &RunOptions) -> (RunSummary, Weights) {
    cfg.train_cpu(opts)
}

/// Trains `cfg` with `run` in two legs: stopped after `stop` steps, then resumed from its
/// checkpoint in the same output directory. Returns both legs' results.
pub fn two_legs<C, R>(cfg: &C, stop: u64, run: impl Fn(&C, &RunOptions) -> R) -> (R, R) {
    let first = run(
        cfg,
        &RunOptions {
            stop_after: Some(stop),
            ..Default::default()
        },
    );
    let second = run(
        cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    );
    (first, second)
}

/// Trains `full` in one go and `part` (the same config in another output directory) in two
/// legs stopped after `stop` steps; asserts the legs end at step `stop` and at `full`'s last
/// step, with `full`'s weights bit for bit. Returns `full`'s summary and weights and the
/// resumed leg's summary.
pub fn assert_resumes_exactly<C: Trainer>(
    full: &C,
    part: &C,
    stop: u64,
    what: &str,
) -> (RunSummary, Weights, RunSummary) {
    let (s_full, w_full) = run(full, &RunOptions::default());
    let ((first, _), (rest, w_rest)) = two_legs(part, stop, run);
    assert_eq!(first.global_step, stop, "{what}: the first leg");
    assert_eq!(
        rest.global_step, s_full.global_step,
        "{what}: the resumed leg"
    );
    super::assert_same_bits(&w_full, &w_rest, what);
    (s_full, w_full, rest)
}

/// Two configs of the same 3 optimiser steps that must train alike: `cfg` as it is (one batch
/// a step) and with each batch split into micro-batches of one row, accumulated (output in
/// `dir_b/out`). Adam's eps is 1e-6 in both: its first step moves a weight by
/// lr * g / (|g| + eps), and for the few elements whose gradient is near eps (1e-8 by default)
/// that ratio turns the rounding differences of a different summation order into visible
/// updates (in SFT, 2 of 4096 q_proj elements moved 7e-5 apart at eps 1e-8). An eps well above
/// f32 rounding of the gradients, still below their typical size, compares the gradients
/// themselves through the updated weights.
pub fn batch_and_split<C: TrainerConfig + Clone>(mut cfg: C, dir_b: &Path) -> (C, C) {
    let a = cfg.args_mut();
    a.max_steps = 3;
    a.adam_epsilon = 1e-6;
    let mut split = cfg.clone();
    let b = split.args_mut();
    b.output_dir = dir_b.join("out");
    b.gradient_accumulation_steps = b.per_device_train_batch_size;
    b.per_device_train_batch_size = 1;
    (cfg, split)
}

/// Every step's metrics but the wall-clock ones (what two same-seed runs must agree on).
pub fn timeless(s: &RunSummary) -> Vec<Vec<(String, f64)>> {
    s.steps
        .iter()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| k != "tokens_per_s" && !k.starts_with("time/"))
                .cloned()
                .collect()
        })
        .collect()
}

/// An offline trainer's defaults on the tiny model in `dir` and `data`: 12 steps of batch 4 at a
/// constant learning rate, every step logged to JSONL, output in `dir/out`; `keys` (TOML: the
/// learning rate, the trainer's own settings) override these.
pub fn offline_config<C: TrainerConfig>(dir: &Path, data: &Path, keys: &str) -> C {
    let base = format!(
        r#"
model = "{}"
output_dir = "{}"
dataset = "{}"
lr_scheduler_type = "constant"
per_device_train_batch_size = 4
max_steps = 12
logging_steps = 1
report_to = ["jsonl"]
"#,
        super::tiny_model(dir).display(),
        dir.join("out").display(),
        data.display()
    );
    parse_with(&base, keys)
}

/// 48 sum preferences on the tiny model, 16 held out, `max_length` 64: a DPO or reward-model
/// config of 12 steps of batch 4 at learning rate `lr`.
pub fn preference_config<C: TrainerConfig>(dir: &Path, lr: &str) -> C {
    let data = dir.join("prefs.jsonl");
    super::write_sum_preferences(&data, 48, false);
    let keys = format!("learning_rate = {lr}\neval_size = 16.0\nmax_length = 64");
    offline_config(dir, &data, &keys)
}

/// Parses `base` (TOML) as a `C`, the keys of `extra` (TOML) overriding its own.
pub fn parse_with<C: TrainerConfig>(base: &str, extra: &str) -> C {
    let mut table: toml::Table = base.parse().unwrap();
    for (k, v) in extra.parse::<toml::Table>().unwrap() {
        table.insert(k, v);
    }
    C::from_table(table, "test.toml").unwrap()
}

/// `args` training LoRA adapters of rank 4 (alpha and dropout as they are) instead of every
/// weight.
pub fn use_lora_r4(args: &mut TrainingArgs) {
    args.use_peft = true;
    args.lora.r = 4;
}
