//! `rlft online-dpo` on a tiny random model: the loss at the first step is the DPO loss of a
//! policy equal to its reference, same seed same metrics, batch x accumulation invariance,
//! exact resume, TRL's metric names.

mod common;

use std::path::Path;

use common::assert_same_bits;
use common::online::{max_diff, metric, parse_with, tiny_run_toml};
use common::train::{assert_resumes_exactly, run};
use rlft::config::online_dpo::OnlineDpoConfig;
use rlft::run::RunOptions;

/// The tiny online run ([`tiny_run_toml`]) as Online DPO: pairs of 8-token completions, 4
/// prompts per step, a letter reward; `extra` overrides the base keys.
fn config(dir: &Path, extra: &str) -> OnlineDpoConfig {
    let base = format!(
        "{}max_length = 72\nmax_new_tokens = 8\nper_device_train_batch_size = 4\n\
         gradient_accumulation_steps = 1\nlogging_steps = 1\n\n[[rewards]]\n\
         type = \"regex_format\"\nname = \"letter\"\npattern = \"[a-z]\"\n",
        tiny_run_toml(dir)
    );
    parse_with(&base, extra)
}

#[test]
fn first_step_is_the_dpo_loss_at_the_reference_and_runs_repeat() {
    for (loss_type, at_reference) in [("sigmoid", std::f64::consts::LN_2), ("ipo", 25.0)] {
        let extra = format!("loss_type = \"{loss_type}\"\nbeta = 0.1");
        let [d1, d2] = common::tempdirs();
        let (sa, wa) = run(&config(d1.path(), &extra), &RunOptions::default());
        let (sb, wb) = run(&config(d2.path(), &extra), &RunOptions::default());
        // Full fine-tuning: before the first update the policy is its reference, so every
        // pair's log-ratio difference is 0: sigmoid gives ln 2, IPO (0 - 1/(2 beta))^2 = 25.
        let l0 = metric(&sa, 0, "loss");
        assert!((l0 - at_reference).abs() < 1e-4, "{loss_type}: loss {l0}");
        assert!(metric(&sa, 0, "rewards/chosen").abs() < 1e-6);
        assert!(metric(&sa, 0, "objective/kl").abs() < 1e-4);
        assert!(
            metric(&sa, 0, "grad_norm") > 0.0,
            "{loss_type}: no gradient"
        );
        for step in 0..3 {
            for key in [
                "loss",
                "reward",
                "objective/scores_margin",
                "rewards/margins",
                "logps/chosen",
            ] {
                assert_eq!(metric(&sa, step, key), metric(&sb, step, key), "{key}");
            }
            // The chosen completion never scores below the rejected one.
            assert!(metric(&sa, step, "objective/scores_margin") >= 0.0);
            assert_eq!(metric(&sa, step, "beta"), 0.1);
        }
        // After two updates the policy has moved from the reference.
        assert!(metric(&sa, 2, "objective/kl").abs() > 0.0, "{loss_type}");
        assert_same_bits(&wa, &wb, loss_type);
    }
}

#[test]
fn split_invariant_and_resumes_exactly() {
    let [d1, d2] = common::tempdirs();
    let a = config(d1.path(), "");
    let b = config(
        d2.path(),
        "per_device_train_batch_size = 2\ngradient_accumulation_steps = 2",
    );
    let (sa, wa) = run(&a, &RunOptions::default());
    let (sb, wb) = run(&b, &RunOptions::default());
    for step in 0..3 {
        let (la, lb) = (metric(&sa, step, "loss"), metric(&sb, step, "loss"));
        assert!((la - lb).abs() < 1e-5, "step {step}: loss {la} vs {lb}");
    }
    // One batch of 4 and two micro-batches of 2 sum the gradients in different orders, and
    // the kernels' order also depends on the CPU's SIMD width. Adam turns that rounding into
    // a visible update for elements whose gradient is near `adam_epsilon` (a relative
    // difference there moves the weight by a fraction of `learning_rate` = 3e-3; 1.1e-4 seen
    // on an AVX-512 host). A split that lost or mixed up a micro-batch would change the
    // update's direction, moving weights by up to a learning rate.
    let d = max_diff(&wa, &wb);
    assert!(d < 3e-4, "weights differ by {d}");

    let more = "max_steps = 4\nsave_steps = 2\nuse_peft = true\nbeta = [0.2, 0.05]";
    let [d3, d4] = common::tempdirs();
    let part = config(d4.path(), more);
    let (sf, _, sr) = assert_resumes_exactly(&config(d3.path(), more), &part, 2, "resume");
    assert_eq!(metric(&sf, 3, "loss"), metric(&sr, 1, "loss"));
    // 16 prompts, 4 per step: steps 0-3 are epoch 0 (beta 0.2) and the list's first value.
    assert_eq!(metric(&sf, 0, "beta"), 0.2);
    common::assert_adapter_exported(&part.args.output_dir);
}

#[test]
fn beta_follows_the_epoch() {
    // 16 prompts at 8 per step: two steps per epoch.
    let d = tempfile::tempdir().unwrap();
    let c = config(
        d.path(),
        "per_device_train_batch_size = 8\nmax_steps = 4\nbeta = [0.3, 0.1]",
    );
    let (s, _) = run(&c, &RunOptions::default());
    let betas: Vec<f64> = (0..4).map(|i| metric(&s, i, "beta")).collect();
    assert_eq!(betas, vec![0.3, 0.3, 0.1, 0.1]);
}

#[test]
fn same_seed_runs_at_the_same_time_agree() {
    // Runs in one process share rayon's workers, the allocator and every process-wide switch:
    // three same-seed runs at once (full fine-tuning, a frozen reference, IPO's large
    // gradients, clipped) must still give the same bits, whichever worker ran which task.
    let extra = "loss_type = \"ipo\"\nbeta = 0.1\nmax_steps = 4";
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let cfgs: Vec<_> = dirs.iter().map(|d| config(d.path(), extra)).collect();
    let outs: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = cfgs
            .iter()
            .map(|c| s.spawn(move || run(c, &RunOptions::default())))
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (s, w)) in outs.iter().enumerate().skip(1) {
        for step in 0..4 {
            assert_eq!(metric(&outs[0].0, step, "loss"), metric(s, step, "loss"));
        }
        assert_same_bits(&outs[0].1, w, &format!("run {i}"));
    }
}
