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
use common::online::{assert_finite_metrics, assert_same_run, config, max_diff, metric, run};
use common::train::assert_resumes_exactly;

#[test]
fn smoke_run_writes_everything_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "beta = 0.04");
    let (s, w) = run(&cfg, &RunOptions::default());
    assert_eq!(s.global_step, 3);
    assert_eq!(s.steps.len(), 3);
    let keys = [
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
    ];
    assert_finite_metrics(&s, 0, &keys, "smoke");
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
    let [dir, dir2] = common::tempdirs();
    let cfg2: OnlineConfig = config(dir2.path(), extra);
    let (full, _, rest) = assert_resumes_exactly(
        &config::<OnlineConfig>(dir.path(), extra),
        &cfg2,
        2,
        "resume",
    );
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
    common::assert_lora_only(&w);
    // Step 1 starts at the base model: KL exactly 0; later steps drift.
    assert_eq!(metric(&s, 0, "kl"), 0.0);
    assert!(metric(&s, 2, "kl") > 0.0);
    common::assert_adapter_exported(&cfg.args.output_dir);
}

/// `prepare`'s error for `cfg` (it must fail).
fn prepare_err(cfg: &OnlineConfig) -> String {
    prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu)
        .err()
        .unwrap()
        .to_string()
}

#[test]
fn bad_inputs_fail_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg: OnlineConfig = config(dir.path(), "");
    // The tiny run with one reward (a TOML `[[rewards]]` table's keys).
    let with_reward = |reward: &str| -> OnlineConfig {
        let text = format!(
            "model = \"{}\"\ndataset = \"{}\"\n[[rewards]]\n{reward}\n",
            cfg.args.model,
            cfg.args.dataset.display()
        );
        OnlineConfig::from_table(text.parse().unwrap(), "t").unwrap()
    };
    let external = |script: &str| {
        format!("type = \"command\"\nname = \"ext\"\ncommand = [\"sh\", \"-c\", \"{script}\"]\ntimeout_s = 5")
    };
    // A reward reading a column the data lacks; an external reward that prints garbage, or
    // crashes: the error names the column or the reward.
    for (reward, expect) in [
        (
            "type = \"boxed_accuracy\"\nanswer_field = \"solution\"".to_string(),
            &["solution"][..],
        ),
        (
            external("while read l; do echo garbage; done"),
            &["ext", "garbage"],
        ),
        (external("read l; exit 3"), &["ext", "exit"]),
    ] {
        let e = prepare_err(&with_reward(&reward));
        assert!(expect.iter().all(|x| e.contains(x)), "{e}");
    }
    // The prompt column is missing.
    cfg.rollout.prompt_column = "question".into();
    let e = prepare_err(&cfg);
    assert!(e.contains("prompt_column"), "{e}");
}

#[test]
fn shared_prompt_pass_equals_plain_rows() {
    let extra = "beta = 0.04\nnum_iterations = 2";
    let plain = format!("{extra}\nshare_prompts = false");
    assert_same_run(&plain, extra, "shared prompt pass");
}

#[test]
fn gradient_checkpointing_equals_keeping_activations() {
    // Shared prompt stream and plain rows; full fine-tuning with a KL term.
    for extra in ["beta = 0.04", "beta = 0.04\nshare_prompts = false"] {
        let ckpt = format!("{extra}\ngradient_checkpointing = true");
        assert_same_run(extra, &ckpt, extra);
    }
}

#[test]
fn bf16_weights_train_with_f32_loss_maths() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "bf16 = true\nbeta = 0.04");
    let (s, w) = run(&cfg, &RunOptions::default());
    assert_eq!(s.global_step, 3);
    assert_finite_metrics(&s, 2, &["loss", "kl", "grad_norm", "reward"], "bf16");
    assert!(w.iter().all(|(_, v)| v.iter().all(|x| x.is_finite())));
}

/// AdamW's state of bf16 weights (`optim`): the split master trains to the f32 master's weights
/// bit for bit, and each mode resumes exactly from its checkpoint.
#[test]
fn optim_modes_of_bf16_weights() {
    let base = "bf16 = true\nmax_steps = 4\nsave_steps = 2";
    let dir = tempfile::tempdir().unwrap();
    let (_, w_master) = run(&config(dir.path(), base), &RunOptions::default());
    for optim in ["adamw_exact", "adamw_torch"] {
        let extra = format!("{base}\noptim = \"{optim}\"");
        let [a, b] = common::tempdirs();
        let full: OnlineConfig = config(a.path(), &extra);
        let (_, w, _) = assert_resumes_exactly(&full, &config(b.path(), &extra), 2, optim);
        if optim == "adamw_exact" {
            assert_same_bits(&w_master, &w, "adamw_exact = adamw_f32_master");
        }
        assert!(
            w.iter().all(|(_, v)| v.iter().all(|x| x.is_finite())),
            "{optim}"
        );
    }
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
