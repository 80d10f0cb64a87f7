//! Zero-advantage rows left out of the training pass (`grpo::skip`) on a tiny random model: for
//! every `loss_type`, RLOO's loss, GSPO's sequence ratios and masked truncated completions, a
//! run that leaves them out equals the run that scores every row
//! (`train_scoring_every_row`): the same loss, gradient norm and clip metrics at every step and
//! the same weights to 1e-6, with groups that straddle micro-batches (some micro-batches lose
//! some rows, some vanish). The skip counts match the zero-std groups; a step with no signal at
//! all still takes AdamW's step (bit for bit as with computed zero gradients); skipping is off
//! where it would not be exact; a run that skips resumes exactly.

mod common;

use std::path::Path;

use candle_core::Device;
use common::online::{config, metric};
use common::train::two_legs;
use common::{assert_same_bits, Weights};
use rlft::config::online::OnlineConfig;
use rlft::online::{prepare, train, train_scoring_every_row, OnlineSummary};
use rlft::run::RunOptions;
use rlft_rewards::{Reward, RewardError, RewardOutput, RewardSet, Sample};

/// How a completion is scored.
#[derive(Clone, Copy)]
enum Scoring {
    /// `0.1` for prompts `a+b=` with an even `a` (their groups have advantage 0); for the others
    /// 1 or 0 by the parity of the completion's bytes (they mostly differ).
    PromptDependent,
    /// Distinct scores for the first 24 completions (one rollout of [`cfg`]: a hash of the
    /// text), then `0.1` everywhere: no signal after the first rollout.
    SignalOnlyFirst,
}

struct TestReward {
    scoring: Scoring,
    /// Completions scored before this batch.
    scored: usize,
}

impl Reward for TestReward {
    fn name(&self) -> &str {
        "test"
    }

    fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
        let first = self.scored < 24;
        self.scored += batch.len();
        let score = |s: &Sample<'_>| match self.scoring {
            Scoring::PromptDependent => {
                let prompt = s.row["prompt"].as_str().unwrap();
                let a: u32 = prompt.split('+').next().unwrap().parse().unwrap();
                let parity = s.completion.bytes().map(u32::from).sum::<u32>() % 2;
                if a.is_multiple_of(2) {
                    0.1
                } else {
                    f64::from(parity)
                }
            }
            Scoring::SignalOnlyFirst if first => {
                let h = s.completion.bytes().fold(7u64, |h, b| h * 31 + b as u64);
                (h % 1009) as f64 / 1009.0 + s.completion.len() as f64
            }
            Scoring::SignalOnlyFirst => 0.1,
        };
        Ok(RewardOutput::from_scores(batch.iter().map(score).collect()))
    }
}

/// Trains `cfg` with `scoring`, leaving zero-advantage rows out or not (`skip`).
fn run(
    cfg: &OnlineConfig,
    scoring: Scoring,
    skip: bool,
    opts: &RunOptions,
) -> (OnlineSummary, Weights) {
    let mut p = prepare(cfg, Path::new(&cfg.args.model), &Device::Cpu).unwrap();
    p.rewards = RewardSet::with_builder(&cfg.rollout.rewards, None, |_| {
        Ok(Box::new(TestReward { scoring, scored: 0 }))
    })
    .unwrap();
    let s = if skip {
        train(cfg, &mut p, opts).unwrap()
    } else {
        train_scoring_every_row(cfg, &mut p, opts).unwrap()
    };
    (s, common::weights(&p.policy))
}

/// Trains [`cfg`] with `extra` and `scoring` twice, each in a fresh directory: leaving
/// zero-advantage rows out, then scoring every row.
fn skipping_and_not(
    extra: &str,
    scoring: Scoring,
) -> ((OnlineSummary, Weights), (OnlineSummary, Weights)) {
    let [d1, d2] = common::tempdirs();
    let opts = RunOptions::default();
    (
        run(&cfg(d1.path(), extra), scoring, true, &opts),
        run(&cfg(d2.path(), extra), scoring, false, &opts),
    )
}

