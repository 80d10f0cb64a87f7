//! `rlft dpo --config dpo.toml`: DPO settings with TRL 1.16's `DPOConfig` names
//! (`trl/trainer/dpo_config.py`): the shared [`TrainingArgs`] plus `beta`, `loss_type` (one name
//! or a list, with `loss_weights`), `label_smoothing`, the length limits and the reference
//! log-prob options.
//!
//! rlft's own keys: `max_prompt_length` (TRL < 1.0 had it: a longer prompt keeps its last
//! tokens) and `eval_size` (held-out pairs, as in `rlft sft`).
//!
//! TRL keys rlft does not take: `model_init_kwargs`, `trust_remote_code`,
//! `router_aux_loss_coef`, `dataset_num_proc`, `padding_free`, `pad_to_multiple_of`, `ld_alpha`,
//! `f_divergence_type` (always `reverse_kl`), `f_alpha_divergence_coef`, `use_weighting`,
//! `activation_offloading`, `sync_ref_model` and its `ref_model_*` settings, `pad_token`.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::args::TrainingArgs;
use super::{shared_args, ConfigError, TrainerConfig};
use crate::algo::dpo_loss::{DpoLossConfig, DpoLossType};

/// Which end of a too-long sequence `max_length` keeps (TRL's `truncation_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncationMode {
    /// Keep the first `max_length` tokens of prompt + completion: the completion loses its end
    /// (TRL's default). A prompt that alone fills `max_length` is an error (TRL drops the row).
    #[default]
    KeepStart,
    /// Keep the last `max_length` tokens: the prompt loses its start (deprecated in TRL 1.16).
    KeepEnd,
}

/// DPO config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DpoConfig {
    /// Model, data, optimiser, batch, cadence, LoRA: the keys every trainer shares. A step
    /// takes `per_device_train_batch_size` pairs per micro-batch.
    #[serde(flatten)]
    pub args: TrainingArgs,
    /// The strength of the implicit KL to the reference: higher stays closer (IPO's `tau`).
    pub beta: f64,
    /// The loss, one name or a list summed with `loss_weights`: "sigmoid" (DPO), "hinge",
    /// "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    /// "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm" (see `algo::dpo_loss`).
    #[serde(deserialize_with = "one_or_many")]
    pub loss_type: Vec<DpoLossType>,
    /// Weights of the `loss_type` list (same length); unset = 1.0 each.
    pub loss_weights: Option<Vec<f64>>,
    /// `robust`: the probability a label is flipped, in `[0, 0.5)` (0.1 is typical); `exo_pair`:
    /// its epsilon (> 0, 1e-3 is typical); `aot*`: their smoothing.
    pub label_smoothing: f64,
    /// DiscoPOP's temperature (`loss_type = "discopop"`).
    pub discopop_tau: f64,
    /// Longest prompt + completion in tokens; longer ones are cut as `truncation_mode` says.
    /// 0 = no limit (TRL's `None`).
    pub max_length: usize,
    /// Longest prompt in tokens: a longer one keeps its last tokens (rlft's key, from TRL <
    /// 1.0). 0 = no limit.
    pub max_prompt_length: usize,
    /// "keep_start" (TRL's default) or "keep_end".
    pub truncation_mode: TruncationMode,
    /// Compute the reference log-probs of every pair once before training (with full
    /// fine-tuning the frozen copy is then freed) instead of in every step.
    pub precompute_ref_log_probs: bool,
    /// Pairs per reference pass when precomputing; 0 = `per_device_train_batch_size`.
    pub precompute_ref_batch_size: usize,
    /// Turn dropout off (TRL's default): with LoRA the adapters' `lora_dropout` is 0 in
    /// training (the adapter config keeps its value). The decoders have no other dropout.
    pub disable_dropout: bool,
    /// Held-out eval pairs when no eval split exists: a fraction (< 1) or a count (>= 1); 0 =
    /// none (rlft's).
    pub eval_size: f64,
}

fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<DpoLossType>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Vec<DpoLossType>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a loss type name or a list of them")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(vec![s.parse().map_err(E::custom)?])
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                out.push(s.parse().map_err(de::Error::custom)?);
            }
            Ok(out)
        }
    }
    d.deserialize_any(V)
}

impl Default for DpoConfig {
    /// TRL's `DPOConfig` defaults (learning rate 1e-6, logging every 10 steps, beta 0.1,
    /// sigmoid loss, max_length 1024), except `gradient_checkpointing` and `bf16`, which stay
    /// off as everywhere in rlft on the CPU.
    fn default() -> Self {
        DpoConfig {
            args: TrainingArgs::offline("artifacts/dpo", 1e-6),
            beta: 0.1,
            loss_type: vec![DpoLossType::Sigmoid],
            loss_weights: None,
            label_smoothing: 0.0,
            discopop_tau: 0.05,
            max_length: 1024,
            max_prompt_length: 0,
            truncation_mode: TruncationMode::KeepStart,
            precompute_ref_log_probs: false,
            precompute_ref_batch_size: 0,
            disable_dropout: true,
            eval_size: 0.0,
        }
    }
}

impl TrainerConfig for DpoConfig {
    shared_args!();

