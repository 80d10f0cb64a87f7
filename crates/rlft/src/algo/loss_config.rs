//! The settings of the GRPO policy loss ([`LossConfig`]) and its variants as enums: the loss
//! formulation [`LossType`] and the [`ImportanceSamplingLevel`] of the ratio. Names, meanings
//! and defaults are TRL 1.16's `GRPOConfig` (`trl/trainer/grpo_config.py`).

use super::config_names;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// The loss formulation and how per-token losses are reduced to one number (TRL's
/// `loss_type`).
///
/// With `N` completions in the micro-batch, `m` the completion mask, `l` the per-token loss and
/// `k` the gradient-accumulation steps of one optimiser step:
///
/// | type      | per-token policy loss                  | reduction                                | split-invariant |
/// |-----------|----------------------------------------|------------------------------------------|-----------------|
/// | `grpo`    | clipped surrogate                      | `mean_i( sum_t m l / max(sum_t m, 1) ) / k` | yes (*)      |
/// | `bnpo`    | clipped surrogate                      | `sum m l / max(sum m, 1) / k`            | no              |
/// | `dr_grpo` | clipped surrogate                      | `sum m l / (N * max_completion_length) / k` | yes (*)      |
/// | `dapo`    | clipped surrogate                      | `sum m l / max(num_items_in_batch, 1)`   | yes             |
/// | `cispo`   | `-sg(min(r, eps_high)) * A * logp`     | as `dapo`                                | yes             |
/// | `sapo`    | `-sigmoid(tau (r - 1)) * 4 / tau * A`  | as `grpo`                                | yes (*)         |
///
/// "Split-invariant": summing the losses (and gradients) of the `k` micro-batches of a split
/// optimiser step gives the loss of the whole step computed at once with `k = 1`. (*) When the
/// micro-batches hold equally many completions, as they do in GRPO (`grpo` is a mean of per-row
/// means, `dr_grpo` divides by a row count). `bnpo` normalises by the micro-batch's own token
/// count, so its result depends on how the tokens fall into micro-batches. `dapo` divides by
/// the token count of the whole step, which the caller passes in
/// [`super::LossNormalizer`]. With `top_entropy_quantile < 1` no type is split-invariant: the
/// entropy threshold is a quantile of each micro-batch (as in TRL).
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
    /// CISPO (MiniMax-M1, arXiv:2506.13585): clips the importance weight, not the update. The
    /// ratio, capped at `epsilon_high` (ScaleRL's `eps_max`, recommended 5.0) and detached,
    /// weights a REINFORCE term `-A * logp`, so every token keeps a gradient. `dapo`'s
    /// reduction.
    Cispo,
    /// SAPO ("Soft Adaptive Policy Optimization", arXiv:2511.20347): a smooth gate
    /// `sigmoid(tau (r - 1)) * 4 / tau` in place of the hard clip, with temperature
    /// `sapo_temperature_pos` for positive advantages and `sapo_temperature_neg` otherwise; its
    /// gradient is `r A` at `r = 1` and fades as `r` leaves 1. `grpo`'s reduction.
    Sapo,
    /// RLOO's loss (TRL `RLOOTrainer`, [`super::rloo_loss`]): PPO's clipped surrogate on the
    /// *sequence* ratio (of summed log-probs), one term per completion, mean over the
    /// micro-batch's completions. It takes one advantage per completion and no KL term (put the
    /// KL into the reward, as `advantage_estimator = "rloo"` does). `rlft rloo`'s default.
    Rloo,
}

config_names!(LossType, "loss_type", {
    Grpo => "grpo",
    Bnpo => "bnpo",
    DrGrpo => "dr_grpo",
    Dapo => "dapo",
    Cispo => "cispo",
    Sapo => "sapo",
    Rloo => "rloo",
});

/// How a loss type reduces its masked per-token losses (see [`LossType`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Mean of per-sequence token means, `/ k`.
    SequenceMean,
    /// Token mean of the micro-batch, `/ k`.
    MicroBatchTokenMean,
    /// Token sum over `N * max_completion_length`, `/ k`.
    ConstantNormalized,
    /// Token sum over the optimiser step's token count.
    StepTokenMean,
}

impl LossType {
    /// The types [`super::grpo_loss`] computes: every one but `rloo`.
    pub const TOKEN_LOSSES: [LossType; 6] = [
        LossType::Grpo,
        LossType::Bnpo,
        LossType::DrGrpo,
        LossType::Dapo,
        LossType::Cispo,
        LossType::Sapo,
    ];

    /// The reduction over tokens (TRL `_compute_loss`, `grpo_trainer.py:3153-3176`).
    pub fn reduction(self) -> Reduction {
        match self {
            // RLOO's mean over completions is of sequence terms (`rloo_loss` takes it itself).
            LossType::Grpo | LossType::Sapo | LossType::Rloo => Reduction::SequenceMean,
            LossType::Bnpo => Reduction::MicroBatchTokenMean,
            LossType::DrGrpo => Reduction::ConstantNormalized,
            LossType::Dapo | LossType::Cispo => Reduction::StepTokenMean,
        }
    }

