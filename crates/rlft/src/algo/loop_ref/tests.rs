use super::*;
use crate::algo::{
    compute_advantages, grpo_loss, multi_reward_advantages, GroupedRewards,
    ImportanceSamplingLevel, LossConfig, LossInputs, LossNormalizer, LossStats, LossType,
};
use candle_core::{DType, Device, Tensor, Var};

/// SplitMix64: a tiny deterministic generator for test inputs.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `|a - b| <= tol * max(1, |b|)`; returns the scaled error.
fn close(a: f64, b: f64, tol: f64, what: &str) -> f64 {
    let err = (a - b).abs() / b.abs().max(1.0);
    assert!(
        err <= tol,
        "{what}: {a} vs {b} (scaled error {err:e} > {tol:e})"
    );
    err
}

/// The per-completion and per-group series of two [`Advantages`], by name (equal lengths).
fn series<'a>(v: &'a Advantages, l: &'a Advantages) -> [(&'static str, &'a [f64], &'a [f64]); 3] {
    let all = [
        ("values", &v.values, &l.values),
        ("group_mean", &v.group_mean, &l.group_mean),
        ("group_std", &v.group_std, &l.group_std),
    ];
    all.map(|(name, a, b)| {
        assert_eq!(a.len(), b.len(), "{name}");
        (name, &a[..], &b[..])
    })
}

#[test]
fn advantages_loop_equals_vectorised() {
    let mut rng = Rng(7);
    let mut max_err: f64 = 0.0;
    for &g in &[1usize, 2, 4, 8] {
        let groups = 5;
        let mut rewards: Vec<f64> = (0..g * groups).map(|_| rng.uniform(-3.0, 30.0)).collect();
        // One group of identical rewards, one with a tiny spread.
        rewards[..g].fill(1.0);
        for (j, r) in rewards[g..2 * g].iter_mut().enumerate() {
            *r = 0.5 + 1e-7 * j as f64;
        }
        for scale in [ScaleRewards::Group, ScaleRewards::Batch, ScaleRewards::None] {
            for (epsilon, clamp) in [(1e-4, None), (1e-4, Some(1.0)), (1e-9, Some(10.0))] {
                let cfg = AdvantageConfig {
                    scale,
                    epsilon,
                    clamp,
                };
                let v = compute_advantages(&rewards, g, &cfg);
                let l = advantages_loop(&rewards, g, &cfg);
                assert_eq!(v.frac_zero_std, l.frac_zero_std);
                for (name, a, b) in series(&v, &l) {
                    for (x, y) in a.iter().zip(b) {
                        assert!(x.is_finite(), "{name} {scale} g={g}");
                        max_err = max_err.max(close(*x, *y, 1e-12, name));
                    }
                }
            }
        }
    }
    eprintln!("advantages: loop vs vectorised max scaled error {max_err:e}");
}

/// `None` rewards and several functions: the loop equals the vectorised code for both
/// aggregations and every scaling, with unscorable completions, groups with one scored
/// completion and groups with none.
#[test]
fn multi_reward_advantages_loop_equals_vectorised() {
    let mut rng = Rng(11);
    let mut max_err: f64 = 0.0;
    for &g in &[1usize, 2, 4] {
        let n = g * 6;
        let mut f1: Vec<Option<f64>> = (0..n).map(|_| Some(rng.uniform(0.0, 1.0))).collect();
        let mut f2: Vec<Option<f64>> = (0..n).map(|_| Some(rng.uniform(-5.0, 20.0))).collect();
        for i in 0..n {
            match rng.below(5) {
                0 => f1[i] = None,
                1 => f2[i] = None,
                2 => (f1[i], f2[i]) = (None, None),
                _ => {}
            }
        }
        // A whole unscorable group, one with a single scored completion.
        for i in 0..g {
            (f1[i], f2[i]) = (None, None);
        }
        for i in g + 1..2 * g {
            (f1[i], f2[i]) = (None, None);
        }
        let fs: [&[Option<f64>]; 2] = [&f1, &f2];
        for agg in [
            MultiObjectiveAggregation::SumThenNormalize,
            MultiObjectiveAggregation::NormalizeThenSum,
        ] {
            for scale in [ScaleRewards::Group, ScaleRewards::Batch, ScaleRewards::None] {
                for clamp in [None, Some(1.0)] {
                    let cfg = AdvantageConfig {
                        scale,
                        epsilon: 1e-4,
                        clamp,
                    };
                    let what = format!("{agg} {scale} g={g} clamp={clamp:?}");
                    let r = GroupedRewards {
                        per_function: &fs,
                        weights: &[1.0, 0.5],
                        group_size: g,
                    };
                    let v = multi_reward_advantages(r, agg, &cfg);
                    let l = multi_reward_advantages_loop(r, agg, &cfg);
                    assert_eq!(v.frac_zero_std, l.frac_zero_std, "{what}");
                    for i in 0..g {
                        assert_eq!(v.values[i], 0.0, "{what}: unscorable row {i}");
                    }
                    for (name, a, b) in series(&v, &l) {
                        for (x, y) in a.iter().zip(b) {
                            if y.is_nan() {
                                assert!(x.is_nan(), "{what} {name}: {x} vs NaN");
                                continue;
                            }
                            max_err = max_err.max(close(*x, *y, 1e-12, &what));
                        }
                    }
                }
            }
        }
    }
    eprintln!("multi-reward advantages: loop vs vectorised max scaled error {max_err:e}");
}

