//! The `command` reward against real processes (small python3 scripts in a temporary directory):
//! a good one in both modes, one that crashes, one that hangs, one that prints garbage.
#![cfg(unix)]

use std::path::Path;
use std::time::{Duration, Instant};

use rlft_rewards::{build_reward, Reward, RewardError, RewardSet, RewardSpec, Sample};
use serde_json::{json, Value};

/// `python3`, which these tests need (so does `scripts/fetch-default-model.sh`).
fn python() -> &'static str {
    let ok = std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 is not on PATH: these tests run small python3 scripts as reward commands"
    );
    "python3"
}

fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.to_string_lossy().into_owned()
}

fn spec(command: &[&str], timeout_s: f64, batch: bool) -> RewardSpec {
    serde_json::from_value(json!({
        "type": "command", "name": "ext", "command": command, "timeout_s": timeout_s, "batch": batch
    }))
    .unwrap()
}

fn samples<'a>(completions: &[&'a str], row: &'a Value) -> Vec<Sample<'a>> {
    completions
        .iter()
        .map(|c| Sample {
            prompt: "P",
            completion: c,
            row,
            completion_ids: &[],
            completion_tokens: c.len(),
            truncated: false,
            environment_reward: None,
        })
        .collect()
}

const GOOD: &str = r#"
import json, sys
for line in sys.stdin:
    s = json.loads(line)
    if s["completion"] == "skip":
        print("null", flush=True)
    elif s["completion"] == "plain":
        print(0.25, flush=True)
    else:
        hit = s["row"]["answer"] in s["completion"]
        print(json.dumps({"score": 1.0 if hit else 0.0, "parts": {"tokens": s["completion_tokens"]}}), flush=True)
"#;

const GOOD_BATCH: &str = r#"
import json, sys
for line in sys.stdin:
    body = json.loads(line)
    scores = [len(s["completion"]) + (0.5 if s["truncated"] else 0) for s in body["samples"]]
    print(json.dumps({"scores": scores}), flush=True)
"#;

#[test]
fn good_process_per_sample_and_kept_running() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let path = script(dir.path(), "good.py", GOOD);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, false)).unwrap();
    let row = json!({"answer": "26"});
    for _ in 0..3 {
        let out = reward
            .score(&samples(&["it is 26", "25", "skip", "plain"], &row))
            .unwrap();
        assert_eq!(out.scores, vec![Some(1.0), Some(0.0), None, Some(0.25)]);
        let tokens = out.part("tokens").unwrap();
        assert_eq!(&tokens[..2], &[8.0, 2.0]);
        assert!(tokens[2].is_nan() && tokens[3].is_nan());
    }
    // An empty batch does not talk to the process.
    assert!(reward.score(&[]).unwrap().scores.is_empty());
    // Big batches do not deadlock on full pipes.
    let long = "x".repeat(5000);
    let many: Vec<&str> = (0..300).map(|_| long.as_str()).collect();
    let out = reward.score(&samples(&many, &row)).unwrap();
    assert_eq!(out.scores.len(), 300);
}

#[test]
fn good_process_batch_mode() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let path = script(dir.path(), "batch.py", GOOD_BATCH);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, true)).unwrap();
    let row = json!({});
    let mut batch = samples(&["a", "abc"], &row);
    batch[1].truncated = true;
    assert_eq!(
        reward.score(&batch).unwrap().scores,
        vec![Some(1.0), Some(3.5)]
    );
    assert_eq!(reward.score(&batch[..1]).unwrap().scores, vec![Some(1.0)]);
}

#[test]
fn crash_reports_status_and_stderr() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let body = "import sys\nsys.stdin.readline()\nprint('Traceback: KeyError: answer', file=sys.stderr)\nsys.exit(3)\n";
    let path = script(dir.path(), "crash.py", body);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, false)).unwrap();
    let row = json!({});
    let err = reward.score(&samples(&["a", "b"], &row)).unwrap_err();
    assert!(matches!(err, RewardError::Process { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("reward `ext`: reward process `python3 "),
        "{msg}"
    );
    assert!(
        msg.contains("exit status: 3") && msg.contains("after answering 0 of 2 samples"),
        "{msg}"
    );
    assert!(msg.contains("KeyError: answer"), "{msg}");
    // It is restarted (and crashes again) on the next call.
    let msg = reward
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("exit status: 3"), "{msg}");
}

