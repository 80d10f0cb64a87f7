//! SFT end to end on a tiny random model: it learns, resume equals an uninterrupted run,
//! batch 8 x accumulation 1 equals batch 1 x accumulation 8, LoRA trains only adapters.

mod common;

use std::path::Path;

use candle_core::Device;
use common::train::{assert_resumes_exactly, batch_and_split, offline_config, run, use_lora_r4};
use common::{assert_same_bits, assert_same_weights, weights};
use rlft::config::sft::SftConfig;
use rlft::run::RunOptions;
use rlft::sft::{prepare, train};

/// 40 sums on the tiny model: 12 steps of batch 4 at 3e-3, 8 rows held out.
fn setup(dir: &Path) -> SftConfig {
    let data = dir.join("data.jsonl");
    common::write_sums(&data, 40, "completion");
    offline_config(
        dir,
        &data,
        "learning_rate = 3e-3\neval_size = 8.0\nmax_length = 32",
    )
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
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, full, _) = assert_resumes_exactly(&setup(a.path()), &setup(b.path()), 5, "resume");
    // Same seed, fresh directory: the same bits.
    let again = tempfile::tempdir().unwrap();
    let (_, twice) = run(&setup(again.path()), &RunOptions::default());
    assert_same_bits(&full, &twice, "same seed");
}

#[test]
fn batch_times_accumulation_is_invariant() {
    // Batch 8 x accumulation 1 and batch 1 x accumulation 8.
    let [a, b] = common::tempdirs();
    let mut cfg = setup(a.path());
    cfg.args.per_device_train_batch_size = 8;
    let (cfg_a, cfg_b) = batch_and_split(cfg, b.path());
    let (sa, wa) = run(&cfg_a, &RunOptions::default());
    let (sb, wb) = run(&cfg_b, &RunOptions::default());
    for (x, y) in sa.step_values("loss").iter().zip(&sb.step_values("loss")) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
    // Weights agree to 1e-5, except the k_proj bias (rounding noise: see
    // `common::assert_same_weights`): at most 2 * lr apart per step.
    let tol = 2.0 * cfg_a.args.max_steps as f32 * cfg_a.args.learning_rate as f32;
    assert_same_weights(&wa, &wb, tol, "batch x accumulation");
}

#[test]
fn lora_trains_adapters_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    use_lora_r4(&mut cfg.args);
    cfg.args.learning_rate = 1e-2;
    let (s, w) = run(&cfg, &RunOptions::default());
    common::assert_lora_only(&w);
    assert!(s.final_metric("eval_loss").unwrap() < s.initial_metric("eval_loss").unwrap());
    common::assert_adapter_exported(&cfg.args.output_dir);
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
                use_lora_r4(&mut cfg.args);
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
        use_lora_r4(&mut cfg.args);
        cfg.args.lora.lora_dropout = 0.1;
        cfg.args.max_steps = 6;
        cfg
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    assert_resumes_exactly(&lora(a.path()), &lora(b.path()), 2, "resume");
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
    let before = weights(&p.policy);
    let s = train(&cfg, &mut p, &RunOptions::default()).unwrap();
    assert_eq!(s.global_step, 3, "the run goes on");
    assert_eq!(
        s.skipped_steps, 3,
        "every step is skipped and counted ({name})"
    );
    // No update was applied: every weight is what it was (NaN stays NaN, bit for bit).
    assert_same_bits(&before, &weights(&p.policy), "skipped steps");
    let log = std::fs::read_to_string(cfg.args.output_dir.join("metrics.jsonl")).unwrap();
    assert!(log.contains("\"skipped_steps\":3"), "{log}");
}
