//! The GRPO policy loss: PPO's clipped surrogate on per-token importance ratios, an optional k3
//! KL penalty to a reference policy, and an aggregation over tokens chosen by [`LossType`].
//!
//! Per token `(i, t)` of completion `i` (TRL `_compute_loss`, `importance_sampling_level =
//! "token"`; GRPO, DeepSeekMath arXiv:2402.03300, eq. 3):
//!
//! ```text
//! r       = exp(logp - old_logp)                          importance ratio
//! l_pg    = -min(r * A_i, clip(r, 1 - eps_low, 1 + eps_high) * A_i)
//! kl      = exp(ref - logp) - (ref - logp) - 1            k3 estimator, >= 0
//! l       = l_pg + beta * kl                              (kl only when beta != 0)
//! ```
//!
//! then `l` is summed over the completion tokens (`mask`) and normalised per [`LossType`].
//! `eps_high > eps_low` is DAPO's "clip-higher" (arXiv:2503.14476).

use std::fmt;
use std::str::FromStr;

use candle_core::{bail, DType, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::UnknownVariant;
use crate::config::ConfigError;

/// How the per-token losses of a micro-batch are reduced to one number (TRL's `loss_type`).
///
/// With `N` completions in the micro-batch, `m` the completion mask, `l` the per-token loss and
/// `k` the gradient-accumulation steps of one optimiser step:
///
/// | type      | loss                                                  | split-invariant |
/// |-----------|-------------------------------------------------------|-----------------|
/// | `grpo`    | `mean_i( sum_t m l / max(sum_t m, 1) ) / k`           | yes (*)         |
/// | `bnpo`    | `sum m l / max(sum m, 1) / k`                         | no              |
/// | `dr_grpo` | `sum m l / (N * max_completion_length) / k`           | yes (*)         |
/// | `dapo`    | `sum m l / max(num_items_in_batch, 1)`                | yes             |
///
/// "Split-invariant": summing the losses (and gradients) of the `k` micro-batches of a split
/// optimiser step gives the loss of the whole step computed at once with `k = 1`. (*) When the
/// micro-batches hold equally many completions, as they do in GRPO (`grpo` is a mean of per-row
/// means, `dr_grpo` divides by a row count). `bnpo` normalises by the micro-batch's own token
/// count, so its result depends on how the tokens fall into micro-batches. `dapo` divides by
/// the token count of the whole step, which the caller passes in [`LossNormalizer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    /// Per-sequence token mean, then mean over sequences (GRPO, DeepSeekMath). Tokens of short
    /// completions weigh more: biased towards short right answers and long wrong ones.
    Grpo,
    /// Token mean over the micro-batch (named after BNPO, "Beta Normalization Policy
    /// Optimization", arXiv:2506.02864; TRL's `bnpo` is only its batch-token normalisation).
    Bnpo,
    /// Token sum divided by the constant `N * max_completion_length` (Dr. GRPO, "Understanding
    /// R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783): no length bias.
    DrGrpo,
    /// Token sum divided by the number of completion tokens of the whole optimiser step (DAPO,
    /// "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476):
    /// every token weighs the same. TRL's default.
    #[default]
    Dapo,
}

impl LossType {
    /// The config names, in declaration order.
    pub const NAMES: &'static [&'static str] = &["grpo", "bnpo", "dr_grpo", "dapo"];

    /// Every variant, in declaration order.
    pub const ALL: [LossType; 4] = [
        LossType::Grpo,
        LossType::Bnpo,
        LossType::DrGrpo,
        LossType::Dapo,
    ];

    /// The config name (`"grpo"`, `"bnpo"`, `"dr_grpo"`, `"dapo"`).
    pub fn as_str(self) -> &'static str {
        match self {
            LossType::Grpo => "grpo",
            LossType::Bnpo => "bnpo",
            LossType::DrGrpo => "dr_grpo",
            LossType::Dapo => "dapo",
        }
    }
}

impl fmt::Display for LossType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LossType {
    type Err = UnknownVariant;