#[test]
fn hang_times_out_quickly_and_restarts() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("helper.pid");
    let body = format!(
        r#"
import json, subprocess, sys, time
for line in sys.stdin:
    s = json.loads(line)
    if s["completion"] == "hang":
        helper = subprocess.Popen(["sleep", "60"])
        open({pid:?}, "w").write(str(helper.pid))
        time.sleep(3600)
    print(1.0, flush=True)
"#,
        pid = pid_file.to_string_lossy()
    );
    let path = script(dir.path(), "hang.py", &body);
    // 2 s: the restarted interpreter must start and answer within it, also on a loaded machine
    // (at 0.5 s a python3 start beside two trainings and a build missed it).
    let mut reward = build_reward(&spec(&[py, &path], 2.0, false)).unwrap();
    let row = json!({});
    let start = Instant::now();
    let err = reward.score(&samples(&["ok", "hang"], &row)).unwrap_err();
    let elapsed = start.elapsed();
    assert!(matches!(err, RewardError::Timeout { .. }), "{err}");
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("no answer within 2 s") && msg.contains("answered 1 of 2 samples"),
        "{msg}"
    );
    // The helper the script started was killed with it (the whole process group).
    let helper: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{helper}/stat")).unwrap_or_default();
        let gone = stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .is_some_and(|s| s.trim_start().starts_with('Z'));
        if gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "helper {helper} still running: {stat}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A fresh process answers the next batch.
    assert_eq!(
        reward.score(&samples(&["ok"], &row)).unwrap().scores,
        vec![Some(1.0)]
    );
}

#[test]
fn garbage_is_quoted_with_what_was_expected() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let body = "import sys\nfor line in sys.stdin:\n    print('Loading model weights... done', flush=True)\n";
    let path = script(dir.path(), "garbage.py", body);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, false)).unwrap();
    let row = json!({});
    let err = reward.score(&samples(&["a"], &row)).unwrap_err();
    assert!(matches!(err, RewardError::Protocol { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("`Loading model weights... done"), "{msg}");
    assert!(msg.contains("a JSON number, null, or an object"), "{msg}");
    assert!(msg.contains("send logs to stderr"), "{msg}");

    // A wrong answer shape in batch mode, and a huge garbage line gets truncated in the message.
    let body = "import sys\nfor line in sys.stdin:\n    print('{\"score\": [1]}' + 'x' * 5000, flush=True)\n";
    let path = script(dir.path(), "garbage_batch.py", body);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, true)).unwrap();
    let msg = reward
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(r#"expected {"scores": [...]} with 1 entries"#),
        "{msg}"
    );
    assert!(
        msg.len() < 1500,
        "message not truncated: {} bytes",
        msg.len()
    );
}

#[test]
fn extra_lines_and_early_exit_are_errors() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    // Answers, then a stray line.
    let body =
        "import sys\nfor line in sys.stdin:\n    print(1, flush=True)\n    print(2, flush=True)\n";
    let path = script(dir.path(), "chatty.py", body);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, false)).unwrap();
    let row = json!({});
    assert_eq!(
        reward.score(&samples(&["a"], &row)).unwrap().scores,
        vec![Some(1.0)]
    );
    std::thread::sleep(Duration::from_millis(200));
    let msg = reward
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("printed a line when no answer was due") && msg.contains("`2"),
        "{msg}"
    );

    // Answers one batch, then exits.
    let body = "import sys\nsys.stdin.readline()\nprint(1, flush=True)\n";
    let path = script(dir.path(), "once.py", body);
    let mut reward = build_reward(&spec(&[py, &path], 10.0, false)).unwrap();
    assert_eq!(
        reward.score(&samples(&["a"], &row)).unwrap().scores,
        vec![Some(1.0)]
    );
    std::thread::sleep(Duration::from_millis(200));
    let msg = reward
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("exit status: 0") && msg.contains("its stderr was empty"),
        "{msg}"
    );
}

#[test]
fn missing_program_and_on_error() {
    let mut reward = build_reward(&spec(&["/nonexistent/reward-binary"], 1.0, false)).unwrap();
    let row = json!({});
    let msg = reward
        .score(&samples(&["a"], &row))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("cannot start `/nonexistent/reward-binary`") && msg.contains("PATH"),
        "{msg}"
    );

    // In a set with on_error, a failing process gives the default and is counted.
    let mut spec = spec(&["/nonexistent/reward-binary"], 1.0, false);
    spec.on_error = Some(-0.5);
    let mut set = RewardSet::new(&[spec], None).unwrap();
    let scores = set.score(&samples(&["a", "b"], &row)).unwrap();
    assert_eq!(scores.total, vec![-0.5, -0.5]);
    assert_eq!(scores.failures, vec![2]);
    assert!(scores.errors[0]
        .as_deref()
        .unwrap()
        .contains("cannot start"));
}

#[test]
fn drop_ends_the_process() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let body = format!(
        "import os, sys, time\nopen({:?}, 'w').write(str(os.getpid()))\nfor line in sys.stdin:\n    print(1, flush=True)\n",
        pid_file.to_string_lossy()
    );
    let path = script(dir.path(), "pid.py", &body);
    let mut reward: Box<dyn Reward> = build_reward(&spec(&[py, &path], 10.0, false)).unwrap();
    let row = json!({});
    reward.score(&samples(&["a"], &row)).unwrap();
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    let start = Instant::now();
    drop(reward);
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} survived the drop"
    );
}
