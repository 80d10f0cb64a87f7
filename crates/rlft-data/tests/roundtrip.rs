//! rows -> each format -> rows gives identical JSON; writes are atomic and careful.

use std::fs;
use std::path::Path;

use rlft_data::{
    load_dataset, save_dataset, save_dataset_dict, train_test_split, write_jsonl, write_parquet,
    DataError, Dataset,
};
use serde_json::{json, Value};

fn sample_rows() -> Vec<Value> {
    (0..2500)
        .map(|i| {
            json!({
                "prompt": format!("What is {i} + 1?\n\"quoted\" ✓"),
                "reward_model": {"ground_truth": (i + 1).to_string(), "style": "rule"},
                "extra_info": {"index": i, "split": "train", "weight": 0.5 + i as f64, "ok": i % 2 == 0,
                               "deep": {"list": [i, i + 1], "none": null}},
                "messages": if i % 7 == 0 { json!([]) } else {
                    json!([{"role": "user", "content": format!("q{i}")}, {"role": "assistant", "content": "a"}])
                },
                "score": if i % 5 == 0 { Value::Null } else { json!(i as f64 / 8.0) },
                "maybe_int": if i % 3 == 0 { Value::Null } else { json!(-(i as i64)) },
                "tags": (match i % 3 { 0 => json!(["x"]), 1 => json!(["y", "z"]), _ => json!([]) }),
                "nested_lists": [[1, 2], [], [3]],
                "always_null": null,
                "big": i64::MAX - i as i64,
            })
        })
        .collect()
}

fn assert_same(a: &Dataset, b: &Dataset, what: &str) {
    assert_eq!(a.columns, b.columns, "{what}: columns");
    assert_eq!(a.rows.len(), b.rows.len(), "{what}: row count");
    for (i, (x, y)) in a.rows.iter().zip(&b.rows).enumerate() {
        assert_eq!(x.to_string(), y.to_string(), "{what}: row {i}");
    }
}

#[test]
fn every_format_round_trips_nested_rows() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::from_rows(sample_rows()).unwrap();

    write_jsonl(dir.path().join("a.jsonl"), &ds).unwrap();
    assert_same(
        &ds,
        &load_dataset(dir.path().join("a.jsonl"), None).unwrap(),
        "jsonl",
    );

    write_parquet(dir.path().join("a.parquet"), &ds).unwrap();
    assert_same(
        &ds,
        &load_dataset(dir.path().join("a.parquet"), None).unwrap(),
        "parquet",
    );

    save_dataset(dir.path().join("single"), &ds).unwrap();
    assert_same(
        &ds,
        &load_dataset(dir.path().join("single"), None).unwrap(),
        "Dataset dir",
    );

    let parts = train_test_split(&ds, 0.2, 7).unwrap();
    let dict = dir.path().join("dict");
    save_dataset_dict(&dict, &[("train", &parts.train), ("test", &parts.test)]).unwrap();
    assert_same(
        &parts.train,
        &load_dataset(&dict, Some("train")).unwrap(),
        "DatasetDict train",
    );
    assert_same(
        &parts.test,
        &load_dataset(&dict, Some("test")).unwrap(),
        "DatasetDict test",
    );
}

