//! Datasets for rlft: read JSONL, Parquet and Hugging Face `save_to_disk` directories into rows
//! of JSON, write them back, validate them for a trainer, and split them for held-out eval.
//!
//! ```no_run
//! use rlft_data::{load_dataset, require_columns, get_path, train_test_split};
//!
//! let ds = load_dataset("data/tiny_python_expr", Some("train"))?; // DatasetDict dir, or .jsonl, .parquet
//! require_columns(&ds, &["prompt", "reward_model"])?;             // names the closest column if missing
//! for row in &ds {
//!     let prompt = row["prompt"].as_str().unwrap_or_default();
//!     let truth = get_path(row, "reward_model.ground_truth");
//!     # let _ = (prompt, truth);
//! }
//! let parts = train_test_split(&ds, 0.1, 42)?;                    // deterministic, see `split`
//! rlft_data::save_dataset_dict("out/ds", &[("train", &parts.train), ("test", &parts.test)])?;
//! # Ok::<(), rlft_data::DataError>(())
//! ```
//!
//! # Rows
//!
//! A [`Dataset`] is its column names plus one `serde_json::Value` object per row (in memory;
//! RL prompt sets are small). Arrow values map to JSON as `datasets`' `ds[i]` shows them:
//!
//! | Arrow | JSON |
//! |---|---|
//! | null, or a null slot | `null` |
//! | bool | `true`/`false` |
//! | int8..int64, uint8..uint64 | integer |
//! | float16/32/64 | number (the f64 of the value; NaN and infinities become `null`) |
//! | string, large_string, string_view, dictionary-encoded strings | string |
//! | list, large_list, fixed_size_list | array |
//! | struct | object, fields in schema order |
//! | map | object for string keys, else `[{"key": k, "value": v}, ...]` |
//! | binary | array of byte values |
//! | date32/64 | `"2024-01-31"`; timestamp: `"2024-01-31T12:00:00.5"` (+`Z` if zoned) |
//! | decimal128 | string (exact) |
//!
//! Other types (unions, durations, ...) are an error naming the file and column.
//!
//! # Writing
//!
//! Writers infer one Arrow schema from the rows (ints `int64`, floats `float64`, strings `string`, arrays lists, objects structs, `null` anywhere;
//! ints and floats mix as float; other mixes are an error naming the column and row) and write
//! atomically (a temporary sibling renamed into place). `save_dataset_dict` produces what
//! `datasets` 5.x `DatasetDict.save_to_disk` produces: IPC-stream shards, `dataset_info.json`
//! features in `datasets`' notation, `state.json`, `dataset_dict.json`.
//!
//! Round trips through any format give back identical rows when each column holds one JSON type
//! (or null) and every object in a column has the same keys; a key missing from some objects
//! comes back as `null`, and integers in a float column come back as floats.
//!
//! # Synthetic datasets
//!
//! [`synth::tiny_python_expr`] generates the seed example's prompt set (integer arithmetic
//! expressions; options for seed, sizes, operators `+ - * // % **`, depth, leaf and value
//! ranges). For any options its rows, and its JSONL bytes, equal those of the Python reference
//! `scripts/reference/tiny_python_expr_reference.py`, which for the defaults is the original
//! generator; that rests on [`pyrandom::PyRandom`], a bit-exact twin of CPython's
//! `random.Random`. See the [`synth`] docs and `docs/datasets.md`.

#![warn(missing_docs)]

mod atomic;
mod dataset;
mod error;
mod features;
mod hf;
mod jsonl;
mod load;
mod parquet_io;
pub mod pyrandom;
pub mod split;
pub mod synth;
mod to_arrow;
mod to_json;
mod validate;

pub use dataset::Dataset;
pub use error::{DataError, Result};
pub use hf::{read_splits, save_dataset, save_dataset_dict};
pub use jsonl::{read_jsonl, write_jsonl};
pub use load::{detect_format, list_splits, load_dataset, Format};
pub use parquet_io::{read_parquet, write_parquet};
pub use split::{train_test_split, TestSize, TrainTest};
pub use validate::{get_path, lookup, require_columns, require_non_empty};
