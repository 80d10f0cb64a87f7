//! GRPO end to end on a tiny random model (byte-level tokenizer): a smoke run writes every
//! output, the same seed gives the same metrics, batch 8 x accumulation 1 equals batch 4 x
//! accumulation 2, resume equals an uninterrupted run, LoRA with a KL term trains adapters
//! only, and bad inputs fail with the fix.

mod common;

use std::path::Path;

use candle_core::Device;
use rlft::config::online::OnlineConfig;
use rlft::config::TrainerConfig;
use rlft::online::prepare;
use rlft::run::RunOptions;

use common::assert_same_bits;
use common::online::{config, max_diff, metric, run};

#[test]
fn smoke_run_writes_everything_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "beta = 0.04");
    let (s, w) = run(&cfg, &RunOptions::default());
    assert_eq!(s.global_step, 3);
    assert_eq!(s.steps.len(), 3);
    for key in [
        "loss",
        "reward",
        "reward_std",
        "rewards/digit/mean",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "clip_ratio/region_mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "grad_norm",
        "learning_rate",
        "time/generate",
        "time/update",
    ] {
        let v = metric(&s, 0, key);
        assert!(v.is_finite(), "{key} = {v}");
    }
    // The rewards vary within groups, so the update is not trivially zero.
    assert!(metric(&s, 0, "reward_std") > 0.0 && metric(&s, 0, "grad_norm") > 0.0);
    let out = &cfg.args.output_dir;
    for f in [
        "metrics.jsonl",
        "samples.jsonl",
        "run_summary.json",
        "config.toml",
        "final/model.safetensors",
        "checkpoint-3/trainer_state.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let samples = std::fs::read_to_string(out.join("samples.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(samples.lines().next().unwrap()).unwrap();
    assert!(first["rewards"]["digit"].is_number(), "{first}");
    // Same seed, fresh directory: the same metrics and weights.
    let dir2 = tempfile::tempdir().unwrap();
    let cfg2 = config(dir2.path(), "beta = 0.04");
    let (s2, w2) = run(&cfg2, &RunOptions::default());
    for step in 0..3 {
        for key in ["loss", "reward", "kl", "grad_norm"] {
            assert_eq!(
                metric(&s, step, key),
                metric(&s2, step, key),
                "{key} step {step}"
            );
        }
    }
    assert_same_bits(&w, &w2, "same seed");
}

#[test]
fn batch_times_accumulation_is_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let a = config(dir.path(), "loss_type = \"grpo\"\nbeta = 0.04");
    let (sa, wa) = run(&a, &RunOptions::default());
    let dir2 = tempfile::tempdir().unwrap();
    let b = config(
        dir2.path(),
        "loss_type = \"grpo\"\nbeta = 0.04\nper_device_train_batch_size = 4\ngradient_accumulation_steps = 2",
    );
    let (sb, wb) = run(&b, &RunOptions::default());
    for step in 0..3 {
        assert_eq!(metric(&sa, step, "reward"), metric(&sb, step, "reward"));
        let (la, lb) = (metric(&sa, step, "loss"), metric(&sb, step, "loss"));
        assert!((la - lb).abs() < 1e-5, "step {step}: loss {la} vs {lb}");
    }
    let d = max_diff(&wa, &wb);
    assert!(d < 1e-4, "weights differ by {d}");
}

#[test]
fn resume_equals_uninterrupted() {
    let extra = "max_steps = 4\nnum_iterations = 2\nbeta = 0.04\nsave_steps = 2";
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), extra);
    let (full, w_full) = run(&cfg, &RunOptions::default());
    let dir2 = tempfile::tempdir().unwrap();
    let cfg2 = config(dir2.path(), extra);
    let stop = RunOptions {
        stop_after: Some(2),
        ..Default::default()
    };
    let (part, _) = run(&cfg2, &stop);
    assert_eq!(part.global_step, 2);
    let (rest, w_rest) = run(
        &cfg2,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    );
    assert_eq!(rest.global_step, 4);
    assert_same_bits(&w_full, &w_rest, "resume");
    assert_eq!(metric(&full, 3, "loss"), metric(&rest, 1, "loss"));
    let lines = std::fs::read_to_string(cfg2.args.output_dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("loss").is_some())
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4]);
}

#[test]
fn lora_with_kl_trains_adapters_only() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "use_peft = true\nbeta = 0.1\nlearning_rate = 1e-2\n[lora]\nr = 4\nlora_alpha = 8\ntarget_modules = [\"q_proj\", \"v_proj\"]",
    );
    let (s, w) = run(&cfg, &RunOptions::default());
    assert!(
        w.iter().all(|(n, _)| n.contains("lora_")),
        "{:?}",
        w.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    // Step 1 starts at the base model: KL exactly 0; later steps drift.
    assert_eq!(metric(&s, 0, "kl"), 0.0);
    assert!(metric(&s, 2, "kl") > 0.0);
    assert!(cfg
        .args
        .output_dir
        .join("adapter/adapter_config.json")
        .exists());
}

