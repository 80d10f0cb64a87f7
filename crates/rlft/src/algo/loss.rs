//! The GRPO policy loss of TRL 1.16 (`GRPOTrainer._compute_loss`,
//! `trl/trainer/grpo_trainer.py:3020-3290`): an importance ratio per token or per completion, a
//! policy term chosen by [`LossType`], an optional entropy mask, an optional k3 KL penalty to a
//! reference policy, and a reduction over tokens.
//!
//! Per token `(i, t)` of completion `i`, `m` the completion mask, `len_i = max(sum_t m_it, 1)`:
//!
//! ```text
//! r      = exp(logp - old)                                 importance_sampling_level = token
//!        = exp(sum_t m (logp - old) / len_i)               = sequence (GSPO), one per row
//! kl     = exp(ref - logp) - (ref - logp) - 1              k3 estimator, >= 0
//!          (* r when use_bias_correction_kl)
//! policy = -min(rd * A, clip(r, 1 - eps_low, 1 + eps_high) * A)    grpo, bnpo, dr_grpo, dapo
//!          rd = min(r, delta) with two-sided clipping (delta), else r
//!        = -sg(min(r, eps_high)) * A * logp                          cispo
//!        = -sigmoid(tau (r - 1)) * 4 / tau * A,  tau = A > 0 ? tau_pos : tau_neg     sapo
//! l      = policy * entropy_mask * is_weight + beta * kl   (kl only when beta != 0;
//!                                                          is_weight: server rollouts)
//! ```
//!
//! then `l` is summed over the completion tokens and normalised per [`LossType`]. `eps_high >
//! eps_low` is DAPO's "clip-higher" (arXiv:2503.14476); GRPO is DeepSeekMath arXiv:2402.03300,
//! eq. 3. `sg` stops the gradient.

use candle_core::{bail, DType, Result, Tensor};

use super::entropy_mask::high_entropy_mask;
pub use super::loss_config::{ImportanceSamplingLevel, LossConfig, LossType, Reduction};

/// What the loss is normalised by beyond the micro-batch itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossNormalizer {
    /// Micro-batches per optimiser step (TRL `current_gradient_accumulation_steps`; 1 in eval).
    /// Divides `grpo`, `bnpo`, `dr_grpo` and `sapo`; `dapo` and `cispo` ignore it.
    pub accumulation_steps: usize,
    /// `dapo` and `cispo` only: the number of active completion tokens (`sum mask`) of the
    /// whole optimiser step, summed over all its accumulation micro-batches (and processes).
    /// TRL computes it per generation batch and rescales by `accumulation_steps /
    /// steps_per_generation`, which is the same number in the usual `steps_per_generation ==
    /// gradient_accumulation_steps` setup. Clamped to at least 1.
    pub num_items_in_batch: f64,
    /// The whole micro-batch when the loss is given only some of its rows: the others were
    /// left out because their loss terms and gradients are exactly 0 (zero advantage and no
    /// KL term; see `grpo::skip`). Its rows are the `N` of `grpo`, `sapo` and `dr_grpo`, its
    /// active tokens `bnpo`'s divisor, so that every given row weighs what it weighs in the
    /// whole micro-batch. `None`: the rows given are the whole micro-batch.
    pub micro_batch: Option<MicroBatchSize>,
}

/// The size of a whole micro-batch (see [`LossNormalizer::micro_batch`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MicroBatchSize {
    /// Completions, those left out included.
    pub rows: usize,
    /// Active completion tokens (`sum mask`), those of the rows left out included.
    pub tokens: f64,
}

impl LossNormalizer {
    /// No accumulation: the micro-batch is the whole step; `tokens` is its `sum mask`.
    pub fn single(tokens: f64) -> Self {
        LossNormalizer {
            accumulation_steps: 1,
            num_items_in_batch: tokens,
            micro_batch: None,
        }
    }

    /// The rows and active tokens the reduction divides by, for `rows` given rows holding
    /// `tokens` active tokens: theirs, or the whole micro-batch's.
    pub fn micro_batch_size(&self, rows: usize, tokens: f64) -> MicroBatchSize {
        self.micro_batch.unwrap_or(MicroBatchSize { rows, tokens })
    }
}