/// Groups of 4 in micro-batches of 3 (a group straddles two), 3 groups per optimiser step, 6
/// per rollout used twice (`num_iterations = 2`: the second pass has ratios off 1, so clipping
/// happens): 4 steps, micro-batches that lose some rows and micro-batches that vanish.
fn cfg(dir: &Path, extra: &str) -> OnlineConfig {
    let base = "per_device_train_batch_size = 3\ngradient_accumulation_steps = 4\n\
                generation_batch_size = 24\nnum_iterations = 2\nmax_steps = 4\n\
                weight_decay = 0.1\n";
    // `extra` overrides the base keys.
    let mut table: toml::Table = base.parse().unwrap();
    table.extend(extra.parse::<toml::Table>().unwrap());
    config(dir, &toml::to_string(&table).unwrap())
}

/// `|a - b| <= tol * max(|a|, |b|, 1e-3)`.
fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1e-3)
}

/// The largest difference between two runs' weights relative to their size: over the tensors,
/// `|x - y| / |x|` (L2 norms).
fn max_rel_diff(a: &Weights, b: &Weights) -> f64 {
    let mut worst: f64 = 0.0;
    for ((name, x), (_, y)) in a.iter().zip(b) {
        let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|e| (e as f64).powi(2)).sum::<f64>();
        let d = norm(&mut x.iter().zip(y).map(|(p, q)| p - q)).sqrt();
        let size = norm(&mut x.iter().copied()).sqrt().max(1e-12);
        assert!(d.is_finite(), "{name}: non-finite weights");
        worst = worst.max(d / size);
    }
    worst
}

/// Skipping and scoring every row give the same steps and weights; checks that some rows were
/// skipped, in vanished micro-batches and beside scored rows, and not all. Returns the
/// skipping run's summary.
fn assert_same_run(what: &str, extra: &str) -> OnlineSummary {
    let ((skip, ws), (full, wf)) = skipping_and_not(extra, Scoring::PromptDependent);
    assert_eq!(skip.global_step, 4, "{what}");
    let (mut skipped, mut vanished) = (0.0, 0.0);
    for step in 0..4 {
        for key in ["loss", "grad_norm", "reward"] {
            let (a, b) = (metric(&skip, step, key), metric(&full, step, key));
            assert!(close(a, b, 1e-6), "{what} step {step}: {key} {a} vs {b}");
        }
        for key in ["clip_ratio/region_mean", "cispo_clip_ratio"] {
            let find = |s: &OnlineSummary| s.step_values(key).get(step).copied();
            match (find(&skip), find(&full)) {
                (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "{what}: {key} {a} vs {b}"),
                (a, b) => assert_eq!(a.is_some(), b.is_some(), "{what}: {key}"),
            }
        }
        assert!(full.step_values("skipped_zero_adv_rows").is_empty());
        skipped += metric(&skip, step, "skipped_zero_adv_rows");
        vanished += metric(&skip, step, "skipped_zero_adv_micro_batches");
    }
    let d = max_rel_diff(&ws, &wf);
    eprintln!("{what}: {skipped} of 48 rows skipped, {vanished} of 16 micro-batches vanished, weights differ by {d:e} (relative)");
    assert!(d < 1e-6, "{what}: weights differ by {d:e}");
    // Micro-batches of 3: rows skipped beside scored ones when more than 3 per vanished one.
    let partial = skipped - 3.0 * vanished;
    assert!(
        vanished > 0.0 && partial > 0.0 && skipped < 48.0,
        "{what}: the case"
    );
    skip
}

#[test]
fn every_loss_type_is_unchanged_by_skipping() {
    for loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"] {
        let eps_high = if loss_type == "cispo" { 5.0 } else { 0.28 };
        let extra = format!("loss_type = \"{loss_type}\"\nepsilon_high = {eps_high}\n");
        assert_same_run(loss_type, &extra);
    }
}

#[test]
fn rloo_gspo_and_masked_truncation_are_unchanged_by_skipping() {
    for (what, extra) in [
        ("rloo", "advantage_estimator = \"rloo\"\n"),
        (
            "gspo",
            "importance_sampling_level = \"sequence\"\nloss_type = \"grpo\"\n",
        ),
        (
            "masked truncation",
            "mask_truncated_completions = true\nloss_type = \"bnpo\"\n\
             max_completion_length = 64\n",
        ),
        (
            "lora",
            "use_peft = true\nlearning_rate = 1e-2\n[lora]\nr = 4\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
        ),
    ] {
        let s = assert_same_run(what, extra);
        let truncated = s.step_values("completions/clipped_ratio");
        if what == "masked truncation" {
            assert!(truncated.iter().any(|&t| t > 0.0 && t < 1.0), "{what}: the case");
        }
    }
}

