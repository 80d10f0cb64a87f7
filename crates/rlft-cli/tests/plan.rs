//! `rlft plan` against a real run: the predicted peak RSS of a GRPO config on a random model is
//! within 15% of the peak the run measures (`run_summary.json`'s `peak_rss_mib`, the trainer's
//! VmHWM), and the JSON and text outputs hold together.
//!
//! The tiny test models (hidden 64) would leave the peak to the process baseline (tens of MiB
//! of binary, tokenizer and threads), which says nothing about the arithmetic. This test uses a
//! larger random model (23M parameters: hidden 512, 6 layers, vocabulary 8192) trained fully
//! with a KL reference (weights, reference copy, AdamW state, gradients) on micro-batches of
//! 8 x ~80 tokens, so the baseline is under 10% of the peak; it checks the total and the
//! increase over the predicted baseline, both within 15%. Two steps (the peak needs AdamW's
//! state touched by a first step), about ten seconds in release mode. The same for PPO, whose
//! critic (a second copy of the model, trained beside the policy) the plan counts too.

mod common;

use common::{ok, rlft};

use std::path::Path;

use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};
use serde_json::Value;

/// A random Qwen2-shaped model of 23M parameters.
fn model(dir: &Path) -> String {
    let mut c = tiny_config(Family::Qwen2);
    c.vocab_size = 8192;
    c.hidden_size = 512;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 6;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    let p = dir.join("model");
    save_tiny_hf_dir(c, 3, &p).unwrap();
    p.display().to_string()
}

/// The test config: GRPO, or with `ppo` PPO's (one completion per prompt, a critic: `vf_coef`
/// tells `rlft plan` it is a PPO config).
fn config(dir: &Path, ppo: bool) -> std::path::PathBuf {
    let data = dir.join("prompts.jsonl");
    let mut s = String::new();
    for i in 0..8 {
        let row = serde_json::json!({"prompt": format!("What is {i} + {}?", i * 3 % 7)});
        s.push_str(&row.to_string());
        s.push('\n');
    }
    std::fs::write(&data, s).unwrap();
    let text = format!(
        r#"
model = "{}"
output_dir = "{}"
dataset = "{}"
max_prompt_length = 64
max_completion_length = 48
{}
per_device_train_batch_size = 8
gradient_accumulation_steps = 1
learning_rate = 1e-5
max_steps = 2
beta = 0.04
share_prompts = false
report_to = ["jsonl"]
seed = 1

[[rewards]]
type = "regex_format"
pattern = "[a-z]"
"#,
        model(dir),
        dir.join("out").display(),
        data.display(),
        if ppo {
            "num_generations = 1\nvf_coef = 0.1"
        } else {
            "num_generations = 4"
        }
    );
    let cfg = dir.join("grpo.toml");
    std::fs::write(&cfg, text).unwrap();
    cfg
}

#[test]
fn predicted_peak_is_within_15_percent_of_a_run() {
    let plain = check_prediction("grpo", &[]);
    // Activation checkpointing: fewer activations predicted, and the prediction still holds.
    let ckpt = check_prediction("grpo", &["--set", "gradient_checkpointing=true"]);
    assert!(
        ckpt < 0.5 * plain,
        "activations {ckpt:.1} vs {plain:.1} MiB"
    );
}

/// PPO: a critic as large as the policy (its weights, AdamW state, gradients, value pass and
/// activations) beside a policy that takes 4 optimiser steps per rollout (an old-policy pass).
#[test]
fn predicted_ppo_peak_is_within_15_percent_of_a_run() {
    check_prediction("ppo", &[]);
}

