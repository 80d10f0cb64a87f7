//! The DPO family of preference losses, as TRL 1.16's `DPOTrainer._compute_loss`
//! (`trl/trainer/dpo_trainer.py`, lines 1349-1528), over per-sequence summed completion
//! log-probs:
//!
//! ```text
//! c_i = logp_policy(chosen_i) - logp_ref(chosen_i)         (chosen log-ratio)
//! r_i = logp_policy(rejected_i) - logp_ref(rejected_i)     (rejected log-ratio)
//! d_i = c_i - r_i
//! loss = sum_k w_k * mean_i l_k(i)                          (one term per `loss_type`)
//! rewards/chosen = beta c_i, rewards/rejected = beta r_i    (detached)
//! ```
//!
//! Every `l_k` of TRL's list is here ([`DpoLossType`]); the log-probs are sums over the
//! completion tokens only ([`sequence_logps`], `dpo_trainer.py:1304`). [`dpo_loss`] returns the
//! per-pair weighted losses so a trainer divides their sum by the pairs of the whole optimiser
//! step (TRL's mean per micro-batch averaged over equal micro-batches). `aot`, `aot_unpaired`
//! and `sft` couple the pairs of a batch (sorting, a token mean), so theirs are per-pair shares
//! whose mean is TRL's batch value.
//!
//! Not here (TRL options rlft does not take): `f_divergence_type` other than `reverse_kl`,
//! `use_weighting` (WPO) and `ld_alpha` (LD-DPO), which need per-token quantities.
//!
//! `-log sigmoid(x)` is `logsumexp(0, -x)`, finite for any finite `x`.
//!
//! Papers: DPO (Rafailov et al. 2023, arXiv:2305.18290), IPO (Azar et al. 2023,
//! arXiv:2310.12036), hinge (SLiC, Zhao et al. 2023, arXiv:2305.10425), robust DPO (Chowdhury et
//! al. 2024, arXiv:2403.00409), EXO (Ji et al. 2024, arXiv:2402.00856), NCA (Chen et al. 2024,
//! arXiv:2402.05369), BCO (Jung et al. 2024, arXiv:2404.04656), SPPO (Wu et al. 2024,
//! arXiv:2405.00675), AOT (Melnyk et al. 2024, arXiv:2406.05882), APO (D'Oosterlinck et al.
//! 2024, arXiv:2408.06266), DiscoPOP (Chris Lu et al. 2024, arXiv:2406.08414).

use super::config_names;

use candle_core::{bail, DType, Result, Tensor};
use serde::{Deserialize, Serialize};

/// One DPO loss (TRL's `loss_type` values, `dpo_trainer.py:1386-1526`). `beta` is `b`,
/// `label_smoothing` is `e`, `c`, `r`, `d` as in the module docs, `n_c`, `n_r` the completion
/// token counts, `ls(x) = log sigmoid(x)`, `s(x) = sigmoid(x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoLossType {
    /// `-ls(b d)`: DPO's Bradley-Terry loss (TRL's default).
    Sigmoid,
    /// `relu(1 - b d)`: SLiC's hinge loss.
    Hinge,
    /// `(c / n_c - r / n_r - 1 / (2 b))^2`: IPO on per-token mean log-ratios (TRL normalises by
    /// the completion lengths, as the IPO authors did; without lengths, the plain sums).
    Ipo,
    /// EXO-pref: `s(b d)(ls(b d) - log(1 - e)) + s(-b d)(ls(-b d) - log e)`; needs `e > 0`.
    ExoPair,
    /// NCA: `-ls(b c) - ls(-b c) / 2 - ls(-b r) / 2`.
    NcaPair,
    /// Robust DPO: `(-(1 - e) ls(b d) + e ls(-b d)) / (1 - 2 e)`, `e` in `[0, 0.5)`.
    Robust,
    /// BCO on pairs: `-ls(b c) - ls(-b r)`.
    BcoPair,
    /// SPPO (hard labels): `(c - 1 / (2 b))^2 + (r + 1 / (2 b))^2`.
    SppoHard,
    /// AOT: `-(1 - e) ls(b x) - e ls(-b x)` with `x` the sorted policy log-ratios
    /// `logp_c - logp_r` minus the sorted reference ones (the batch couples the pairs).
    Aot,
    /// AOT unpaired: as `aot` with `x` the sorted `c` minus the sorted `r`.
    AotUnpaired,
    /// APO-zero: `1 - s(b c) + s(b r)`: raise chosen, lower rejected.
    ApoZero,
    /// APO-down: `s(b c) + 1 - s(b d)`: lower both, rejected more.
    ApoDown,
    /// DiscoPOP: `-ls(b d) (1 - m) + exp(-b d) m` with `m = s(b d / discopop_tau)`.
    Discopop,
    /// The negative log-likelihood of the chosen completions, a token mean over the batch
    /// (each pair's share is `-logp_c * n / sum n_c`).
    Sft,
    /// `-ls(b (c / n_c - r / n_r))`: sigmoid on per-token mean log-ratios.
    SigmoidNorm,
}

