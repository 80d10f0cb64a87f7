//! Error messages name the file, line, column or split at fault and the fix; validation and
//! split helpers behave as documented.

use std::fs;
use std::path::PathBuf;

use rlft_data::{
    get_path, load_dataset, lookup, require_columns, save_dataset_dict, train_test_split,
    write_jsonl, DataError, Dataset, TestSize,
};
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn msg(e: DataError) -> String {
    e.to_string()
}

#[test]
fn bad_jsonl_line_is_reported_with_its_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    fs::write(
        &path,
        "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"}\n{\"prompt\": oops}\n",
    )
    .unwrap();
    let err = load_dataset(&path, None).unwrap_err();
    assert!(
        matches!(err, DataError::JsonLine { line: 4, .. }),
        "{err:?}"
    );
    let m = msg(err);
    assert!(
        m.starts_with(&format!("{}:4: invalid JSON", path.display())),
        "{m}"
    );

    fs::write(&path, "{\"a\": 1}\n[1, 2]\n").unwrap();
    let m = msg(load_dataset(&path, None).unwrap_err());
    assert!(
        m.contains("bad.jsonl:2") && m.contains("must be a JSON object") && m.contains("an array"),
        "{m}"
    );
}

#[test]
fn json_array_files_and_blank_lines_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.json");
    fs::write(&path, "\u{feff}\n  [{\"a\": 1}, {\"b\": [true]}]").unwrap();
    let ds = load_dataset(&path, None).unwrap();
    assert_eq!(ds.columns, ["a", "b"]);
    assert_eq!(
        ds.rows,
        [json!({"a": 1, "b": null}), json!({"a": null, "b": [true]})]
    );
}

#[test]
fn missing_paths_and_unknown_formats_say_what_is_supported() {
    let m = msg(load_dataset("/nonexistent/train.jsonl", None).unwrap_err());
    assert!(
        m.contains("/nonexistent/train.jsonl does not exist") && m.contains("save_to_disk"),
        "{m}"
    );
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("data.csv");
    fs::write(&csv, "a,b\n").unwrap();
    let m = msg(load_dataset(&csv, None).unwrap_err());
    assert!(
        m.contains("data.csv") && m.contains("extension .csv") && m.contains(".parquet"),
        "{m}"
    );
    let m = msg(load_dataset(dir.path(), None).unwrap_err());
    assert!(m.contains("without dataset_dict.json or state.json"), "{m}");
}

#[test]
fn dataset_dict_needs_a_known_split() {
    let dict = fixture("tiny_expr_dict");
    let err = load_dataset(&dict, None).unwrap_err();
    assert!(matches!(err, DataError::SplitRequired { .. }));
    let m = msg(err);
    assert!(
        m.contains("DatasetDict with splits [train, test]") && m.contains("\"train\""),
        "{m}"
    );
    let m = msg(load_dataset(&dict, Some("tset")).unwrap_err());
    assert!(
        m.contains("no split \"tset\"") && m.contains("did you mean \"test\"?"),
        "{m}"
    );
    let m = msg(load_dataset(fixture("tiny_expr_train.jsonl"), Some("test")).unwrap_err());
    assert!(
        m.contains("single dataset") && m.contains("no split \"test\""),
        "{m}"
    );
    // A split's own directory is a Dataset dir; its recorded `_split` is null in datasets' output.
    assert_eq!(load_dataset(dict.join("test"), None).unwrap().len(), 3);
}

#[test]
fn broken_save_to_disk_directories_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::from_rows(vec![json!({"a": 1})]).unwrap();
    let out = dir.path().join("out");
    save_dataset_dict(&out, &[("train", &ds)]).unwrap();
    fs::remove_file(out.join("train/data-00000-of-00001.arrow")).unwrap();
    let m = msg(load_dataset(&out, Some("train")).unwrap_err());
    assert!(
        m.contains("cannot open") && m.contains("data-00000-of-00001.arrow"),
        "{m}"
    );
    fs::write(
        out.join("train/data-00000-of-00001.arrow"),
        b"not arrow at all",
    )
    .unwrap();
    let m = msg(load_dataset(&out, Some("train")).unwrap_err());
    assert!(
        m.contains("data-00000-of-00001.arrow: cannot read Arrow IPC data"),
        "{m}"
    );
    fs::write(out.join("train/state.json"), "{}").unwrap();
    let m = msg(load_dataset(&out, Some("train")).unwrap_err());
    assert!(
        m.contains("state.json") && m.contains("_data_files") && m.contains("save_to_disk"),
        "{m}"
    );
}

