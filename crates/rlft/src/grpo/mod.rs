//! GRPO: Group Relative Policy Optimization (DeepSeekMath) and its relatives (Dr. GRPO, DAPO,
//! BNPO), as TRL's `GRPOTrainer` defines them: `rlft grpo --config grpo.toml`.
//!
//! - [`algo`]: the pure maths (advantages, clipped loss with KL, aggregation per loss type);
//! - [`prompts`]: dataset rows -> chat-templated prompt ids;
//! - [`rollout`]: G completions per prompt, and per-token log-probs of completions;
//! - [`stats`]: metrics with TRL's names and the health signs;
//! - [`eval`]: eval passes (also `rlft eval`);
//! - [`trainer`]: the loop, as named timed phases, with checkpoints and exact resume.

pub mod algo;
pub mod eval;
pub mod prompts;
pub mod rollout;
pub mod samples;
pub mod setup;
pub mod stats;
pub mod trainer;

pub use setup::{prepare, Prepared};
pub use trainer::{train, GrpoSummary};

/// GRPO errors; each says what happened and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum GrpoError {
    /// Config problems.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Dataset files.
    #[error(transparent)]
    Dataset(#[from] rlft_data::DataError),
    /// Dataset contents (prompts, columns).
    #[error("{0}")]
    Data(String),
    /// Reward functions.
    #[error(transparent)]
    Reward(#[from] rlft_rewards::RewardError),
    /// Model problems.
    #[error(transparent)]
    Model(#[from] rlft_model::ModelError),
    /// Tokenizer / template problems.
    #[error(transparent)]
    Text(#[from] rlft_text::TextError),
    /// Optimiser problems.
    #[error(transparent)]
    Train(#[from] rlft_train::TrainError),
    /// Checkpoint problems.
    #[error(transparent)]
    Checkpoint(#[from] rlft_train::checkpoint::CheckpointError),
    /// Metrics problems.
    #[error(transparent)]
    Metrics(#[from] rlft_train::metrics::MetricsError),
    /// Tensor errors.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// Anything else, with its fix.
    #[error("{0}")]
    Other(String),
}

/// Result alias of the GRPO trainer.
pub type Result<T, E = GrpoError> = std::result::Result<T, E>;