config_names!(DpoLossType, "loss_type", {
    Sigmoid => "sigmoid",
    Hinge => "hinge",
    Ipo => "ipo",
    ExoPair => "exo_pair",
    NcaPair => "nca_pair",
    Robust => "robust",
    BcoPair => "bco_pair",
    SppoHard => "sppo_hard",
    Aot => "aot",
    AotUnpaired => "aot_unpaired",
    ApoZero => "apo_zero",
    ApoDown => "apo_down",
    Discopop => "discopop",
    Sft => "sft",
    SigmoidNorm => "sigmoid_norm",
});

impl DpoLossType {
    /// Whether the loss reads the completion lengths.
    pub fn needs_lengths(self) -> bool {
        matches!(
            self,
            DpoLossType::SigmoidNorm | DpoLossType::Sft | DpoLossType::Ipo
        )
    }
}

/// The settings of [`dpo_loss`] (TRL's `DPOConfig` names).
#[derive(Debug, Clone, PartialEq)]
pub struct DpoLossConfig {
    /// `beta`: the strength of the implicit KL to the reference (IPO's `tau`).
    pub beta: f64,
    /// `(loss_type, loss_weight)` pairs, summed (TRL's `loss_type` list with `loss_weights`).
    pub losses: Vec<(DpoLossType, f64)>,
    /// `label_smoothing`: `robust`'s flip probability, EXO's `e`, AOT's smoothing.
    pub label_smoothing: f64,
    /// `discopop_tau`: DiscoPOP's temperature.
    pub discopop_tau: f64,
}

impl Default for DpoLossConfig {
    /// TRL's defaults: `beta = 0.1`, `["sigmoid"]`, no smoothing, `discopop_tau = 0.05`.
    fn default() -> Self {
        DpoLossConfig {
            beta: 0.1,
            losses: vec![(DpoLossType::Sigmoid, 1.0)],
            label_smoothing: 0.0,
            discopop_tau: 0.05,
        }
    }
}

/// One `[n]` tensor for the chosen and one for the rejected completions of `n` pairs.
#[derive(Debug, Clone, Copy)]
pub struct ChosenRejected<'a> {
    /// `[n]` of the chosen completions.
    pub chosen: &'a Tensor,
    /// `[n]` of the rejected completions.
    pub rejected: &'a Tensor,
}

/// The summed completion log-probs of `n` pairs, each `[n]` of one float dtype (TRL's
/// `chosen_logps`, `rejected_logps`, `ref_chosen_logps`, `ref_rejected_logps`).
#[derive(Debug, Clone, Copy)]
pub struct DpoLogps<'a> {
    /// The policy's log-probs: differentiable.
    pub policy: ChosenRejected<'a>,
    /// The reference's log-probs: treated as constants.
    pub reference: ChosenRejected<'a>,
    /// The completions' token counts: needed by `sigmoid_norm` and `sft`; `ipo` divides by them
    /// when given (TRL's `DPOTrainer`) and uses the plain sums without (TRL's
    /// `OnlineDPOTrainer`).
    pub lens: Option<ChosenRejected<'a>>,
}

