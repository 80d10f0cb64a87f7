//! `rlft bench grpo`: GRPO steps in the configuration of the reference's
//! `bench/reference/grpo.py` (SmolLM2-135M-Instruct, f32, full fine-tune, 2 prompts x 4
//! generations per step, at most 32 new tokens, beta 0.001, lr 1e-6, TRL's loss and defaults),
//! on the same 64 prompts: the reference's `prompts(64, 0)` rebuilt with the CPython-compatible
//! RNG, so both sides see identical prompt texts.
//!
//! `rlft bench rloo` and `rlft bench ppo`: the same step under `rlft rloo` and `rlft ppo`
//! (each command's defaults, then the case's settings). RLOO: 2 prompts x 4 generations, the KL
//! in the reward, so an old-policy and a reference pass every rollout, RLOO's sequence loss (the
//! reference: `grpo.py --trainer rloo`, TRL's RLOOTrainer). PPO: 8 prompts x 1 generation (PPO's
//! one completion per prompt, the same 8 completions), one PPO epoch so a step is a rollout as in
//! the other two, a critic started from the model (full fine-tune): its value pass and its
//! forward + backward join the step. TRL has no PPOTrainer since 1.0: no reference.
//!
//! Simplification: the correctness reward is `boxed_accuracy` (normalised comparison, e.g.
//! `26.0` equals `26`) where the reference compares the stripped boxed text exactly; it only
//! changes scores, not the work of a step.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use candle_core::Device;
use rlft::config::online::OnlineConfig;
use rlft::config::online::{PpoConfig, RlooConfig};
use rlft::config::TrainerConfig;
use rlft::run::RunOptions;
use rlft_data::pyrandom::PyRandom;
use rlft_model::bench::median;
use serde_json::{json, Value};

use super::cases::Meter;
use super::Case;

/// Python's value of `a op b` for + - * on small ints.
fn apply(a: i64, op: char, b: i64) -> i64 {
    match op {
        '+' => a + b,
        '-' => a - b,
        _ => a * b,
    }
}

/// `a op1 b op2 c` with Python precedence (* before + and -, left to right otherwise).
fn eval3(a: i64, op1: char, b: i64, op2: char, c: i64) -> i64 {
    if op2 == '*' && op1 != '*' {
        apply(a, op1, b * c)
    } else {
        apply(apply(a, op1, b), op2, c)
    }
}

/// The rows of grpo.py's `prompts(n, seed)`: `prompt` (one user message) and `answer`.
pub fn reference_prompts(n: usize, seed: u64) -> Vec<Value> {
    let mut rng = PyRandom::new(seed);
    let ops = ['+', '-', '*'];
    let mut rows = Vec::with_capacity(n);
    while rows.len() < n {
        let a = rng.randint(1, 20);
        let b = rng.randint(1, 20);
        let c = rng.randint(1, 9);
        let op1 = ops[rng.choice(3)];
        let op2 = ops[rng.choice(3)];
        let forms = [
            (format!("{a} {op1} {b} {op2} {c}"), eval3(a, op1, b, op2, c)),
            (
                format!("({a} {op1} {b}) {op2} {c}"),
                apply(apply(a, op1, b), op2, c),
            ),
            (format!("{a} {op1} {b}"), apply(a, op1, b)),
        ];
        let (expr, answer) = forms[rng.choice(3)].clone();
        let msg = format!(
            "Compute the value of the Python expression `{expr}`. Put the final answer in \\boxed{{}}."
        );
        rows.push(
            json!({"prompt": [{"role": "user", "content": msg}], "answer": answer.to_string()}),
        );
    }
    rows
}

/// The timed phases of an online step (`time/<phase>` in the trainer's metrics; those a
/// trainer does not run count 0).
const PHASES: [&str; 7] = [
    "generate",
    "reward",
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "values",
    "update",
];

/// The case's config lines beside the shared ones: the group shape, and for PPO one epoch per
/// rollout.
fn case_keys(case: Case) -> &'static str {
    match case {
        Case::Ppo => "num_generations = 1\nnum_iterations = 1",
        _ => "num_generations = 4",
    }
}

/// The case's config read with its command's defaults.
fn load_config(case: Case, path: &Path, sets: &[String]) -> Result<OnlineConfig> {
    Ok(match case {
        Case::Rloo => RlooConfig::load(path, sets)?.0,
        Case::Ppo => PpoConfig::load(path, sets)?.0,
        _ => OnlineConfig::load(path, sets)?,
    })
}

/// The case's config: the shared settings of the reference's grpo.py and the case's own keys.
fn config_text(case: Case, model: &Path, out: &Path, data: &Path, steps: usize) -> String {
    format!(
        r#"
model = "{}"
output_dir = "{}"
dataset = "{}"
{}
per_device_train_batch_size = 8
max_completion_length = 32
learning_rate = 1e-6
beta = 0.001
max_steps = {steps}
report_to = ["jsonl"]
reward_weights = [0.1, 0.9]
seed = 0
logging_steps = 1
num_completions_to_log = 0

[[rewards]]
type = "regex_format"
name = "format_reward"
pattern = '\\boxed\{{([^{{}}]*)\}}'

[[rewards]]
type = "boxed_accuracy"
name = "correctness_reward"
answer_field = "answer"
"#,
        model.display(),
        out.display(),
        data.display(),
        case_keys(case)
    )
}

