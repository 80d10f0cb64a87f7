//! TRL 1.16's GRPO options end to end on a tiny random model: GSPO (sequence-level ratios) with
//! CISPO, a KL term with its bias correction and a high-entropy mask trains; SAPO, `delta` and
//! `normalize_then_sum` train; an external reward that answers `null` leaves those completions
//! unscored (advantage 0, out of the reward mean); settings that conflict fail with the fix.

mod common;

use std::path::Path;

use candle_core::Device;
use common::online::{config_with_rewards as config, try_metric as metric, DIGIT};
use rlft::config::online::OnlineConfig;
use rlft::config::TrainerConfig;
use rlft::online::{prepare, train, OnlineSummary};
use rlft::run::RunOptions;

/// Trains `cfg`; returns the summary and the largest weight change.
fn train_and_diff(cfg: &OnlineConfig) -> (OnlineSummary, f32) {
    let mut p = prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    let before = common::weights(&p.policy);
    let s = train(cfg, &mut p, &RunOptions::default()).unwrap();
    let after = common::weights(&p.policy);
    let moved = before
        .iter()
        .zip(&after)
        .flat_map(|((_, a), (_, b))| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max);
    (s, moved)
}

#[test]
fn gspo_cispo_with_kl_and_entropy_mask_trains() {
    let dir = tempfile::tempdir().unwrap();
    let cfg: OnlineConfig = config(
        dir.path(),
        "importance_sampling_level = \"sequence\"\nloss_type = \"cispo\"\nepsilon_high = 5.0\n\
         num_iterations = 2\nbeta = 0.04\ntop_entropy_quantile = 0.5",
        DIGIT,
    );
    assert!(cfg.use_bias_correction_kl, "TRL 1.16's default");
    assert_eq!(
        cfg.warnings().len(),
        1,
        "sequence-level cispo sums over tokens"
    );
    let (s, moved) = train_and_diff(&cfg);
    assert_eq!(s.global_step, 3);
    assert!(moved > 0.0, "the weights did not move");
    for step in 0..3 {
        for key in ["loss", "kl", "entropy", "cispo_clip_ratio", "grad_norm"] {
            let v = metric(&s, step, key).unwrap_or_else(|| panic!("no {key}"));
            assert!(v.is_finite(), "step {step}: {key} = {v}");
        }
        // CISPO logs its own clip metric, not PPO's.
        assert!(metric(&s, step, "clip_ratio/region_mean").is_none());
    }
    assert!(metric(&s, 0, "grad_norm").unwrap() > 0.0);
}

#[test]
fn sapo_delta_and_normalize_then_sum_train() {
    let two_rewards = format!(
        "{DIGIT}[[rewards]]\ntype = \"regex_format\"\nname = \"upper\"\npattern = \"[A-Z]\"\n\
         weight = 0.5\n"
    );
    for (extra, rewards, metric_key) in [
        ("loss_type = \"sapo\"\nnum_iterations = 2", DIGIT, None),
        (
            "loss_type = \"dapo\"\nnum_iterations = 2\ndelta = 1.5",
            DIGIT,
            Some("clip_ratio/region_mean"),
        ),
        (
            "loss_type = \"grpo\"\nimportance_sampling_level = \"sequence\"\n\
             multi_objective_aggregation = \"normalize_then_sum\"",
            &two_rewards[..],
            Some("clip_ratio/region_mean"),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg: OnlineConfig = config(dir.path(), extra, rewards);
        assert!(cfg.warnings().is_empty(), "{extra}");
        let (s, moved) = train_and_diff(&cfg);
        assert!(moved > 0.0, "{extra}: the weights did not move");
        for step in 0..3 {
            let loss = metric(&s, step, "loss").unwrap();
            assert!(loss.is_finite(), "{extra}: loss {loss}");
            if let Some(k) = metric_key {
                assert!(metric(&s, step, k).unwrap().is_finite(), "{extra}: {k}");
            }
        }
    }
}

/// Answers `null` for a third of the completions (by a hash of the text), a number otherwise.
const SOMETIMES_NULL: &str = r#"
import json, sys
for line in sys.stdin:
    s = json.loads(line)
    c = s["completion"]
    if sum(map(ord, c)) % 3 == 0:
        print("null", flush=True)
    else:
        print(len(set(c)) % 5, flush=True)
"#;

#[test]
fn null_rewards_get_no_advantage_and_stay_out_of_the_mean() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sometimes_null.py");
    std::fs::write(&script, SOMETIMES_NULL).unwrap();
    let rewards = format!(
        "[[rewards]]\ntype = \"command\"\nname = \"ext\"\ncommand = [\"python3\", \"{}\"]\n\
         timeout_s = 30\n",
        script.display()
    );
    let cfg: OnlineConfig = config(
        dir.path(),
        "max_steps = 4\nnum_completions_to_log = 2",
        &rewards,
    );
    let (s, _) = train_and_diff(&cfg);
    let lines = std::fs::read_to_string(cfg.args.output_dir.join("samples.jsonl")).unwrap();
    let (mut nulls, mut scored) = (0, 0);
    for l in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["split"] != "train" {
            continue;
        }
        if v["reward"].is_null() {
            nulls += 1;
            assert_eq!(
                v["advantage"], 0.0,
                "an unscorable completion moved the policy: {v}"
            );
        } else {
            scored += 1;
        }
    }
    assert!(
        nulls > 0 && scored > 0,
        "{nulls} null, {scored} scored lines"
    );
    for step in 0..4 {
        let r = metric(&s, step, "reward").unwrap();
        assert!(
            r.is_finite() && (0.0..5.0).contains(&r),
            "step {step}: reward {r}"
        );
        assert!(metric(&s, step, "loss").unwrap().is_finite());
    }
}

#[test]
fn conflicting_options_fail_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    config::<OnlineConfig>(dir.path(), "", DIGIT); // writes the model and data
    let bad = |extra: &str| -> String {
        let text = format!("model = \"m\"\ndataset = \"d.jsonl\"\n{extra}\n{DIGIT}",);
        OnlineConfig::from_table(text.parse().unwrap(), "t.toml")
            .err()
            .unwrap_or_else(|| panic!("{extra} should fail"))
            .to_string()
    };
    // Each setting and what its error must say (every part).
    for (extra, fix) in [
        ("loss_type = \"cispo\"", &["epsilon_high = 5.0"][..]),
        ("loss_type = \"sapo\"\ndelta = 2.0", &["Unset delta"]),
        ("delta = 0.9", &["must be > 1"]),
        ("top_entropy_quantile = 1.2", &["[0, 1]"]),
        (
            "multi_objective_aggregation = \"normalize_then_sum\"\nscale_rewards = \"none\"",
            &["remove scale_rewards"],
        ),
        ("importance_sampling_level = \"sequnce\"", &["sequence"]),
        ("loss_type = \"gspo\"", &["cispo", "sapo"]),
        (
            "mask_truncated_rewards = true",
            &[
                "mask_truncated_completions = true",
                "mask_truncated_rewards = false",
            ],
        ),
        (
            "mask_truncated_rewards = true\nmask_truncated_completions = true\n\
             advantage_estimator = \"rloo\"",
            &["group_norm"],
        ),
        (
            "mask_truncated_rewards = true\nmask_truncated_completions = true\n\
             missing_eos_penalty = 1.0",
            &["remove those two"],
        ),
    ] {
        let e = bad(extra);
        assert!(fix.iter().all(|f| e.contains(f)), "{e}");
    }
}
