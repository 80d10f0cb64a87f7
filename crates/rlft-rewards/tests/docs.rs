//! The examples in the crate docs and `docs/rewards.md` work: every TOML snippet parses and
//! builds, and the Python reward process and server of `docs/rewards.md` answer real batches.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rlft_rewards::{build_reward, RewardError, RewardKind, RewardSet, RewardSpec, Sample};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Config {
    rewards: Vec<RewardSpec>,
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fenced blocks of `language` in markdown `text` (lines of `//!` docs are unprefixed first).
fn blocks(text: &str, language: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line
            .strip_prefix("//! ")
            .or(line.strip_prefix("//!"))
            .unwrap_or(line);
        match &mut current {
            None if line.trim() == format!("```{language}") => current = Some(String::new()),
            Some(block) if line.trim() == "```" => {
                out.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

/// `docs/rewards.md`, whose examples these tests run.
fn docs_md() -> String {
    let path = manifest().join("../../docs/rewards.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; its TOML and Python examples are tested here",
            path.display()
        )
    })
}

/// The `rewards.py` of `docs/rewards.md`'s `python` section.
fn docs_rewards_py(md: &str) -> String {
    blocks(md, "python")
        .into_iter()
        .find(|b| b.starts_with("# rewards.py"))
        .expect("docs/rewards.md has a ```python block starting `# rewards.py`")
}

#[test]
fn toml_snippets_parse_and_build() {
    let mut sources = vec![std::fs::read_to_string(manifest().join("src/lib.rs")).unwrap()];
    sources.push(docs_md());
    // `python` rewards name a file relative to the working directory: the docs' rewards.py
    // stands in for it.
    let dir = tempfile::tempdir().unwrap();
    let rewards_py = write(dir.path(), "rewards.py", &docs_rewards_py(&sources[1]));
    let mut count = 0;
    for source in &sources {
        for block in blocks(source, "toml") {
            let mut config: Config =
                toml::from_str(&block).unwrap_or_else(|e| panic!("{e}\n{block}"));
            for spec in &mut config.rewards {
                if let RewardKind::Python(p) = &mut spec.kind {
                    assert_eq!(p.path, "rewards.py", "{block}");
                    p.path = rewards_py.clone();
                }
            }
            // A `model` reward needs a model: this crate parses it; the trainers build it
            // (crates/rlft/tests/model_reward.rs).
            let (model, rest): (Vec<RewardSpec>, Vec<RewardSpec>) = config
                .rewards
                .iter()
                .cloned()
                .partition(|s| matches!(s.kind, RewardKind::Model(_)));
            for spec in &model {
                let e = build_reward(spec)
                    .err()
                    .expect("a model reward is not built here");
                assert!(e.to_string().contains("reward_set"), "{e}");
            }
            if !rest.is_empty() {
                RewardSet::new(&rest, None).unwrap_or_else(|e| panic!("{e}\n{block}"));
            }
            count += config.rewards.len();
        }
    }
    assert!(count >= 12, "only {count} specs in the docs");
}

#[test]
fn toml_errors_name_the_problem() {
    let err = |text: &str| toml::from_str::<Config>(text).err().unwrap().to_string();
    let e = err("[[rewards]]\ntype = \"python_exp_rule\"\n");
    assert!(
        e.contains("unknown reward type `python_exp_rule` (did you mean `python_expr_rule`?)"),
        "{e}"
    );
    let e = err("[[rewards]]\ntype = \"overlong\"\nmax_completion_length = 128\nbufer = 8\n");
    assert!(
        e.contains("unknown field `bufer`") && e.contains("`buffer`"),
        "{e}"
    );
    let e = err("[[rewards]]\ntype = \"overlong\"\nmax_completion_length = 128\n");
    assert!(e.contains("missing field `buffer`"), "{e}");
}

/// Fails unless `python3` runs (the examples are Python scripts).
fn require_python() {
    let ok = std::process::Command::new("python3")
        .args(["-c", "pass"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 is not on PATH: docs/rewards.md's Python examples need it"
    );
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn python_examples_work() {
    let md = docs_md();
    require_python();
    let scripts = blocks(&md, "python");
    assert_eq!(
        scripts.len(),
        3,
        "expected the python (TRL), command and http examples"
    );
    let dir = tempfile::tempdir().unwrap();
    let row = json!({"answer": 26});
    let batch: Vec<Sample> = ["it is 26", "27"]
        .iter()
        .map(|c| Sample {
            prompt: "",
            completion: c,
            row: &row,
            completion_ids: &[],
            completion_tokens: 3,
            truncated: false,
            environment_reward: None,
        })
        .collect();

    let command_script = scripts.iter().find(|s| s.contains("sys.stdin")).unwrap();
    let server_script = scripts.iter().find(|s| s.contains("http.server")).unwrap();
    let command = write(dir.path(), "reward.py", command_script);
    let spec: RewardSpec =
        serde_json::from_value(json!({"type": "command", "command": ["python3", command]}))
            .unwrap();
    let out = build_reward(&spec).unwrap().score(&batch).unwrap();
    assert_eq!(out.scores, vec![Some(1.0), Some(0.0)]);
    assert_eq!(out.part("hit"), Some(&[1.0, 0.0][..]));

    let server = write(dir.path(), "server.py", server_script);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new("python3")
        .arg(&server)
        .arg(port.to_string())
        .spawn()
        .unwrap();
    let spec: RewardSpec = serde_json::from_value(
        json!({"type": "http", "url": format!("http://127.0.0.1:{port}/score")}),
    )
    .unwrap();
    let mut reward = build_reward(&spec).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let result = loop {
        match reward.score(&batch) {
            Err(RewardError::Http { message, .. })
                if message.contains("cannot connect") && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => break other,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(result.unwrap().scores, vec![Some(1.0), Some(0.0)]);
}

#[test]
fn python_trl_example_works() {
    let md = docs_md();
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "rewards.py", &docs_rewards_py(&md));
    let toml_block = blocks(&md, "toml")
        .into_iter()
        .find(|b| b.contains("type = \"python\""))
        .unwrap();
    let mut config: Config = toml::from_str(&toml_block).unwrap();
    for spec in &mut config.rewards {
        if let RewardKind::Python(p) = &mut spec.kind {
            p.path = path.clone();
        }
    }
    let mut set = RewardSet::new(&config.rewards, None).unwrap();
    let chat = json!({"prompt": [{"role": "user", "content": "2 + 2?"}], "ground_truth": "4"});
    let no_truth = json!({"prompt": [{"role": "user", "content": "Say hi."}]});
    let batch: Vec<Sample> = [
        ("<think>2 and 2</think> <answer>4</answer>", &chat),
        ("<answer>5</answer>", &chat),
        ("<think>hi</think><answer>hi</answer>", &no_truth),
    ]
    .iter()
    .map(|(c, row)| Sample {
        prompt: "",
        completion: c,
        row,
        completion_ids: &[],
        completion_tokens: 3,
        truncated: false,
        environment_reward: None,
    })
    .collect();
    let scores = set.score(&batch).unwrap();
    // accuracy (weight 1) + 0.2 x format; the row without a ground truth is not applicable.
    assert_eq!(
        scores.per_function[0].scores,
        vec![Some(1.0), Some(0.0), None]
    );
    assert_eq!(
        scores.per_function[1].scores,
        vec![Some(1.0), Some(0.0), Some(1.0)]
    );
    assert_eq!(scores.total, vec![1.2, 0.0, 0.2]);
}
