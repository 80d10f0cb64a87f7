//! The one error type of this crate. Every message names the file (or column, or row) at fault
//! and, where there is one, the fix.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing, validating or splitting a dataset.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The path given to [`crate::load_dataset`] does not exist.
    #[error(
        "dataset path {} does not exist; pass a .jsonl/.json file, a .parquet file or a \
         directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`",
        path.display()
    )]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },

    /// The path exists but is not a format this crate reads.
    #[error(
        "cannot tell the dataset format of {}: {reason}; supported are .jsonl/.json (one JSON \
         object per line, or one JSON array), .parquet, and `save_to_disk` directories (with \
         dataset_dict.json, or dataset_info.json + state.json)",
        path.display()
    )]
    UnknownFormat {
        /// The path.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },

    /// An operating-system error on a file or directory.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done ("cannot read", "cannot create", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A line of a JSONL file (or a whole `.json` file, `line` 1) is not valid JSON.
    #[error(
        "{}:{line}: invalid JSON: {message}; each line of a JSONL file must hold exactly one \
         JSON object",
        path.display()
    )]
    JsonLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// serde_json's description.
        message: String,
    },

    /// A row is valid JSON but not an object (`{...}`).
    #[error("{location}: a row must be a JSON object with one key per column, found {found}")]
    NotAnObject {
        /// `file:line`, or `row N` for in-memory rows.
        location: String,
        /// The JSON kind that was found ("array", "string", ...).
        found: &'static str,
    },

    /// Arrow data (a `.arrow` shard or a Parquet file) could not be decoded.
    #[error("{}: {message}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },

    /// A `save_to_disk` directory is missing a file or holds malformed metadata.
    #[error(
        "{}: not a valid `save_to_disk` directory: {message}; re-save it with \
         `datasets` (`ds.save_to_disk(path)`) or with rlft-data's `save_dataset_dict`",
        path.display()
    )]
    HfLayout {
        /// The directory (or the metadata file in it).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },

    /// A `DatasetDict` was loaded without saying which split to use.
    #[error(
        "{} is a DatasetDict with splits [{}]; choose one (trainers default to \"train\")",
        path.display(), splits.join(", ")
    )]
    SplitRequired {
        /// The DatasetDict directory.
        path: PathBuf,
        /// Its splits.
        splits: Vec<String>,
    },

    /// The requested split is not in the `DatasetDict`.
    #[error(
        "{} has no split {split:?}; its splits are [{}]{}",
        path.display(), splits.join(", "), suggestion_suffix(suggestion)
    )]
    UnknownSplit {
        /// The DatasetDict directory.
        path: PathBuf,
        /// The split asked for.
        split: String,
        /// The splits that exist.
        splits: Vec<String>,
        /// The closest existing split name, if one is close.
        suggestion: Option<String>,
    },

    /// A split other than "train" was asked of a single-split source (a file or a `Dataset` dir).
    #[error(
        "{} holds a single dataset, not a DatasetDict, so it has no split {split:?}; pass no \
         split (or \"train\"{}), or point at the file that holds the {split:?} rows",
        path.display(), recorded.as_ref().map(|s| format!(" or {s:?}")).unwrap_or_default()
    )]
    NoSuchSplit {
        /// The file or directory.
        path: PathBuf,
        /// The split asked for.
        split: String,
        /// The split name recorded in a `Dataset` directory's state.json, if any.
        recorded: Option<String>,
    },

    /// An Arrow type with no JSON counterpart here.
    #[error(
        "{}: column {column:?} has Arrow type {data_type}, which rlft-data cannot convert to \
         JSON; cast it to a string, number, list or struct column before saving",
        path.display()
    )]
    UnsupportedType {
        /// The file.
        path: PathBuf,
        /// Dotted column path.
        column: String,
        /// The Arrow type.
        data_type: String,
    },

    /// Rows handed to a writer disagree on a column's type.
    #[error(
        "column {column:?}: row {row} holds {found} but earlier rows hold {expected}; every row \
         must use one type per column (null is allowed anywhere; ints and floats mix as float)"
    )]
    InconsistentType {
        /// Dotted column path (`extra_info.index`, `messages[].role`).
        column: String,
        /// 0-based row index.
        row: usize,
        /// The type seen before.
        expected: String,
        /// The type in this row.
        found: String,
    },

    /// A number a writer cannot store (beyond int64, or not finite).
    #[error("column {column:?}: row {row} holds {value}, which {reason}")]
    BadNumber {
        /// Dotted column path.
        column: String,
        /// 0-based row index.
        row: usize,
        /// The number.
        value: String,
        /// Why it cannot be stored.
        reason: &'static str,
    },

    /// Writing a dataset failed (encoding, or the destination is unsafe to replace).
    #[error("cannot write {}: {message}", path.display())]
    Write {
        /// The destination.
        path: PathBuf,
        /// What failed.
        message: String,
    },

    /// A required column is missing.
    #[error(
        "dataset {source_name} has no column {column:?}; its columns are [{}]{}",
        columns.join(", "), suggestion_suffix(suggestion)
    )]
    MissingColumn {
        /// The dataset's file, or "(in memory)".
        source_name: String,
        /// The column asked for.
        column: String,
        /// The columns that exist.
        columns: Vec<String>,
        /// The closest existing column, if one is close.
        suggestion: Option<String>,
    },

    /// A dotted path (`reward_model.ground_truth`) does not resolve in a row.
    #[error("{context}: no value at {path:?}: {reason}")]
    MissingPath {
        /// Where the row came from (`row 3`, or a dataset name and row).
        context: String,
        /// The dotted path asked for.
        path: String,
        /// Which segment failed and what was there.
        reason: String,
    },

    /// The dataset has no rows.
    #[error(
        "dataset {source_name} has no rows; check the file (and the split) you pointed at, \
         and any filter that ran before this"
    )]
    EmptyDataset {
        /// The dataset's file, or "(in memory)".
        source_name: String,
    },

    /// Bad arguments to [`crate::train_test_split`].
    #[error("train_test_split: {0}")]
    InvalidSplit(String),

    /// Options of a synthetic dataset generator ([`crate::synth`]) that cannot work.
    #[error("{generator}: {message}")]
    InvalidSynthOptions {
        /// The generator (`tiny_python_expr`).
        generator: &'static str,
        /// What is wrong and the fix.
        message: String,
    },

    /// A synthetic generator could not find enough distinct rows for a split: the space of
    /// rows its options allow is (nearly) used up.
    #[error(
        "{generator}: the {split} split needs {wanted} distinct rows but only {found} were \
         found ({reason}); lower the {split} size or widen the range ({hint})"
    )]
    SynthExhausted {
        /// The generator (`tiny_python_expr`).
        generator: &'static str,
        /// The split being built.
        split: &'static str,
        /// Rows asked for.
        wanted: usize,
        /// Distinct rows found.
        found: usize,
        /// Why it gave up (duplicates in a row, or too much work for one new row).
        reason: String,
        /// The options that widen the space.
        hint: &'static str,
    },
}

fn suggestion_suffix(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!("; did you mean {s:?}?"),
        None => String::new(),
    }
}

/// Result alias of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

impl DataError {
    /// An [`DataError::Io`] for `path`.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        DataError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
