//! [`super::super::grpo_loss`] as scalar loops with the analytic gradient (derivation in the
//! module docs of [`super`]).

use crate::algo::entropy_mask::high_entropy_mask;
use crate::algo::loss::{ClipStats, Reduction};
use crate::algo::{ImportanceSamplingLevel, LossConfig, LossNormalizer, LossStats, LossType};

/// The inputs of [`grpo_loss_loop`]: [`crate::algo::LossInputs`] as row-major `f64` slices.
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
    /// `[N * T]` per-token entropies; required iff `top_entropy_quantile < 1`.
    pub entropies: Option<&'a [f64]>,
    /// Accumulation steps and the `dapo` / `cispo` token count.
    pub normalizer: LossNormalizer,
}

/// The loss, its gradient and its diagnostics.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopLossOutput {
    /// The scalar loss.
    pub loss: f64,
    /// `[N * T]` analytic `d loss / d logp` (row-major).
    pub grad_logp: Vec<f64>,
    /// Same definitions as [`crate::algo::grpo_loss`].
    pub stats: LossStats,
}

/// One token's policy term `p`, its derivative through the ratio `dp/dr`, its direct
/// derivative `dp/dlogp` (CISPO's `logp` factor), and whether its ratio counts as clipped
/// (low, high) or capped (CISPO).
struct PolicyTerm {
    value: f64,
    d_ratio: f64,
    d_logp: f64,
    low: bool,
    high: bool,
    cispo_capped: bool,
}

/// The policy term of a token with ratio `r`, advantage `a`, log-prob `lp` (module docs).
fn policy_term(r: f64, a: f64, lp: f64, cfg: &LossConfig) -> PolicyTerm {
    let mut p = PolicyTerm {
        value: 0.0,
        d_ratio: 0.0,
        d_logp: 0.0,
        low: false,
        high: false,
        cispo_capped: false,
    };
    match cfg.loss_type {
        LossType::Grpo | LossType::Bnpo | LossType::DrGrpo | LossType::Dapo => {
            let (lo, hi) = (1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high);
            // Unclipped branch rd = min(r, delta): slope 1 in r unless capped.
            let (rd, rd_slope) = match cfg.delta {
                Some(d) if r > d => (d, 0.0),
                _ => (r, 1.0),
            };
            // Clipped branch clip(r, lo, hi): slope 1 inside [lo, hi].
            let (c, c_slope) = if r < lo {
                (lo, 0.0)
            } else if r > hi {
                (hi, 0.0)
            } else {
                (r, 1.0)
            };
            // -min(rd a, c a): a > 0 takes the smaller coefficient, a <= 0 the larger.
            let take_rd = if a > 0.0 { rd <= c } else { rd >= c };
            let (coef, slope) = if take_rd {
                (rd, rd_slope)
            } else {
                (c, c_slope)
            };
            p.value = -coef * a;
            p.d_ratio = -slope * a;
            p.low = rd < lo && a < 0.0;
            p.high = rd > hi && a > 0.0;
        }
        LossType::Cispo => {
            let w = r.min(cfg.epsilon_high);
            p.value = -w * a * lp;
            p.d_logp = -w * a;
            p.cispo_capped = r > cfg.epsilon_high && a > 0.0;
        }
        LossType::Sapo => {
            let tau = if a > 0.0 {
                cfg.sapo_temperature_pos
            } else {
                cfg.sapo_temperature_neg
            };
            let s = 1.0 / (1.0 + (-tau * (r - 1.0)).exp());
            p.value = -s * 4.0 / tau * a;
            p.d_ratio = -4.0 * s * (1.0 - s) * a;
        }
        // `grpo_loss` refuses it too: RLOO's loss is `rloo_loss`, pinned by its own tests.
        LossType::Rloo => unreachable!("loss_type rloo is not a grpo_loss type"),
    }
    p
}