    /// Parses a config name (case-insensitive, surrounding spaces ignored).
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        LossType::ALL
            .into_iter()
            .find(|t| t.as_str() == lower)
            .ok_or_else(|| UnknownVariant::new("loss_type", s, Self::NAMES))
    }
}

/// Loss settings (TRL names: `epsilon` is `epsilon_low`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    /// Aggregation over tokens; default `dapo` (TRL's default).
    pub loss_type: LossType,
    /// Lower clip: ratios below `1 - epsilon_low` stop pushing down negative-advantage tokens
    /// (TRL `epsilon`, default 0.2).
    pub epsilon_low: f64,
    /// Upper clip: ratios above `1 + epsilon_high` stop pushing up positive-advantage tokens
    /// (TRL `epsilon_high`, defaults to `epsilon`; DAPO recommends 0.28).
    pub epsilon_high: f64,
    /// Weight of the k3 KL penalty to the reference policy; 0 (TRL's default) needs no
    /// reference log-probs. DeepSeek-R1 used 0.001, the GRPO paper 0.04.
    pub beta: f64,
    /// Longest completion in tokens; the `dr_grpo` normaliser. Must be >= the `T` of the inputs
    /// to mean what Dr. GRPO means (not checked: TRL does not check it either).
    pub max_completion_length: usize,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            loss_type: LossType::Dapo,
            epsilon_low: 0.2,
            epsilon_high: 0.2,
            beta: 0.0,
            max_completion_length: 512,
        }
    }
}

impl LossConfig {
    /// Checks `epsilon_low, epsilon_high >= 0`, `beta >= 0` (all finite) and
    /// `max_completion_length >= 1`. A huge epsilon (e.g. 1e9) turns clipping off.
    pub fn validate(&self) -> std::result::Result<(), ConfigError> {
        for (k, v) in [
            ("epsilon", self.epsilon_low),
            ("epsilon_high", self.epsilon_high),
            ("beta", self.beta),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::Invalid(format!(
                    "{k} = {v} must be finite and >= 0"
                )));
            }
        }
        if self.max_completion_length == 0 {
            return Err(ConfigError::Invalid(
                "max_completion_length must be >= 1".into(),
            ));
        }
        Ok(())
    }
}

/// What the loss is normalised by beyond the micro-batch itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossNormalizer {
    /// Micro-batches per optimiser step (TRL `current_gradient_accumulation_steps`; 1 in eval).
    /// Divides `grpo`, `bnpo` and `dr_grpo`; `dapo` ignores it.
    pub accumulation_steps: usize,
    /// `dapo` only: the number of active completion tokens (`sum mask`) of the whole optimiser
    /// step, summed over all its accumulation micro-batches (and processes). TRL computes it per
    /// generation batch and rescales by `accumulation_steps / steps_per_generation`, which is
    /// the same number in the usual `steps_per_generation == gradient_accumulation_steps` setup.
    /// Clamped to at least 1.
    pub num_items_in_batch: f64,
}