/// Plans and runs the test config for `trainer` (grpo or ppo) with `sets`; checks the
/// prediction, returns the predicted activations (MiB).
fn check_prediction(trainer: &str, sets: &[&str]) -> f64 {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), trainer == "ppo");
    let cfg_s = cfg.to_str().unwrap();
    let with =
        |args: &[&str]| -> Vec<String> { args.iter().chain(sets).map(|s| s.to_string()).collect() };
    let rlft_with = |args: &[&str]| {
        let v = with(args);
        rlft(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let plan: Value = serde_json::from_str(&ok(&rlft_with(&["plan", "--config", cfg_s, "--json"])))
        .expect("plan JSON");
    assert_eq!(plan["trainer"], trainer);
    let mib = |b: &Value| b.as_u64().unwrap() as f64 / (1u64 << 20) as f64;
    let predicted = mib(&plan["total_bytes"]);
    let components = plan["plan"]["components"].as_array().unwrap();
    let bytes = |key: &str| {
        components
            .iter()
            .find(|c| c["key"] == key)
            .map(|c| mib(&c["bytes"]))
            .unwrap_or_else(|| panic!("no component {key}"))
    };
    let baseline = bytes("baseline");
    // Full fine-tuning with beta > 0: a reference copy as large as the weights.
    assert_eq!(bytes("reference"), bytes("weights"));
    assert!(bytes("activations") > 0.0);
    if trainer == "ppo" {
        // The critic starts from the policy's model: its weights and a [1, hidden] head.
        let head = 512.0 * 4.0 / (1u64 << 20) as f64;
        assert!((bytes("critic_weights") - bytes("weights") - head).abs() < 1e-9);
        assert!(bytes("critic_activations") > 0.0 && bytes("critic_values") > 0.0);
    }
    assert_eq!(plan["lengths"]["source"], "dataset");
    // The text output has the same total, up to the process baseline, which each invocation
    // measures from its own RSS (they differ by a fraction of a MiB).
    let text = ok(&rlft_with(&["plan", "--config", cfg_s]));
    let number_after = |prefix: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in {text}"));
        line[prefix.len()..]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no number after {prefix:?}: {line}"))
    };
    let text_baseline = number_after("process baseline");
    let text_total = number_after("predicted peak RSS:");
    let want = predicted - baseline + text_baseline;
    // Both figures are printed rounded (0.1 MiB and 1 MiB).
    assert!(
        (text_total - want).abs() <= 0.6,
        "{want:.1} MiB wanted: {text}"
    );

    ok(&rlft_with(&[trainer, "--config", cfg_s]));
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("out/run_summary.json")).unwrap(),
    )
    .unwrap();
    let measured = summary["peak_rss_mib"].as_f64().unwrap();
    let err = (predicted - measured) / measured;
    eprintln!(
        "{sets:?}: predicted {predicted:.0} MiB (baseline {baseline:.0}), measured \
         {measured:.0} MiB: {:+.1}%",
        err * 100.0
    );
    assert!(
        baseline < 0.1 * measured,
        "the baseline {baseline:.0} MiB is too large a share of {measured:.0} MiB for a \
         meaningful check"
    );
    assert!(
        err.abs() <= 0.15,
        "predicted {predicted:.0} MiB, measured {measured:.0} MiB ({:+.1}%)\n{text}",
        err * 100.0
    );
    let over = ((predicted - baseline) - (measured - baseline)) / (measured - baseline);
    assert!(
        over.abs() <= 0.15,
        "increase over the baseline: predicted {:.0} MiB, measured {:.0} MiB ({:+.1}%)",
        predicted - baseline,
        measured - baseline,
        over * 100.0
    );
    bytes("activations")
}

#[test]
fn too_little_memory_gets_suggestions() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), false);
    let cfg_s = cfg.to_str().unwrap();
    let plan: Value =
        serde_json::from_str(&ok(&rlft(&["plan", "--config", cfg_s, "--json"]))).unwrap();
    // 90% of the predicted peak available: the plan's limit (90% of that) is 81% of the peak.
    let avail = (plan["total_mib"].as_f64().unwrap() * 0.9) as u64;
    let avail_s = avail.to_string();
    let v: Value = serde_json::from_str(&ok(&rlft(&[
        "plan",
        "--config",
        cfg_s,
        "--json",
        "--available-mib",
        &avail_s,
    ])))
    .unwrap();
    assert_eq!(v["fits"], false);
    let s = v["suggestions"].as_array().unwrap();
    assert!(!s.is_empty(), "{v}");
    let budget = v["budget_bytes"].as_u64().unwrap();
    for x in s {
        assert!(x["total_bytes"].as_u64().unwrap() <= budget, "{x}");
    }
    // Each suggestion is a config the planner itself predicts to fit.
    let first = &s[0];
    let mut args = vec!["plan", "--config", cfg_s, "--json"];
    let sets: Vec<String> = first["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    for x in &sets {
        args.push("--set");
        args.push(x);
    }
    let again: Value = serde_json::from_str(&ok(&rlft(&args))).unwrap();
    let total = again["total_bytes"].as_u64().unwrap() as f64;
    let want = first["total_bytes"].as_u64().unwrap() as f64;
    // The baseline is measured again in the second process: allow a few MiB.
    assert!(
        (total - want).abs() < 8.0 * (1 << 20) as f64,
        "{total} vs {want}"
    );
    let text = ok(&rlft(&[
        "plan",
        "--config",
        cfg_s,
        "--available-mib",
        &avail_s,
    ]));
    assert!(
        text.contains("does NOT fit") && text.contains("--set"),
        "{text}"
    );
    // Not a GRPO or SFT config: the error says how to name the trainer.
    let odd = tmp.path().join("odd.toml");
    std::fs::write(&odd, "dataset = \"x\"\n").unwrap();
    let out = rlft(&["plan", "--config", odd.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("rlft plan grpo"));
}

