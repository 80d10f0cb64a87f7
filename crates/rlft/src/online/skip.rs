//! Less work per useful sample: completions whose policy gradient is exactly zero are left out
//! of the training pass (no forward, no backward; a micro-batch of them vanishes).
//!
//! A completion whose advantage is 0 on every token (a group whose rewards are all equal, a
//! completion no reward function could score) has a policy term of exactly 0 under every
//! `loss_type`, and so a gradient of 0: each term is `A` times something finite,
//!
//! ```text
//! -min(rd A, clip(r) A)            grpo, bnpo, dr_grpo, dapo (per token or GSPO's per row)
//! -sg(min(r, eps_high)) A logp     cispo
//! -sigmoid(tau (r - 1)) 4 / tau A  sapo
//! -coef_i A_i                      RLOO's sequence loss
//! ```
//!
//! times the entropy mask and the importance-sampling weight of server rollouts, both per token.
//! Leaving such a row out changes nothing, as long as nothing else in the loss reads it
//! ([`skip_is_exact`]); the reduction still divides by the whole micro-batch's rows and tokens,
//! which the rollout knows without a forward pass (`LossNormalizer::micro_batch`).

use crate::algo::MicroBatchSize;
use crate::config::online::OnlineConfig;

/// Whether leaving zero-advantage rows out of the training pass gives exactly the loss and
/// gradient of scoring them: only then are they left out. It is not when
///
/// - the loss has a KL term (`beta > 0` with `group_norm`; the other estimators put the KL in
///   the reward, where it reaches the advantages instead): k3's gradient is not 0 at `A = 0`;
/// - a critic is trained (`gae`): PPO's value loss regresses every row on its returns;
/// - `top_entropy_quantile < 1`: the entropy threshold is a quantile over all the micro-batch's
///   tokens, so the rows left out would move the other rows' mask;
/// - LoRA adapters drop out (`lora_dropout > 0`): each forward draws its masks over the
///   micro-batch's shape, so the other rows would get other masks.
pub fn skip_is_exact(cfg: &OnlineConfig, critic: bool, lora_dropout: bool) -> bool {
    let loss = cfg.loss_config();
    loss.beta == 0.0 && !critic && loss.top_entropy_quantile >= 1.0 && !lora_dropout
}

/// A micro-batch split into the rows to score and the rows left out.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroSplit {
    /// The rows to score, in the micro-batch's order.
    pub scored: Vec<usize>,
    /// The whole micro-batch: what the reduction divides by.
    pub whole: MicroBatchSize,
    /// Rows left out.
    pub skipped_rows: usize,
    /// Active tokens of the rows left out.
    pub skipped_tokens: f64,
}

/// Splits micro-batch `mb` (`[B]` row indices) by `zero` (`[N]`, per rollout row: whether its
/// advantages are all exactly 0; `None`: leave nothing out) into rows to score and rows left
/// out; `tokens` (`[B]`, aligned with `mb`) holds each row's active tokens (0 for a masked-out
/// row).
pub fn split_micro_batch(mb: &[usize], zero: Option<&[bool]>, tokens: &[usize]) -> MicroSplit {
    assert_eq!(
        mb.len(),
        tokens.len(),
        "one token count per micro-batch row"
    );
    let mut split = MicroSplit {
        scored: Vec::with_capacity(mb.len()),
        whole: MicroBatchSize {
            rows: mb.len(),
            tokens: tokens.iter().sum::<usize>() as f64,
        },
        skipped_rows: 0,
        skipped_tokens: 0.0,
    };
    for (&i, &t) in mb.iter().zip(tokens) {
        if zero.is_some_and(|z| z[i]) {
            split.skipped_rows += 1;
            split.skipped_tokens += t as f64;
        } else {
            split.scored.push(i);
        }
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_order_and_counts_the_whole() {
        let zero = [false, true, true, false, true];
        let s = split_micro_batch(&[4, 3, 1, 0], Some(&zero), &[5, 2, 7, 0]);
        assert_eq!(s.scored, vec![3, 0]);
        assert_eq!(
            s.whole,
            MicroBatchSize {
                rows: 4,
                tokens: 14.0
            }
        );
        assert_eq!((s.skipped_rows, s.skipped_tokens), (2, 12.0));
        let all = split_micro_batch(&[1, 2], Some(&zero), &[3, 4]);
        assert!(all.scored.is_empty() && all.skipped_rows == 2);
        let none = split_micro_batch(&[1, 2], None, &[3, 4]);
        assert_eq!((none.scored, none.skipped_rows), (vec![1, 2], 0));
    }

    #[test]
    fn exact_only_without_terms_that_read_zero_advantage_rows() {
        let base = OnlineConfig::default();
        assert!(skip_is_exact(&base, false, false));
        assert!(!skip_is_exact(&base, true, false));
        assert!(!skip_is_exact(&base, false, true));
        let kl = OnlineConfig {
            beta: 0.04,
            ..base.clone()
        };
        assert!(!skip_is_exact(&kl, false, false));
        let entropy_mask = OnlineConfig {
            top_entropy_quantile: 0.2,
            ..base
        };
        assert!(!skip_is_exact(&entropy_mask, false, false));
    }
}