/// The inputs of [`grpo_loss`]. `N` completions, `T` completion positions (right-padded).
#[derive(Debug, Clone, Copy)]
pub struct LossInputs<'a> {
    /// `[N, T]` per-token log-probs of the completion under the policy being trained; the loss is
    /// differentiable with respect to it. Padded positions must hold finite values (e.g. 0).
    pub logp: &'a Tensor,
    /// `[N, T]` log-probs under the policy that sampled the batch (no gradient). `None` when
    /// `num_iterations == 1`: then the batch is on-policy and `logp.detach()` is used, so the
    /// ratio is exactly 1 and its gradient `d r / d logp = 1` (TRL does the same).
    pub old_logp: Option<&'a Tensor>,
    /// `[N, T]` log-probs under the reference policy (no gradient); required iff `beta != 0`.
    pub ref_logp: Option<&'a Tensor>,
    /// `[N]` one advantage per completion (GRPO's group-relative ones, see
    /// [`super::compute_advantages`]), or `[N, T]` one per token (PPO's GAE, REINFORCE++'s
    /// returns with a per-token KL penalty).
    pub advantages: &'a Tensor,
    /// `[N, T]` 1 for completion tokens that count, 0 for padding (and tool output).
    pub mask: &'a Tensor,
    /// `[N, T]` per-token entropies of the policy's distributions (no gradient); required iff
    /// `top_entropy_quantile < 1`, ignored otherwise.
    pub entropies: Option<&'a Tensor>,
    /// `[N, T]` importance-sampling weights of rollouts sampled by a server (no gradient; see
    /// [`super::is_correction`]): they multiply the policy term, before the KL is added (TRL
    /// `grpo_trainer.py:3146-3147`). `None` = 1.
    pub is_weight: Option<&'a Tensor>,
    /// Accumulation steps and, for `dapo` and `cispo`, the step's token count.
    pub normalizer: LossNormalizer,
}

/// The clip fractions of the clipped-surrogate types (TRL `clip_ratio/*_mean`), from the ratio
/// after the `delta` cap, as TRL computes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipStats {
    /// Fraction with `r < 1 - eps_low` and `A < 0` (TRL `clip_ratio/low_mean`).
    pub low: f64,
    /// Fraction with `r > 1 + eps_high` and `A > 0` (TRL `clip_ratio/high_mean`).
    pub high: f64,
    /// `low + high`: clipped, so no policy gradient (TRL `clip_ratio/region_mean`).
    pub region: f64,
}

/// Diagnostics of one loss call (TRL's metrics before their cross-process reduction). Token
/// means are `sum(x * mask) / max(sum mask, 1)`; the ratio fractions are such token means at
/// token level, and means over the rows (all of them, as TRL's `global_masked_mean` of a
/// `(B, 1)` tensor) at sequence level with one advantage per row: see `ratio_count`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossStats {
    /// Token mean of the KL term (k3, times the ratio under `use_bias_correction_kl`; TRL
    /// `kl`); `None` when `beta == 0`.
    pub kl: Option<f64>,
    /// Clip fractions; `Some` for the clipped-surrogate types (`grpo`, `bnpo`, `dr_grpo`,
    /// `dapo`).
    pub clip: Option<ClipStats>,
    /// `cispo` only: fraction with `r > epsilon_high` and `A > 0`, whose weight is capped (TRL
    /// `cispo_clip_ratio`).
    pub cispo_clip_ratio: Option<f64>,
    /// What the ratio fractions average over: active tokens, or rows at sequence level; the
    /// weight to combine micro-batches with.
    pub ratio_count: f64,
    /// Number of active tokens, `sum mask`.
    pub tokens: f64,
}

/// A scalar loss to call `backward` on, and its diagnostics.
#[derive(Debug, Clone)]
pub struct LossOutput {
    /// `[]` scalar, dtype of `logp`.
    pub loss: Tensor,
    /// Diagnostics (no gradient).
    pub stats: LossStats,
}

/// Masked mean of each row: `[N, T], [N, T] -> [N]`, `sum_t x * mask / max(sum_t mask, 1)`.
///
/// A row without active tokens gives 0 (TRL's logging helper gives NaN there; its loss clamps
/// the count to 1 as here). Differentiable with respect to `x`.
pub fn masked_mean_per_row(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mask = mask.to_dtype(x.dtype())?;
    let lens = mask.sum(1)?.maximum(1.0)?;
    x.mul(&mask)?.sum(1)?.div(&lens)
}

/// The importance ratio, differentiable: `[N, T]` per token, or `[N, 1]` per row at sequence
/// level (TRL `coef_1`, `grpo_trainer.py:3083-3095`).
fn importance_ratio(
    logp: &Tensor,
    old: &Tensor,
    mask: &Tensor,
    level: ImportanceSamplingLevel,
) -> Result<Tensor> {
    let log_ratio = logp.sub(old)?;
    match level {
        ImportanceSamplingLevel::Token => log_ratio.exp(),
        ImportanceSamplingLevel::Sequence => {
            let lens = mask.sum_keepdim(1)?.maximum(1.0)?;
            log_ratio.mul(mask)?.sum_keepdim(1)?.div(&lens)?.exp()
        }
    }
}