/// Random inputs of one loss case: `n` rows of `t` tokens, row lengths from empty to full.
struct Case {
    n: usize,
    t: usize,
    logp: Vec<f64>,
    old: Vec<f64>,
    refp: Vec<f64>,
    adv: Vec<f64>,
    mask: Vec<f64>,
    entropies: Vec<f64>,
}

impl Case {
    fn random(rng: &mut Rng, n: usize, t: usize, round_to_f32: bool) -> Case {
        let r = |x: f64| if round_to_f32 { x as f32 as f64 } else { x };
        let logp: Vec<f64> = (0..n * t).map(|_| r(rng.uniform(-4.0, -0.01))).collect();
        let old = logp
            .iter()
            .map(|&l| r(l + rng.uniform(-0.5, 0.5)))
            .collect();
        let refp = logp
            .iter()
            .map(|&l| r(l + rng.uniform(-1.0, 1.0)))
            .collect();
        let entropies = (0..n * t).map(|_| r(rng.uniform(0.0, 3.0))).collect();
        // Alternating signs, so that both clip sides occur.
        let mut adv: Vec<f64> = (0..n)
            .map(|i| r(rng.uniform(0.05, 2.0) * if i % 2 == 0 { 1.0 } else { -1.0 }))
            .collect();
        let mut mask = vec![0.0; n * t];
        for i in 0..n {
            // With enough rows: one empty row, one full row, one zero advantage.
            let len = match i {
                0 if n >= 3 => 0,
                1 => t,
                _ => rng.below(t + 1),
            };
            if n >= 3 && i == n / 2 {
                adv[i] = 0.0;
            }
            mask[i * t..i * t + len].fill(1.0);
        }
        Case {
            n,
            t,
            logp,
            old,
            refp,
            adv,
            mask,
            entropies,
        }
    }
}

/// The loss settings the comparisons run: every loss type at both importance-sampling
/// levels with beta 0 / 0.04 (bias correction on and off), and on top clipping off, `delta`
/// above and below `1 + epsilon_high`, entropy masks and other SAPO temperatures.
fn variants(t: usize) -> Vec<LossConfig> {
    let base = LossConfig {
        epsilon_low: 0.2,
        epsilon_high: 0.28,
        max_completion_length: t + 3,
        ..Default::default()
    };
    let mut out = Vec::new();
    for loss_type in LossType::TOKEN_LOSSES {
        let epsilon_high = if loss_type == LossType::Cispo {
            1.2
        } else {
            0.28
        };
        for importance_sampling_level in [
            ImportanceSamplingLevel::Token,
            ImportanceSamplingLevel::Sequence,
        ] {
            let c = LossConfig {
                loss_type,
                epsilon_high,
                importance_sampling_level,
                ..base
            };
            for (beta, use_bias_correction_kl) in [(0.0, true), (0.04, true), (0.04, false)] {
                out.push(LossConfig {
                    beta,
                    use_bias_correction_kl,
                    ..c
                });
            }
            for top_entropy_quantile in [0.3, 0.0] {
                out.push(LossConfig {
                    top_entropy_quantile,
                    beta: 0.04,
                    ..c
                });
            }
            if loss_type.is_clipped_surrogate() {
                out.push(LossConfig {
                    epsilon_low: 1e9,
                    epsilon_high: 1e9,
                    ..c
                });
                for delta in [1.3, 1.1] {
                    out.push(LossConfig {
                        delta: Some(delta),
                        ..c
                    });
                }
            }
            if loss_type == LossType::Sapo {
                out.push(LossConfig {
                    sapo_temperature_pos: 2.0,
                    sapo_temperature_neg: 0.5,
                    ..c
                });
            }
        }
    }
    out
}

/// Maximum scaled errors of one comparison run: (loss, grad, stats).
type Errs = (f64, f64, f64);

