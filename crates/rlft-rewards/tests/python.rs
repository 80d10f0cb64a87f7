//! The `python` reward (TRL's reward-function signature) against real python3.
//!
//! Reward functions written the way TRL's documentation writes them score exactly what the same
//! functions return when called directly in Python with the keyword arguments TRL's
//! `GRPOTrainer` passes (built here, independently of rlft's worker): that direct call is the
//! reference. Errors name the function and the file, show the traceback and the batch; a hang
//! is killed at `timeout_s`; the worker and its module state are kept across batches.
#![cfg(unix)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlft_rewards::{
    build_reward, Reward, RewardError, RewardSet, RewardSpec, Sample, TrainerState,
};
use serde_json::{json, Value};

/// Fails unless `python3` runs: these tests are about Python reward functions.
fn require_python() {
    let ok = Command::new("python3")
        .args(["-c", "pass"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 is not on PATH: the `python` reward tests need it"
    );
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.to_string_lossy().into_owned()
}

fn spec(name: &str, path: &str, function: &str, timeout_s: f64) -> RewardSpec {
    serde_json::from_value(json!({
        "type": "python", "name": name, "path": path, "function": function,
        "timeout_s": timeout_s,
    }))
    .unwrap()
}

/// One completion of a batch: its dataset row, the rendered prompt, its text and token ids.
struct Case {
    row: Value,
    rendered: String,
    completion: String,
    ids: Vec<u32>,
}

fn case(row: &Value, completion: &str, ids: &[u32]) -> Case {
    Case {
        row: row.clone(),
        rendered: format!("<|user|>{}<|assistant|>", row["prompt"]),
        completion: completion.to_string(),
        ids: ids.to_vec(),
    }
}

fn samples(cases: &[Case]) -> Vec<Sample<'_>> {
    cases
        .iter()
        .map(|c| Sample {
            prompt: &c.rendered,
            completion: &c.completion,
            row: &c.row,
            completion_ids: &c.ids,
            completion_tokens: c.ids.len(),
            truncated: false,
            environment_reward: None,
        })
        .collect()
}

/// The keyword arguments TRL's `GRPOTrainer._calculate_rewards` passes for `cases`: the
/// dataset's `prompt` as `prompts`, completions wrapped as assistant messages when the prompt
/// is conversational, `completion_ids`, `trainer_state`, and every other column of the first
/// row as a list.
fn trl_kwargs(cases: &[Case], state: TrainerState) -> Value {
    let conversational = cases[0].row["prompt"].is_array();
    let completions: Vec<Value> = cases
        .iter()
        .map(|c| {
            if conversational {
                json!([{"role": "assistant", "content": c.completion}])
            } else {
                json!(c.completion)
            }
        })
        .collect();
    let mut kwargs = json!({
        "prompts": cases.iter().map(|c| c.row["prompt"].clone()).collect::<Vec<_>>(),
        "completions": completions,
        "completion_ids": cases.iter().map(|c| c.ids.clone()).collect::<Vec<_>>(),
        "trainer_state": state,
    });
    for key in cases[0].row.as_object().unwrap().keys() {
        if key != "prompt" {
            let column: Vec<Value> = cases.iter().map(|c| c.row[key].clone()).collect();
            kwargs[key] = json!(column);
        }
    }
    kwargs
}