#[test]
fn save_to_disk_layout_matches_datasets() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::from_rows(vec![
        json!({"prompt": "p", "reward_model": {"ground_truth": "1"}, "messages": [{"role": "user", "content": "hi"}],
               "n": null, "x": 1.5, "tags": ["a"]}),
    ])
    .unwrap();
    let out = dir.path().join("out");
    save_dataset_dict(&out, &[("train", &ds)]).unwrap();
    let dd: Value =
        serde_json::from_str(&fs::read_to_string(out.join("dataset_dict.json")).unwrap()).unwrap();
    assert_eq!(dd, json!({"splits": ["train"]}));
    let info: Value =
        serde_json::from_str(&fs::read_to_string(out.join("train/dataset_info.json")).unwrap())
            .unwrap();
    assert_eq!(
        info["features"],
        json!({
            "prompt": {"dtype": "string", "_type": "Value"},
            "reward_model": {"ground_truth": {"dtype": "string", "_type": "Value"}},
            "messages": {"feature": {"role": {"dtype": "string", "_type": "Value"},
                                     "content": {"dtype": "string", "_type": "Value"}}, "_type": "List"},
            "n": {"dtype": "null", "_type": "Value"},
            "x": {"dtype": "float64", "_type": "Value"},
            "tags": {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"},
        })
    );
    let state: Value =
        serde_json::from_str(&fs::read_to_string(out.join("train/state.json")).unwrap()).unwrap();
    assert_eq!(
        state["_data_files"],
        json!([{"filename": "data-00000-of-00001.arrow"}])
    );
    assert_eq!(state["_split"], json!("train"));
    assert_eq!(state["_fingerprint"].as_str().unwrap().len(), 16);
    let bytes = fs::read(out.join("train/data-00000-of-00001.arrow")).unwrap();
    assert_ne!(
        &bytes[..6],
        b"ARROW1",
        "datasets uses the IPC stream format, not the file format"
    );
    // Same rows, same bytes, same fingerprint.
    let again = dir.path().join("again");
    save_dataset_dict(&again, &[("train", &ds)]).unwrap();
    assert_eq!(
        bytes,
        fs::read(again.join("train/data-00000-of-00001.arrow")).unwrap()
    );
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn writes_replace_datasets_but_never_other_directories() {
    let dir = tempfile::tempdir().unwrap();
    let one = Dataset::from_rows(vec![json!({"a": 1})]).unwrap();
    let two = Dataset::from_rows(vec![json!({"a": 2}), json!({"a": 3})]).unwrap();
    let out = dir.path().join("ds");
    save_dataset_dict(&out, &[("train", &one)]).unwrap();
    save_dataset_dict(&out, &[("train", &two)]).unwrap();
    assert_eq!(load_dataset(&out, Some("train")).unwrap().rows, two.rows);
    assert_eq!(
        entries(dir.path()),
        ["ds"],
        "no temporary or backup directory left behind"
    );

    let precious = dir.path().join("home");
    fs::create_dir(&precious).unwrap();
    fs::write(precious.join("notes.txt"), "keep me").unwrap();
    let err = save_dataset_dict(&precious, &[("train", &one)]).unwrap_err();
    assert!(matches!(err, DataError::Write { .. }), "{err}");
    assert!(err.to_string().contains("not a saved dataset"), "{err}");
    assert_eq!(
        fs::read_to_string(precious.join("notes.txt")).unwrap(),
        "keep me"
    );

    // A failed write (inconsistent rows) leaves the old file in place and no temp file.
    let file = dir.path().join("rows.parquet");
    write_parquet(&file, &one).unwrap();
    let bad = Dataset::from_rows(vec![json!({"a": 1}), json!({"a": "x"})]).unwrap();
    assert!(write_parquet(&file, &bad).is_err());
    assert!(save_dataset_dict(&out, &[("train", &bad)]).is_err());
    assert_eq!(load_dataset(&file, None).unwrap().rows, one.rows);
    assert_eq!(load_dataset(&out, Some("train")).unwrap().rows, two.rows);
    assert_eq!(entries(dir.path()), ["ds", "home", "rows.parquet"]);
}

#[test]
fn empty_and_all_null_datasets_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let empty = Dataset::new(vec!["prompt".into()], vec![]);
    save_dataset(dir.path().join("empty"), &empty).unwrap();
    let back = load_dataset(dir.path().join("empty"), None).unwrap();
    assert_eq!(back.columns, ["prompt"]);
    assert!(back.is_empty());
    write_parquet(dir.path().join("empty.parquet"), &empty).unwrap();
    assert_eq!(
        load_dataset(dir.path().join("empty.parquet"), None)
            .unwrap()
            .columns,
        ["prompt"]
    );
}

#[test]
fn sparse_keys_and_mixed_numbers_read_back_as_arrow_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::from_rows(vec![
        json!({"a": 1, "s": {"x": 1}}),
        json!({"a": 2.5, "s": {"y": "k"}, "b": true}),
    ])
    .unwrap();
    assert_eq!(
        ds.rows[0],
        json!({"a": 1, "s": {"x": 1}, "b": null}),
        "absent columns are filled with null"
    );
    let path = dir.path().join("m.parquet");
    write_parquet(&path, &ds).unwrap();
    let back = load_dataset(&path, None).unwrap();
    assert_eq!(
        back.rows[0],
        json!({"a": 1.0, "s": {"x": 1, "y": null}, "b": null})
    );
    assert_eq!(
        back.rows[1],
        json!({"a": 2.5, "s": {"x": null, "y": "k"}, "b": true})
    );
}
