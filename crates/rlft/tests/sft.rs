//! SFT end to end on a tiny random model: it learns, resume equals an uninterrupted run,
//! batch 8 x accumulation 1 equals batch 1 x accumulation 8, LoRA trains only adapters.

mod common;

use std::path::Path;

use candle_core::Device;
use rlft::config::sft::SftConfig;
use rlft::config::{LrSchedulerType, ReportTo, TrainingArgs};
use rlft::run::RunOptions;
use rlft::sft::{prepare, train};
use rlft_model::config::Family;
use rlft_model::tiny::{save_tiny_hf_dir, tiny_config};

fn setup(dir: &Path) -> SftConfig {
    let model = dir.join("model");
    save_tiny_hf_dir(tiny_config(Family::Qwen2), 1, &model).unwrap();
    let data = dir.join("data.jsonl");
    common::write_sums(&data, 40, "completion");
    SftConfig {
        args: TrainingArgs {
            model: model.display().to_string(),
            output_dir: dir.join("out"),
            dataset: data,
            learning_rate: 3e-3,
            lr_scheduler_type: LrSchedulerType::Constant,
            per_device_train_batch_size: 4,
            max_steps: 12,
            logging_steps: 1,
            report_to: vec![ReportTo::Jsonl],
            ..SftConfig::default().args
        },
        eval_size: 8.0,
        max_length: 32,
        ..Default::default()
    }
}

fn run(cfg: &SftConfig, opts: &RunOptions) -> (rlft::run::RunSummary, Vec<(String, Vec<f32>)>) {
    let mut p = prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let s = train(cfg, &mut p, opts).unwrap();
    let w = common::weights(&p.policy);
    (s, w)
}

#[test]
fn sft_learns_and_writes_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path());
    let (s, _) = run(&cfg, &RunOptions::default());
    let (first, last) = (
        s.initial_metric("eval_loss").unwrap(),
        s.final_metric("eval_loss").unwrap(),
    );
    assert!(last < first * 0.8, "eval loss {first} -> {last}");
    assert_eq!(s.global_step, 12);
    let out = &cfg.args.output_dir;
    assert!(out.join("metrics.jsonl").exists());
    assert!(out.join("final/model.safetensors").exists());
    assert!(out.join("checkpoint-12/trainer_state.json").exists());
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert!(lines.lines().count() >= 12);
}

#[test]
fn same_seed_repeats_and_resume_equals_uninterrupted() {
    let a = tempfile::tempdir().unwrap();
    let cfg_a = setup(a.path());
    let (_, full) = run(&cfg_a, &RunOptions::default());
    // Same seed, fresh directory: the same bits.
    let again = tempfile::tempdir().unwrap();
    let (_, twice) = run(&setup(again.path()), &RunOptions::default());
    common::assert_same_bits(&full, &twice, "same seed");
    let b = tempfile::tempdir().unwrap();
    let cfg_b = setup(b.path());
    let (s1, _) = run(
        &cfg_b,
        &RunOptions {
            stop_after: Some(5),
            ..Default::default()
        },
    );
    assert_eq!(s1.global_step, 5);
    let (s2, resumed) = run(
        &cfg_b,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    );
    assert_eq!(s2.global_step, 12);
    common::assert_same_bits(&full, &resumed, "resume");
}

#[test]
fn batch_times_accumulation_is_invariant() {
    let a = tempfile::tempdir().unwrap();
    let mut cfg_a = setup(a.path());
    cfg_a.args.max_steps = 3;
    cfg_a.args.per_device_train_batch_size = 8;
    // Adam's first step moves a weight by lr * g / (|g| + eps): for the few elements whose
    // gradient is near eps (1e-8 by default) that ratio turns the rounding differences of a
    // different summation order into visible updates (2 of 4096 q_proj elements moved 7e-5
    // apart at eps 1e-8). An eps well above f32 rounding of the gradients, still below their
    // typical size, compares the gradients themselves through the updated weights.
    cfg_a.args.adam_epsilon = 1e-6;
    let (sa, wa) = run(&cfg_a, &RunOptions::default());
    let b = tempfile::tempdir().unwrap();
    let mut cfg_b = setup(b.path());
    cfg_b.args.max_steps = 3;
    cfg_b.args.per_device_train_batch_size = 1;
    cfg_b.args.gradient_accumulation_steps = 8;
    cfg_b.args.adam_epsilon = 1e-6;
    let (sb, wb) = run(&cfg_b, &RunOptions::default());
    for (x, y) in sa.step_values("loss").iter().zip(&sb.step_values("loss")) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
    // Weights agree to 1e-5, except the k_proj bias: its gradient is mathematically zero
    // (softmax ignores a per-query constant), so what it gets is rounding noise, and Adam
    // normalises noise into updates of up to ~lr * g / (|g| + eps), of either sign. Any change
    // in summation order (kernels, batch split) moves it, so the only sound bound is Adam's
    // step bound: at most 2 * lr apart per step.
    let tol = 2.0 * cfg_a.args.max_steps as f32 * cfg_a.args.learning_rate as f32;
    assert_same_weights(&wa, &wb, tol, "batch x accumulation");
}

