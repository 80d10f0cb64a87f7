//! Files written by Python `datasets` 5.2 / pyarrow (scripts/reference/make_dataset_fixtures.py)
//! read as the rows Python sees.

use std::path::PathBuf;

use rlft_data::{detect_format, get_path, list_splits, load_dataset, Dataset, Format};
use serde_json::{json, Value};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

const COLUMNS: [&str; 10] = [
    "data_source",
    "prompt",
    "ability",
    "reward_model",
    "extra_info",
    "messages",
    "difficulty",
    "verified",
    "parent_index",
    "tags",
];

#[test]
fn dataset_dict_parquet_and_jsonl_give_the_same_rows() {
    let dict = fixture("tiny_expr_dict");
    assert_eq!(detect_format(&dict).unwrap(), Format::HfDatasetDict);
    assert_eq!(list_splits(&dict).unwrap(), ["train", "test"]);
    for (split, n) in [("train", 6), ("test", 3)] {
        let from_arrow = load_dataset(&dict, Some(split)).unwrap();
        let from_parquet =
            load_dataset(fixture(&format!("tiny_expr_{split}.parquet")), None).unwrap();
        let from_jsonl =
            load_dataset(fixture(&format!("tiny_expr_{split}.jsonl")), Some("train")).unwrap();
        assert_eq!(from_arrow.len(), n);
        assert_eq!(
            from_arrow.columns, COLUMNS,
            "{split}: columns in file order"
        );
        assert_eq!(from_parquet.columns, from_arrow.columns);
        assert_eq!(from_jsonl.columns, from_arrow.columns);
        assert_eq!(
            from_arrow.rows, from_jsonl.rows,
            "{split}: save_to_disk vs Python's rows"
        );
        assert_eq!(
            from_parquet.rows, from_jsonl.rows,
            "{split}: to_parquet vs Python's rows"
        );
        // Key order too (Value equality ignores it): serialised text must match.
        for (a, b) in from_arrow.rows.iter().zip(&from_jsonl.rows) {
            assert_eq!(a.to_string(), b.to_string());
        }
    }
}

#[test]
fn nested_columns_keep_their_shape() {
    let ds = load_dataset(fixture("tiny_expr_dict"), Some("train")).unwrap();
    let row = &ds.rows[1];
    assert_eq!(
        get_path(row, "reward_model.ground_truth"),
        Some(&json!("26"))
    );
    assert_eq!(get_path(row, "extra_info.index"), Some(&json!(1)));
    assert_eq!(
        get_path(row, "extra_info.expression"),
        Some(&json!("(13 * 2)"))
    );
    assert_eq!(get_path(row, "messages.0.role"), Some(&json!("system")));
    assert_eq!(
        get_path(row, "messages.0.content"),
        Some(&json!("Be brief. Ünïcödé ✓ 数学"))
    );
    assert_eq!(row["messages"].as_array().unwrap().len(), 2);
    assert_eq!(row["parent_index"], Value::Null);
    assert_eq!(ds.rows[0]["parent_index"], json!(0));
    assert_eq!(ds.rows[3]["messages"], json!([]));
    assert_eq!(ds.rows[1]["tags"], json!([]));
    assert_eq!(ds.rows[4]["difficulty"], json!(2.5));
    assert_eq!(ds.rows[0]["verified"], json!(false));
    assert!(row["prompt"].as_str().unwrap().contains("\\boxed{answer}"));
}

#[test]
fn assorted_arrow_types_match_pyarrow() {
    let expected: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(fixture("arrow_types.expected.json")).unwrap(),
    )
    .unwrap();
    let expected = Dataset::from_rows(expected).unwrap();
    for file in ["arrow_types.arrow", "arrow_types.parquet"] {
        let ds = load_dataset(fixture(file), None).unwrap();
        assert_eq!(ds.columns, expected.columns, "{file}");
        assert_eq!(ds.len(), 4, "{file}");
        for (i, (got, want)) in ds.rows.iter().zip(&expected.rows).enumerate() {
            for c in &ds.columns {
                assert_eq!(got[c], want[c], "{file}: row {i}, column {c}");
            }
        }
    }
}