/// One step per rollout with groups of 8 (whose `0.1 * 8 / 8` rounds without the exact mean):
/// the rows skipped are the zero-std groups' rows, and whole micro-batches of one group vanish.
#[test]
fn skip_counts_are_the_zero_std_groups() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "num_generations = 8\nper_device_train_batch_size = 8\n\
                 gradient_accumulation_steps = 4\ngeneration_batch_size = 32\n\
                 num_iterations = 1\nmax_steps = 3\n";
    let c = config(dir.path(), extra);
    let (s, _) = run(&c, Scoring::PromptDependent, true, &RunOptions::default());
    let (mut any, mut all) = (false, true);
    for step in 0..3 {
        let zero_groups = metric(&s, step, "frac_reward_zero_std") * 4.0;
        let rows = metric(&s, step, "skipped_zero_adv_rows");
        assert_eq!(rows, zero_groups * 8.0, "step {step}");
        assert_eq!(
            metric(&s, step, "skipped_zero_adv_micro_batches"),
            zero_groups
        );
        any |= rows > 0.0;
        all &= rows == 32.0;
    }
    assert!(
        any && !all,
        "the case needs some groups with and some without signal"
    );
}

/// After the first rollout no completion has an advantage: those steps compute nothing, and
/// AdamW still steps with zero gradients (momentum, weight decay, step count) exactly as when
/// they are computed, bit for bit.
#[test]
fn steps_without_signal_still_step_adamw_exactly() {
    let extra = "num_iterations = 1\nmax_steps = 6\n";
    let ((s, ws), (f, wf)) = skipping_and_not(extra, Scoring::SignalOnlyFirst);
    assert_eq!(metric(&s, 0, "skipped_zero_adv_rows"), 0.0);
    for step in 2..6 {
        assert_eq!(metric(&s, step, "skipped_zero_adv_rows"), 12.0);
        assert_eq!(metric(&s, step, "skipped_zero_adv_micro_batches"), 4.0);
        assert_eq!(metric(&s, step, "grad_norm"), 0.0);
        assert_eq!(metric(&f, step, "grad_norm"), 0.0);
    }
    assert_eq!(s.skipped_steps, 0);
    assert_same_bits(&ws, &wf, "no-signal steps");
    // The weights kept moving after the signal ended (momentum, weight decay).
    let two = "num_iterations = 1\nmax_steps = 2\n";
    let ((_, w2), (_, w2f)) = skipping_and_not(two, Scoring::SignalOnlyFirst);
    assert_same_bits(&w2, &w2f, "first rollout");
    assert!(max_rel_diff(&w2, &ws) > 0.0, "AdamW did not step");
}

/// Skipping is off (no metric, every row scored) where leaving rows out would not be exact.
#[test]
fn no_skipping_where_it_would_not_be_exact() {
    for (what, extra) in [
        ("kl", "beta = 0.04\n"),
        ("entropy mask", "top_entropy_quantile = 0.5\n"),
        (
            "lora dropout",
            "use_peft = true\n[lora]\nlora_dropout = 0.1\ntarget_modules = [\"q_proj\"]\n",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), &format!("max_steps = 1\n{extra}"));
        let (s, _) = run(&c, Scoring::PromptDependent, true, &RunOptions::default());
        assert!(s.step_values("skipped_zero_adv_rows").is_empty(), "{what}");
        assert!(metric(&s, 0, "frac_reward_zero_std") > 0.0, "{what}");
    }
}

#[test]
fn a_run_that_skips_resumes_exactly() {
    let [d1, d2] = common::tempdirs();
    let a = cfg(d1.path(), "num_iterations = 1\n");
    let b = cfg(d2.path(), "num_iterations = 1\n");
    let (_, full) = run(&a, Scoring::PromptDependent, true, &RunOptions::default());
    let skipping =
        |c: &OnlineConfig, opts: &RunOptions| run(c, Scoring::PromptDependent, true, opts);
    let (_, (s, resumed)) = two_legs(&b, 2, skipping);
    assert_eq!(s.global_step, 4);
    assert!(s.step_values("skipped_zero_adv_rows").iter().sum::<f64>() > 0.0);
    assert_same_bits(&full, &resumed, "resume with skipping");
}
