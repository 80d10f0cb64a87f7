//! Learning-rate schedules as data, computing exactly what transformers' `get_scheduler`
//! (a `LambdaLR` over the optimizer's initial lr) computes.
//!
//! The lr of optimizer step `s` (0-based: the number of steps already taken, as transformers'
//! scheduler is stepped after each optimizer step) is `base_lr * factor(s)` with `W` warmup
//! steps and `T` total steps:
//!
//! | schedule             | `s < W`          | `s >= W`, with `q = (s - W) / max(1, T - W)`        |
//! |----------------------|------------------|-----------------------------------------------------|
//! | `constant`           | `s / max(1, W)`  | `1`                                                 |
//! | `linear`             | `s / max(1, W)`  | `max(0, (T - s) / max(1, T - W))`                   |
//! | `cosine`             | `s / max(1, W)`  | `max(0, 0.5 * (1 + cos(pi * q)))`                   |
//! | `cosine_with_min_lr` | `s / max(1, W)`  | `max(0, c * (1 - r) + r)`, `c` the cosine factor, `r = min_lr_rate` |
//!
//! (cosine uses transformers' default `num_cycles = 0.5`; past `T` it turns back up, as there.)
//!
//! rlft's `constant` honours the warmup: it is transformers' `constant_with_warmup` (accepted as
//! an alias). transformers' own `constant` ignores `warmup_steps`; the two agree when `W = 0`.

#![warn(missing_docs)]

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Names accepted for [`LrSchedule`], for error messages.
pub const SCHEDULE_NAMES: &str =
    "constant, constant_with_warmup, linear, cosine, cosine_with_min_lr";

/// The shape of the lr curve after warmup (transformers' `lr_scheduler_type`).
///
/// Deserialises from a name (`"cosine"`) or, for schedules with options, a table with a `type`
/// key (`{ type = "cosine_with_min_lr", min_lr_rate = 0.1 }`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ScheduleRepr", into = "ScheduleRepr")]
pub enum LrSchedule {
    /// Constant after warmup (`constant_with_warmup`).
    Constant,
    /// Linear decay to 0 at the last step.
    Linear,
    /// Half-cosine decay to 0 at the last step.
    Cosine,
    /// Half-cosine decay to `min_lr_rate * base_lr`.
    CosineWithMinLr {
        /// Final lr as a fraction of the base lr, in [0, 1].
        min_lr_rate: f64,
    },
}

impl LrSchedule {
    /// Parses a name; `cosine_with_min_lr` needs its `min_lr_rate` (use the table form or
    /// construct the variant).
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "constant" | "constant_with_warmup" => LrSchedule::Constant,
            "linear" => LrSchedule::Linear,
            "cosine" => LrSchedule::Cosine,
            "cosine_with_min_lr" => {
                return Err(TrainError::Schedule(
                    "`cosine_with_min_lr` needs its final lr fraction: write \
                     { type = \"cosine_with_min_lr\", min_lr_rate = 0.1 }"
                        .into(),
                ))
            }
            _ => {
                return Err(TrainError::UnknownSchedule {
                    name: name.to_string(),
                    valid: SCHEDULE_NAMES,
                })
            }
        })
    }

    /// The name used in configs.
    pub fn name(&self) -> &'static str {
        match self {
            LrSchedule::Constant => "constant",
            LrSchedule::Linear => "linear",
            LrSchedule::Cosine => "cosine",
            LrSchedule::CosineWithMinLr { .. } => "cosine_with_min_lr",
        }
    }

    /// The multiplier of the base lr at step `step` (0-based) of `total_steps`, with
    /// `warmup_steps` warmup steps (transformers' `lr_lambda`).
    pub fn factor(&self, step: usize, warmup_steps: usize, total_steps: usize) -> f64 {
        if step < warmup_steps {
            return step as f64 / warmup_steps.max(1) as f64;
        }
        let decay_steps = total_steps.saturating_sub(warmup_steps).max(1) as f64;
        let cosine = || {
            let progress = (step - warmup_steps) as f64 / decay_steps;
            0.5 * (1.0 + (std::f64::consts::PI * 0.5 * 2.0 * progress).cos())
        };
        match *self {
            LrSchedule::Constant => 1.0,
            LrSchedule::Linear => {
                let left = total_steps as f64 - step as f64;
                (left / decay_steps).max(0.0)
            }
            LrSchedule::Cosine => cosine().max(0.0),
            LrSchedule::CosineWithMinLr { min_lr_rate } => {
                (cosine() * (1.0 - min_lr_rate) + min_lr_rate).max(0.0)
            }
        }
    }

    fn validate(&self) -> Result<()> {
        if let LrSchedule::CosineWithMinLr { min_lr_rate } = *self {
            if !(0.0..=1.0).contains(&min_lr_rate) {
                return Err(TrainError::Hyperparameter {
                    what: "min_lr_rate",
                    value: min_lr_rate,
                    fix: "the final lr fraction must be in [0, 1], e.g. 0.1",
                });
            }
        }
        Ok(())
    }
}

