//! The loop version: advantages and the GRPO loss as plain scalar loops in `f64`, with the
//! gradient of the loss derived by hand. Not used in training; it is the second, independent
//! implementation the tests hold the vectorised code ([`super::compute_advantages`],
//! [`super::grpo_loss`]) against.
//!
//! Gradient of the loss with respect to `logp[i][t]`, for an active token (`mask = m > 0`):
//!
//! ```text
//! d loss / d logp = w_it * ( d l_pg / d logp + beta * d kl / d logp )
//! d l_pg / d logp = -r * A_i   when the unclipped branch of min(r A, clip(r) A) is taken,
//!                   0          when the clipped (constant) one is: r < 1 - eps_low with A < 0,
//!                              or r > 1 + eps_high with A > 0 (TRL's is_region_clipped)
//! d kl / d logp   = 1 - exp(ref - logp)          (kl = exp(ref - logp) - (ref - logp) - 1)
//! ```
//!
//! using `d r / d logp = r` (`r = exp(logp - old)`, `old` held constant; on-policy `r = 1`), and
//! `w_it = d loss / d l_it`, the aggregation weight:
//!
//! ```text
//! grpo    : m_it / max(len_i, 1) / N / k      len_i = sum_t m_it
//! bnpo    : m_it / max(sum m, 1) / k
//! dr_grpo : m_it / (N * max_completion_length) / k
//! dapo    : m_it / max(num_items_in_batch, 1)
//! ```

use super::advantage::{clamp_advantage, Advantages, ZERO_STD_ATOL};
use super::{AdvantageConfig, LossConfig, LossNormalizer, LossStats, LossType, ScaleRewards};

/// [`super::compute_advantages`] again, one reward at a time: each reward's group mean and std
/// are recomputed from scratch with explicit loops (quadratic in the group size, on purpose).
pub fn advantages_loop(rewards: &[f64], group_size: usize, cfg: &AdvantageConfig) -> Advantages {
    assert!(group_size > 0 && rewards.len().is_multiple_of(group_size));
    let num_groups = rewards.len() / group_size;
    let stats = |lo: usize, hi: usize| -> (f64, f64) {
        let mut sum = 0.0;
        for r in &rewards[lo..hi] {
            sum += r;
        }
        let count = (hi - lo) as f64;
        let mean = if count > 0.0 { sum / count } else { 0.0 };
        let mut ss = 0.0;
        for r in &rewards[lo..hi] {
            ss += (r - mean) * (r - mean);
        }
        let std = if hi - lo > 1 {
            (ss / (count - 1.0)).sqrt()
        } else {
            0.0
        };
        (mean, std)
    };
    let mut values = Vec::with_capacity(rewards.len());
    for (i, &r) in rewards.iter().enumerate() {
        let g = i / group_size;
        let (gm, gs) = stats(g * group_size, (g + 1) * group_size);
        let a = match cfg.scale {
            ScaleRewards::Group => (r - gm) / (gs + cfg.epsilon),
            ScaleRewards::Batch => (r - gm) / (stats(0, rewards.len()).1 + cfg.epsilon),
            ScaleRewards::None => r - gm,
        };
        values.push(clamp_advantage(a, cfg.clamp));
    }
    let mut group_mean = Vec::with_capacity(num_groups);
    let mut group_std = Vec::with_capacity(num_groups);
    let mut zero = 0usize;
    for g in 0..num_groups {
        let (m, s) = stats(g * group_size, (g + 1) * group_size);
        group_mean.push(m);
        group_std.push(s);
        if s <= ZERO_STD_ATOL {
            zero += 1;
        }
    }
    let frac_zero_std = if num_groups == 0 {
        0.0
    } else {
        zero as f64 / num_groups as f64
    };
    Advantages {
        values,
        group_mean,
        group_std,
        frac_zero_std,
    }
}

/// The inputs of [`grpo_loss_loop`]: [`super::LossInputs`] as row-major `f64` slices.
#[derive(Debug, Clone, Copy)]
pub struct LoopLossInputs<'a> {
    /// Completions.
    pub n: usize,
    /// Completion positions.
    pub t: usize,
    /// `[N * T]` policy log-probs.
    pub logp: &'a [f64],
    /// `[N * T]` sampling-policy log-probs; `None`: on-policy (`old = logp`).
    pub old_logp: Option<&'a [f64]>,
    /// `[N * T]` reference log-probs; required iff `beta != 0`.
    pub ref_logp: Option<&'a [f64]>,
    /// `[N]` advantages.
    pub advantages: &'a [f64],
    /// `[N * T]` 0/1 completion mask.
    pub mask: &'a [f64],
    /// Accumulation steps and the `dapo` token count.
    pub normalizer: LossNormalizer,
}