    fn validate_own(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if !(self.beta > 0.0 && self.beta.is_finite()) {
            return bad(format!(
                "beta must be > 0 (got {}); TRL uses 0.1",
                self.beta
            ));
        }
        if self.loss_type.is_empty() {
            return bad("loss_type is an empty list; give at least one, e.g. \"sigmoid\"".into());
        }
        if let Some(w) = &self.loss_weights {
            if w.len() != self.loss_type.len() {
                return bad(format!(
                    "loss_weights has {} weights for {} loss types; give one per loss_type",
                    w.len(),
                    self.loss_type.len()
                ));
            }
            if w.iter().any(|x| !x.is_finite()) {
                return bad("loss_weights must be finite numbers".into());
            }
        }
        let ls = self.label_smoothing;
        if self.loss_type.contains(&DpoLossType::Robust) && !(0.0..0.5).contains(&ls) {
            return bad(format!(
                "label_smoothing must lie in [0, 0.5) for the `robust` loss (got {ls}); the \
                 Robust DPO paper suggests 0.1"
            ));
        }
        if self.loss_type.contains(&DpoLossType::ExoPair) && !(ls > 0.0 && ls < 1.0) {
            return bad(format!(
                "label_smoothing must be in (0, 1) for the `exo_pair` loss (got {ls}); the EXO \
                 paper recommends 1e-3"
            ));
        }
        if !(0.0..=1.0).contains(&ls) {
            return bad(format!("label_smoothing must be in [0, 1] (got {ls})"));
        }
        if !(self.discopop_tau > 0.0 && self.discopop_tau.is_finite()) {
            return bad(format!(
                "discopop_tau must be > 0 (got {}); the paper uses 0.05",
                self.discopop_tau
            ));
        }
        if self.max_length == 1 {
            return bad("max_length must be >= 2 tokens (or 0 for no limit)".into());
        }
        if self.max_length > 0 && self.max_prompt_length >= self.max_length {
            return bad(format!(
                "max_prompt_length ({}) must be below max_length ({}) so completions keep \
                 tokens; lower max_prompt_length or raise max_length",
                self.max_prompt_length, self.max_length
            ));
        }
        if self.eval_size < 0.0 {
            return bad(format!("eval_size must be >= 0 (got {})", self.eval_size));
        }
        Ok(())
    }
}

impl DpoConfig {
    /// The loss settings of [`crate::algo::dpo_loss::dpo_loss`].
    pub fn loss_config(&self) -> DpoLossConfig {
        let w = self
            .loss_weights
            .clone()
            .unwrap_or_else(|| vec![1.0; self.loss_type.len()]);
        DpoLossConfig {
            beta: self.beta,
            losses: self.loss_type.iter().copied().zip(w).collect(),
            label_smoothing: self.label_smoothing,
            discopop_tau: self.discopop_tau,
        }
    }

    /// Pairs per reference pass when precomputing.
    pub fn ref_batch(&self) -> usize {
        if self.precompute_ref_batch_size > 0 {
            self.precompute_ref_batch_size
        } else {
            self.args.per_device_train_batch_size.max(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::parse;

    #[test]
    fn defaults_are_trls() {
        let c = parse::<DpoConfig>("dataset = \"d\"").unwrap();
        assert_eq!(c.args.learning_rate, 1e-6);
        assert_eq!(c.args.logging_steps, 10);
        assert_eq!((c.beta, c.max_length), (0.1, 1024));
        assert_eq!(c.loss_type, vec![DpoLossType::Sigmoid]);
        assert_eq!(c.truncation_mode, TruncationMode::KeepStart);
        assert!(c.disable_dropout && !c.precompute_ref_log_probs);
    }

    #[test]
    fn loss_type_is_a_name_or_a_list() {
        let c = parse::<DpoConfig>("dataset = \"d\"\nloss_type = \"ipo\"").unwrap();
        assert_eq!(c.loss_config().losses, vec![(DpoLossType::Ipo, 1.0)]);
        let c = parse::<DpoConfig>(
            "dataset = \"d\"\nloss_type = [\"sigmoid\", \"bco_pair\", \"sft\"]\n\
             loss_weights = [0.8, 0.2, 1.0]",
        )
        .unwrap();
        assert_eq!(
            c.loss_config().losses,
            vec![
                (DpoLossType::Sigmoid, 0.8),
                (DpoLossType::BcoPair, 0.2),
                (DpoLossType::Sft, 1.0)
            ]
        );
        // A config written back reads the same.
        let again = DpoConfig::from_table(toml::Table::try_from(&c).unwrap(), "x").unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn errors_name_the_key_and_fix() {
        let e = |s: &str| {
            parse::<DpoConfig>(&format!("dataset = \"d\"\n{s}"))
                .unwrap_err()
                .to_string()
        };
        assert!(e("loss_type = \"sigmod\"").contains("did you mean `sigmoid`"));
        assert!(e("loss_type = [\"ipo\", \"hinge\"]\nloss_weights = [1.0]").contains("one per"));
        assert!(e("loss_type = \"robust\"\nlabel_smoothing = 0.5").contains("0.1"));
        assert!(e("loss_type = \"exo_pair\"").contains("1e-3"));
        assert!(e("beta = 0.0").contains("0.1"));
        assert!(e("max_length = 64\nmax_prompt_length = 64").contains("max_prompt_length"));
        assert!(e("truncation_mode = \"keep_middle\"").contains("keep_start"));
        assert!(e("betta = 0.1").contains("did you mean `beta`"));
    }
}