/// Serde form of [`LrSchedule`]: a name or a `{ type, min_lr_rate }` table.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ScheduleRepr {
    Name(String),
    Table {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min_lr_rate: Option<f64>,
    },
}

impl TryFrom<ScheduleRepr> for LrSchedule {
    type Error = TrainError;

    fn try_from(r: ScheduleRepr) -> Result<Self> {
        let s = match r {
            ScheduleRepr::Name(name) => LrSchedule::from_name(&name)?,
            ScheduleRepr::Table {
                kind,
                min_lr_rate: Some(min_lr_rate),
            } if kind == "cosine_with_min_lr" => LrSchedule::CosineWithMinLr { min_lr_rate },
            ScheduleRepr::Table {
                kind,
                min_lr_rate: Some(_),
            } => {
                return Err(TrainError::Schedule(format!(
                    "`min_lr_rate` only applies to `cosine_with_min_lr`, not `{kind}`; remove it"
                )))
            }
            ScheduleRepr::Table { kind, .. } => LrSchedule::from_name(&kind)?,
        };
        s.validate()?;
        Ok(s)
    }
}

impl From<LrSchedule> for ScheduleRepr {
    fn from(s: LrSchedule) -> Self {
        match s {
            LrSchedule::CosineWithMinLr { min_lr_rate } => ScheduleRepr::Table {
                kind: s.name().to_string(),
                min_lr_rate: Some(min_lr_rate),
            },
            _ => ScheduleRepr::Name(s.name().to_string()),
        }
    }
}

/// Warmup length: a step count or a fraction of the total steps.
///
/// Deserialises from a number with transformers 5's `warmup_steps` rule: `>= 1` is a step count
/// (truncated), `< 1` a ratio (`warmup = 0.1` = 10% of the steps, transformers 4's
/// `warmup_ratio`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub enum Warmup {
    /// Exactly this many steps.
    Steps(usize),
    /// `ceil(ratio * total_steps)` steps (transformers' rounding), ratio in [0, 1).
    Ratio(f64),
}

impl Default for Warmup {
    fn default() -> Self {
        Warmup::Steps(0)
    }
}

impl Warmup {
    /// The number of warmup steps for a run of `total_steps`.
    pub fn steps(&self, total_steps: usize) -> usize {
        match *self {
            Warmup::Steps(n) => n,
            Warmup::Ratio(r) => (total_steps as f64 * r).ceil() as usize,
        }
    }
}

impl TryFrom<f64> for Warmup {
    type Error = TrainError;

    fn try_from(w: f64) -> Result<Self> {
        if !(w.is_finite() && w >= 0.0) {
            return Err(TrainError::Hyperparameter {
                what: "warmup",
                value: w,
                fix: "warmup is a step count (>= 1) or a fraction of the run in [0, 1)",
            });
        }
        Ok(if w >= 1.0 {
            Warmup::Steps(w as usize)
        } else {
            Warmup::Ratio(w)
        })
    }
}

impl From<Warmup> for f64 {
    fn from(w: Warmup) -> f64 {
        match w {
            Warmup::Steps(n) => n as f64,
            Warmup::Ratio(r) => r,
        }
    }
}

/// A schedule, its warmup and the base lr: the lr of every step, as a value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrScheduler {
    /// Peak learning rate (the optimizer's initial lr in transformers).
    pub base_lr: f64,
    /// Curve after warmup.
    pub schedule: LrSchedule,
    /// Linear warmup from 0.
    #[serde(default)]
    pub warmup: Warmup,
}

impl LrScheduler {
    /// The lr for optimizer step `step` (0-based; steps already taken) of `total_steps`.
    pub fn lr_at(&self, step: usize, total_steps: usize) -> f64 {
        let warmup = self.warmup.steps(total_steps);
        self.base_lr * self.schedule.factor(step, warmup, total_steps)
    }
}