fn stats_pairs(s: &LossStats, w: &LossStats) -> Vec<(f64, f64)> {
    let clip =
        |c: &Option<crate::algo::ClipStats>| c.map_or([0.0; 3], |c| [c.low, c.high, c.region]);
    let (a, b) = (clip(&s.clip), clip(&w.clip));
    vec![
        (s.kl.unwrap_or(0.0), w.kl.unwrap_or(0.0)),
        (a[0], b[0]),
        (a[1], b[1]),
        (a[2], b[2]),
        (
            s.cispo_clip_ratio.unwrap_or(0.0),
            w.cispo_clip_ratio.unwrap_or(0.0),
        ),
        (s.ratio_count, w.ratio_count),
    ]
}

fn compare(case: &Case, dtype: DType, tol: f64) -> Errs {
    let dev = Device::Cpu;
    let (n, t) = (case.n, case.t);
    let tensor = |v: &[f64], shape: &[usize]| {
        Tensor::from_slice(v, shape, &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let logp = Var::from_tensor(&tensor(&case.logp, &[n, t])).unwrap();
    let old = tensor(&case.old, &[n, t]);
    let refp = tensor(&case.refp, &[n, t]);
    let adv = tensor(&case.adv, &[n]);
    let mask = tensor(&case.mask, &[n, t]);
    let ent = tensor(&case.entropies, &[n, t]);
    let tokens: f64 = case.mask.iter().sum();
    let normalizer = LossNormalizer {
        accumulation_steps: 3,
        num_items_in_batch: 2.0 * tokens + 5.0,
        micro_batch: None,
    };
    let mut errs: Errs = (0.0, 0.0, 0.0);
    for cfg in variants(t) {
        cfg.validate().unwrap();
        for with_old in [true, false] {
            let what = format!("{cfg:?} old={with_old} {dtype:?}");
            let out = grpo_loss(
                &LossInputs {
                    logp: logp.as_tensor(),
                    old_logp: with_old.then_some(&old),
                    ref_logp: Some(&refp),
                    advantages: &adv,
                    mask: &mask,
                    entropies: Some(&ent),
                    is_weight: None,
                    normalizer,
                },
                &cfg,
            )
            .unwrap();
            let want = grpo_loss_loop(
                &LoopLossInputs {
                    n,
                    t,
                    logp: &case.logp,
                    old_logp: with_old.then_some(&case.old[..]),
                    ref_logp: Some(&case.refp),
                    advantages: &case.adv,
                    mask: &case.mask,
                    entropies: Some(&case.entropies),
                    normalizer,
                },
                &cfg,
            );
            let loss = out
                .loss
                .to_dtype(DType::F64)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            errs.0 = errs
                .0
                .max(close(loss, want.loss, tol, &format!("loss {what}")));
            let grads = out.loss.backward().unwrap();
            let g = grads
                .get(logp.as_tensor())
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            for (a, b) in g.iter().zip(&want.grad_logp) {
                errs.1 = errs.1.max(close(*a, *b, tol, &format!("grad {what}")));
            }
            let (s, w) = (out.stats, want.stats);
            assert_eq!(s.kl.is_some(), cfg.beta != 0.0, "{what}");
            assert_eq!(s.clip.is_some(), w.clip.is_some(), "{what}");
            assert_eq!(s.cispo_clip_ratio.is_some(), w.cispo_clip_ratio.is_some());
            assert_eq!(s.tokens, w.tokens, "{what}");
            for (a, b) in stats_pairs(&s, &w) {
                errs.2 = errs.2.max(close(a, b, tol, &format!("stats {what}")));
            }
            let token = cfg.importance_sampling_level == ImportanceSamplingLevel::Token;
            if let Some(c) = w.clip {
                let on = cfg.epsilon_low < 1.0 && cfg.delta.is_none();
                if with_old && on && token && w.tokens >= 20.0 {
                    assert!(c.low > 0.0 && c.high > 0.0, "{what}: no clipping");
                }
                if !with_old || cfg.epsilon_low > 1.0 {
                    assert_eq!(c.region, 0.0, "{what}");
                }
            }
        }
    }
    errs
}

/// The candle version equals the loop version, loss, gradient and stats, for every setting of
/// [`variants`] x old_logp given/not, in f64 (1e-12) and f32 (1e-5).
#[test]
fn loss_vectorised_equals_loop_every_variant() {
    let mut rng = Rng(42);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let mut max: Errs = (0.0, 0.0, 0.0);
        for (n, t) in [(8, 7), (12, 16), (1, 5)] {
            let case = Case::random(&mut rng, n, t, dtype == DType::F32);
            let e = compare(&case, dtype, tol);
            max = (max.0.max(e.0), max.1.max(e.1), max.2.max(e.2));
        }
        eprintln!(
            "loss {dtype:?}: candle vs loop max scaled error: loss {:e}, grad {:e}, stats {:e}",
            max.0, max.1, max.2
        );
    }
}

/// Sequence-level ratios give one gradient per row spread over its tokens by `1 / len`: with
/// `grpo` on-policy and no KL, every active token of row `i` gets `-A_i / len_i / N / k`, the
/// same as token level (the ratios are all 1) — and off-policy they differ.
#[test]
fn sequence_level_on_policy_equals_token_level() {
    let mut rng = Rng(5);
    let case = Case::random(&mut rng, 6, 5, false);
    let run = |level, old: Option<&[f64]>| {
        let cfg = LossConfig {
            loss_type: LossType::Grpo,
            importance_sampling_level: level,
            ..Default::default()
        };
        grpo_loss_loop(
            &LoopLossInputs {
                n: case.n,
                t: case.t,
                logp: &case.logp,
                old_logp: old,
                ref_logp: None,
                advantages: &case.adv,
                mask: &case.mask,
                entropies: None,
                normalizer: LossNormalizer::single(1.0),
            },
            &cfg,
        )
    };
    let (tok, seq) = (
        run(ImportanceSamplingLevel::Token, None),
        run(ImportanceSamplingLevel::Sequence, None),
    );
    assert!((tok.loss - seq.loss).abs() < 1e-15);
    for (a, b) in tok.grad_logp.iter().zip(&seq.grad_logp) {
        assert!((a - b).abs() < 1e-15, "{a} vs {b}");
    }
    let (tok, seq) = (
        run(ImportanceSamplingLevel::Token, Some(&case.old)),
        run(ImportanceSamplingLevel::Sequence, Some(&case.old)),
    );
    assert!((tok.loss - seq.loss).abs() > 1e-6);
}

/// One optimiser step of `2k` rows at once (accumulation 1) vs the same rows as `k`
/// micro-batches: every type but `bnpo` gives the same summed loss and gradient, at both
/// importance-sampling levels; `bnpo` does not (its per-micro-batch token normaliser sees the
/// split).
#[test]
fn accumulation_split_invariance() {
    let mut rng = Rng(3);
    let (n, t, k) = (8, 6, 4);
    let case = Case::random(&mut rng, n, t, false);
    let tokens: f64 = case.mask.iter().sum();
    let run = |rows: std::ops::Range<usize>, cfg: &LossConfig, steps: usize| -> (f64, Vec<f64>) {
        let sl = |v: &[f64]| v[rows.start * t..rows.end * t].to_vec();
        let out = grpo_loss_loop(
            &LoopLossInputs {
                n: rows.len(),
                t,
                logp: &sl(&case.logp),
                old_logp: Some(&sl(&case.old)),
                ref_logp: Some(&sl(&case.refp)),
                advantages: &case.adv[rows.clone()],
                mask: &sl(&case.mask),
                entropies: None,
                normalizer: LossNormalizer {
                    accumulation_steps: steps,
                    num_items_in_batch: tokens,
                    micro_batch: None,
                },
            },
            cfg,
        );
        (out.loss, out.grad_logp)
    };
    for loss_type in LossType::TOKEN_LOSSES {
        for importance_sampling_level in [
            ImportanceSamplingLevel::Token,
            ImportanceSamplingLevel::Sequence,
        ] {
            let cfg = LossConfig {
                loss_type,
                epsilon_low: 0.2,
                epsilon_high: if loss_type == LossType::Cispo {
                    5.0
                } else {
                    0.28
                },
                beta: 0.04,
                importance_sampling_level,
                max_completion_length: 10,
                ..Default::default()
            };
            let (whole, whole_grad) = run(0..n, &cfg, 1);
            let mut split = 0.0;
            let mut split_grad = Vec::new();
            for s in 0..k {
                let (l, g) = run(s * n / k..(s + 1) * n / k, &cfg, k);
                split += l;
                split_grad.extend(g);
            }
            let grad_diff = whole_grad
                .iter()
                .zip(&split_grad)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            let what = format!("{loss_type} {importance_sampling_level}");
            if loss_type == LossType::Bnpo {
                assert!(
                    (whole - split).abs() > 1e-6,
                    "bnpo should depend on the split"
                );
            } else {
                assert!((whole - split).abs() < 1e-12, "{what}: {whole} vs {split}");
                assert!(grad_diff < 1e-12, "{what}: grad diff {grad_diff}");
            }
        }
    }
}