/// Calls `function` from `file` directly in python3 with `kwargs` (`trainer_state` as an object
/// with attributes): the reference. NaN reads as None, as TRL treats both the same.
fn call_directly(file: &str, function: &str, kwargs: &Value) -> Vec<Option<f64>> {
    const CALL: &str = r#"
import importlib.util, json, math, sys, types
spec = importlib.util.spec_from_file_location("reference", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
kwargs = json.loads(sys.stdin.read())
kwargs["trainer_state"] = types.SimpleNamespace(**kwargs["trainer_state"])
result = getattr(module, sys.argv[2])(**kwargs)
print(json.dumps([None if x is None or math.isnan(x) else x for x in result]))
"#;
    let mut child = Command::new("python3")
        .args(["-c", CALL, file, function])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input = kwargs.to_string();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the direct call failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Scores `cases` with `function` through rlft and directly; asserts they agree and returns
/// the scores.
fn agrees_with_direct_call(
    file: &str,
    function: &str,
    cases: &[Case],
    state: TrainerState,
) -> Vec<Option<f64>> {
    let mut reward = build_reward(&spec("f", file, function, 10.0)).unwrap();
    reward.set_trainer_state(state);
    let got = reward.score(&samples(cases)).unwrap().scores;
    let want = call_directly(file, function, &trl_kwargs(cases, state));
    assert_eq!(got, want, "rlft vs calling `{function}` directly");
    got
}

const FORMAT: &str = r#"
import re


def think_answer_format(prompts, completions, **kwargs):
    """1.0 for <think>...</think><answer>...</answer>, +0.25 when the user asked a question."""
    pattern = r"^<think>.*?</think>\s*<answer>.*?</answer>$"
    contents = [completion[0]["content"] for completion in completions]
    rewards = [1.0 if re.match(pattern, c, re.DOTALL) else 0.0 for c in contents]
    asked = [prompt[-1]["content"].endswith("?") for prompt in prompts]
    return [r + (0.25 if a else 0.0) for r, a in zip(rewards, asked)]
"#;

#[test]
fn conversational_format_reward_matches_trl() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "format.py", FORMAT);
    let asks = json!({"prompt": [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "What is 3 * 4?"}
    ]});
    let tells = json!({"prompt": [{"role": "user", "content": "Multiply 3 by 4."}]});
    let cases = [
        case(
            &asks,
            "<think>3 fours</think>\n<answer>12</answer>",
            &[1, 2],
        ),
        case(&asks, "12", &[3]),
        case(
            &tells,
            "<think>\nthree\nfours\n</think><answer>12</answer>",
            &[4],
        ),
        case(&tells, "<answer>12</answer><think>late</think>", &[5]),
    ];
    let got = agrees_with_direct_call(
        &file,
        "think_answer_format",
        &cases,
        TrainerState::default(),
    );
    assert_eq!(got, vec![Some(1.25), Some(0.25), Some(1.0), Some(0.0)]);
}

const LENGTH: &str = r#"
def token_budget(completion_ids, trainer_state, **kwargs):
    """Curriculum on length: the target grows with the step; scaled by the run's length."""
    target = 2 + trainer_state.global_step
    scale = 1.0 / trainer_state.max_steps
    return [-abs(target - len(ids)) * scale + trainer_state.epoch for ids in completion_ids]
"#;

#[test]
fn completion_ids_and_trainer_state_match_trl() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "length.py", LENGTH);
    let row = json!({"prompt": "Count:"});
    let cases = [
        case(&row, "a", &[7]),
        case(&row, "a b c", &[7, 8, 9, 10, 11]),
        case(&row, "", &[]),
    ];
    let state = TrainerState {
        global_step: 3,
        max_steps: 8,
        epoch: 0.5,
    };
    let got = agrees_with_direct_call(&file, "token_budget", &cases, state);
    // Target 5 tokens at step 3: |5 - 1|, |5 - 5|, |5 - 0| over 8 steps, plus epoch 0.5.
    assert_eq!(got, vec![Some(0.0), Some(0.5), Some(-0.125)]);
}

const ACCURACY: &str = r#"
import re


def boxed_accuracy(prompts, completions, solution, difficulty, **kwargs):
    """1 when the first \boxed{} holds the solution, weighted by the row's difficulty."""
    rewards = []
    for prompt, completion, truth, level in zip(prompts, completions, solution, difficulty):
        assert isinstance(prompt, str) and prompt.startswith("Compute"), prompt
        match = re.search(r"\\boxed\{([^{}]*)\}", completion)
        hit = match is not None and match.group(1).strip() == str(truth)
        rewards.append((1.0 if hit else 0.0) * (1 + level / 10))
    return rewards
"#;

#[test]
fn dataset_columns_match_trl() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "accuracy.py", ACCURACY);
    let easy = json!({"prompt": "Compute 2 + 2.", "solution": "4", "difficulty": 1});
    let hard = json!({"prompt": "Compute 12 * 12.", "solution": 144, "difficulty": 5});
    let cases = [
        case(&easy, "so \\boxed{4}", &[1]),
        case(&easy, "\\boxed{5}", &[1]),
        case(&hard, "\\boxed{ 144 } and \\boxed{1}", &[1]),
        case(&hard, "144", &[1]),
    ];
    let got = agrees_with_direct_call(&file, "boxed_accuracy", &cases, TrainerState::default());
    assert_eq!(got, vec![Some(1.1), Some(0.0), Some(1.5), Some(0.0)]);
}

