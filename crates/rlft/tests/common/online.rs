//! The online trainers' test harness: a tiny random model, 16 sum prompts, a reward that
//! varies within groups, and the helpers the GRPO and online-family tests share.

use std::path::Path;

use rlft::config::online::OnlineConfig;
use rlft::config::TrainerConfig;
use rlft::online::OnlineSummary;
use rlft::run::RunOptions;

pub use super::train::parse_with;
use super::Weights;

/// The reward of [`config`]: a letter anywhere, which varies within groups of random byte
/// completions, so advantages are not all zero.
pub const DIGIT: &str =
    "[[rewards]]\ntype = \"regex_format\"\nname = \"digit\"\npattern = \"[a-z]\"\n";

/// What every online test run shares (TOML): the tiny model and 16 sum prompts in `dir` (written
/// once), output in `dir/out`, 3 steps at a constant 3e-3, seed 5, temperature 30 (near-random
/// bytes), metrics to JSONL.
pub fn tiny_run_toml(dir: &Path) -> String {
    let model = super::tiny_model(dir);
    let data = dir.join("prompts.jsonl");
    if !data.exists() {
        super::write_sums(&data, 16, "answer");
    }
    format!(
        r#"
model = "{}"
output_dir = "{}"
dataset = "{}"
learning_rate = 3e-3
lr_scheduler_type = "constant"
max_steps = 3
report_to = ["jsonl"]
seed = 5
temperature = 30.0
"#,
        model.display(),
        dir.join("out").display(),
        data.display()
    )
}

/// A GRPO-shaped config over the tiny run ([`tiny_run_toml`]): 4 generations of 8 tokens,
/// batch 8, the [`DIGIT`] reward; `extra` overrides the base keys.
pub fn config<C: TrainerConfig>(dir: &Path, extra: &str) -> C {
    config_with_rewards(dir, extra, DIGIT)
}

/// [`config`] with `rewards` (TOML `[[rewards]]` tables) instead of [`DIGIT`].
pub fn config_with_rewards<C: TrainerConfig>(dir: &Path, extra: &str, rewards: &str) -> C {
    let base = format!(
        "{}max_prompt_length = 64\nmax_completion_length = 8\nnum_generations = 4\n\
         per_device_train_batch_size = 8\ngradient_accumulation_steps = 1\n{rewards}",
        tiny_run_toml(dir)
    );
    parse_with(&base, extra)
}

/// [`super::train::run`] for the online configs (`RlooConfig` and `PpoConfig` deref to
/// `OnlineConfig`).
pub fn run(cfg: &OnlineConfig, opts: &RunOptions) -> (OnlineSummary, Weights) {
    super::train::run(cfg, opts)
}

/// Step `step`'s metric `key`, if logged.
pub fn try_metric(s: &OnlineSummary, step: usize, key: &str) -> Option<f64> {
    s.steps[step]
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
}

/// Step `step`'s metric `key`; panics where it is not logged.
pub fn metric(s: &OnlineSummary, step: usize, key: &str) -> f64 {
    try_metric(s, step, key).unwrap_or_else(|| panic!("no {key} at step {step}"))
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

/// Asserts that step `step` logged every metric of `keys`, each finite.
pub fn assert_finite_metrics(s: &OnlineSummary, step: usize, keys: &[&str], what: &str) {
    for key in keys {
        let v = metric(s, step, key);
        assert!(v.is_finite(), "{what}: {key} = {v} at step {step}");
    }
}

/// Runs `config(dir, extra)` for `reference` and `other` in fresh directories; asserts the same
/// loss, KL and gradient norm at each of the 3 steps (to 1e-5, relative past 1) and weights
/// within 1e-4: two code paths that must compute the same run.
pub fn assert_same_run(reference: &str, other: &str, what: &str) {
    let [d1, d2] = super::tempdirs();
    let (r, wr) = run(&config(d1.path(), reference), &RunOptions::default());
    let (o, wo) = run(&config(d2.path(), other), &RunOptions::default());
    for step in 0..3 {
        for key in ["loss", "kl", "grad_norm"] {
            let (x, y) = (metric(&o, step, key), metric(&r, step, key));
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "{what}: {key} step {step}: {x} vs {y}"
            );
        }
    }
    let d = max_diff(&wo, &wr);
    assert!(d < 1e-4, "{what}: weights differ by {d}");
}