/// `-min(rd A, clip(r) A)` with `rd = min(r, delta)` (TRL `grpo_trainer.py:3112-3120`), all
/// `[N, T]`. Written as a choice between the two branches so that the gradient is exactly
/// torch's: the chosen branch's, `-A r` where it is `r` itself and 0 where it is a constant;
/// at a tie both branches have the same gradient (torch's `clamp` passes it at the bounds).
fn clipped_surrogate(ratio: &Tensor, adv: &Tensor, cfg: &LossConfig) -> Result<Tensor> {
    let (lo, hi) = (1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high);
    let outside = ratio.lt(lo)?.add(&ratio.gt(hi)?)?; // disjoint: lo <= 1 <= hi
    let clipped = outside.where_cond(&ratio.detach().clamp(lo, hi)?, ratio)?;
    let capped = match cfg.delta {
        Some(d) => ratio
            .gt(d)?
            .where_cond(&ratio.detach().minimum(d)?, ratio)?,
        None => ratio.clone(),
    };
    // A > 0 takes the smaller coefficient, A <= 0 the larger (A = 0 contributes nothing).
    let take_capped = adv
        .gt(0.0)?
        .where_cond(&capped.le(&clipped)?, &capped.ge(&clipped)?)?;
    take_capped.where_cond(&capped, &clipped)?.mul(adv)?.neg()
}

/// SAPO's soft gate `-sigmoid(tau (r - 1)) * 4 / tau * A` (TRL `grpo_trainer.py:3121-3124`),
/// with `tau = sapo_temperature_pos` where `A > 0`, else `sapo_temperature_neg`; `[N, T]`.
fn sapo_surrogate(ratio: &Tensor, adv: &Tensor, cfg: &LossConfig) -> Result<Tensor> {
    let pos = adv.gt(0.0)?;
    let full = |v: f64| Tensor::full(v, adv.dims(), adv.device())?.to_dtype(adv.dtype());
    let tau = pos.where_cond(
        &full(cfg.sapo_temperature_pos)?,
        &full(cfg.sapo_temperature_neg)?,
    )?;
    // sigmoid(x) = 1 / (1 + exp(-x)); x >= -tau since r >= 0, so exp(-x) stays finite.
    let x = ratio.affine(1.0, -1.0)?.mul(&tau)?;
    let gate = (x.neg()?.exp()? + 1.0)?.recip()?;
    gate.mul(&tau.recip()?.affine(4.0, 0.0)?)?.mul(adv)?.neg()
}

/// The high-entropy mask of [`super::entropy_mask`] as a `[N, T]` tensor of `dtype`.
fn entropy_mask_tensor(entropies: &Tensor, mask: &Tensor, top_q: f64) -> Result<Tensor> {
    let flat =
        |x: &Tensor| -> Result<Vec<f64>> { x.to_dtype(DType::F64)?.flatten_all()?.to_vec1() };
    let keep = high_entropy_mask(&flat(entropies)?, &flat(mask)?, top_q);
    Tensor::from_vec(keep, mask.dims(), mask.device())?.to_dtype(mask.dtype())
}