const MULTI_TASK: &str = r#"
def math_reward(completions, task, solution, **kwargs):
    """Scores math rows only: None (not applicable) for the others, NaN for chat rows."""
    rewards = []
    for completion, kind, truth in zip(completions, task, solution):
        if kind == "math":
            rewards.append(1.0 if truth in completion else -1.0)
        elif kind == "chat":
            rewards.append(float("nan"))
        else:
            rewards.append(None)
    return rewards
"#;

#[test]
fn none_for_samples_it_does_not_apply_to() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "multi.py", MULTI_TASK);
    let math = json!({"prompt": "2+2=", "task": "math", "solution": "4"});
    let code = json!({"prompt": "def add", "task": "code", "solution": "a + b"});
    let chat = json!({"prompt": "hi", "task": "chat", "solution": ""});
    let cases = [
        case(&math, "4", &[1]),
        case(&code, "return a + b", &[1]),
        case(&math, "5", &[1]),
        case(&chat, "hello", &[1]),
    ];
    let got = agrees_with_direct_call(&file, "math_reward", &cases, TrainerState::default());
    assert_eq!(got, vec![Some(1.0), None, Some(-1.0), None]);

    // In a set, None counts as 0 in the total (TRL's nansum); a sample no function scores is
    // unscorable.
    let mut set = RewardSet::new(&[spec("math", &file, "math_reward", 10.0)], None).unwrap();
    let scores = set.score(&samples(&cases)).unwrap();
    assert_eq!(scores.total, vec![1.0, 0.0, -1.0, 0.0]);
    assert_eq!(scores.totals(), vec![Some(1.0), None, Some(-1.0), None]);
}

const FAILING: &str = r#"
def parse(text):
    return float(text.split("=")[1])


def equals_reward(completions, **kwargs):
    return [parse(c) for c in completions]
"#;

#[test]
fn exception_shows_traceback_and_batch_and_keeps_the_worker() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "failing.py", FAILING);
    let mut reward = build_reward(&spec("eq", &file, "equals_reward", 10.0)).unwrap();
    reward.set_trainer_state(TrainerState {
        global_step: 4,
        max_steps: 10,
        epoch: 0.0,
    });
    let row = json!({"prompt": "What is 1 + 1?"});
    let good = [case(&row, "x=2", &[1])];
    assert_eq!(
        reward.score(&samples(&good)).unwrap().scores,
        vec![Some(2.0)]
    );
    let bad = [case(&row, "x=2", &[1]), case(&row, "two", &[2])];
    let err = reward.score(&samples(&bad)).unwrap_err();
    assert!(matches!(err, RewardError::Python { .. }), "{err}");
    let msg = err.to_string();
    for want in [
        "reward `eq`: `equals_reward` (",
        "failing.py) raised IndexError on batch 2 (2 completions, global_step 4; first prompt: \
         `What is 1 + 1?`)",
        "Traceback (most recent call last)",
        "in equals_reward",
        "line 3, in parse",
        "IndexError: list index out of range",
    ] {
        assert!(msg.contains(want), "missing {want:?} in:\n{msg}");
    }
    // Only the user's frames: the worker's own are left out.
    assert!(!msg.contains("<string>"), "{msg}");
    // The worker answered, so it keeps running and scores the next batch.
    assert_eq!(
        reward.score(&samples(&good)).unwrap().scores,
        vec![Some(2.0)]
    );
}

const SHAPES: &str = r#"
def shaped(completions, mode, **kwargs):
    n = len(completions)
    return {
        "short": lambda: [1.0] * (n - 1),
        "text": lambda: ["1.0"] * n,
        "scalar": lambda: 1.0,
        "inf": lambda: [float("inf")] * n,
        "bools": lambda: [True] * n,
    }[mode[0]]()
"#;

#[test]
fn wrong_return_values_say_what_was_expected() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "shapes.py", SHAPES);
    let mut reward = build_reward(&spec("shape", &file, "shaped", 10.0)).unwrap();
    let score = |reward: &mut Box<dyn Reward>, mode: &str| {
        let row = json!({"prompt": "p", "mode": mode});
        reward.score(&samples(&[case(&row, "a", &[1]), case(&row, "b", &[2])]))
    };
    for (mode, want) in [
        ("short", "returned 1 value for 2 completions"),
        ("text", "value 0 is str '1.0'"),
        ("scalar", "returned float 1.0"),
        ("inf", "value 0 is inf; return a finite float"),
    ] {
        let err = score(&mut reward, mode).unwrap_err();
        assert!(matches!(err, RewardError::Output { .. }), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("`shaped` (") && msg.contains(want) && msg.contains(", on batch "),
            "{mode}: {msg}"
        );
        if mode != "inf" {
            assert!(msg.contains("one float (or None) per completion"), "{msg}");
        }
    }
    // Booleans are numbers to TRL (torch.tensor), so they are here.
    assert_eq!(
        score(&mut reward, "bools").unwrap().scores,
        vec![Some(1.0), Some(1.0)]
    );
}