    /// Whether the policy term is PPO's clipped surrogate (the types `delta` and the
    /// `clip_ratio/*` metrics apply to).
    pub fn is_clipped_surrogate(self) -> bool {
        matches!(
            self,
            LossType::Grpo | LossType::Bnpo | LossType::DrGrpo | LossType::Dapo
        )
    }
}

/// Where the importance ratio is taken (TRL's `importance_sampling_level`,
/// `grpo_trainer.py:3083-3095`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportanceSamplingLevel {
    /// One ratio per token, `r_t = exp(logp_t - old_t)` (PPO, GRPO). TRL's default.
    #[default]
    Token,
    /// One ratio per completion, `r_i = exp(sum_t m_t (logp_t - old_t) / max(sum_t m_t, 1))`,
    /// shared by its tokens (GSPO, "Group Sequence Policy Optimization", arXiv:2507.18071). The
    /// mean is not detached, so each token's gradient is the sequence's `d l / d r * r / len`.
    Sequence,
}

config_names!(ImportanceSamplingLevel, "importance_sampling_level", {
    Token => "token",
    Sequence => "sequence",
});

/// Loss settings (TRL 1.16 names: `epsilon` is `epsilon_low`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    /// Formulation and reduction; default `dapo` (TRL's default).
    pub loss_type: LossType,
    /// Lower clip: ratios below `1 - epsilon_low` stop pushing down negative-advantage tokens
    /// (TRL `epsilon`, default 0.2).
    pub epsilon_low: f64,
    /// Upper clip: ratios above `1 + epsilon_high` stop pushing up positive-advantage tokens
    /// (TRL `epsilon_high`, defaults to `epsilon`; DAPO recommends 0.28). For `cispo` it is the
    /// cap of the ratio itself (ScaleRL's `eps_max`, recommended 5.0).
    pub epsilon_high: f64,
    /// Two-sided clipping (INTELLECT-2, arXiv:2505.07291): the unclipped ratio is capped at
    /// `delta` too, so a negative-advantage token whose ratio ran far up stops growing the
    /// loss. `None` (TRL's default): standard clipping. Clipped-surrogate types only.
    pub delta: Option<f64>,
    /// Ratio per token or per completion (GSPO).
    pub importance_sampling_level: ImportanceSamplingLevel,
    /// `sapo`'s gate temperature for tokens with positive advantage (TRL default 1.0).
    pub sapo_temperature_pos: f64,
    /// `sapo`'s gate temperature for tokens with advantage <= 0 (TRL default 1.05).
    pub sapo_temperature_neg: f64,
    /// Only the tokens whose entropy is at or above this quantile-from-the-top of the
    /// micro-batch's token entropies carry the policy term ("Beyond the 80/20 Rule",
    /// arXiv:2506.01939, recommends 0.2); 1.0 (TRL's default) keeps every token, 0.0 only the
    /// highest-entropy one. The KL term is not masked.
    pub top_entropy_quantile: f64,
    /// Weight of the k3 KL penalty to the reference policy; 0 (TRL's default) needs no
    /// reference log-probs. DeepSeek-R1 used 0.001, the GRPO paper 0.04.
    pub beta: f64,
    /// Multiply the per-token KL by the (differentiable) importance ratio, which makes its
    /// gradient the unbiased reverse-KL gradient off-policy (DeepSeek-V3.2, arXiv:2512.02556).
    /// TRL 1.16's default `true`; it changes the KL gradient even on-policy (`r = 1`, but
    /// `d r / d logp = 1`).
    pub use_bias_correction_kl: bool,
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
            delta: None,
            importance_sampling_level: ImportanceSamplingLevel::Token,
            sapo_temperature_pos: 1.0,
            sapo_temperature_neg: 1.05,
            top_entropy_quantile: 1.0,
            beta: 0.0,
            use_bias_correction_kl: true,
            max_completion_length: 512,
        }
    }
}