impl LossNormalizer {
    /// No accumulation: the micro-batch is the whole step; `tokens` is its `sum mask`.
    pub fn single(tokens: f64) -> Self {
        LossNormalizer {
            accumulation_steps: 1,
            num_items_in_batch: tokens,
        }
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
    /// Accumulation steps and, for `dapo`, the step's token count.
    pub normalizer: LossNormalizer,
}

/// Diagnostics of one loss call; masked means over the micro-batch's tokens (TRL's metrics
/// before their cross-process reduction), each `sum(x * mask) / max(sum mask, 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossStats {
    /// Mean k3 KL to the reference policy (TRL `kl`); `None` when `beta == 0`.
    pub kl: Option<f64>,
    /// Fraction of tokens with `r < 1 - eps_low` and `A < 0` (TRL `clip_ratio/low_mean`).
    pub clip_low: f64,
    /// Fraction of tokens with `r > 1 + eps_high` and `A > 0` (TRL `clip_ratio/high_mean`).
    pub clip_high: f64,
    /// `clip_low + clip_high`: tokens whose surrogate is clipped and so get no policy gradient
    /// (TRL `clip_ratio/region_mean`).
    pub clip_region: f64,
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

/// The GRPO loss of one micro-batch (shapes in [`LossInputs`]; the formula and the
/// aggregations in the module docs and [`LossType`]).
///
/// Computes in the dtype of `logp` (f32 in training; f64 works too), converting the other
/// inputs to it. The surrogate is written as `-A * where(clipped, clip(r).detach(), r)` with
/// `clipped` TRL's `is_region_clipped` (`r < 1 - eps_low, A < 0` or `r > 1 + eps_high, A > 0`):
/// the same value as `-min(r A, clip(r) A)`, and the same gradient, `-r A` where not clipped and
/// 0 where clipped, also exactly at the clip bounds, where candle's `min`/`clamp` would split
/// the gradient of a tie in halves.
///
/// Errors on shape mismatches, on `beta != 0` without `ref_logp`, on `accumulation_steps == 0`,
/// on an empty batch and on `max_completion_length == 0`.
pub fn grpo_loss(inp: &LossInputs, cfg: &LossConfig) -> Result<LossOutput> {
    let logp = inp.logp;
    let dtype = logp.dtype();
    let (n, t) = logp.dims2()?;
    if n == 0 {
        bail!("grpo_loss: empty batch (logp is [0, {t}])");
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
    let adv = match inp.advantages.dims() {
        [a] if *a == n => inp
            .advantages
            .to_dtype(dtype)?
            .reshape((n, 1))?
            .broadcast_as((n, t))?,
        [a, b] if *a == n && *b == t => inp.advantages.to_dtype(dtype)?,
        d => bail!(
            "grpo_loss: advantages is {d:?}, expected [{n}] (one per completion) or [{n}, {t}] \
             (one per token)"
        ),
    };
    let old = match inp.old_logp {
        Some(o) => same("old_logp", o)?.detach(),
        None => logp.detach(),
    };

    // Clipped surrogate.
    let ratio = logp.sub(&old)?.exp()?;
    let (lo, hi) = (1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high);
    let low = ratio.lt(lo)?.mul(&adv.lt(0.0)?)?; // u8 indicators
    let high = ratio.gt(hi)?.mul(&adv.gt(0.0)?)?;
    let region = low.add(&high)?; // disjoint: A < 0 vs A > 0
    let clipped = ratio.detach().clamp(lo, hi)?;
    let coef = region.where_cond(&clipped, &ratio)?;
    let mut per_token = coef.mul(&adv)?.neg()?;

    // k3 KL to the reference policy.
    let kl = if cfg.beta != 0.0 {
        let Some(r) = inp.ref_logp else {
            bail!(
                "grpo_loss: beta = {} needs ref_logp (reference log-probs); set beta = 0 to \
                 train without a reference model",
                cfg.beta
            );
        };
        let d = same("ref_logp", r)?.detach().sub(logp)?;
        let kl = ((d.exp()? - &d)? - 1.0)?;
        per_token = (per_token + kl.affine(cfg.beta, 0.0)?)?;
        Some(kl)
    } else {
        None
    };

    let tokens = scalar(&mask.sum_all()?)?;
    let masked_sum = || per_token.mul(&mask)?.sum_all();
    let k = norm.accumulation_steps as f64;
    let loss = match cfg.loss_type {
        LossType::Grpo => masked_mean_per_row(&per_token, &mask)?
            .mean(0)?
            .affine(1.0 / k, 0.0)?,
        LossType::Bnpo => masked_sum()?.affine(1.0 / (tokens.max(1.0) * k), 0.0)?,
        LossType::DrGrpo => {
            let denom = (n * cfg.max_completion_length) as f64 * k;
            masked_sum()?.affine(1.0 / denom, 0.0)?
        }
        LossType::Dapo => masked_sum()?.affine(1.0 / norm.num_items_in_batch.max(1.0), 0.0)?,
    };

    let denom = tokens.max(1.0);
    let masked_mean = |x: &Tensor| -> Result<f64> {
        Ok(scalar(&x.detach().to_dtype(dtype)?.mul(&mask)?.sum_all()?)? / denom)
    };
    let stats = LossStats {
        kl: kl.as_ref().map(masked_mean).transpose()?,
        clip_low: masked_mean(&low)?,
        clip_high: masked_mean(&high)?,
        clip_region: masked_mean(&region)?,
        tokens,
    };
    Ok(LossOutput { loss, stats })
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
        };
        let run = |adv: &Tensor| {
            let inp = LossInputs {
                logp: logp.as_tensor(),
                old_logp: Some(&old),
                ref_logp: None,
                advantages: adv,
                mask: &mask,
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
        let inp = LossInputs {
            logp: logp.as_tensor(),
            old_logp: None,
            ref_logp: None,
            advantages: &bad,
            mask: &mask,
            normalizer: LossNormalizer::single(5.0),
        };
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
        let out = grpo_loss(
            &LossInputs {
                logp: logp.as_tensor(),
                old_logp: None,
                ref_logp: None,
                advantages: &adv,
                mask: &mask,
                normalizer: LossNormalizer {
                    accumulation_steps: 2,
                    num_items_in_batch: 4.0,
                },
            },
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
        assert_eq!((out.stats.clip_region, out.stats.tokens), (0.0, 4.0));
    }

    #[test]
    fn errors_name_the_problem() {
        let logp = t2(&[-1.0; 6], 2, 3);
        let mask = t2(&[1.0; 6], 2, 3);
        let adv = Tensor::new(&[1.0f32, -1.0], &Device::Cpu).unwrap();
        let inp = LossInputs {
            logp: &logp,
            old_logp: None,
            ref_logp: None,
            advantages: &adv,
            mask: &mask,
            normalizer: LossNormalizer::single(6.0),
        };
        let kl_cfg = LossConfig {
            beta: 0.04,
            ..Default::default()
        };
        let e = grpo_loss(&inp, &kl_cfg).unwrap_err().to_string();
        assert!(e.contains("needs ref_logp"), "{e}");
        let bad_mask = t2(&[1.0; 6], 3, 2);
        let e = grpo_loss(
            &LossInputs {
                mask: &bad_mask,
                ..inp
            },
            &LossConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("mask is [3, 2]"), "{e}");
        let bad_adv = Tensor::new(&[1.0f32], &Device::Cpu).unwrap();
        let e = grpo_loss(
            &LossInputs {
                advantages: &bad_adv,
                ..inp
            },
            &LossConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("advantages is [1]"), "{e}");
        let e = grpo_loss(
            &LossInputs {
                normalizer: LossNormalizer {
                    accumulation_steps: 0,
                    num_items_in_batch: 1.0,
                },
                ..inp
            },
            &LossConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("accumulation_steps"), "{e}");
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

    #[test]
    fn names_parse_and_serialise() {
        for lt in LossType::ALL {
            assert_eq!(lt.as_str().parse::<LossType>().unwrap(), lt);
            let json = serde_json::to_string(&lt).unwrap();
            assert_eq!(json, format!("\"{lt}\""));
            assert_eq!(serde_json::from_str::<LossType>(&json).unwrap(), lt);
        }
        assert_eq!("DR_GRPO".parse::<LossType>(), Ok(LossType::DrGrpo));
        let e = "drgrpo".parse::<LossType>().unwrap_err().to_string();
        assert!(
            e.contains("unknown loss_type `drgrpo`")
                && e.contains("did you mean `dr_grpo`?")
                && e.contains("grpo, bnpo, dr_grpo, dapo"),
            "{e}"
        );
        let cfg: LossConfig = serde_json::from_str(r#"{"loss_type": "dr_grpo"}"#).unwrap();
        assert_eq!(cfg.loss_type, LossType::DrGrpo);
        assert!(cfg.validate().is_ok());
        assert!(LossConfig { beta: -1.0, ..cfg }.validate().is_err());
    }
}