impl<'a> DpoLogps<'a> {
    /// The four log-prob sums of `n` pairs, without lengths (TRL's `OnlineDPOTrainer`).
    pub fn sums(policy: (&'a Tensor, &'a Tensor), reference: (&'a Tensor, &'a Tensor)) -> Self {
        let pair = |(chosen, rejected)| ChosenRejected { chosen, rejected };
        DpoLogps {
            policy: pair(policy),
            reference: pair(reference),
            lens: None,
        }
    }

    /// These sums with the pairs' token counts (TRL's `DPOTrainer`).
    pub fn with_lens(self, chosen: &'a Tensor, rejected: &'a Tensor) -> Self {
        DpoLogps {
            lens: Some(ChosenRejected { chosen, rejected }),
            ..self
        }
    }
}

/// What [`dpo_loss`] returns.
#[derive(Debug, Clone)]
pub struct DpoLossOutput {
    /// `[n]` per-pair loss, the weighted sum over the configured types; its mean is TRL's loss.
    pub losses: Tensor,
    /// `[n]` `beta * (policy_chosen - ref_chosen)`, detached (TRL's `rewards/chosen`).
    pub chosen_rewards: Tensor,
    /// `[n]` `beta * (policy_rejected - ref_rejected)`, detached (TRL's `rewards/rejected`).
    pub rejected_rewards: Tensor,
}

/// `log sigmoid(x)` as `-logsumexp(0, -x)`: stable for any finite `x`.
fn log_sigmoid(x: &Tensor) -> Result<Tensor> {
    let z = Tensor::stack(&[x.zeros_like()?, x.neg()?], 1)?;
    z.log_sum_exp(1)?.neg()
}

fn sigmoid(x: &Tensor) -> Result<Tensor> {
    log_sigmoid(x)?.exp()
}

/// `x` sorted ascending along its one dimension (differentiable: a gather by the detached order).
fn sorted(x: &Tensor) -> Result<Tensor> {
    let order = x
        .detach()
        .unsqueeze(0)?
        .arg_sort_last_dim(true)?
        .squeeze(0)?;
    x.index_select(&order, 0)
}

