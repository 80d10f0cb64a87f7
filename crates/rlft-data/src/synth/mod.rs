//! Synthetic datasets, generated in Rust byte for byte like their Python originals.
//!
//! # `tiny_python_expr`
//!
//! The prompt set of rlft's seed GRPO example: integer arithmetic expressions and their values.
//!
//! ```
//! use rlft_data::synth::tiny_python_expr::{generate, Op, TinyPythonExprOptions};
//!
//! let ds = generate(&TinyPythonExprOptions::default())?; // seed 42, 128 train, 32 test
//! assert_eq!(ds.train[2].expression, "(13 * 2)");
//! assert_eq!(ds.train[2].answer, 26);
//!
//! let harder = TinyPythonExprOptions {
//!     seed: 7,
//!     operators: Op::parse_list("+,-,*,//,%")?,
//!     max_depth: 4,
//!     value_max: 1000,
//!     ..Default::default()
//! };
//! let ds = generate(&harder)?;
//! # let _ = ds;
//! # Ok::<(), rlft_data::DataError>(())
//! ```
//!
//! How a row is made, with [`PyRandom`](crate::pyrandom::PyRandom) standing in for Python's
//! `random.Random(seed)` (one stream for both splits):
//!
//! 1. `depth = randint(1, max_depth)`, then `build_expression(depth)`:
//!    - if `depth <= 0` or `random() < 0.35`: a leaf `randint(0, leaf_max)`;
//!    - else up to 64 tries: `choice(operators)`, the left then the right sub-expression at
//!      `depth - 1`; for `-` the operands are swapped when left < right; the try is accepted
//!      when the result lies in `value_min..=value_max` and returns `(left op right)`;
//!    - after 64 rejected tries: a leaf `randint(0, leaf_max)`.
//! 2. An expression already in the split is skipped (so every split holds distinct
//!    expressions; test may repeat train's). Train is built first; test continues the stream.
//! 3. The row: `data_source = "tiny_python_expr"`, `prompt` (the expression inside a fixed
//!    instruction ending in `\boxed{answer}`), `ability = "math"`,
//!    `reward_model = {ground_truth: str(answer)}`, `extra_info = {label, reference, answer,
//!    expression, split, index}`, keys in that order.
//!
//! Operators beyond the original's `+ - *` follow Python: `//` floors and `%` takes the
//! divisor's sign (a zero divisor rejects the try); `**` accepts exponents `0..=4` only
//! ([`MAX_POW_EXPONENT`](tiny_python_expr::MAX_POW_EXPONENT)), larger results are rejected by
//! the range check. A rejected try has still drawn its sub-expressions, exactly as in Python.
//!
//! A split that cannot be filled stops with
//! [`DataError::SynthExhausted`] instead of looping forever
//! (Python would): after
//! [`MAX_CONSECUTIVE_DUPLICATES`](tiny_python_expr::MAX_CONSECUTIVE_DUPLICATES) duplicate draws
//! in a row (more rows asked for than distinct expressions the options allow), or after
//! [`MAX_NODES_PER_ROW`](tiny_python_expr::MAX_NODES_PER_ROW) expression nodes without a new
//! row (options under which almost every try is rejected, where one row can cost
//! `(2 * 64)^depth` nodes).
//!
//! **Compatibility guarantee.** For every option value, the rows equal those of
//! `scripts/reference/tiny_python_expr_reference.py` with the same options, and
//! [`TinyPythonExprDataset::to_jsonl`](tiny_python_expr::TinyPythonExprDataset::to_jsonl) equals
//! its JSONL output byte for byte (`json.dumps` per line, [`python_json_dumps`]). With the
//! default options that is the original generator: the test suite compares the output with
//! the repository's `tests/fixtures/tiny_python_expr/dataset_seed42_128_32.jsonl` and with
//! goldens for other seeds, sizes and operators in `tests/data/`. Python's own exceptions (a split that cannot be
//! filled loops forever there) are the only divergence.

mod pyjson;
pub mod tiny_python_expr;
pub mod tiny_python_expr_preferences;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use pyjson::{python_float_repr, python_json_dumps};

use crate::atomic;
use crate::dataset::{json_kind, Dataset};
use crate::error::{DataError, Result};

/// Extra files [`save_splits`] writes next to the `DatasetDict`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveFormats {
    /// `SPLIT.jsonl` per split, lines as Python's `json.dumps` writes them.
    pub jsonl: bool,
    /// `SPLIT.parquet` per split ([`crate::write_parquet`]).
    pub parquet: bool,
}

/// Saves `splits` as a `DatasetDict` directory `dir` ([`crate::save_dataset_dict`]; an existing
/// dataset directory there is replaced, anything else non-empty is refused), then the extra
/// `formats` inside it (`dir/train.jsonl`, `dir/train.parquet`, ...), which `datasets` ignores
/// when loading the directory. Returns every path written: the directory first.
pub fn save_splits(
    dir: &Path,
    splits: &[(&str, &Dataset)],
    formats: SaveFormats,
) -> Result<Vec<PathBuf>> {
    crate::save_dataset_dict(dir, splits)?;
    let mut written = vec![dir.to_path_buf()];
    for (name, dataset) in splits {
        if formats.jsonl {
            let path = dir.join(format!("{name}.jsonl"));
            write_python_jsonl(&path, &dataset.rows)?;
            written.push(path);
        }
        if formats.parquet {
            let path = dir.join(format!("{name}.parquet"));
            crate::write_parquet(&path, dataset)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// Writes `rows` as JSON Lines exactly as Python's `json.dumps(row)` + `"\n"` per row
/// (`ensure_ascii=True`), atomically. Rows must be objects.
pub fn write_python_jsonl(path: impl AsRef<Path>, rows: &[Value]) -> Result<()> {
    let path = path.as_ref();
    if let Some((i, row)) = rows.iter().enumerate().find(|(_, r)| !r.is_object()) {
        return Err(DataError::NotAnObject {
            location: format!("row {i}"),
            found: json_kind(row),
        });
    }
    atomic::write_file(path, |w| {
        use std::io::Write;
        for row in rows {
            let mut line = python_json_dumps(row, true);
            line.push('\n');
            w.write_all(line.as_bytes())
                .map_err(|e| DataError::io("cannot write", path, e))?;
        }
        Ok(())
    })
}