/// The GRPO loss of one micro-batch (shapes in [`LossInputs`]; the formulas in the module docs
/// and [`LossType`]).
///
/// Computes in the dtype of `logp` (f32 in training; f64 works too), converting the other
/// inputs to it. The clipped surrogate's gradient is exactly torch's, also at the clip bounds
/// (see `clipped_surrogate`), where candle's `min`/`clamp` would split the gradient of a tie
/// in halves. The entropy mask multiplies the policy term only (TRL: before the KL is added).
///
/// Errors on shape mismatches, on `beta != 0` without `ref_logp`, on `top_entropy_quantile < 1`
/// without `entropies`, on `accumulation_steps == 0`, on an empty batch, on
/// `max_completion_length == 0` and on a [`LossNormalizer::micro_batch`] smaller than the rows
/// given.
pub fn grpo_loss(inp: &LossInputs, cfg: &LossConfig) -> Result<LossOutput> {
    let logp = inp.logp;
    let dtype = logp.dtype();
    let (n, t) = logp.dims2()?;
    if n == 0 {
        bail!("grpo_loss: empty batch (logp is [0, {t}])");
    }
    if cfg.loss_type == LossType::Rloo {
        bail!("grpo_loss: loss_type \"rloo\" is RLOO's sequence loss; call rloo_loss");
    }
    let same = |name: &str, x: &Tensor| -> Result<Tensor> {
        if x.dims() != [n, t] {
            bail!("grpo_loss: {name} is {:?}, logp is [{n}, {t}]", x.dims());
        }
        x.to_dtype(dtype)
    };
    let mask = same("mask", inp.mask)?;
    let norm = inp.normalizer;
    if norm.accumulation_steps == 0 {
        bail!("grpo_loss: accumulation_steps must be >= 1");
    }
    if cfg.max_completion_length == 0 {
        bail!("grpo_loss: max_completion_length must be >= 1");
    }
    let (adv, per_row_adv) = match inp.advantages.dims() {
        [a] if *a == n => (inp.advantages.to_dtype(dtype)?.reshape((n, 1))?, true),
        [a, b] if *a == n && *b == t => (inp.advantages.to_dtype(dtype)?, false),
        d => bail!(
            "grpo_loss: advantages is {d:?}, expected [{n}] (one per completion) or [{n}, {t}] \
             (one per token)"
        ),
    };
    let adv_full = adv.broadcast_as((n, t))?;
    let old = match inp.old_logp {
        Some(o) => same("old_logp", o)?.detach(),
        None => logp.detach(),
    };

    let ratio = importance_ratio(logp, &old, &mask, cfg.importance_sampling_level)?;
    let ratio_full = ratio.broadcast_as((n, t))?;

    // k3 KL to the reference policy, optionally times the ratio (TRL grpo_trainer.py:3098-3105).
    let kl = if cfg.beta != 0.0 {
        let Some(r) = inp.ref_logp else {
            bail!(
                "grpo_loss: beta = {} needs ref_logp (reference log-probs); set beta = 0 to \
                 train without a reference model",
                cfg.beta
            );
        };
        let d = same("ref_logp", r)?.detach().sub(logp)?;
        let k3 = ((d.exp()? - &d)? - 1.0)?;
        Some(if cfg.use_bias_correction_kl {
            k3.mul(&ratio_full)?
        } else {
            k3
        })
    } else {
        None
    };

    let mut per_token = match cfg.loss_type {
        LossType::Grpo | LossType::Bnpo | LossType::DrGrpo | LossType::Dapo => {
            clipped_surrogate(&ratio_full, &adv_full, cfg)?
        }
        LossType::Cispo => {
            let weight = ratio_full.detach().minimum(cfg.epsilon_high)?;
            weight.mul(&adv_full)?.mul(logp)?.neg()?
        }
        LossType::Sapo => sapo_surrogate(&ratio_full, &adv_full, cfg)?,
        LossType::Rloo => unreachable!("refused at the top"),
    };
    if cfg.top_entropy_quantile < 1.0 {
        let Some(e) = inp.entropies else {
            bail!(
                "grpo_loss: top_entropy_quantile = {} needs the per-token entropies; pass \
                 them, or set top_entropy_quantile = 1.0",
                cfg.top_entropy_quantile
            );
        };
        let e = same("entropies", e)?;
        per_token = per_token.mul(&entropy_mask_tensor(&e, &mask, cfg.top_entropy_quantile)?)?;
    }
    if let Some(w) = inp.is_weight {
        per_token = per_token.mul(&same("is_weight", w)?.detach())?;
    }
    if let Some(kl) = &kl {
        per_token = (per_token + kl.affine(cfg.beta, 0.0)?)?;
    }

    let tokens = scalar(&mask.sum_all()?)?;
    let whole = norm.micro_batch_size(n, tokens);
    if whole.rows < n || whole.tokens < tokens {
        bail!(
            "grpo_loss: the whole micro-batch ({} rows, {} tokens) is smaller than the rows \
             given ({n} rows, {tokens} tokens)",
            whole.rows,
            whole.tokens
        );
    }
    let loss = reduce(&per_token, &mask, cfg, norm, whole)?;
    let sequence_stats =
        cfg.importance_sampling_level == ImportanceSamplingLevel::Sequence && per_row_adv;
    let stats = ratio_stats(&ratio, &adv, &mask, cfg, sequence_stats)?;
    let denom = tokens.max(1.0);
    let kl = match &kl {
        Some(k) => Some(scalar(&k.detach().mul(&mask)?.sum_all()?)? / denom),
        None => None,
    };
    Ok(LossOutput {
        loss,
        stats: LossStats {
            kl,
            tokens,
            ..stats
        },
    })
}

