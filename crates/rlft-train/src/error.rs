//! Typed errors of the training core. Every message says what is wrong and how to fix it.

#![warn(missing_docs)]

/// Errors from the optimizer, clipping, schedules and gradient accumulation.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A hyperparameter is out of range.
    #[error("invalid {what} = {value}: {fix}")]
    Hyperparameter {
        /// The option (PyTorch / transformers name).
        what: &'static str,
        /// The value given.
        value: f64,
        /// The valid range and how to fix it.
        fix: &'static str,
    },
    /// The parameter groups are malformed (duplicate or non-float vars).
    #[error("invalid parameter groups: {0}")]
    Groups(String),
    /// An LR schedule name that rlft does not know.
    #[error("unknown lr schedule `{name}`; valid names: {valid}")]
    UnknownSchedule {
        /// The name given.
        name: String,
        /// The names rlft accepts, comma-separated.
        valid: &'static str,
    },
    /// An LR schedule or warmup that cannot be built as written.
    #[error("lr schedule: {0}")]
    Schedule(String),
    /// An optimizer precision that these parameters or this device cannot use.
    #[error("optimizer precision: {0}")]
    Precision(String),
    /// Optimizer state being loaded does not fit the optimizer.
    #[error("optimizer state: {0}")]
    State(String),
    /// A tensor has a dtype the operation cannot handle.
    #[error("{what}: dtype {dtype:?} is not supported; use f32, bf16 or f16 (f64 works on the reference path)")]
    UnsupportedDType {
        /// What was being processed.
        what: String,
        /// The offending dtype.
        dtype: candle_core::DType,
    },
    /// Tensor backend errors.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;