/// Weights within 1e-5, k_proj biases within `bias_tol` (their gradient is rounding noise: see
/// `batch_times_accumulation_is_invariant`).
fn assert_same_weights(
    wa: &[(String, Vec<f32>)],
    wb: &[(String, Vec<f32>)],
    bias_tol: f32,
    what: &str,
) {
    for ((n, x), (_, y)) in wa.iter().zip(wb) {
        let d = x
            .iter()
            .zip(y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let limit = if n.contains("k_proj.bias") {
            bias_tol
        } else {
            1e-5
        };
        assert!(d < limit, "{what}: {n}: {d}");
    }
}

#[test]
fn lora_trains_adapters_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    cfg.args.use_peft = true;
    cfg.args.lora.r = 4;
    cfg.args.learning_rate = 1e-2;
    let (s, w) = run(&cfg, &RunOptions::default());
    assert!(
        w.iter().all(|(n, _)| n.contains("lora_")),
        "{:?}",
        w.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    assert!(s.final_metric("eval_loss").unwrap() < s.initial_metric("eval_loss").unwrap());
    assert!(cfg
        .args
        .output_dir
        .join("adapter/adapter_config.json")
        .exists());
    assert!(cfg.args.output_dir.join("final/model.safetensors").exists());
}

#[test]
fn gradient_checkpointing_equals_keeping_activations() {
    // Full fine-tuning, and LoRA with dropout (the recomputation must replay the masks).
    for lora in [false, true] {
        let cfg = |dir: &Path, ckpt: bool| {
            let mut cfg = setup(dir);
            cfg.args.max_steps = 3;
            cfg.args.gradient_checkpointing = ckpt;
            if lora {
                cfg.args.use_peft = true;
                cfg.args.lora.r = 4;
                cfg.args.lora.lora_dropout = 0.1;
            }
            cfg
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (cfg_a, cfg_b) = (cfg(a.path(), false), cfg(b.path(), true));
        let (sa, wa) = run(&cfg_a, &RunOptions::default());
        let (sb, wb) = run(&cfg_b, &RunOptions::default());
        for (x, y) in sa.step_values("loss").iter().zip(&sb.step_values("loss")) {
            assert!((x - y).abs() < 1e-5, "lora {lora}: {x} vs {y}");
        }
        let tol = 2.0 * 3.0 * cfg_a.args.learning_rate as f32;
        assert_same_weights(&wa, &wb, tol, &format!("checkpointing, lora {lora}"));
    }
}

#[test]
fn lora_with_dropout_resumes_exactly() {
    let lora = |dir: &Path| {
        let mut cfg = setup(dir);
        cfg.args.use_peft = true;
        cfg.args.lora.r = 4;
        cfg.args.lora.lora_dropout = 0.1;
        cfg.args.max_steps = 6;
        cfg
    };
    let a = tempfile::tempdir().unwrap();
    let (_, full) = run(&lora(a.path()), &RunOptions::default());
    let b = tempfile::tempdir().unwrap();
    let cfg_b = lora(b.path());
    run(
        &cfg_b,
        &RunOptions {
            stop_after: Some(2),
            ..Default::default()
        },
    );
    let (_, resumed) = run(
        &cfg_b,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    );
    common::assert_same_bits(&full, &resumed, "resume");
}

#[test]
fn bad_data_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    std::fs::write(
        &cfg.args.dataset,
        "{\"question\": \"x\", \"answer\": \"y\"}\n",
    )
    .unwrap();
    cfg.eval_size = 0.0;
    let e = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("question") && e.contains("completion"), "{e}");
    std::fs::write(&cfg.args.dataset, "").unwrap();
    let e = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn non_finite_loss_skips_the_step_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    cfg.args.max_steps = 3;
    let mut p = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    // Poison one weight: every forward gives a NaN loss.
    let (name, var) = p
        .policy
        .vars
        .iter()
        .find(|(n, _)| n.contains("embed_tokens"))
        .unwrap()
        .clone();
    let poisoned = (var.as_tensor() * f64::NAN).unwrap();
    var.set(&poisoned).unwrap();
    let before: Vec<Vec<f32>> = p
        .policy
        .vars
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let s = train(&cfg, &mut p, &RunOptions::default()).unwrap();
    assert_eq!(s.global_step, 3, "the run goes on");
    assert_eq!(
        s.skipped_steps, 3,
        "every step is skipped and counted ({name})"
    );
    let after: Vec<Vec<f32>> = p
        .policy
        .vars
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    // No update was applied: every weight is what it was (NaN stays NaN, bit for bit).
    for (a, b) in before.iter().zip(&after) {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    let log = std::fs::read_to_string(cfg.args.output_dir.join("metrics.jsonl")).unwrap();
    assert!(log.contains("\"skipped_steps\":3"), "{log}");
}