#[test]
fn bad_inputs_fail_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: OnlineConfig = config(dir.path(), "");
    // A reward reading a column the data lacks.
    let text = format!(
        "model = \"{}\"\ndataset = \"{}\"\n[[rewards]]\ntype = \"boxed_accuracy\"\nanswer_field = \"solution\"\n",
        cfg.args.model,
        cfg.args.dataset.display()
    );
    let bad = OnlineConfig::from_table(text.parse().unwrap(), "t").unwrap();
    let e = prepare(&bad, Path::new(&bad.args.model), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("solution"), "{e}");
    // An external reward that prints garbage, or crashes: the error names the reward.
    for (script, expect) in [
        ("while read l; do echo garbage; done", "garbage"),
        ("read l; exit 3", "exit"),
    ] {
        let text = format!(
            "model = \"{}\"\ndataset = \"{}\"\n[[rewards]]\ntype = \"command\"\nname = \"ext\"\ncommand = [\"sh\", \"-c\", \"{script}\"]\ntimeout_s = 5\n",
            cfg.args.model,
            cfg.args.dataset.display()
        );
        let bad = OnlineConfig::from_table(text.parse().unwrap(), "t").unwrap();
        let e = prepare(&bad, Path::new(&bad.args.model), &Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ext") && e.contains(expect), "{e}");
    }
    // The prompt column is missing.
    cfg.rollout.prompt_column = "question".into();
    let e = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("prompt_column"), "{e}");
}

#[test]
fn shared_prompt_pass_equals_plain_rows() {
    let extra = "beta = 0.04\nnum_iterations = 2";
    let dir = tempfile::tempdir().unwrap();
    let (a, wa) = run(&config(dir.path(), extra), &RunOptions::default());
    let dir2 = tempfile::tempdir().unwrap();
    let plain = format!("{extra}\nshare_prompts = false");
    let (b, wb) = run(&config(dir2.path(), &plain), &RunOptions::default());
    for step in 0..3 {
        for key in ["loss", "kl", "grad_norm"] {
            let (x, y) = (metric(&a, step, key), metric(&b, step, key));
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "{key} step {step}: {x} vs {y}"
            );
        }
    }
    let d = max_diff(&wa, &wb);
    assert!(d < 1e-4, "weights differ by {d}");
}

#[test]
fn gradient_checkpointing_equals_keeping_activations() {
    // Shared prompt stream and plain rows; full fine-tuning with a KL term.
    for extra in ["beta = 0.04", "beta = 0.04\nshare_prompts = false"] {
        let dir = tempfile::tempdir().unwrap();
        let (a, wa) = run(&config(dir.path(), extra), &RunOptions::default());
        let dir2 = tempfile::tempdir().unwrap();
        let ckpt = format!("{extra}\ngradient_checkpointing = true");
        let (b, wb) = run(&config(dir2.path(), &ckpt), &RunOptions::default());
        for step in 0..3 {
            for key in ["loss", "kl", "grad_norm"] {
                let (x, y) = (metric(&b, step, key), metric(&a, step, key));
                assert!(
                    (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "{extra}: {key} step {step}: {x} vs {y}"
                );
            }
        }
        let d = max_diff(&wa, &wb);
        assert!(d < 1e-4, "{extra}: weights differ by {d}");
    }
}

#[test]
fn bf16_weights_train_with_f32_loss_maths() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "bf16 = true\nbeta = 0.04");
    let (s, w) = run(&cfg, &RunOptions::default());
    assert_eq!(s.global_step, 3);
    for key in ["loss", "kl", "grad_norm", "reward"] {
        assert!(metric(&s, 2, key).is_finite(), "{key}");
    }
    assert!(w.iter().all(|(_, v)| v.iter().all(|x| x.is_finite())));
}

#[test]
fn trl_colocate_default_trains_in_process() {
    // TRL's `use_vllm = true` with its default `vllm_mode = "colocate"`: rlft's in-process
    // rollout, the same run as `use_vllm = false`, whatever the server keys say.
    let dir = tempfile::tempdir().unwrap();
    let (s, w) = run(&config(dir.path(), ""), &RunOptions::default());
    let dir2 = tempfile::tempdir().unwrap();
    let colocated: OnlineConfig = config(
        dir2.path(),
        "use_vllm = true\nvllm_server_base_url = \"http://127.0.0.1:9\"",
    );
    assert!(!colocated.servers.on_servers());
    let (s2, w2) = run(&colocated, &RunOptions::default());
    for step in 0..3 {
        assert_eq!(metric(&s, step, "loss"), metric(&s2, step, "loss"));
    }
    assert_same_bits(&w, &w2, "colocate = in process");
}