/// Runs `steps` steps of the online `case` (grpo, rloo or ppo; the first step is a warm-up,
/// excluded from the times) and returns the case's result JSON (see [`super::cases`]);
/// `detail` holds every step's seconds and the per-phase medians. `sets` override config keys
/// (`key=value`). The steps run on `device` (`--device`; `bf16 = true` in `sets` for bf16).
pub fn bench_online(
    case: Case,
    model: &Path,
    steps: usize,
    sets: &[String],
    device: &Device,
) -> Result<Value> {
    let t0 = Instant::now();
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("prompts.jsonl");
    let text: String = reference_prompts(64, 0)
        .iter()
        .map(|r| format!("{r}\n"))
        .collect();
    std::fs::write(&data, text)?;
    let toml_text = config_text(case, model, &dir.path().join("out"), &data, steps);
    let cfg_path = dir.path().join(format!("{}.toml", case.name()));
    std::fs::write(&cfg_path, toml_text)?;
    let cfg = load_config(case, &cfg_path, sets)?;
    let mut p = rlft::online::prepare(&cfg, model, device)?;
    let load_s = t0.elapsed().as_secs_f64();
    let meter = Meter::start();
    rlft_kernels::op_time::take();
    let s = rlft::online::train(&cfg, &mut p, &RunOptions::default())?;
    let get = |m: &[(String, f64)], k: &str| {
        m.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| *v)
            .unwrap_or(0.0)
    };
    let timed = &s.steps[1.min(s.steps.len())..];
    let step_s: Vec<f64> = s
        .steps
        .iter()
        .map(|m| PHASES.iter().map(|ph| get(m, &format!("time/{ph}"))).sum())
        .collect();
    if rlft_kernels::op_time::enabled() {
        // Every step, the warm-up one included (the ops do not know which step runs them).
        let mean = step_s.iter().sum::<f64>() / step_s.len().max(1) as f64;
        let t = rlft_kernels::op_time::take();
        eprint!("{}", rlft_kernels::op_time::table(&t, step_s.len(), mean));
    }
    let mut phases = serde_json::Map::new();
    for ph in PHASES {
        let v: Vec<f64> = timed
            .iter()
            .map(|m| get(m, &format!("time/{ph}")))
            .collect();
        phases.insert(ph.into(), json!(median(&v)));
    }
    let reward: Vec<f64> = timed.iter().map(|m| get(m, "reward")).collect();
    let detail = json!({
        "step_s": step_s,
        "phase_s_median": phases,
        "reward_median": median(&reward),
    });
    Ok(meter.finish(case, &step_s[1.min(step_s.len())..], load_s, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_precedence() {
        assert_eq!(eval3(2, '+', 3, '*', 4), 14);
        assert_eq!(eval3(2, '*', 3, '+', 4), 10);
        assert_eq!(eval3(2, '-', 3, '-', 4), -5);
        assert_eq!(eval3(2, '*', 3, '*', 4), 24);
    }

    #[test]
    fn each_case_runs_its_command_in_the_same_shape() {
        let dir = tempfile::tempdir().unwrap();
        let (m, out, data) = (Path::new("m.gguf"), dir.path(), dir.path().join("d.jsonl"));
        let load = |case: Case| {
            let path = dir.path().join(format!("{}.toml", case.name()));
            std::fs::write(&path, config_text(case, m, out, &data, 3)).unwrap();
            load_config(case, &path, &[]).unwrap()
        };
        use rlft::algo::Estimator;
        for case in [Case::Grpo, Case::Rloo, Case::Ppo] {
            let c = load(case);
            let plan = c.plan(64);
            // Eight completions of <= 32 tokens per step, one optimiser step per rollout.
            assert_eq!(plan.rollout_completions, 8, "{case:?}");
            assert_eq!(plan.steps_per_rollout, 1, "{case:?}");
            assert_eq!((c.max_completion_length, c.beta), (32, 0.001));
            let want = match case {
                Case::Rloo => Estimator::Rloo,
                Case::Ppo => Estimator::Gae,
                _ => Estimator::GroupNorm,
            };
            assert_eq!(c.estimator.advantage_estimator, want);
            assert_eq!(c.estimator.value_model.is_some(), case == Case::Ppo);
            assert_eq!(c.num_generations, if case == Case::Ppo { 1 } else { 4 });
        }
        // PPO's critic starts from the model itself.
        assert_eq!(load(Case::Ppo).estimator.value_model.unwrap(), m);
    }

    #[test]
    fn prompts_are_deterministic() {
        let a = reference_prompts(64, 0);
        assert_eq!(a.len(), 64);
        assert_eq!(a, reference_prompts(64, 0));
        // Printed by grpo.py's prompts(64, 0) with CPython 3.
        let expr = |i: usize| a[i]["prompt"][0]["content"].as_str().unwrap().to_string();
        assert_eq!(
            expr(0),
            "Compute the value of the Python expression `(13 - 14) * 1`. Put the final answer in \\boxed{}."
        );
        assert!(expr(1).contains("`13 - 10 * 8`"));
        assert_eq!(a[1]["answer"], "-67");
        assert!(expr(63).contains("`(16 - 4) + 8`"));
        assert_eq!(a[63]["answer"], "20");
    }
}
