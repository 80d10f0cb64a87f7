//! GRPO with a `python` reward (a function with TRL's signature) on a tiny random model: the
//! function receives TRL's arguments from real rollouts (the dataset's raw prompts and columns,
//! the completions' token ids, the trainer's step), and since it computes what the built-in
//! `regex_format` reward does, the run trains bit for bit as it does with the built-in.

mod common;

use common::assert_same_bits;
use common::online::{config, metric, run};
use rlft::config::online::OnlineConfig;
use rlft::run::RunOptions;
use serde_json::Value;

/// Checks every argument against the dataset rows (a wrong one raises, which stops the run),
/// logs what it was called with, and scores as `regex_format` with pattern `[a-z]`.
const REWARD: &str = r#"
import json
import re

LOG = __LOG__


def has_letter(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
    assert len(prompts) == len(completions) == len(completion_ids) == len(answer)
    for prompt, truth, ids in zip(prompts, answer, completion_ids):
        a, b = prompt.rstrip("=").split("+")
        assert int(a) + int(b) == int(truth), (prompt, truth)
        assert all(isinstance(i, int) and i >= 0 for i in ids), ids
    with open(LOG, "a") as f:
        call = {
            "step": trainer_state.global_step,
            "max_steps": trainer_state.max_steps,
            "epoch": trainer_state.epoch,
            "lengths": [len(ids) for ids in completion_ids],
        }
        f.write(json.dumps(call) + "\n")
    return [1.0 if re.search("[a-z]", c) else 0.0 for c in completions]
"#;

#[test]
fn python_reward_trains_as_the_builtin_it_mirrors() {
    let python_ok = std::process::Command::new("python3")
        .args(["-c", "pass"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        python_ok,
        "python3 is not on PATH: the `python` reward needs it"
    );

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.jsonl");
    let file = dir.path().join("rewards.py");
    let source = REWARD.replace("__LOG__", &format!("{:?}", log.to_string_lossy()));
    std::fs::write(&file, source).unwrap();
    let extra = format!(
        "max_steps = 2\nrewards = [{{ type = \"python\", name = \"digit\", path = {:?}, \
         function = \"has_letter\" }}]",
        file.to_string_lossy()
    );
    let cfg: OnlineConfig = config(dir.path(), &extra);
    let (s, w) = run(&cfg, &RunOptions::default());
    assert_eq!(s.global_step, 2);

    let builtin_dir = tempfile::tempdir().unwrap();
    let builtin: OnlineConfig = config(builtin_dir.path(), "max_steps = 2");
    let (b, wb) = run(&builtin, &RunOptions::default());
    for step in 0..2 {
        for key in ["reward", "rewards/digit/mean", "loss"] {
            assert_eq!(
                metric(&s, step, key),
                metric(&b, step, key),
                "{key} step {step}"
            );
        }
    }
    // The rewards varied within groups, so equal weights mean equal updates, not no update.
    assert!(metric(&b, 0, "reward_std") > 0.0);
    assert_same_bits(&w, &wb, "python reward vs built-in regex_format");

    // One call at startup (the setup's check, an empty completion, before training), then one
    // per step's rollout with where training stands and the real token ids.
    let calls: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert_eq!(calls[0]["lengths"], serde_json::json!([0]));
    let mut last_epoch = -1.0;
    for (step, call) in calls[1..].iter().enumerate() {
        assert_eq!(call["step"], step as u64, "{call}");
        assert_eq!(call["max_steps"], 2, "{call}");
        let epoch = call["epoch"].as_f64().unwrap();
        assert!(epoch > last_epoch && epoch < 1.0, "{call}");
        last_epoch = epoch;
        let lengths: Vec<f64> = call["lengths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap())
            .collect();
        assert_eq!(lengths.len(), 8, "{call}");
        let mean = lengths.iter().sum::<f64>() / lengths.len() as f64;
        assert_eq!(mean, metric(&s, step, "completions/mean_length"), "{call}");
    }
}
