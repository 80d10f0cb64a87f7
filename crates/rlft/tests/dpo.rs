//! DPO end to end on a tiny random model: the loss falls and the implicit rewards separate,
//! same seed same metrics, resume equals an uninterrupted run, batch x accumulation is
//! invariant, the shared prompt pass equals the plain rows, LoRA trains adapters only against
//! the base with adapters off, precomputed reference log-probs equal the per-step ones, bad rows
//! and too-long prompts name themselves and the fix.

mod common;

use std::path::Path;

use candle_core::Device;
use common::assert_same_weights;
use common::train::{
    assert_resumes_exactly, batch_and_split, preference_config, run, timeless, use_lora_r4,
};
use rlft::config::dpo::{DpoConfig, TruncationMode};
use rlft::dpo::{pair_logps, prepare, train};
use rlft::rollout::{completion_logprobs, token_batch};
use rlft::run::RunOptions;

/// 48 sum preferences on the tiny model: 12 steps of batch 4 at 1e-3, 16 pairs held out.
fn setup(dir: &Path) -> DpoConfig {
    preference_config(dir, "1e-3")
}

#[test]
fn dpo_loss_falls_and_rewards_separate() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    cfg.args.max_steps = 24;
    let (s, _) = run(&cfg, &RunOptions::default());
    let (first, last) = (
        s.initial_metric("eval_loss").unwrap(),
        s.final_metric("eval_loss").unwrap(),
    );
    // At the start the policy is the reference: every pair's loss is log 2.
    assert!((first - std::f64::consts::LN_2).abs() < 1e-4, "{first}");
    assert!(last < first - 0.05, "eval loss {first} -> {last}");
    assert!(s.final_metric("eval_rewards/margins").unwrap() > 0.0);
    for key in [
        "rewards/chosen",
        "rewards/rejected",
        "rewards/accuracies",
        "rewards/margins",
        "logps/chosen",
        "logps/rejected",
    ] {
        assert_eq!(s.step_values(key).len(), 24, "{key}");
    }
    let l = s.step_values("loss");
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(mean(&l[18..]) < mean(&l[..6]), "{l:?}");
    assert!(cfg.args.output_dir.join("final/config.json").exists());
}

#[test]
fn same_seed_same_metrics_and_resume_equals_uninterrupted() {
    let [a, b, c] = common::tempdirs();
    let (sa, wa, sc) = assert_resumes_exactly(&setup(a.path()), &setup(c.path()), 5, "resume");
    assert_eq!(timeless(&sc), timeless(&sa)[5..]);
    let (sb, wb) = run(&setup(b.path()), &RunOptions::default());
    assert_eq!(timeless(&sa), timeless(&sb));
    common::assert_same_bits(&wa, &wb, "same seed");
}

#[test]
fn batch_times_accumulation_is_invariant_and_precompute_equals_per_step() {
    let [a, b, c] = common::tempdirs();
    let (cfg_a, cfg_b) = batch_and_split(setup(a.path()), b.path());
    let mut cfg_c = cfg_a.clone();
    cfg_c.args.output_dir = c.path().join("out");
    cfg_c.precompute_ref_log_probs = true;
    cfg_c.precompute_ref_batch_size = 7;
    let (sa, wa) = run(&cfg_a, &RunOptions::default());
    let (sb, wb) = run(&cfg_b, &RunOptions::default());
    let (sc, wc) = run(&cfg_c, &RunOptions::default());
    for key in [
        "loss",
        "rewards/margins",
        "rewards/chosen",
        "logps/rejected",
    ] {
        for other in [&sb, &sc] {
            for (x, y) in sa.step_values(key).iter().zip(&other.step_values(key)) {
                assert!((x - y).abs() < 1e-5 * (1.0 + x.abs()), "{key}: {x} vs {y}");
            }
        }
    }
    let tol = 2.0 * 3.0 * cfg_a.args.learning_rate as f32;
    assert_same_weights(&wa, &wb, tol, "batch x accumulation");
    assert_eq!(wa.len(), wc.len());
}