/// [`crate::algo::grpo_loss`] as scalar loops, with the analytic gradient (module docs).
///
/// # Panics
/// On slices of the wrong length, `beta != 0` without `ref_logp`, or
/// `top_entropy_quantile < 1` without `entropies`.
#[allow(clippy::needless_range_loop)] // indices as in the formulas, on purpose
pub fn grpo_loss_loop(inp: &LoopLossInputs, cfg: &LossConfig) -> LoopLossOutput {
    let (n, t) = (inp.n, inp.t);
    assert_eq!(inp.logp.len(), n * t);
    assert_eq!(inp.mask.len(), n * t);
    assert_eq!(inp.advantages.len(), n);
    let k = inp.normalizer.accumulation_steps as f64;
    let sequence = cfg.importance_sampling_level == ImportanceSamplingLevel::Sequence;

    let mut total_tokens = 0.0;
    let mut row_tokens = vec![0.0; n];
    for i in 0..n {
        for j in 0..t {
            row_tokens[i] += inp.mask[i * t + j];
        }
        total_tokens += row_tokens[i];
    }
    // The whole micro-batch's rows and tokens, when only some of its rows are given.
    let whole = inp.normalizer.micro_batch_size(n, total_tokens);
    let weight = |i: usize| -> f64 {
        match cfg.loss_type.reduction() {
            Reduction::SequenceMean => 1.0 / row_tokens[i].max(1.0) / whole.rows as f64 / k,
            Reduction::MicroBatchTokenMean => 1.0 / whole.tokens.max(1.0) / k,
            Reduction::ConstantNormalized => {
                1.0 / (whole.rows * cfg.max_completion_length) as f64 / k
            }
            Reduction::StepTokenMean => 1.0 / inp.normalizer.num_items_in_batch.max(1.0),
        }
    };
    let keep = if cfg.top_entropy_quantile < 1.0 {
        let e = inp
            .entropies
            .expect("top_entropy_quantile < 1 needs entropies");
        high_entropy_mask(e, inp.mask, cfg.top_entropy_quantile)
    } else {
        vec![1.0; n * t]
    };
    let old = |idx: usize| inp.old_logp.map_or(inp.logp[idx], |o| o[idx]);

    let mut loss = 0.0;
    let mut grad_logp = vec![0.0; n * t];
    let (mut kl_sum, mut low_sum, mut high_sum, mut cispo_sum) = (0.0, 0.0, 0.0, 0.0);
    for i in 0..n {
        let a = inp.advantages[i];
        let w_row = weight(i);
        // The row's sequence-level ratio: exp of the masked mean log-ratio.
        let mut seq_log = 0.0;
        for j in 0..t {
            let idx = i * t + j;
            seq_log += inp.mask[idx] * (inp.logp[idx] - old(idx));
        }
        let seq_ratio = (seq_log / row_tokens[i].max(1.0)).exp();
        // Sequence level: sum over the row of W * dl/dr, spread back through dr/dlogp.
        let mut row_d_ratio = 0.0;
        for j in 0..t {
            let idx = i * t + j;
            let m = inp.mask[idx];
            let lp = inp.logp[idx];
            let r = if sequence {
                seq_ratio
            } else {
                (lp - old(idx)).exp()
            };
            let p = policy_term(r, a, lp, cfg);
            let e = keep[idx];
            let (mut l, mut d_ratio, mut d_logp) = (e * p.value, e * p.d_ratio, e * p.d_logp);
            if cfg.beta != 0.0 {
                let rf = inp.ref_logp.expect("beta != 0 needs ref_logp")[idx];
                let d = rf - lp;
                let k3 = d.exp() - d - 1.0;
                let (kl, dkl_dlogp, dkl_dr) = if cfg.use_bias_correction_kl {
                    (k3 * r, (1.0 - d.exp()) * r, k3)
                } else {
                    (k3, 1.0 - d.exp(), 0.0)
                };
                l += cfg.beta * kl;
                d_logp += cfg.beta * dkl_dlogp;
                d_ratio += cfg.beta * dkl_dr;
                kl_sum += kl * m;
            }
            let w = w_row * m;
            loss += w * l;
            if sequence {
                grad_logp[idx] = w * d_logp;
                row_d_ratio += w * d_ratio;
            } else {
                grad_logp[idx] = w * (d_logp + d_ratio * r);
            }
            if !sequence {
                low_sum += f64::from(u8::from(p.low)) * m;
                high_sum += f64::from(u8::from(p.high)) * m;
                cispo_sum += f64::from(u8::from(p.cispo_capped)) * m;
            }
        }
        if sequence {
            // One value per row, every row counted (TRL's metrics of a (B, 1) ratio).
            let p = policy_term(seq_ratio, a, 0.0, cfg);
            low_sum += f64::from(u8::from(p.low));
            high_sum += f64::from(u8::from(p.high));
            cispo_sum += f64::from(u8::from(p.cispo_capped));
            for j in 0..t {
                let idx = i * t + j;
                grad_logp[idx] += row_d_ratio * seq_ratio * inp.mask[idx] / row_tokens[i].max(1.0);
            }
        }
    }
    let denom = total_tokens.max(1.0);
    let ratio_count = if sequence { n as f64 } else { total_tokens };
    let frac = |x: f64| x / ratio_count.max(1.0);
    LoopLossOutput {
        loss,
        grad_logp,
        stats: LossStats {
            kl: (cfg.beta != 0.0).then_some(kl_sum / denom),
            clip: cfg.loss_type.is_clipped_surrogate().then(|| ClipStats {
                low: frac(low_sum),
                high: frac(high_sum),
                region: frac(low_sum + high_sum),
            }),
            cispo_clip_ratio: (cfg.loss_type == LossType::Cispo).then(|| frac(cispo_sum)),
            ratio_count,
            tokens: total_tokens,
        },
    }
}