impl LossConfig {
    /// Checks ranges and combinations; each error names the key and the fix. A huge epsilon
    /// (e.g. 1e9) turns clipping off.
    pub fn validate(&self) -> std::result::Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        for (k, v) in [
            ("epsilon", self.epsilon_low),
            ("epsilon_high", self.epsilon_high),
            ("beta", self.beta),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("{k} = {v} must be finite and >= 0"));
            }
        }
        if self.max_completion_length == 0 {
            return bad("max_completion_length must be >= 1".into());
        }
        if let Some(d) = self.delta {
            if !self.loss_type.is_clipped_surrogate() {
                return bad(format!(
                    "delta = {d} has no effect with loss_type = \"{}\" (TRL ignores it): delta \
                     caps the ratio of the clipped losses (grpo, bnpo, dr_grpo, dapo); cispo \
                     caps its weight at epsilon_high and sapo has no hard clip. Unset delta, or \
                     use loss_type = \"dapo\"",
                    self.loss_type
                ));
            }
            if !(d.is_finite() && d > 1.0) {
                return bad(format!(
                    "delta = {d} must be > 1: it caps the ratio, and a cap at or below 1 stops \
                     the gradient of on-policy tokens; use a value above 1 + epsilon_high = {} \
                     (INTELLECT-2's recommendation), or unset delta",
                    1.0 + self.epsilon_high
                ));
            }
        }
        if self.loss_type == LossType::Cispo && self.epsilon_high < 1.0 {
            return bad(format!(
                "loss_type = \"cispo\" caps the importance ratio at epsilon_high = {} (its \
                 eps_max; unset, epsilon_high is epsilon), below the on-policy ratio 1, which \
                 scales every token's gradient down by that factor; set epsilon_high = 5.0 \
                 (ScaleRL's recommended eps_max)",
                self.epsilon_high
            ));
        }
        for (k, v) in [
            ("sapo_temperature_pos", self.sapo_temperature_pos),
            ("sapo_temperature_neg", self.sapo_temperature_neg),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!(
                    "{k} = {v} must be finite and > 0 (TRL: pos 1.0, neg 1.05)"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.top_entropy_quantile) {
            return bad(format!(
                "top_entropy_quantile = {} must be in [0, 1]: 1.0 keeps every token, 0.2 (the \
                 paper's) the fifth with the highest entropy",
                self.top_entropy_quantile
            ));
        }
        Ok(())
    }

    /// Warnings for settings that run but are likely not what was meant (TRL 1.16 warns about
    /// the same, `grpo_trainer.py:928`): sequence-level ratios with a loss that sums over
    /// tokens weight each completion by its length instead of optimising GSPO's per-sequence
    /// objective.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        let sums_tokens = matches!(
            self.loss_type,
            LossType::Bnpo | LossType::DrGrpo | LossType::Dapo | LossType::Cispo
        );
        if self.importance_sampling_level == ImportanceSamplingLevel::Sequence && sums_tokens {
            w.push(format!(
                "importance_sampling_level = \"sequence\" with loss_type = \"{}\": the loss sums \
                 per-token contributions, so each completion weighs by its length instead of \
                 GSPO's per-sequence objective; for the GSPO paper's setup use loss_type = \
                 \"grpo\"",
                self.loss_type
            ));
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_serialise() {
        for &lt in LossType::ALL {
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
                && e.contains("grpo, bnpo, dr_grpo, dapo, cispo, sapo"),
            "{e}"
        );
        for l in [
            ImportanceSamplingLevel::Token,
            ImportanceSamplingLevel::Sequence,
        ] {
            assert_eq!(l.as_str().parse::<ImportanceSamplingLevel>(), Ok(l));
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(
                serde_json::from_str::<ImportanceSamplingLevel>(&json).unwrap(),
                l
            );
        }
        let e = "sequnce"
            .parse::<ImportanceSamplingLevel>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean `sequence`?"), "{e}");
        let cfg: LossConfig = serde_json::from_str(r#"{"loss_type": "dr_grpo"}"#).unwrap();
        assert_eq!(cfg.loss_type, LossType::DrGrpo);
        assert!(cfg.validate().is_ok());
        assert!(LossConfig { beta: -1.0, ..cfg }.validate().is_err());
    }

    #[test]
    fn validation_names_the_conflict_and_the_fix() {
        let err = |c: LossConfig| c.validate().unwrap_err().to_string();
        let base = LossConfig::default();
        let e = err(LossConfig {
            loss_type: LossType::Cispo,
            ..base
        });
        assert!(
            e.contains("cispo") && e.contains("epsilon_high = 5.0"),
            "{e}"
        );
        let cispo = LossConfig {
            loss_type: LossType::Cispo,
            epsilon_high: 5.0,
            ..base
        };
        assert!(cispo.validate().is_ok());
        let e = err(LossConfig {
            delta: Some(2.0),
            ..cispo
        });
        assert!(e.contains("delta") && e.contains("Unset delta"), "{e}");
        let e = err(LossConfig {
            delta: Some(1.0),
            ..base
        });
        assert!(e.contains("must be > 1"), "{e}");
        assert!(LossConfig {
            delta: Some(1.5),
            ..base
        }
        .validate()
        .is_ok());
        let e = err(LossConfig {
            top_entropy_quantile: 1.5,
            ..base
        });
        assert!(e.contains("top_entropy_quantile"), "{e}");
        let e = err(LossConfig {
            loss_type: LossType::Sapo,
            sapo_temperature_neg: 0.0,
            ..base
        });
        assert!(e.contains("sapo_temperature_neg"), "{e}");
        let seq = LossConfig {
            importance_sampling_level: ImportanceSamplingLevel::Sequence,
            ..base
        };
        let w = seq.warnings();
        assert!(
            w.len() == 1 && w[0].contains("loss_type = \"grpo\""),
            "{w:?}"
        );
        let gspo = LossConfig {
            loss_type: LossType::Grpo,
            ..seq
        };
        assert!(gspo.warnings().is_empty());
    }
}