const TWO_FUNCTIONS: &str = r#"
import re
from math import sqrt


def accuracy_reward(completions, **kwargs):
    return [0.0 for _ in completions]


def format_reward(completions, **kwargs):
    return [sqrt(0.0) for _ in completions]
"#;

#[test]
fn missing_function_file_or_module_name_the_fix() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "rewards.py", TWO_FUNCTIONS);
    let row = json!({"prompt": "p"});
    let batch = [case(&row, "a", &[1])];

    let mut reward = build_reward(&spec("acc", &file, "acuracy_reward", 10.0)).unwrap();
    let err = reward.score(&samples(&batch)).unwrap_err();
    assert!(matches!(err, RewardError::Config { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("has no function `acuracy_reward`; its functions: accuracy_reward, format_reward; set `function`"),
        "{msg}"
    );

    let missing = dir.path().join("nope.py").to_string_lossy().into_owned();
    let msg = build_reward(&spec("acc", &missing, "f", 10.0))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("nope.py is not a file") && msg.contains("working directory"),
        "{msg}"
    );

    let file = write(
        dir.path(),
        "needs.py",
        "import rlft_test_no_such_module\n\ndef f(completions, **kwargs):\n    return [1.0]\n",
    );
    let mut reward = build_reward(&spec("needs", &file, "f", 10.0)).unwrap();
    let err = reward.score(&samples(&batch)).unwrap_err();
    assert!(matches!(err, RewardError::Python { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("raised ModuleNotFoundError")
            && msg.contains("No module named 'rlft_test_no_such_module'")
            && msg.contains("set `python` to the interpreter"),
        "{msg}"
    );
}

const COUNTER: &str = r#"
import time

calls = 0


def counted(completions, **kwargs):
    global calls
    calls += 1
    print("scoring batch", calls)  # to stdout: must not break the answers
    if completions[0] == "hang":
        time.sleep(60)
    if completions[0] == "raise":
        raise RuntimeError("asked to")
    return [float(calls)] * len(completions)
"#;

#[test]
fn worker_is_reused_killed_at_timeout_and_restarted() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "counter.py", COUNTER);
    // 2 s: a fresh worker must start Python and import the module within it, also on a loaded
    // machine.
    let mut spec = spec("count", &file, "counted", 2.0);
    spec.on_error = Some(-1.0);
    let mut set = RewardSet::new(&[spec], None).unwrap();
    let row = json!({"prompt": "p"});
    let score = |set: &mut RewardSet, text: &str| {
        let batch = [case(&row, text, &[1]), case(&row, "b", &[2])];
        set.score(&samples(&batch)).unwrap()
    };
    // One worker, imported once: the module-level counter goes on across batches.
    for expect in [1.0, 2.0, 3.0] {
        assert_eq!(score(&mut set, "a").total, vec![expect; 2]);
    }
    // An exception falls back to on_error and the worker (and its counter) lives on.
    let s = score(&mut set, "raise");
    assert_eq!(
        (s.total.clone(), s.failures.clone()),
        (vec![-1.0; 2], vec![2])
    );
    assert!(s.errors[0]
        .as_deref()
        .unwrap()
        .contains("RuntimeError: asked to"));
    assert_eq!(score(&mut set, "a").total, vec![5.0; 2]);
    // A hang is killed at timeout_s...
    let start = Instant::now();
    let s = score(&mut set, "hang");
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    assert_eq!(s.failures, vec![2]);
    let msg = s.errors[0].as_deref().unwrap();
    assert!(
        msg.contains("no answer within 2 s") && msg.contains("calling `counted`"),
        "{msg}"
    );
    // ...and the next batch starts a fresh worker: the module is imported again.
    assert_eq!(score(&mut set, "a").total, vec![1.0; 2]);
}

#[test]
fn timeout_error_without_on_error() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "counter.py", COUNTER);
    let mut reward = build_reward(&spec("count", &file, "counted", 0.5)).unwrap();
    let row = json!({"prompt": "p"});
    let err = reward
        .score(&samples(&[case(&row, "hang", &[1])]))
        .unwrap_err();
    assert!(matches!(err, RewardError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("raise `timeout_s`"), "{err}");
}