/// 16 preference rows: a question, a longer right answer and a shorter wrong one (the test
/// model's tokenizer reads about a token per byte).
fn preferences(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("prefs.jsonl");
    let mut s = String::new();
    for i in 0..16 {
        let row = serde_json::json!({
            "prompt": format!("Question {i}: what is {i} plus {}? Answer briefly.", i * 3 % 7),
            "chosen": format!(
                "Adding {i} and {} step by step gives {}, so the answer is {}.",
                i * 3 % 7,
                i + i * 3 % 7,
                i + i * 3 % 7
            ),
            "rejected": format!("It is {}.", i + 1),
        });
        s.push_str(&row.to_string());
        s.push('\n');
    }
    std::fs::write(&data, s).unwrap();
    data
}

/// Plans `cfg` (the trainer told by its keys must be `trainer`), runs it with `rlft
/// <trainer>`, and checks the predicted peak against the run's within 15%, in total and over
/// the baseline.
fn check_trainer(trainer: &str, cfg: &Path, out: &Path) {
    let cfg_s = cfg.to_str().unwrap();
    let plan: Value = serde_json::from_str(&ok(&rlft(&["plan", "--config", cfg_s, "--json"])))
        .expect("plan JSON");
    assert_eq!(plan["trainer"], trainer);
    assert_eq!(plan["lengths"]["source"], "dataset");
    let mib = |b: &Value| b.as_u64().unwrap() as f64 / (1u64 << 20) as f64;
    let predicted = mib(&plan["total_bytes"]);
    let components = plan["plan"]["components"].as_array().unwrap();
    let baseline = components
        .iter()
        .find(|c| c["key"] == "baseline")
        .map(|c| mib(&c["bytes"]))
        .unwrap();
    ok(&rlft(&[trainer, "--config", cfg_s]));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run_summary.json")).unwrap())
            .unwrap();
    let measured = summary["peak_rss_mib"].as_f64().unwrap();
    let err = (predicted - measured) / measured;
    let over = (predicted - measured) / (measured - baseline);
    eprintln!(
        "{trainer}: predicted {predicted:.0} MiB (baseline {baseline:.0}), measured \
         {measured:.0} MiB: {:+.1}% ({:+.1}% over the baseline)",
        err * 100.0,
        over * 100.0
    );
    assert!(baseline < 0.1 * measured, "baseline {baseline:.0} MiB");
    assert!(
        err.abs() <= 0.15 && over.abs() <= 0.15,
        "{err:+.3} / {over:+.3}"
    );
}

/// The shared keys of the preference tests' configs: full fine-tuning of the 23M model on
/// micro-batches of 8 (pairs, or completions for Online DPO), two steps.
fn preference_config(dir: &Path, data: &Path, body: &str) -> std::path::PathBuf {
    let text = format!(
        "model = \"{}\"\noutput_dir = \"{}\"\ndataset = \"{}\"\nper_device_train_batch_size = \
         {}\ngradient_accumulation_steps = 1\nlearning_rate = 1e-5\nmax_steps = 2\nreport_to = \
         [\"jsonl\"]\nseed = 1\n{body}\n",
        model(dir),
        dir.join("out").display(),
        data.display(),
        if body.contains("rewards") { 4 } else { 8 },
    );
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// DPO (detected by its `loss_type`): a frozen reference copy, each prompt run once for the
/// chosen and rejected completions of its pair.
#[test]
fn predicted_dpo_peak_is_within_15_percent_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = preferences(tmp.path());
    let body = "beta = 0.1\nloss_type = \"sigmoid\"\nmax_length = 256";
    let cfg = preference_config(tmp.path(), &data, body);
    check_trainer("dpo", &cfg, &tmp.path().join("out"));
}

/// The reward model (detected by `center_rewards_coefficient`): 16 sequences per micro-batch,
/// a score head and no LM head.
#[test]
fn predicted_reward_model_peak_is_within_15_percent_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = preferences(tmp.path());
    let body = "center_rewards_coefficient = 0.01\nmax_length = 256";
    let cfg = preference_config(tmp.path(), &data, body);
    check_trainer("reward-model", &cfg, &tmp.path().join("out"));
}

/// Online DPO (detected by `max_new_tokens` with rewards): 4 prompts x 2 completions of 48
/// tokens per micro-batch, a reference copy.
#[test]
fn predicted_online_dpo_peak_is_within_15_percent_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("prompts.jsonl");
    let rows: String = (0..8)
        .map(|i| format!("{{\"prompt\": \"What is {i} + {}?\"}}\n", i * 3 % 7))
        .collect();
    std::fs::write(&data, rows).unwrap();
    let body = "max_new_tokens = 48\nmax_length = 128\nbeta = 0.1\n\n[[rewards]]\ntype = \
                \"regex_format\"\npattern = \"[a-z]\"";
    let cfg = preference_config(tmp.path(), &data, body);
    check_trainer("online-dpo", &cfg, &tmp.path().join("out"));
}