#[test]
fn writers_name_the_column_and_row_of_a_type_clash() {
    let dir = tempfile::tempdir().unwrap();
    let rows = vec![
        json!({"extra_info": {"index": 0}}),
        json!({"extra_info": {"index": 1}}),
        json!({"extra_info": {"index": "two"}}),
    ];
    let ds = Dataset::from_rows(rows).unwrap();
    let err = save_dataset_dict(dir.path().join("o"), &[("train", &ds)]).unwrap_err();
    assert!(
        matches!(&err, DataError::InconsistentType { column, row: 2, .. } if column == "extra_info.index")
    );
    assert!(msg(err).contains("row 2 holds a string but earlier rows hold an integer"));

    let ds = Dataset::from_rows(vec![json!({"m": [{"role": "user"}, {"role": 3}]})]).unwrap();
    let m = msg(rlft_data::write_parquet(dir.path().join("o.parquet"), &ds).unwrap_err());
    assert!(m.starts_with("column \"m[].role\": row 0"), "{m}");

    let ds = Dataset::from_rows(vec![json!({"n": u64::MAX})]).unwrap();
    let m = msg(rlft_data::write_parquet(dir.path().join("o.parquet"), &ds).unwrap_err());
    assert!(m.contains("\"n\"") && m.contains("int64 range"), "{m}");

    let m = msg(Dataset::from_rows(vec![json!({"a": 1}), json!("text")]).unwrap_err());
    assert!(m.contains("row 1") && m.contains("a string"), "{m}");
    let m = msg(write_jsonl(
        dir.path().join("x.jsonl"),
        &Dataset::new(vec![], vec![json!(3)]),
    )
    .unwrap_err());
    assert!(m.contains("row 0"), "{m}");
    let m = msg(save_dataset_dict(
        dir.path().join("o2"),
        &[("train/x", &Dataset::new(vec![], vec![]))],
    )
    .unwrap_err());
    assert!(m.contains("split name \"train/x\""), "{m}");
}

#[test]
fn require_columns_suggests_the_closest_column() {
    let ds = load_dataset(fixture("tiny_expr_train.jsonl"), None).unwrap();
    require_columns(&ds, &["prompt", "reward_model"]).unwrap();
    let err = require_columns(&ds, &["prompt", "promt"]).unwrap_err();
    let m = msg(err);
    assert!(
        m.contains("tiny_expr_train.jsonl has no column \"promt\""),
        "{m}"
    );
    assert!(
        m.contains("its columns are [data_source, prompt, ability, reward_model"),
        "{m}"
    );
    assert!(m.ends_with("did you mean \"prompt\"?"), "{m}");
    let m = msg(require_columns(&ds, &["question"]).unwrap_err());
    assert!(
        !m.contains("did you mean"),
        "no suggestion when nothing is close: {m}"
    );
    let m = msg(require_columns(&ds, &["Messages"]).unwrap_err());
    assert!(m.ends_with("did you mean \"messages\"?"), "{m}");

    let empty = Dataset::new(vec!["prompt".into()], vec![]);
    let m = msg(require_columns(&empty, &["prompt"]).unwrap_err());
    assert!(m.contains("dataset (in memory) has no rows"), "{m}");
}

#[test]
fn dotted_paths_walk_objects_and_arrays() {
    let row = json!({"reward_model": {"ground_truth": "26"}, "messages": [{"content": "hi"}],
                     "flat.key": 5, "n": null});
    assert_eq!(
        get_path(&row, "reward_model.ground_truth"),
        Some(&json!("26"))
    );
    assert_eq!(get_path(&row, "messages.0.content"), Some(&json!("hi")));
    assert_eq!(get_path(&row, "flat.key"), Some(&json!(5)));
    assert_eq!(get_path(&row, "reward_model.answer"), None);
    let m = msg(lookup(&row, "reward_model.answer", "row 3").unwrap_err());
    assert!(
        m.contains("row 3: no value at \"reward_model.answer\"")
            && m.contains("keys: [ground_truth]"),
        "{m}"
    );
    let m = msg(lookup(&row, "messages.5", "row 0").unwrap_err());
    assert!(m.contains("has 1 items, no index 5"), "{m}");
    let m = msg(lookup(&row, "n.x", "row 0").unwrap_err());
    assert!(m.contains("\"n\" is null, not an object"), "{m}");
}

#[test]
fn train_test_split_is_deterministic_and_checked() {
    let ds = Dataset::from_rows((0..10).map(|i| json!({"i": i})).collect()).unwrap();
    let a = train_test_split(&ds, 0.25, 42).unwrap();
    assert_eq!(
        (a.train.len(), a.test.len()),
        (7, 3),
        "ceil(0.25 * 10) = 3 test rows"
    );
    assert_eq!(a, train_test_split(&ds, 0.25, 42).unwrap());
    assert_ne!(
        a.test.rows,
        train_test_split(&ds, 0.25, 43).unwrap().test.rows
    );
    let mut all: Vec<i64> = a
        .train
        .iter()
        .chain(a.test.iter())
        .map(|r| r["i"].as_i64().unwrap())
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    // Pinned: the documented SplitMix64 + Fisher-Yates permutation for seed 42.
    assert_eq!(rlft_data::split::permutation(10, 42), PINNED_SEED42);
    let b = train_test_split(&ds, TestSize::Count(2), 42).unwrap();
    assert_eq!(b.test.len(), 2);

    for bad in [
        TestSize::Fraction(0.0),
        TestSize::Fraction(1.0),
        TestSize::Count(0),
        TestSize::Count(10),
    ] {
        let m = msg(train_test_split(&ds, bad, 1).unwrap_err());
        assert!(m.starts_with("train_test_split:"), "{m}");
    }
}

/// Computed by an independent Python transcription of the algorithm in `split`'s docs.
const PINNED_SEED42: [usize; 10] = [8, 3, 6, 5, 4, 0, 9, 2, 1, 7];
