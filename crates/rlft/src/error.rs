//! [`TrainerError`]: the one error type of the library's trainers; each message says what
//! happened and how to fix it. The binary wraps it in `anyhow`.

/// Errors of the trainers (setup, data, rollouts, the run core).
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// Config problems.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Dataset files.
    #[error(transparent)]
    Dataset(#[from] rlft_data::DataError),
    /// Dataset contents (prompts, columns, examples).
    #[error("{0}")]
    Data(String),
    /// Rows that cannot become SFT examples.
    #[error(transparent)]
    SftData(#[from] crate::data::sft::SftDataError),
    /// Reward functions.
    #[error(transparent)]
    Reward(#[from] rlft_rewards::RewardError),
    /// Tool specs (`[[tools]]`).
    #[error(transparent)]
    Tool(#[from] rlft_tools::ToolError),
    /// The `[environment]` is invalid or failed.
    #[error(transparent)]
    Environment(#[from] rlft_tools::EnvError),
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
    /// A file the run writes (config copy, summary, samples).
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Anything else, with its fix.
    #[error("{0}")]
    Other(String),
}

impl TrainerError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<std::path::PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| TrainerError::Io { path, source }
    }
}

/// Result alias of the trainers.
pub type Result<T, E = TrainerError> = std::result::Result<T, E>;