/// The loss, its gradient and its diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopLossOutput {
    /// The scalar loss.
    pub loss: f64,
    /// `[N * T]` analytic `d loss / d logp` (row-major).
    pub grad_logp: Vec<f64>,
    /// Same definitions as [`super::grpo_loss`].
    pub stats: LossStats,
}

/// [`super::grpo_loss`] as scalar loops, with the analytic gradient (module docs).
///
/// # Panics
/// On slices of the wrong length, or `beta != 0` without `ref_logp`.
#[allow(clippy::needless_range_loop)] // indices as in the formulas, on purpose
pub fn grpo_loss_loop(inp: &LoopLossInputs, cfg: &LossConfig) -> LoopLossOutput {
    let (n, t) = (inp.n, inp.t);
    assert_eq!(inp.logp.len(), n * t);
    assert_eq!(inp.mask.len(), n * t);
    assert_eq!(inp.advantages.len(), n);
    let k = inp.normalizer.accumulation_steps as f64;
    let (lo, hi) = (1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high);

    let mut total_tokens = 0.0;
    let mut row_tokens = vec![0.0; n];
    for i in 0..n {
        for j in 0..t {
            row_tokens[i] += inp.mask[i * t + j];
        }
        total_tokens += row_tokens[i];
    }
    let weight = |i: usize| -> f64 {
        match cfg.loss_type {
            LossType::Grpo => 1.0 / row_tokens[i].max(1.0) / n as f64 / k,
            LossType::Bnpo => 1.0 / total_tokens.max(1.0) / k,
            LossType::DrGrpo => 1.0 / (n * cfg.max_completion_length) as f64 / k,
            LossType::Dapo => 1.0 / inp.normalizer.num_items_in_batch.max(1.0),
        }
    };

    let mut loss = 0.0;
    let mut grad_logp = vec![0.0; n * t];
    let (mut kl_sum, mut low_sum, mut high_sum) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let a = inp.advantages[i];
        let w_row = weight(i);
        for j in 0..t {
            let idx = i * t + j;
            let m = inp.mask[idx];
            let lp = inp.logp[idx];
            let old = inp.old_logp.map_or(lp, |o| o[idx]);
            let r = (lp - old).exp();
            let is_low = r < lo && a < 0.0;
            let is_high = r > hi && a > 0.0;
            let (l_pg, g_pg) = if is_low || is_high {
                (-(r.clamp(lo, hi) * a), 0.0)
            } else {
                (-(r * a), -(r * a))
            };
            let (mut l, mut g) = (l_pg, g_pg);
            if cfg.beta != 0.0 {
                let rf = inp.ref_logp.expect("beta != 0 needs ref_logp")[idx];
                let d = rf - lp;
                let kl = d.exp() - d - 1.0;
                l += cfg.beta * kl;
                g += cfg.beta * (1.0 - d.exp());
                kl_sum += kl * m;
            }
            let w = w_row * m;
            loss += w * l;
            grad_logp[idx] = w * g;
            low_sum += f64::from(u8::from(is_low)) * m;
            high_sum += f64::from(u8::from(is_high)) * m;
        }
    }
    let denom = total_tokens.max(1.0);
    LoopLossOutput {
        loss,
        grad_logp,
        stats: LossStats {
            kl: (cfg.beta != 0.0).then_some(kl_sum / denom),
            clip_low: low_sum / denom,
            clip_high: high_sum / denom,
            clip_region: (low_sum + high_sum) / denom,
            tokens: total_tokens,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{compute_advantages, grpo_loss, LossInputs};
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
                    for (name, a, b) in [
                        ("values", &v.values, &l.values),
                        ("group_mean", &v.group_mean, &l.group_mean),
                        ("group_std", &v.group_std, &l.group_std),
                    ] {
                        assert_eq!(a.len(), b.len());
                        for (x, y) in a.iter().zip(b.iter()) {
                            assert!(x.is_finite(), "{name} {scale} g={g}");
                            max_err = max_err.max(close(*x, *y, 1e-12, name));
                        }
                    }
                }
            }
        }
        eprintln!("advantages: loop vs vectorised max scaled error {max_err:e}");
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
            }
        }
    }

    /// Maximum scaled errors of one comparison run: (loss, grad, stats).
    type Errs = (f64, f64, f64);

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
        let tokens: f64 = case.mask.iter().sum();
        let normalizer = LossNormalizer {
            accumulation_steps: 3,
            num_items_in_batch: 2.0 * tokens + 5.0,
        };
        let mut errs: Errs = (0.0, 0.0, 0.0);
        for loss_type in LossType::ALL {
            for (epsilon_low, epsilon_high) in [(0.2, 0.28), (1e9, 1e9)] {
                for beta in [0.0, 0.04] {
                    for with_old in [true, false] {
                        let cfg = LossConfig {
                            loss_type,
                            epsilon_low,
                            epsilon_high,
                            beta,
                            max_completion_length: t + 3,
                        };
                        let what = format!(
                            "{loss_type} eps={epsilon_low} beta={beta} old={with_old} {dtype:?}"
                        );
                        let out = grpo_loss(
                            &LossInputs {
                                logp: logp.as_tensor(),
                                old_logp: with_old.then_some(&old),
                                ref_logp: Some(&refp),
                                advantages: &adv,
                                mask: &mask,
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
                        assert_eq!(s.kl.is_some(), beta != 0.0, "{what}");
                        assert_eq!(s.tokens, w.tokens, "{what}");
                        for (a, b) in [
                            (s.kl.unwrap_or(0.0), w.kl.unwrap_or(0.0)),
                            (s.clip_low, w.clip_low),
                            (s.clip_high, w.clip_high),
                            (s.clip_region, w.clip_region),
                        ] {
                            errs.2 = errs.2.max(close(a, b, tol, &format!("stats {what}")));
                        }
                        if with_old && epsilon_low < 1.0 && w.tokens >= 20.0 {
                            assert!(w.clip_low > 0.0 && w.clip_high > 0.0, "{what}: no clipping");
                        }
                        if !with_old || epsilon_low > 1.0 {
                            assert_eq!(w.clip_region, 0.0, "{what}");
                        }
                    }
                }
            }
        }
        errs
    }

    /// The candle version equals the loop version, loss, gradient and stats, for every loss type
    /// x clip on/off x beta 0/0.04 x old_logp given/not, in f64 (1e-12) and f32 (1e-5).
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

    /// One optimiser step of `2k` rows at once (accumulation 1) vs the same rows as `k`
    /// micro-batches: `grpo`, `dr_grpo` and `dapo` give the same summed loss and gradient,
    /// `bnpo` does not (its per-micro-batch token normaliser sees the split).
    #[test]
    fn accumulation_split_invariance() {
        let mut rng = Rng(3);
        let (n, t, k) = (8, 6, 4);
        let case = Case::random(&mut rng, n, t, false);
        let tokens: f64 = case.mask.iter().sum();
        let run =
            |rows: std::ops::Range<usize>, cfg: &LossConfig, steps: usize| -> (f64, Vec<f64>) {
                let m = rows.len();
                let sl = |v: &[f64]| v[rows.start * t..rows.end * t].to_vec();
                let out = grpo_loss_loop(
                    &LoopLossInputs {
                        n: m,
                        t,
                        logp: &sl(&case.logp),
                        old_logp: Some(&sl(&case.old)),
                        ref_logp: Some(&sl(&case.refp)),
                        advantages: &case.adv[rows.clone()],
                        mask: &sl(&case.mask),
                        normalizer: LossNormalizer {
                            accumulation_steps: steps,
                            num_items_in_batch: tokens,
                        },
                    },
                    cfg,
                );
                (out.loss, out.grad_logp)
            };
        for loss_type in LossType::ALL {
            let cfg = LossConfig {
                loss_type,
                epsilon_low: 0.2,
                epsilon_high: 0.28,
                beta: 0.04,
                max_completion_length: 10,
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
            if loss_type == LossType::Bnpo {
                assert!(
                    (whole - split).abs() > 1e-6,
                    "bnpo should depend on the split"
                );
            } else {
                assert!(
                    (whole - split).abs() < 1e-12,
                    "{loss_type}: {whole} vs {split}"
                );
                assert!(grad_diff < 1e-12, "{loss_type}: grad diff {grad_diff}");
            }
        }
    }
}
