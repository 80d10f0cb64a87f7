//! What a run prints: the step line every `logging_steps`, the figures beside the progress bar
//! and the eval line, each a typed list of metrics ([`Console`]) that an algorithm declares.

use rlft_train::metrics::MetricsLogger;

use super::{find, Metrics, Position};
use crate::error::Result;

/// How a shown value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Three decimals (losses, rewards, accuracies).
    Fixed,
    /// Scientific notation, for values too small for three decimals (the learning rate).
    Scientific,
}

/// One metric on a console line: its `metrics.jsonl` key, its label and its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// The metric's key, as logged.
    pub key: &'static str,
    /// The short label printed before the value.
    pub label: &'static str,
    /// How the value is written.
    pub format: Format,
}

impl Shown {
    /// `key` under `label`, with three decimals.
    pub const fn new(key: &'static str, label: &'static str) -> Self {
        Shown {
            key,
            label,
            format: Format::Fixed,
        }
    }

    /// `label value`, or None when `metrics` lacks the key.
    fn render(&self, metrics: &[(String, f64)]) -> Option<String> {
        let v = find(metrics, self.key)?;
        Some(match self.format {
            Format::Fixed => format!("{} {v:.3}", self.label),
            Format::Scientific => format!("{} {v:.2e}", self.label),
        })
    }
}

/// The loss.
pub const LOSS: Shown = Shown::new("loss", "loss");
/// The gradient norm before clipping.
pub const GRAD_NORM: Shown = Shown::new("grad_norm", "gnorm");
/// The learning rate of the step.
pub const LEARNING_RATE: Shown = Shown {
    key: "learning_rate",
    label: "lr",
    format: Format::Scientific,
};

/// The three lines an algorithm shows.
#[derive(Debug, Clone, Copy)]
pub struct Console {
    /// The step line, printed every `logging_steps`.
    pub step: &'static [Shown],
    /// Beside the progress bar, after every step.
    pub progress: &'static [Shown],
    /// Eval metrics, before, during and after training.
    pub eval: &'static [Shown],
}

/// `label value` pairs of the `shown` metrics found in `metrics`.
pub fn line(metrics: &[(String, f64)], shown: &[Shown]) -> String {
    shown
        .iter()
        .filter_map(|s| s.render(metrics))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Writes `m` to `metrics.jsonl` (and TensorBoard) at `at`.
pub(super) fn log(logger: &mut MetricsLogger, at: Position, m: &Metrics) -> Result<()> {
    let refs: Vec<(&str, f64)> = m.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    logger.log(at.global_step, at.epoch, &refs)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_what_is_there_in_order() {
        let m = vec![
            ("learning_rate".to_string(), 5e-7),
            ("loss".to_string(), 0.25),
            ("grad_norm".to_string(), 1.5),
        ];
        let shown = [LOSS, Shown::new("absent", "x"), GRAD_NORM, LEARNING_RATE];
        assert_eq!(line(&m, &shown), "loss 0.250 gnorm 1.500 lr 5.00e-7");
        assert_eq!(line(&m, &[]), "");
    }
}
