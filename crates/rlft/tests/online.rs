//! The online family on a tiny random model: RLOO, REINFORCE++, REINFORCE++-baseline and
//! dynamic sampling and PPO with a critic through the GRPO trainer's code path. Each estimator: same seed same
//! metrics, exact resume, batch x accumulation invariance, its metrics; `rlft rloo`'s defaults.

mod common;

use std::path::Path;

use candle_core::Device;
use common::online::{assert_finite_metrics, config, max_diff, metric, run};
use common::train::{assert_resumes_exactly, two_legs};
use common::{assert_same_bits, var_values, weights, Weights};
use rlft::config::online::OnlineConfig;
use rlft::config::online::{PpoConfig, RlooConfig};
use rlft::online::{prepare, train, OnlineSummary};
use rlft::run::RunOptions;

const ESTIMATORS: [&str; 3] = ["rloo", "reinforce", "reinforce_baseline"];

fn extra(est: &str, more: &str) -> String {
    format!("advantage_estimator = \"{est}\"\nbeta = 0.05\n{more}")
}

#[test]
fn each_estimator_is_deterministic_and_trains() {
    for est in ESTIMATORS {
        let [d1, d2] = common::tempdirs();
        let a: OnlineConfig = config(d1.path(), &extra(est, ""));
        let b: OnlineConfig = config(d2.path(), &extra(est, ""));
        let (sa, wa) = run(&a, &RunOptions::default());
        let (sb, wb) = run(&b, &RunOptions::default());
        for step in 0..3 {
            for key in [
                "loss",
                "reward",
                "kl",
                "grad_norm",
                "clip_ratio/region_mean",
            ] {
                let v = metric(&sa, step, key);
                assert!(v.is_finite(), "{est}: {key} = {v}");
                assert_eq!(v, metric(&sb, step, key), "{est}: {key} step {step}");
            }
        }
        assert!(metric(&sa, 0, "grad_norm") > 0.0, "{est}: no gradient");
        assert_same_bits(&wa, &wb, &format!("{est}: same seed"));
        if est != "rloo" {
            assert!(metric(&sa, 0, "returns/mean").is_finite(), "{est}");
        }
    }
}

#[test]
fn each_estimator_is_split_invariant_and_resumes_exactly() {
    for est in ESTIMATORS {
        let [d1, d2] = common::tempdirs();
        let a: OnlineConfig = config(d1.path(), &extra(est, ""));
        let b: OnlineConfig = config(
            d2.path(),
            &extra(
                est,
                "per_device_train_batch_size = 4\ngradient_accumulation_steps = 2",
            ),
        );
        let (sa, wa) = run(&a, &RunOptions::default());
        let (sb, wb) = run(&b, &RunOptions::default());
        for step in 0..3 {
            let (la, lb) = (metric(&sa, step, "loss"), metric(&sb, step, "loss"));
            assert!(
                (la - lb).abs() < 1e-5,
                "{est} step {step}: loss {la} vs {lb}"
            );
        }
        let d = max_diff(&wa, &wb);
        assert!(d < 1e-4, "{est}: weights differ by {d}");

        let more = "max_steps = 4\nnum_iterations = 2\nsave_steps = 2";
        let [d3, d4] = common::tempdirs();
        let full: OnlineConfig = config(d3.path(), &extra(est, more));
        let part: OnlineConfig = config(d4.path(), &extra(est, more));
        let (sf, _, sr) = assert_resumes_exactly(&full, &part, 2, &format!("{est}: resume"));
        assert_eq!(metric(&sf, 3, "loss"), metric(&sr, 1, "loss"), "{est}");
    }
}

#[test]
fn rloo_command_defaults_and_dynamic_sampling() {
    let d = tempfile::tempdir().unwrap();
    let r: RlooConfig = config(d.path(), "num_generations = 4");
    assert_eq!(r.beta, 0.05);
    let (s, _) = run(&r, &RunOptions::default());
    assert!(metric(&s, 0, "kl").is_finite());

    // Temperature 30 makes most groups mixed; a strict reward makes many all-zero groups.
    let d2 = tempfile::tempdir().unwrap();
    let ds: OnlineConfig = config(
        d2.path(),
        "dynamic_sampling = true\nmax_num_gen_batches = 3\ntemperature = 1.0\n\
         [[rewards]]\ntype = \"regex_format\"\nname = \"digit\"\npattern = \"^[0-9]\"",
    );
    let (s, _) = run(&ds, &RunOptions::default());
    for step in 0..3 {
        let batches = metric(&s, step, "dynamic_sampling/gen_batches");
        let filtered = metric(&s, step, "dynamic_sampling/filtered_frac");
        assert!((1.0..=3.0).contains(&batches), "{batches}");
        assert!((0.0..=1.0).contains(&filtered), "{filtered}");
        // Topped up only when the cap was reached.
        if metric(&s, step, "dynamic_sampling/topped_up") > 0.0 {
            assert_eq!(batches, 3.0);
        }
    }
}

/// A PPO run: the summary, the policy's and the critic's weights.
fn run_ppo(cfg: &PpoConfig, opts: &RunOptions) -> (OnlineSummary, Weights, Weights) {
    let mut p = prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let s = train(cfg, &mut p, opts).unwrap();
    let critic = p.critic.as_ref().expect("ppo has a critic");
    (s, weights(&p.policy), var_values(&critic.vars))
}

#[test]
fn ppo_trains_a_critic_resumes_it_and_exports_it() {
    // One rollout = 2 mini-batches x 2 epochs = 4 steps.
    let more = "max_steps = 8\nnum_ppo_epochs = 2\nsave_steps = 4\nnum_generations = 1\n\
                per_device_train_batch_size = 4\nnum_mini_batches = 2";
    let [d1, d2, d3] = common::tempdirs();
    let full: PpoConfig = config(d1.path(), more);
    assert_eq!(
        full.estimator.value_model.as_deref(),
        Some(Path::new(&full.args.model))
    );
    let (sf, wf, cf) = run_ppo(&full, &RunOptions::default());
    let keys = [
        "loss",
        "value_loss",
        "vf_clipfrac",
        "explained_variance",
        "returns/mean",
        "values/mean",
        "kl",
    ];
    assert_finite_metrics(&sf, 0, &keys, "ppo");
    assert!(metric(&sf, 0, "value_loss") > 0.0);
    // Same seed: same run.
    let same: PpoConfig = config(d3.path(), more);
    let (ss, ws, cs) = run_ppo(&same, &RunOptions::default());
    assert_eq!(metric(&sf, 7, "value_loss"), metric(&ss, 7, "value_loss"));
    assert_same_bits(&wf, &ws, "policy");
    assert_same_bits(&cf, &cs, "critic");
    // The critic moved, and resumes exactly with the policy.
    let part: PpoConfig = config(d2.path(), more);
    let ((_, _, c_mid), (sr, wr, cr)) = two_legs(&part, 4, run_ppo);
    assert!(max_diff(&c_mid, &cf) > 0.0, "the critic did not train");
    assert_eq!(sr.global_step, 8);
    assert_same_bits(&wf, &wr, "policy resume");
    assert_same_bits(&cf, &cr, "critic resume");
    // The critic is exported as a sequence-classification HF directory.
    let cfg_json =
        std::fs::read_to_string(full.args.output_dir.join("critic/config.json")).unwrap();
    assert!(cfg_json.contains("ForSequenceClassification"), "{cfg_json}");
}
