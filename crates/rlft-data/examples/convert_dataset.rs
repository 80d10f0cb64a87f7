//! Converts any dataset rlft-data reads into a `save_to_disk` DatasetDict plus one JSONL per
//! split (and a Parquet file per split), for `scripts/reference/check_load_from_disk.py` to compare with Python `datasets`.
//!
//! ```sh
//! cargo run --release -p rlft-data --example convert_dataset -- INPUT OUT_DIR [TEST_FRACTION]
//! ```
//!
//! INPUT with several splits keeps them; a single-split INPUT is split into train/test with
//! `train_test_split(TEST_FRACTION, seed 42)` when TEST_FRACTION is given. Writes
//! `OUT_DIR/dict/`, `OUT_DIR/{split}.jsonl` and `OUT_DIR/{split}.parquet`.

use std::path::PathBuf;

use rlft_data::{
    list_splits, load_dataset, save_dataset_dict, train_test_split, write_jsonl, write_parquet,
    Dataset,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, out, rest @ ..] = args.as_slice() else {
        return Err("usage: convert_dataset INPUT OUT_DIR [TEST_FRACTION]".into());
    };
    let out = PathBuf::from(out);
    let splits = list_splits(input)?;
    let mut parts: Vec<(String, Dataset)> = Vec::new();
    if splits.len() == 1 && !rest.is_empty() {
        let ds = load_dataset(input, None)?;
        let tt = train_test_split(&ds, rest[0].parse::<f64>()?, 42)?;
        parts.push(("train".into(), tt.train));
        parts.push(("test".into(), tt.test));
    } else {
        for split in &splits {
            parts.push((split.clone(), load_dataset(input, Some(split))?));
        }
    }
    let refs: Vec<(&str, &Dataset)> = parts.iter().map(|(n, d)| (n.as_str(), d)).collect();
    save_dataset_dict(out.join("dict"), &refs)?;
    for (name, ds) in &parts {
        write_jsonl(out.join(format!("{name}.jsonl")), ds)?;
        write_parquet(out.join(format!("{name}.parquet")), ds)?;
        println!(
            "{name}: {} rows, columns [{}]",
            ds.len(),
            ds.columns.join(", ")
        );
    }
    println!("wrote {}", out.display());
    Ok(())
}
