//! `rlft bench` on a tiny random model: every training-side case runs in its own process and
//! reports positive times, its peak RSS and the machine; a missing reference says how to build it
//! and rlft's cases still run.

mod common;

use common::{ok, rlft};

use std::path::Path;

use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use serde_json::Value;

fn tiny_dir(dir: &Path) -> String {
    let p = dir.join("tiny-llama");
    save_tiny_hf_dir(tiny_config(Family::Llama), 5, &p).unwrap();
    p.display().to_string()
}

#[test]
fn training_cases_report_json_per_case() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(tmp.path());
    let out_file = tmp.path().join("bench.json");
    let stdout = ok(&rlft(&[
        "bench",
        "fwd_bwd",
        "lora",
        "adamw",
        "ref_pass",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--json",
        "--model",
        &model,
        "--out",
        out_file.to_str().unwrap(),
    ]));
    let r: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!(r, written, "--out writes what --json prints");

    let m = &r["machine"];
    assert!(m["threads"].as_u64().unwrap() >= 1);
    assert!(m["date_utc"].as_str().unwrap().ends_with('Z'));
    for key in ["cpu_model", "git_commit", "rlft_version"] {
        assert!(m.get(key).is_some(), "machine.{key} missing");
    }
    assert_eq!(r["settings"]["reps"], 1);
    assert_eq!(r["settings"]["warmup"], 0);

    let cases = r["cases"].as_object().unwrap();
    let names: Vec<&str> = cases.keys().map(String::as_str).collect();
    assert_eq!(names, ["fwd_bwd", "lora", "adamw", "ref_pass"]);
    for (name, e) in cases {
        let o = &e["rlft"];
        assert_eq!(o["case"], name.as_str());
        let t = &o["time"];
        let med = t["median_ms"].as_f64().unwrap();
        assert!(med > 0.0, "{name}: median {med}");
        assert!(t["min_ms"].as_f64().unwrap() > 0.0);
        assert!(t["max_ms"].as_f64().unwrap() >= med);
        assert_eq!(t["reps_ms"].as_array().unwrap().len(), 1);
        assert!(
            o["peak_rss_mib"].as_f64().unwrap() > 0.0,
            "{name}: no peak RSS"
        );
        assert!(o["interference"]["other_procs_cpu_pct"].is_number());
        assert!(e["reference"].is_null() && e["ratio"].is_null());
        assert!(e["warnings"].is_array());
    }
    let trainable = |c: &str| {
        cases[c]["rlft"]["detail"]["trainable_params"]
            .as_u64()
            .unwrap()
    };
    assert!(
        trainable("lora") < trainable("fwd_bwd"),
        "LoRA trains adapters only"
    );
    assert_eq!(
        cases["adamw"]["rlft"]["detail"]["n_params"]
            .as_u64()
            .unwrap(),
        trainable("fwd_bwd"),
        "AdamW steps every parameter"
    );
    assert!(cases["fwd_bwd"]["rlft"]["detail"]["loss"]
        .as_f64()
        .unwrap()
        .is_finite());
}

#[test]
fn missing_reference_says_how_to_build_it_and_rlft_still_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(tmp.path());
    let out = rlft(&[
        "bench",
        "adamw",
        "--reps",
        "1",
        "--warmup",
        "0",
        "--model",
        &model,
        "--against-reference",
        "--reference-python",
        "/nonexistent/venv/bin/python",
    ]);
    let stdout = ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("setup.sh"), "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("adamw"))
        .expect(&stdout);
    assert!(row.contains("MiB"), "{row}");
    assert!(stdout.contains("ratio = rlft median time / reference median time"));
}

#[test]
fn online_step_cases_run_on_a_tiny_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(tmp.path());
    let stdout = ok(&rlft(&[
        "bench", "grpo", "rloo", "ppo", "--reps", "1", "--json", "--model", &model,
    ]));
    let r: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    let cases = r["cases"].as_object().unwrap();
    let names: Vec<&str> = cases.keys().map(String::as_str).collect();
    assert_eq!(names, ["grpo", "rloo", "ppo"]);
    let phase = |case: &str, p: &str| {
        cases[case]["rlft"]["detail"]["phase_s_median"][p]
            .as_f64()
            .unwrap_or_else(|| panic!("{case}: no phase {p}"))
    };
    for name in names {
        let t = &cases[name]["rlft"]["time"];
        assert_eq!(t["reps_ms"].as_array().unwrap().len(), 1, "{name}");
        assert!(t["median_ms"].as_f64().unwrap() > 0.0, "{name}");
        assert!(phase(name, "generate") > 0.0 && phase(name, "update") > 0.0);
        assert!(phase(name, "ref_logprobs") > 0.0, "{name}: beta 0.001");
    }
    // GRPO takes one optimiser step per rollout with the KL in the loss: no old-policy pass.
    // RLOO and PPO put the KL in the reward (an old-policy pass); only PPO has a critic.
    assert_eq!(phase("grpo", "old_logprobs"), 0.0);
    assert!(phase("rloo", "old_logprobs") > 0.0 && phase("ppo", "old_logprobs") > 0.0);
    assert_eq!(phase("rloo", "values"), 0.0);
    assert!(phase("ppo", "values") > 0.0);
}

#[test]
fn offline_step_cases_run_on_a_tiny_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_dir(tmp.path());
    let stdout = ok(&rlft(&[
        "bench",
        "dpo",
        "reward_model",
        "--reps",
        "1",
        "--json",
        "--model",
        &model,
    ]));
    let r: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    let cases = r["cases"].as_object().unwrap();
    let names: Vec<&str> = cases.keys().map(String::as_str).collect();
    assert_eq!(names, ["dpo", "reward_model"]);
    let phase = |case: &str, p: &str| {
        cases[case]["rlft"]["detail"]["phase_s_median"][p]
            .as_f64()
            .unwrap_or_else(|| panic!("{case}: no phase {p}"))
    };
    for name in names {
        let t = &cases[name]["rlft"]["time"];
        assert_eq!(t["reps_ms"].as_array().unwrap().len(), 1, "{name}");
        assert!(phase(name, "update") > 0.0, "{name}");
    }
    // DPO with full fine-tuning scores the frozen reference copy in every step.
    assert!(phase("dpo", "ref_logprobs") > 0.0);
    assert_eq!(phase("reward_model", "ref_logprobs"), 0.0);
}