#[test]
fn the_shared_prompt_pass_equals_plain_rows() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = setup(dir.path());
    let p = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let pairs: Vec<_> = p.train.iter().take(5).collect();
    let m = &p.policy.model;
    let shared = pair_logps(m, &pairs, p.policy.pad_id, false).unwrap();
    let prompts: Vec<&[u32]> = pairs.iter().map(|x| &x.prompt_ids[..]).collect();
    let side = |c: Vec<&[u32]>| -> Vec<f32> {
        let tb = token_batch(&prompts, &c, p.policy.pad_id, &Device::Cpu).unwrap();
        let (lp, _) = completion_logprobs(m, &tb, false, false, 1.0).unwrap();
        (lp * &tb.mask).unwrap().sum(1).unwrap().to_vec1().unwrap()
    };
    let chosen = side(pairs.iter().map(|x| &x.chosen_ids[..]).collect());
    let rejected = side(pairs.iter().map(|x| &x.rejected_ids[..]).collect());
    let got: Vec<f32> = shared.chosen.to_vec1().unwrap();
    let got_r: Vec<f32> = shared.rejected.to_vec1().unwrap();
    for (g, w) in got.iter().chain(&got_r).zip(chosen.iter().chain(&rejected)) {
        assert!((g - w).abs() < 1e-4, "{g} vs {w}");
    }
    // Prompt tokens are counted once per pair.
    let plain: usize = pairs.iter().map(|x| x.tokens()).sum();
    assert!(shared.tokens <= plain, "{} > {plain}", shared.tokens);
}

#[test]
fn lora_trains_adapters_against_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    use_lora_r4(&mut cfg.args);
    cfg.args.lora.lora_alpha = 8.0;
    cfg.args.learning_rate = 3e-3;
    cfg.args.max_steps = 16;
    cfg.loss_type = vec!["ipo".parse().unwrap(), "apo_zero".parse().unwrap()];
    cfg.loss_weights = Some(vec![1.0, 0.5]);
    let (s, w) = run(&cfg, &RunOptions::default());
    common::assert_lora_only(&w);
    let l = s.step_values("loss");
    assert!(l.iter().all(|x| x.is_finite()));
    // The first step's policy is the base (B = 0): rewards are 0.
    assert!(s.step_values("rewards/chosen")[0].abs() < 1e-6);
    assert!(s.final_metric("eval_loss").unwrap() < s.initial_metric("eval_loss").unwrap());
    common::assert_adapter_exported(&cfg.args.output_dir);
}

fn prepare_err(cfg: &DpoConfig) -> String {
    match prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_rows_and_long_prompts_name_the_row_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = setup(dir.path());
    cfg.eval_size = 0.0;
    let write = |rows: &str| std::fs::write(&cfg.args.dataset, rows).unwrap();
    write(
        "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n\
         {\"prompt\": \"1+2=\", \"rejected\": \"4\"}\n",
    );
    let e = prepare_err(&cfg);
    assert!(e.contains("row 1") && e.contains("missing `chosen`"), "{e}");
    write(
        "{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}\n\
         {\"prompt\": \"1+2=\", \"chosen\": \"3\", \"rejected\": \"3\"}\n",
    );
    let e = prepare_err(&cfg);
    assert!(e.contains("row 1") && e.contains("identical"), "{e}");
    let long = "1+".repeat(40) + "1=";
    write(&format!(
        "{{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"3\"}}\n\
         {{\"prompt\": \"{long}\", \"chosen\": \"41\", \"rejected\": \"40\"}}\n"
    ));
    cfg.max_length = 16;
    let e = prepare_err(&cfg);
    assert!(
        e.contains("row 1") && e.contains("max_length = 16") && e.contains("max_prompt_length"),
        "{e}"
    );
    // The fix named: max_prompt_length keeps the prompt's end, and the run trains.
    cfg.max_prompt_length = 8;
    cfg.args.max_steps = 1;
    cfg.args.per_device_train_batch_size = 2;
    let mut p = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let last = &p.train[1];
    assert_eq!(last.prompt_ids.len(), 8);
    assert!(last.prompt_ids.len() + last.chosen_ids.len() <= 16);
    train(&cfg, &mut p, &RunOptions::default()).unwrap();
    // keep_end cuts the prompt's start instead and needs no max_prompt_length.
    cfg.max_prompt_length = 0;
    cfg.truncation_mode = TruncationMode::KeepEnd;
    let p = prepare(&cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let last = &p.train[1];
    assert_eq!(last.prompt_ids.len() + last.chosen_ids.len(), 16);
}