/// The masked per-token losses `[N, T]` reduced to the micro-batch's loss (TRL
/// `grpo_trainer.py:3153-3176`), dividing by the `whole` micro-batch's rows and tokens, and by
/// the accumulation steps `k` (`StepTokenMean`: by `num_items_in_batch` instead).
fn reduce(
    per_token: &Tensor,
    mask: &Tensor,
    cfg: &LossConfig,
    norm: LossNormalizer,
    whole: MicroBatchSize,
) -> Result<Tensor> {
    let masked_sum = || per_token.mul(mask)?.sum_all();
    let k = norm.accumulation_steps as f64;
    match cfg.loss_type.reduction() {
        // `sum * (1 / N)` is candle's `mean`, bit for bit, when all rows are given.
        Reduction::SequenceMean => (masked_mean_per_row(per_token, mask)?.sum(0)?
            * (1.0 / whole.rows as f64))?
            .affine(1.0 / k, 0.0),
        Reduction::MicroBatchTokenMean => {
            masked_sum()?.affine(1.0 / (whole.tokens.max(1.0) * k), 0.0)
        }
        Reduction::ConstantNormalized => {
            let denom = (whole.rows * cfg.max_completion_length) as f64 * k;
            masked_sum()?.affine(1.0 / denom, 0.0)
        }
        Reduction::StepTokenMean => {
            masked_sum()?.affine(1.0 / norm.num_items_in_batch.max(1.0), 0.0)
        }
    }
}

/// The ratio fractions (TRL `grpo_trainer.py:3254-3288`): from `ratio` (`[N, T]`, or `[N, 1]`
/// at sequence level) and `adv` (`[N, 1]` or `[N, T]`); with `per_row` (sequence level, one
/// advantage per row) means over the `N` rows, else token means over `mask`. `kl` and `tokens`
/// are left for the caller (0 / None here).
fn ratio_stats(
    ratio: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    cfg: &LossConfig,
    per_row: bool,
) -> Result<LossStats> {
    let (n, t) = mask.dims2()?;
    let (ratio, adv) = if per_row {
        (ratio.detach(), adv.clone())
    } else {
        (
            ratio.detach().broadcast_as((n, t))?.contiguous()?,
            adv.broadcast_as((n, t))?.contiguous()?,
        )
    };
    let count = if per_row {
        n as f64
    } else {
        scalar(&mask.sum_all()?)?
    };
    let frac = |ind: &Tensor| -> Result<f64> {
        let ind = ind.to_dtype(mask.dtype())?;
        let s = if per_row {
            ind.sum_all()?
        } else {
            ind.mul(mask)?.sum_all()?
        };
        Ok(scalar(&s)? / count.max(1.0))
    };
    let (pos, neg) = (adv.gt(0.0)?, adv.lt(0.0)?);
    let mut stats = LossStats {
        kl: None,
        clip: None,
        cispo_clip_ratio: None,
        ratio_count: count,
        tokens: 0.0,
    };
    if cfg.loss_type.is_clipped_surrogate() {
        let capped = match cfg.delta {
            Some(d) => ratio.minimum(d)?,
            None => ratio,
        };
        let low = capped.lt(1.0 - cfg.epsilon_low)?.mul(&neg)?;
        let high = capped.gt(1.0 + cfg.epsilon_high)?.mul(&pos)?;
        let region = low.add(&high)?; // disjoint: A < 0 vs A > 0
        stats.clip = Some(ClipStats {
            low: frac(&low)?,
            high: frac(&high)?,
            region: frac(&region)?,
        });
    } else if cfg.loss_type == LossType::Cispo {
        let capped = ratio.gt(cfg.epsilon_high)?.mul(&pos)?;
        stats.cispo_clip_ratio = Some(frac(&capped)?);
    }
    Ok(stats)
}

