//! The errors of [`crate::write_report`].

use std::io;
use std::path::PathBuf;

/// What a run directory should hold, said in every "nothing to report" error.
const RUN_DIR_HELP: &str = "a GRPO run directory (the `output_dir` of `rlft grpo --config \
     CONFIG.toml`) holds metrics.jsonl (one JSON object per logged step, written from the first \
     logged step on), and, as the run goes, samples.jsonl, config.toml and run_summary.json; \
     point `rlft report` at that directory, or start a run and report once it has logged a step";

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The run directory does not exist or is not a directory.
    #[error("report: `{}` is not a directory; {RUN_DIR_HELP}", dir.display())]
    NotADirectory {
        /// The path given.
        dir: PathBuf,
    },
    /// The run directory has no `metrics.jsonl`.
    #[error("report: `{}` has no metrics.jsonl; {RUN_DIR_HELP}", dir.display())]
    MissingMetrics {
        /// The run directory.
        dir: PathBuf,
    },
    /// `metrics.jsonl` exists but holds no readable record.
    #[error(
        "report: `{}` holds no metrics record{detail}; {RUN_DIR_HELP}",
        path.display()
    )]
    EmptyMetrics {
        /// The metrics file.
        path: PathBuf,
        /// Why the lines it has were not records (empty when the file is empty).
        detail: String,
    },
    /// Reading or writing a file failed.
    #[error("report: cannot {op} `{}`: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Drawing the dashboard failed.
    #[error("report: cannot draw the dashboard: {0}")]
    Plot(String),
    /// Encoding the dashboard PNG failed.
    #[error("report: cannot encode dashboard.png: {0}")]
    Png(#[from] png::EncodingError),
}

/// A closure turning an I/O error on `path` into a [`ReportError::Io`].
pub(crate) fn io_err(
    op: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(io::Error) -> ReportError {
    let path = path.to_owned();
    move |source| ReportError::Io { op, path, source }
}
