//! `rlft data tiny-python-expr --preferences`, `rlft reward-model` and `rlft score` end to end
//! on a tiny random model: the data is seeded, a LoRA reward model trains and exports, the
//! merged directory and the adapter over its base score alike, and a causal LM is refused.

mod common;

use common::{ok_all as ok, rlft};

use std::path::Path;

use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};

fn scores(path: &Path) -> Vec<(f64, f64)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["chosen_score"].as_f64().unwrap(),
                v["rejected_score"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn preferences_reward_model_and_score() {
    let dir = tempfile::tempdir().unwrap();
    let d = |p: &str| dir.path().join(p).display().to_string();
    let model = d("model");
    save_tiny_hf_dir(tiny_config(Family::Qwen2), 3, Path::new(&model)).unwrap();
    let data = [
        "data",
        "tiny-python-expr",
        "--preferences",
        "--train-size",
        "24",
    ];
    let out = ok(&rlft(
        &[&data[..], &["--test-size", "8", "--jsonl", "-o", &d("p")]].concat(),
    ));
    assert!(out.contains("rows: prompt, chosen"), "{out}");
    ok(&rlft(
        &[&data[..], &["--test-size", "8", "--jsonl", "-o", &d("q")]].concat(),
    ));
    let train = std::fs::read_to_string(dir.path().join("p/train.jsonl")).unwrap();
    assert_eq!(
        train,
        std::fs::read_to_string(dir.path().join("q/train.jsonl")).unwrap()
    );
    assert!(train.contains("\"rejected_kind\""));
    let toml = format!(
        "model = {model:?}\noutput_dir = {:?}\ndataset = {:?}\neval_split = \"test\"\n\
         per_device_train_batch_size = 4\nmax_steps = 4\nlogging_steps = 1\n\
         learning_rate = 1e-3\nuse_peft = true\nreport_to = [\"jsonl\"]\n[lora]\nr = 4\n",
        d("out"),
        d("p")
    );
    std::fs::write(dir.path().join("rm.toml"), toml).unwrap();
    let out = ok(&rlft(&["reward-model", "--config", &d("rm.toml")]));
    assert!(out.contains("\"final_eval_accuracy\""), "{out}");
    let (fin, adapter) = (d("out/final"), d("out/adapter"));
    let split = ["--data", &d("p"), "--split", "test"];
    let out = ok(&rlft(
        &[&["score", "-m", &fin, "-o", &d("s1.jsonl")], &split[..]].concat(),
    ));
    assert!(
        out.contains("scored 8 rows") && out.contains("accuracy"),
        "{out}"
    );
    let via_adapter = [
        "score",
        "-m",
        &adapter,
        "--base",
        &model,
        "-o",
        &d("s2.jsonl"),
    ];
    ok(&rlft(&[&via_adapter[..], &split[..]].concat()));
    let (a, b) = (
        scores(&dir.path().join("s1.jsonl")),
        scores(&dir.path().join("s2.jsonl")),
    );
    assert_eq!(a.len(), 8);
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x.0 - y.0).abs() < 1e-4 && (x.1 - y.1).abs() < 1e-4,
            "{x:?} vs {y:?}"
        );
    }
    let bad = rlft(&[&["score", "-m", &model], &split[..]].concat());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("not a reward model"),
        "{err}"
    );
}

#[test]
fn rejected_kinds_are_chosen_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = |p: &str| dir.path().join(p).display().to_string();
    let data = ["data", "tiny-python-expr", "--preferences", "--train-size"];
    let out = ok(&rlft(
        &[
            &data[..],
            &[
                "16",
                "--test-size",
                "0",
                "--jsonl",
                "--rejected",
                "no_answer",
                "-o",
                &d("n"),
            ],
        ]
        .concat(),
    ));
    assert!(out.contains("rejected (no_answer)"), "{out}");
    let train = std::fs::read_to_string(dir.path().join("n/train.jsonl")).unwrap();
    for line in train.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["extra_info"]["rejected_kind"], "no_answer", "{line}");
        let chosen = v["chosen"][0]["content"].as_str().unwrap();
        assert!(!chosen.contains("\\boxed"), "{chosen}");
    }
    let out = rlft(&[&data[..], &["4", "--rejected", "wrong", "-o", &d("w")]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("wrong_number, missing_box, no_answer"),
        "{err}"
    );
    let out = rlft(&[
        "data",
        "tiny-python-expr",
        "--rejected",
        "no_answer",
        "-o",
        &d("x"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--preferences"),
        "{err}"
    );
}