/// The per-pair loss of one type (TRL `dpo_trainer.py:1386-1526`).
fn one_loss(
    t: DpoLossType,
    cfg: &DpoLossConfig,
    x: &DpoLogps<'_>,
    c: &Tensor,
    r: &Tensor,
) -> Result<Tensor> {
    let (b, e) = (cfg.beta, cfg.label_smoothing);
    let d = (c - r)?;
    let bd = (&d * b)?;
    let lens = || -> Result<(Tensor, Tensor)> {
        let Some(l) = x.lens else {
            bail!("dpo_loss: loss_type `{t}` needs the completion lengths")
        };
        let f = |l: &Tensor| l.to_dtype(c.dtype())?.clamp(1.0, f64::INFINITY);
        Ok((f(l.chosen)?, f(l.rejected)?))
    };
    let aot = |delta: Tensor| -> Result<Tensor> {
        let bx = (delta * b)?;
        (log_sigmoid(&bx)? * -(1.0 - e))? - (log_sigmoid(&bx.neg()?)? * e)?
    };
    match t {
        DpoLossType::Sigmoid => log_sigmoid(&bd)?.neg(),
        DpoLossType::Hinge => (1.0 - bd)?.relu(),
        DpoLossType::Ipo => {
            let delta = match x.lens {
                None => d,
                Some(_) => {
                    let (lc, lr) = lens()?;
                    ((c / lc)? - (r / lr)?)?
                }
            };
            (delta - 1.0 / (2.0 * b))?.sqr()
        }
        DpoLossType::ExoPair => {
            let (lw, ll) = (log_sigmoid(&bd)?, log_sigmoid(&bd.neg()?)?);
            let a = (lw.exp()? * (&lw - (-e).ln_1p())?)?;
            a + (ll.exp()? * (&ll - e.ln())?)?
        }
        DpoLossType::NcaPair => {
            let (bc, br) = ((c * b)?, (r * b)?);
            let l = (log_sigmoid(&bc)?.neg()? - (log_sigmoid(&bc.neg()?)? * 0.5)?)?;
            l - (log_sigmoid(&br.neg()?)? * 0.5)?
        }
        DpoLossType::Robust => {
            let clean = (log_sigmoid(&bd)? * -(1.0 - e))?;
            let flipped = (log_sigmoid(&bd.neg()?)? * -e)?;
            (clean - flipped)? / (1.0 - 2.0 * e)
        }
        DpoLossType::BcoPair => {
            let (bc, br) = ((c * b)?, (r * b)?);
            log_sigmoid(&bc)?.neg()? - log_sigmoid(&br.neg()?)?
        }
        DpoLossType::SppoHard => {
            let w = (c - 0.5 / b)?.sqr()?;
            w + (r + 0.5 / b)?.sqr()?
        }
        DpoLossType::Aot => {
            let pol = (x.policy.chosen - x.policy.rejected)?;
            let refr = (x.reference.chosen - x.reference.rejected)?.to_dtype(pol.dtype())?;
            aot((sorted(&pol)? - sorted(&refr)?)?)
        }
        DpoLossType::AotUnpaired => aot((sorted(c)? - sorted(r)?)?),
        DpoLossType::ApoZero => {
            let chosen = (1.0 - sigmoid(&(c * b)?)?)?;
            chosen + sigmoid(&(r * b)?)?
        }
        DpoLossType::ApoDown => {
            let chosen = sigmoid(&(c * b)?)?;
            chosen + (1.0 - sigmoid(&bd)?)?
        }
        DpoLossType::Discopop => {
            let m = sigmoid(&(&bd / cfg.discopop_tau)?)?;
            let logistic = log_sigmoid(&bd)?.neg()?;
            let exp = bd.neg()?.exp()?;
            (logistic * (1.0 - &m)?)? + (exp * m)?
        }
        DpoLossType::Sft => {
            let (lc, _) = lens()?;
            let n = c.dim(0)? as f64;
            let total = lc.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            (x.policy.chosen * (-n / total))?.to_dtype(c.dtype())
        }
        DpoLossType::SigmoidNorm => {
            let (lc, lr) = lens()?;
            let delta = ((c / lc)? - (r / lr)?)?;
            log_sigmoid(&(delta * b)?)?.neg()
        }
    }
}

/// The DPO losses of `n` pairs (module docs): per-pair `sum_k w_k l_k` and the detached
/// implicit rewards. All four log-prob tensors are `[n]`, `n >= 1`, of one float dtype
/// (the reference ones are cast to the policy's).
pub fn dpo_loss(x: &DpoLogps<'_>, cfg: &DpoLossConfig) -> Result<DpoLossOutput> {
    let n = x.policy.chosen.dims1()?;
    for (name, t) in [
        ("policy rejected", x.policy.rejected),
        ("reference chosen", x.reference.chosen),
        ("reference rejected", x.reference.rejected),
    ] {
        if t.dims() != [n] {
            bail!("dpo_loss: {name} is {:?}, expected [{n}]", t.dims());
        }
    }
    if n == 0 || cfg.losses.is_empty() {
        bail!("dpo_loss: no pairs or no loss_type");
    }
    let dtype = x.policy.chosen.dtype();
    let c = (x.policy.chosen - x.reference.chosen.detach().to_dtype(dtype)?)?;
    let r = (x.policy.rejected - x.reference.rejected.detach().to_dtype(dtype)?)?;
    let mut total: Option<Tensor> = None;
    for &(t, w) in &cfg.losses {
        let l = (one_loss(t, cfg, x, &c, &r)? * w)?;
        total = Some(match total {
            Some(s) => (s + l)?,
            None => l,
        });
    }
    Ok(DpoLossOutput {
        losses: total.expect("at least one loss"),
        chosen_rewards: (c.detach() * cfg.beta)?,
        rejected_rewards: (r.detach() * cfg.beta)?,
    })
}

