//! GRPO maths against TRL's formulas transcribed into torch
//! (`scripts/reference/grpo_loss_golden.py` -> `tests/data/grpo_loss_golden.json`, float64).
//!
//! - advantages: group / batch / none scaling with TRL's eps 1e-4 (with and without a clamp),
//!   LightRFT-style eps 1e-9 with clamp 10, a near-identical group and groups of one;
//! - advantages from several reward functions with `None` rewards (unscorable completions, a
//!   group with none scored, one with one), `sum_then_normalize` x every scaling and
//!   `normalize_then_sum`, with and without a clamp (TRL 1.16);
//! - loss: grpo / bnpo / dr_grpo / dapo x clip on/off x num_iterations 1 (old = logp.detach())
//!   and 2 (old given) x beta 0 / 0.04, then TRL 1.16's options: sequence-level ratios (GSPO),
//!   `delta` above and below `1 + epsilon_high`, cispo (eps_max 5 and 1.2), sapo (two pairs of
//!   temperatures), the high-entropy mask (`top_entropy_quantile` 0.2 / 0 / 0.5), the KL's bias
//!   correction; on 3 groups x 4 completions x 6 ragged positions: loss, `d loss / d logp`, KL,
//!   clip and cispo fractions. The candle loss is checked in f32 (1e-5, the training dtype) and
//!   f64 (1e-10), the loop version in f64 (1e-10);
//! - `torch.quantile` of f32 values (the entropy threshold), bit for bit.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::golden::{f64_rows, scalar};
use rlft::algo::entropy_mask::quantile_f32;
use rlft::algo::loop_ref::{
    advantages_loop, grpo_loss_loop, multi_reward_advantages_loop, LoopLossInputs,
};
use rlft::algo::{
    compute_advantages, grpo_loss, multi_reward_advantages, AdvantageConfig, GroupedRewards,
    ImportanceSamplingLevel, LossConfig, LossInputs, LossNormalizer, LossStats, LossType,
    MultiObjectiveAggregation, ScaleRewards,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Golden {
    advantage_cases: Vec<AdvCase>,
    loss_inputs: Inputs,
    loss_cases: Vec<LossCase>,
    multi_reward_cases: Vec<MultiRewardCase>,
    quantile_cases: Vec<QuantileCase>,
}

#[derive(Deserialize)]
struct MultiRewardCase {
    name: String,
    rewards_per_func: Vec<Vec<Option<f64>>>,
    weights: Vec<f64>,
    group_size: usize,
    aggregation: MultiObjectiveAggregation,
    #[serde(flatten)]
    cfg: AdvantageConfig,
    advantages: Vec<f64>,
    group_mean: Vec<Option<f64>>,
    group_std: Vec<Option<f64>>,
    frac_zero_std: f64,
}

#[derive(Deserialize)]
struct QuantileCase {
    values: Vec<f32>,
    qs: Vec<f64>,
    quantiles: Vec<f32>,
}

#[derive(Deserialize)]
struct AdvCase {
    name: String,
    rewards: Vec<f64>,
    group_size: usize,
    #[serde(flatten)]
    cfg: AdvantageConfig,
    advantages: Vec<f64>,
    group_mean: Vec<f64>,
    group_std: Vec<f64>,
    frac_zero_std: f64,
    trl_frac_reward_zero_std: f64,
}

#[derive(Deserialize)]
struct Inputs {
    n: usize,
    t: usize,
    logp: Vec<Vec<f64>>,
    old_logp: Vec<Vec<f64>>,
    ref_logp: Vec<Vec<f64>>,
    advantages: Vec<f64>,
    mask: Vec<Vec<f64>>,
    entropies: Vec<Vec<f64>>,
    num_items_in_batch: f64,
    max_completion_length: usize,
    accumulation_steps: usize,
}

#[derive(Deserialize)]
struct LossCase {
    loss_type: LossType,
    epsilon_low: f64,
    epsilon_high: f64,
    num_iterations: usize,
    beta: f64,
    importance_sampling_level: ImportanceSamplingLevel,
    delta: Option<f64>,
    top_entropy_quantile: f64,
    use_bias_correction_kl: bool,
    sapo_temperature_pos: f64,
    sapo_temperature_neg: f64,
    loss: f64,
    grad_logp: Vec<Vec<f64>>,
    kl: Option<f64>,
    clip_low: Option<f64>,
    clip_high: Option<f64>,
    clip_region: Option<f64>,
    cispo_clip_ratio: Option<f64>,
    tokens: f64,
}

fn golden() -> Golden {
    common::golden::load("grpo_loss_golden.json")
}

/// Records the largest `|a - b|` and fails past `tol * max(1, |b|)`.
#[derive(Default)]
struct MaxDiff(f64);

impl MaxDiff {
    fn check(&mut self, a: f64, b: f64, tol: f64, what: &str) {
        let d = (a - b).abs();
        assert!(
            d <= tol * b.abs().max(1.0),
            "{what}: {a} vs golden {b} (diff {d:e})"
        );
        self.0 = self.0.max(d);
    }
}

#[test]
fn golden_advantages_match_trl() {
    let g = golden();
    let (mut vec_diff, mut loop_diff) = (MaxDiff::default(), MaxDiff::default());
    for c in &g.advantage_cases {
        let cfg = c.cfg;
        let what = format!("{} scale={}", c.name, cfg.scale);
        for (got, diff) in [
            (
                compute_advantages(&c.rewards, c.group_size, &cfg),
                &mut vec_diff,
            ),
            (
                advantages_loop(&c.rewards, c.group_size, &cfg),
                &mut loop_diff,
            ),
        ] {
            for (name, a, b) in [
                ("advantages", &got.values, &c.advantages),
                ("group_mean", &got.group_mean, &c.group_mean),
                ("group_std", &got.group_std, &c.group_std),
            ] {
                assert_eq!(a.len(), b.len(), "{what} {name}");
                for (x, y) in a.iter().zip(b) {
                    diff.check(*x, *y, 1e-12, &format!("{what} {name}"));
                }
            }
            assert_eq!(got.frac_zero_std, c.frac_zero_std, "{what}");
            if cfg.scale != ScaleRewards::Batch {
                assert_eq!(got.frac_zero_std, c.trl_frac_reward_zero_std, "{what}");
            }
        }
    }
    eprintln!(
        "advantages vs TRL golden: max |diff| vectorised {:e}, loop {:e}",
        vec_diff.0, loop_diff.0
    );
}

fn config(c: &LossCase, inp: &Inputs) -> LossConfig {
    LossConfig {
        loss_type: c.loss_type,
        epsilon_low: c.epsilon_low,
        epsilon_high: c.epsilon_high,
        delta: c.delta,
        importance_sampling_level: c.importance_sampling_level,
        sapo_temperature_pos: c.sapo_temperature_pos,
        sapo_temperature_neg: c.sapo_temperature_neg,
        top_entropy_quantile: c.top_entropy_quantile,
        beta: c.beta,
        use_bias_correction_kl: c.use_bias_correction_kl,
        max_completion_length: inp.max_completion_length,
    }
}

fn normalizer(inp: &Inputs) -> LossNormalizer {
    LossNormalizer {
        accumulation_steps: inp.accumulation_steps,
        num_items_in_batch: inp.num_items_in_batch,
        micro_batch: None,
    }
}

fn case_name(c: &LossCase) -> String {
    format!(
        "{} {} eps=({}, {}) delta={:?} num_iterations={} beta={} bias_kl={} top_q={} sapo=({}, {})",
        c.loss_type,
        c.importance_sampling_level,
        c.epsilon_low,
        c.epsilon_high,
        c.delta,
        c.num_iterations,
        c.beta,
        c.use_bias_correction_kl,
        c.top_entropy_quantile,
        c.sapo_temperature_pos,
        c.sapo_temperature_neg
    )
}

fn check_stats(s: &LossStats, c: &LossCase, tol: f64, diff: &mut MaxDiff, what: &str) {
    assert_eq!(s.kl.is_some(), c.kl.is_some(), "{what} kl presence");
    if let (Some(a), Some(b)) = (s.kl, c.kl) {
        diff.check(a, b, tol, &format!("{what} kl"));
    }
    assert_eq!(
        s.clip.is_some(),
        c.clip_low.is_some(),
        "{what} clip presence"
    );
    if let Some(clip) = s.clip {
        for (name, a, b) in [
            ("clip_low", clip.low, c.clip_low),
            ("clip_high", clip.high, c.clip_high),
            ("clip_region", clip.region, c.clip_region),
        ] {
            diff.check(a, b.unwrap(), tol, &format!("{what} {name}"));
        }
    }
    assert_eq!(
        s.cispo_clip_ratio.is_some(),
        c.cispo_clip_ratio.is_some(),
        "{what} cispo_clip_ratio presence"
    );
    if let (Some(a), Some(b)) = (s.cispo_clip_ratio, c.cispo_clip_ratio) {
        diff.check(a, b, tol, &format!("{what} cispo_clip_ratio"));
    }
    assert_eq!(s.tokens, c.tokens, "{what} tokens");
}

/// The candle loss in `dtype`; returns max |diff| of (loss, grad, stats).
fn candle_vs_golden(dtype: DType, tol: f64) -> (f64, f64, f64) {
    let g = golden();
    let inp = &g.loss_inputs;
    let dev = Device::Cpu;
    let t2 = |v: &[Vec<f64>]| {
        let flat: Vec<f64> = v.iter().flatten().copied().collect();
        Tensor::from_vec(flat, (inp.n, inp.t), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let logp = Var::from_tensor(&t2(&inp.logp)).unwrap();
    let old = t2(&inp.old_logp);
    let refp = t2(&inp.ref_logp);
    let mask = t2(&inp.mask);
    let ent = t2(&inp.entropies);
    let adv = Tensor::new(&inp.advantages[..], &dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let (mut dl, mut dg, mut ds) = (MaxDiff::default(), MaxDiff::default(), MaxDiff::default());
    assert_eq!(g.loss_cases.len(), 84);
    for c in &g.loss_cases {
        let what = format!("{} {dtype:?}", case_name(c));
        let out = grpo_loss(
            &LossInputs {
                logp: logp.as_tensor(),
                old_logp: (c.num_iterations > 1).then_some(&old),
                ref_logp: (c.beta != 0.0).then_some(&refp),
                advantages: &adv,
                mask: &mask,
                entropies: Some(&ent),
                is_weight: None,
                normalizer: normalizer(inp),
            },
            &config(c, inp),
        )
        .unwrap();
        dl.check(scalar(&out.loss), c.loss, tol, &format!("{what} loss"));
        let grads = out.loss.backward().unwrap();
        let grad = f64_rows(grads.get(logp.as_tensor()).unwrap());
        for (a, b) in grad.iter().flatten().zip(c.grad_logp.iter().flatten()) {
            dg.check(*a, *b, tol, &format!("{what} grad"));
        }
        check_stats(&out.stats, c, tol, &mut ds, &what);
    }
    (dl.0, dg.0, ds.0)
}

#[test]
fn golden_loss_candle_f32_matches_trl() {
    let (l, g, s) = candle_vs_golden(DType::F32, 1e-5);
    eprintln!("candle f32 vs TRL golden: max |diff| loss {l:e}, grad {g:e}, stats {s:e}");
}

#[test]
fn golden_loss_candle_f64_matches_trl() {
    let (l, g, s) = candle_vs_golden(DType::F64, 1e-10);
    eprintln!("candle f64 vs TRL golden: max |diff| loss {l:e}, grad {g:e}, stats {s:e}");
}

#[test]
fn golden_loss_loop_matches_trl() {
    let g = golden();
    let inp = &g.loss_inputs;
    let flat = |v: &[Vec<f64>]| -> Vec<f64> { v.iter().flatten().copied().collect() };
    let (logp, old, refp, mask, ent) = (
        flat(&inp.logp),
        flat(&inp.old_logp),
        flat(&inp.ref_logp),
        flat(&inp.mask),
        flat(&inp.entropies),
    );
    let (mut dl, mut dg, mut ds) = (MaxDiff::default(), MaxDiff::default(), MaxDiff::default());
    for c in &g.loss_cases {
        let what = format!("{} loop", case_name(c));
        let out = grpo_loss_loop(
            &LoopLossInputs {
                n: inp.n,
                t: inp.t,
                logp: &logp,
                old_logp: (c.num_iterations > 1).then_some(&old[..]),
                ref_logp: (c.beta != 0.0).then_some(&refp[..]),
                advantages: &inp.advantages,
                mask: &mask,
                entropies: Some(&ent),
                normalizer: normalizer(inp),
            },
            &config(c, inp),
        );
        dl.check(out.loss, c.loss, 1e-10, &format!("{what} loss"));
        for (a, b) in out.grad_logp.iter().zip(c.grad_logp.iter().flatten()) {
            dg.check(*a, *b, 1e-10, &format!("{what} grad"));
        }
        check_stats(&out.stats, c, 1e-10, &mut ds, &what);
    }
    eprintln!(
        "loop f64 vs TRL golden: max |diff| loss {:e}, grad {:e}, stats {:e}",
        dl.0, dg.0, ds.0
    );
}

#[test]
fn golden_multi_reward_advantages_match_trl() {
    let g = golden();
    assert_eq!(g.multi_reward_cases.len(), 32);
    let (mut vec_diff, mut loop_diff) = (MaxDiff::default(), MaxDiff::default());
    for c in &g.multi_reward_cases {
        let cfg = c.cfg;
        let fs: Vec<&[Option<f64>]> = c.rewards_per_func.iter().map(|f| &f[..]).collect();
        let what = format!(
            "{} {} scale={} clamp={:?}",
            c.name, c.aggregation, cfg.scale, cfg.clamp
        );
        let r = GroupedRewards {
            per_function: &fs,
            weights: &c.weights,
            group_size: c.group_size,
        };
        for (got, diff) in [
            (
                multi_reward_advantages(r, c.aggregation, &cfg),
                &mut vec_diff,
            ),
            (
                multi_reward_advantages_loop(r, c.aggregation, &cfg),
                &mut loop_diff,
            ),
        ] {
            assert_eq!(got.values.len(), c.advantages.len(), "{what}");
            for (x, y) in got.values.iter().zip(&c.advantages) {
                diff.check(*x, *y, 1e-12, &format!("{what} advantages"));
            }
            for (name, a, b) in [
                ("group_mean", &got.group_mean, &c.group_mean),
                ("group_std", &got.group_std, &c.group_std),
            ] {
                assert_eq!(a.len(), b.len(), "{what} {name}");
                for (x, y) in a.iter().zip(b) {
                    match y {
                        Some(y) => diff.check(*x, *y, 1e-12, &format!("{what} {name}")),
                        None => assert!(x.is_nan(), "{what} {name}: {x}, TRL NaN"),
                    }
                }
            }
            assert_eq!(got.frac_zero_std, c.frac_zero_std, "{what}");
        }
        // Unscorable completions (every function None) get exactly 0.
        for (i, a) in c.advantages.iter().enumerate() {
            if fs.iter().all(|f| f[i].is_none()) {
                assert_eq!(*a, 0.0, "{what}: unscorable {i}");
            }
        }
    }
    // With every reward scored and one function, the multi-reward path is compute_advantages.
    let c = &g.advantage_cases[0];
    let cfg = c.cfg;
    let opt: Vec<Option<f64>> = c.rewards.iter().copied().map(Some).collect();
    assert_eq!(
        multi_reward_advantages(
            GroupedRewards {
                per_function: &[&opt],
                weights: &[1.0],
                group_size: c.group_size,
            },
            MultiObjectiveAggregation::SumThenNormalize,
            &cfg
        ),
        compute_advantages(&c.rewards, c.group_size, &cfg)
    );
    eprintln!(
        "multi-reward advantages vs TRL golden: max |diff| vectorised {:e}, loop {:e}",
        vec_diff.0, loop_diff.0
    );
}

#[test]
fn golden_entropy_quantile_is_torch_bit_for_bit() {
    let g = golden();
    for c in &g.quantile_cases {
        for (q, want) in c.qs.iter().zip(&c.quantiles) {
            let mut v = c.values.clone();
            let got = quantile_f32(&mut v, *q).unwrap();
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "n={} q={q}: {got} vs torch {want}",
                c.values.len()
            );
        }
    }
}