/// A scalar tensor as f64.
fn scalar(x: &Tensor) -> Result<f64> {
    x.to_dtype(DType::F64)?.to_scalar::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t2(v: &[f32], n: usize, t: usize) -> Tensor {
        Tensor::from_slice(v, (n, t), &Device::Cpu).unwrap()
    }

    /// On-policy inputs (`old = None`) without reference, entropies or IS weights.
    fn on_policy<'a>(
        logp: &'a Tensor,
        advantages: &'a Tensor,
        mask: &'a Tensor,
        normalizer: LossNormalizer,
    ) -> LossInputs<'a> {
        LossInputs {
            logp,
            old_logp: None,
            ref_logp: None,
            advantages,
            mask,
            entropies: None,
            is_weight: None,
            normalizer,
        }
    }

    /// Advantages given per token (`[N, T]`) equal to the per-sequence ones broadcast give the
    /// same loss and gradient; a token whose advantage is 0 gets no policy gradient.
    #[test]
    fn per_token_advantages() {
        let (n, t) = (2, 3);
        let logp = Var::from_tensor(&t2(&[-1.0, -0.5, -2.0, -0.3, -0.7, -1.1], n, t)).unwrap();
        let mask = t2(&[1., 1., 1., 1., 1., 0.], n, t);
        let old = t2(&[-1.1, -0.4, -2.0, -0.2, -0.7, -1.0], n, t);
        let seq = Tensor::from_slice(&[0.5f32, -1.5], n, &Device::Cpu).unwrap();
        let tok = t2(&[0.5, 0.5, 0.5, -1.5, -1.5, -1.5], n, t);
        let cfg = LossConfig {
            loss_type: LossType::Dapo,
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            beta: 0.0,
            max_completion_length: 4,
            ..Default::default()
        };
        let run = |adv: &Tensor| {
            let inp = LossInputs {
                logp: logp.as_tensor(),
                old_logp: Some(&old),
                ref_logp: None,
                advantages: adv,
                mask: &mask,
                entropies: None,
                is_weight: None,
                normalizer: LossNormalizer::single(5.0),
            };
            let out = grpo_loss(&inp, &cfg).unwrap();
            let g = out.loss.backward().unwrap();
            let grad: Vec<f32> = g
                .get(&logp)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            (out.loss.to_scalar::<f32>().unwrap(), grad)
        };
        assert_eq!(run(&seq), run(&tok));
        let zero_first = t2(&[0.0, 0.5, 0.5, -1.5, -1.5, -1.5], n, t);
        let (_, g) = run(&zero_first);
        assert_eq!(g[0], 0.0);
        assert_ne!(g[1], 0.0);
        let bad = t2(&[0.5; 4], 2, 2);
        let inp = on_policy(logp.as_tensor(), &bad, &mask, LossNormalizer::single(5.0));
        let e = grpo_loss(&inp, &cfg).unwrap_err().to_string();
        assert!(e.contains("one per token"), "{e}");
    }

    /// On-policy (`old = None`), no KL: the gradient of `grpo` is `-A_i / len_i / N / k` on
    /// active tokens, and the loss is `-mean(A) / k`.
    #[test]
    fn on_policy_grpo_gradient_is_minus_advantage_over_length() {
        let logp = Var::from_tensor(&t2(&[-1.0, -2.0, -0.5, -0.3, -0.7, -9.0], 2, 3)).unwrap();
        let mask = t2(&[1.0, 1.0, 1.0, 1.0, 0.0, 0.0], 2, 3);
        let adv = Tensor::new(&[0.5f32, -2.0], &Device::Cpu).unwrap();
        let normalizer = LossNormalizer {
            accumulation_steps: 2,
            num_items_in_batch: 4.0,
            micro_batch: None,
        };
        let out = grpo_loss(
            &on_policy(logp.as_tensor(), &adv, &mask, normalizer),
            &LossConfig {
                loss_type: LossType::Grpo,
                ..Default::default()
            },
        )
        .unwrap();
        let loss = out.loss.to_scalar::<f32>().unwrap();
        assert!((loss - (-(0.5 - 2.0) / 2.0 / 2.0)).abs() < 1e-6, "{loss}");
        let g = out.loss.backward().unwrap();
        let g = g.get(logp.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        let a = -0.5 / 3.0 / 4.0;
        let b = 2.0 / 1.0 / 4.0;
        assert_eq!(g, vec![vec![a, a, a], vec![b, 0.0, 0.0]]);
        assert_eq!(out.stats.kl, None);
        assert_eq!(
            (out.stats.clip.unwrap().region, out.stats.tokens),
            (0.0, 4.0)
        );
    }

    /// The gradient of `[N, T]` logp under `cfg`, with `old` and advantages `adv`.
    fn grad_of(cfg: &LossConfig, logp: &[f32], old: &[f32], adv: &[f32]) -> Vec<f32> {
        let n = adv.len();
        let t = logp.len() / n;
        let lp = Var::from_tensor(&t2(logp, n, t)).unwrap();
        let old = t2(old, n, t);
        let adv = Tensor::from_slice(adv, n, &Device::Cpu).unwrap();
        let mask = t2(&vec![1.0; n * t], n, t);
        let out = grpo_loss(
            &LossInputs {
                logp: lp.as_tensor(),
                old_logp: Some(&old),
                ref_logp: None,
                advantages: &adv,
                mask: &mask,
                entropies: None,
                is_weight: None,
                normalizer: LossNormalizer::single((n * t) as f64),
            },
            cfg,
        )
        .unwrap();
        let g = out.loss.backward().unwrap();
        g.get(&lp)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// A token whose ratio ran past `1 + epsilon_high` with `A > 0`: PPO's clip stops its
    /// gradient, CISPO keeps it (weight `min(r, eps_max)`); a token with `A < 0` whose ratio ran
    /// past `delta` loses its gradient only under two-sided clipping. On-policy, SAPO's
    /// gradient is PPO's (`-A / tokens`).
    #[test]
    fn cispo_keeps_clipped_gradients_delta_caps_and_sapo_is_ppo_on_policy() {
        let r = 1.6f32.ln(); // ratio 1.6
        let (logp, old) = ([r, 0.0], [0.0, 0.0]);
        let dapo = LossConfig::default();
        assert_eq!(grad_of(&dapo, &logp, &old, &[1.0])[0], 0.0);
        let cispo = LossConfig {
            loss_type: LossType::Cispo,
            epsilon_high: 5.0,
            ..dapo
        };
        let g = grad_of(&cispo, &logp, &old, &[1.0]);
        assert!(
            (g[0] + 1.6 / 2.0).abs() < 1e-6 && (g[1] + 0.5).abs() < 1e-6,
            "{g:?}"
        );
        let g = grad_of(&dapo, &logp, &old, &[-1.0]);
        assert!((g[0] - 1.6 / 2.0).abs() < 1e-6, "{g:?}");
        let two_sided = LossConfig {
            delta: Some(1.5),
            ..dapo
        };
        assert_eq!(grad_of(&two_sided, &logp, &old, &[-1.0])[0], 0.0);
        let sapo = LossConfig {
            loss_type: LossType::Sapo,
            ..dapo
        };
        let on = [-1.0, -2.0];
        let g_sapo = grad_of(&sapo, &on, &on, &[0.7]);
        let g_grpo = grad_of(
            &LossConfig {
                loss_type: LossType::Grpo,
                ..dapo
            },
            &on,
            &on,
            &[0.7],
        );
        assert_eq!(g_sapo, g_grpo);
    }

    #[test]
    fn errors_name_the_problem() {
        let logp = t2(&[-1.0; 6], 2, 3);
        let mask = t2(&[1.0; 6], 2, 3);
        let adv = Tensor::new(&[1.0f32, -1.0], &Device::Cpu).unwrap();
        let inp = on_policy(&logp, &adv, &mask, LossNormalizer::single(6.0));
        let kl_cfg = LossConfig {
            beta: 0.04,
            ..Default::default()
        };
        let e = grpo_loss(&inp, &kl_cfg).unwrap_err().to_string();
        assert!(e.contains("needs ref_logp"), "{e}");
        let mask_cfg = LossConfig {
            top_entropy_quantile: 0.2,
            ..Default::default()
        };
        let e = grpo_loss(&inp, &mask_cfg).unwrap_err().to_string();
        assert!(e.contains("needs the per-token entropies"), "{e}");
        let bad_mask = t2(&[1.0; 6], 3, 2);
        let bad_adv = Tensor::new(&[1.0f32], &Device::Cpu).unwrap();
        let no_accumulation = LossNormalizer {
            accumulation_steps: 0,
            num_items_in_batch: 1.0,
            micro_batch: None,
        };
        let too_small = LossNormalizer {
            micro_batch: Some(MicroBatchSize {
                rows: 1,
                tokens: 6.0,
            }),
            ..inp.normalizer
        };
        for (bad, want) in [
            (
                LossInputs {
                    mask: &bad_mask,
                    ..inp
                },
                "mask is [3, 2]",
            ),
            (
                LossInputs {
                    advantages: &bad_adv,
                    ..inp
                },
                "advantages is [1]",
            ),
            (
                LossInputs {
                    normalizer: no_accumulation,
                    ..inp
                },
                "accumulation_steps",
            ),
            (
                LossInputs {
                    normalizer: too_small,
                    ..inp
                },
                "smaller than the rows given",
            ),
        ] {
            let e = grpo_loss(&bad, &LossConfig::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    /// `(loss, gradient [N, T])` of `rows` of a fixed off-policy case (f64, ragged mask,
    /// importance-sampling weights), rows 1 and 3 with advantage 0, normalised as `whole`.
    fn case_loss(
        cfg: &LossConfig,
        rows: &[usize],
        whole: Option<MicroBatchSize>,
    ) -> (f64, Vec<Vec<f64>>) {
        let t = 3;
        let pick = |v: &[f64], w: usize| -> Tensor {
            let x: Vec<f64> = rows
                .iter()
                .flat_map(|&i| v[i * w..(i + 1) * w].to_vec())
                .collect();
            Tensor::from_vec(x, (rows.len(), w), &Device::Cpu).unwrap()
        };
        let logp: Vec<f64> = (0..12).map(|i| -0.2 - 0.31 * (i % 5) as f64).collect();
        let old: Vec<f64> = (0..12)
            .map(|i| logp[i] + 0.3 * (i % 3) as f64 - 0.3)
            .collect();
        let refp: Vec<f64> = (0..12).map(|i| logp[i] - 0.1).collect();
        let mask = [1., 1., 1., 1., 0., 0., 1., 1., 0., 1., 1., 1.];
        let isw: Vec<f64> = (0..12).map(|i| 0.5 + 0.1 * i as f64).collect();
        let adv = [0.9, 0.0, -1.3, 0.0];
        let lp = Var::from_tensor(&pick(&logp, t)).unwrap();
        let (old, refp, mask, isw) = (pick(&old, t), pick(&refp, t), pick(&mask, t), pick(&isw, t));
        let adv = pick(&adv, 1).flatten_all().unwrap();
        let out = grpo_loss(
            &LossInputs {
                logp: lp.as_tensor(),
                old_logp: Some(&old),
                ref_logp: Some(&refp),
                advantages: &adv,
                mask: &mask,
                entropies: None,
                is_weight: Some(&isw),
                normalizer: LossNormalizer {
                    accumulation_steps: 2,
                    num_items_in_batch: 12.0,
                    micro_batch: whole,
                },
            },
            cfg,
        )
        .unwrap();
        let g = out.loss.backward().unwrap();
        let g = g.get(lp.as_tensor()).unwrap().to_vec2().unwrap();
        (out.loss.to_scalar().unwrap(), g)
    }

    /// Every loss type at both ratio levels: the rows with advantage 0 get a gradient of
    /// exactly 0 without a KL term, and leaving them out (the whole micro-batch's rows and
    /// tokens in `micro_batch`) gives the same loss and the same gradient on the other rows.
    /// With a KL term their gradient is not 0.
    #[test]
    fn leaving_out_zero_advantage_rows_changes_nothing() {
        let whole = Some(MicroBatchSize {
            rows: 4,
            tokens: 9.0,
        });
        for loss_type in LossType::TOKEN_LOSSES {
            for level in [
                ImportanceSamplingLevel::Token,
                ImportanceSamplingLevel::Sequence,
            ] {
                let cfg = LossConfig {
                    loss_type,
                    importance_sampling_level: level,
                    epsilon_high: if loss_type == LossType::Cispo {
                        5.0
                    } else {
                        0.28
                    },
                    max_completion_length: 4,
                    ..Default::default()
                };
                let what = format!("{loss_type} {level}");
                let (loss, g) = case_loss(&cfg, &[0, 1, 2, 3], None);
                assert_eq!((g[1].clone(), g[3].clone()), (vec![0.0; 3], vec![0.0; 3]));
                let (kept, gk) = case_loss(&cfg, &[0, 2], whole);
                assert!((loss - kept).abs() < 1e-14, "{what}: {loss} vs {kept}");
                assert!(loss != 0.0 && g[0].iter().any(|&x| x != 0.0), "{what}");
                for (a, b) in [(&g[0], &gk[0]), (&g[2], &gk[1])] {
                    let d = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    assert!(d < 1e-14, "{what}: {a:?} vs {b:?}");
                }
                let kl = LossConfig { beta: 0.04, ..cfg };
                let (_, g) = case_loss(&kl, &[0, 1, 2, 3], None);
                assert!(g[1].iter().any(|&x| x != 0.0), "{what}: KL gradient");
            }
        }
    }

    #[test]
    fn masked_mean_per_row_clamps_empty_rows() {
        let x = t2(&[1.0, 3.0, 5.0, 7.0], 2, 2);
        let m = t2(&[1.0, 1.0, 0.0, 0.0], 2, 2);
        let r = masked_mean_per_row(&x, &m)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(r, vec![2.0, 0.0]);
    }
}