/// Per-sequence sums `[n]` of per-token log-probs `[n, T]` over the completion tokens
/// (`mask [n, T]`, 1 on completion tokens, 0 on prompt and padding), as TRL's
/// `per_token_logps.sum(dim=1)` over its label-masked log-probs (`dpo_trainer.py:1304`).
pub fn sequence_logps(per_token: &Tensor, mask: &Tensor) -> Result<Tensor> {
    if per_token.dims() != mask.dims() || per_token.rank() != 2 {
        bail!(
            "sequence_logps: log-probs {:?} and mask {:?} must both be [n, T]",
            per_token.dims(),
            mask.dims()
        );
    }
    (per_token * mask.to_dtype(per_token.dtype())?)?.sum(1)
}

/// What TRL logs of a batch of pairs (`dpo_trainer.py:1581-1599`), as means over the pairs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DpoStats {
    /// `rewards/chosen`: mean `beta * (policy_chosen - ref_chosen)`.
    pub rewards_chosen: f64,
    /// `rewards/rejected`: mean `beta * (policy_rejected - ref_rejected)`.
    pub rewards_rejected: f64,
    /// `rewards/accuracies`: share of pairs with chosen reward strictly above rejected.
    pub rewards_accuracies: f64,
    /// `rewards/margins`: mean chosen minus rejected reward.
    pub rewards_margins: f64,
    /// `logps/chosen`: mean policy log-prob of the chosen completions.
    pub logps_chosen: f64,
    /// `logps/rejected`: mean policy log-prob of the rejected completions.
    pub logps_rejected: f64,
}

impl DpoStats {
    /// The statistics of pairs from their rewards and policy log-probs (equal lengths).
    pub fn of(chosen_rewards: &[f64], rejected_rewards: &[f64], logps: (&[f64], &[f64])) -> Self {
        let n = chosen_rewards.len().max(1) as f64;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let pairs = chosen_rewards.iter().zip(rejected_rewards);
        DpoStats {
            rewards_chosen: mean(chosen_rewards),
            rewards_rejected: mean(rejected_rewards),
            rewards_accuracies: pairs.clone().filter(|(c, r)| c > r).count() as f64 / n,
            rewards_margins: pairs.map(|(c, r)| c - r).sum::<f64>() / n,
            logps_chosen: mean(logps.0),
            logps_rejected: mean(logps.1),
        }
    }

    /// `(TRL name, value)` pairs, with `prefix` (`""` or `"eval_"`).
    pub fn named(&self, prefix: &str) -> Vec<(String, f64)> {
        [
            ("rewards/chosen", self.rewards_chosen),
            ("rewards/rejected", self.rewards_rejected),
            ("rewards/accuracies", self.rewards_accuracies),
            ("rewards/margins", self.rewards_margins),
            ("logps/chosen", self.logps_chosen),
            ("logps/rejected", self.logps_rejected),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn names_round_trip() {
        for &t in DpoLossType::ALL {
            assert_eq!(t.as_str().parse::<DpoLossType>().unwrap(), t);
            let s: DpoLossType = serde_json::from_value(t.as_str().into()).unwrap();
            assert_eq!(s, t);
        }
        let e = "sigmoïd".parse::<DpoLossType>().unwrap_err().to_string();
        assert!(e.contains("sigmoid"), "{e}");
    }

    #[test]
    fn sigmoid_at_zero_is_log2_and_rewards_are_beta_ratios() {
        let d = Device::Cpu;
        let t = |v: &[f64]| Tensor::new(v, &d).unwrap();
        let (pc, pr, rc, rr) = (t(&[-1.0]), t(&[-2.0]), t(&[-1.0]), t(&[-2.0]));
        let x = DpoLogps::sums((&pc, &pr), (&rc, &rr));
        let out = dpo_loss(&x, &DpoLossConfig::default()).unwrap();
        let l: Vec<f64> = out.losses.to_vec1().unwrap();
        assert!((l[0] - std::f64::consts::LN_2).abs() < 1e-12);
        let cfg = DpoLossConfig {
            losses: vec![(DpoLossType::Sft, 1.0)],
            ..Default::default()
        };
        assert!(dpo_loss(&x, &cfg).unwrap_err().to_string().contains("sft"));
    }
}
