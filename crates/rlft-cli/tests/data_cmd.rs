//! `rlft data tiny-python-expr`: writes the seed example's DatasetDict (byte-identical to the
//! Python original), refuses to clobber, and names bad options.

mod common;

use common::rlft;

use std::path::{Path, PathBuf};
use std::process::Output;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "rlft failed: {}", stderr(out));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

#[test]
fn defaults_write_the_fixture_as_a_dataset_dict() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tpe");
    let d = dir.to_str().unwrap();
    let stdout = ok(&rlft(&[
        "data",
        "tiny-python-expr",
        "--output",
        d,
        "--jsonl",
        "--parquet",
    ]));
    assert!(stdout.contains("train: 128 rows"), "{stdout}");
    assert!(stdout.contains("test:  32 rows"), "{stdout}");
    assert!(stdout.contains(&format!("--set dataset={d}")), "{stdout}");
    for f in [
        "dataset_dict.json",
        "train/state.json",
        "test/dataset_info.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    for f in ["train.jsonl", "test.jsonl", "train.parquet", "test.parquet"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let train = rlft_data::load_dataset(&dir, Some("train")).unwrap();
    assert_eq!(train.len(), 128);
    assert_eq!(train.rows[2]["extra_info"]["expression"], "(13 * 2)");
    let jsonl = read(&dir.join("train.jsonl")) + &read(&dir.join("test.jsonl"));
    let want = fixtures::read_fixture(fixtures::TINY_PYTHON_EXPR_DATASET);
    assert!(jsonl == want, "the JSONL differs from the seed fixture");

    // A second run refuses the non-empty directory, and replaces it with --overwrite.
    let again = rlft(&["data", "tiny-python-expr", "-o", d]);
    assert!(!again.status.success());
    let msg = stderr(&again);
    assert!(
        msg.contains("already exists and is not empty; pass --overwrite"),
        "{msg}"
    );
    let stdout = ok(&rlft(&[
        "data",
        "tiny-python-expr",
        "-o",
        d,
        "--overwrite",
        "--seed",
        "7",
        "--train-size",
        "50",
        "--test-size",
        "20",
        "--jsonl",
    ]));
    assert!(stdout.contains("train: 50 rows"), "{stdout}");
    assert!(
        !dir.join("train.parquet").exists(),
        "the old directory was replaced"
    );
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rlft-data/tests/data/tiny_python_expr_seed7_50_20.jsonl");
    let jsonl = read(&dir.join("train.jsonl")) + &read(&dir.join("test.jsonl"));
    assert!(
        jsonl == read(&golden),
        "seed 7 differs from the Python golden"
    );
}

#[test]
fn overwrite_never_deletes_a_directory_that_is_not_a_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("notes.txt"), "keep me").unwrap();
    let d = tmp.path().to_str().unwrap();
    let out = rlft(&["data", "tiny-python-expr", "-o", d, "--overwrite"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a saved dataset"),
        "{}",
        stderr(&out)
    );
    assert_eq!(read(&tmp.path().join("notes.txt")), "keep me");
}

#[test]
fn extended_operators_and_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ops");
    let d = dir.to_str().unwrap();
    let stdout = ok(&rlft(&[
        "data",
        "tiny-python-expr",
        "-o",
        d,
        "--operators",
        "+,-,*,//,%,**",
        "--max-depth",
        "4",
        "--value-max",
        "500",
        "--train-size",
        "40",
        "--test-size",
        "10",
    ]));
    assert!(stdout.contains("operators + - * // % **"), "{stdout}");
    assert_eq!(
        rlft_data::load_dataset(&dir, Some("test")).unwrap().len(),
        10
    );

    let bad = rlft(&["data", "tiny-python-expr", "-o", d, "--operators", "+,/"]);
    assert!(
        stderr(&bad).contains("unknown operator \"/\""),
        "{}",
        stderr(&bad)
    );
    let fresh = tmp.path().join("fresh");
    let too_many = rlft(&[
        "data",
        "tiny-python-expr",
        "-o",
        fresh.to_str().unwrap(),
        "--operators",
        "+",
        "--max-depth",
        "1",
        "--leaf-max",
        "2",
        "--train-size",
        "20",
    ]);
    let msg = stderr(&too_many);
    assert!(
        msg.contains("needs 20 distinct rows but only 12 were found")
            && msg.contains("lower the train size or widen the range"),
        "{msg}"
    );
    assert!(!fresh.exists(), "nothing is written on error");
}

#[test]
fn exclude_leaves_the_training_expressions_out_of_a_held_out_test_split() {
    let tmp = tempfile::tempdir().unwrap();
    let (train, held) = (tmp.path().join("train"), tmp.path().join("held"));
    let (t, h) = (train.to_str().unwrap(), held.to_str().unwrap());
    ok(&rlft(&[
        "data",
        "tiny-python-expr",
        "-o",
        t,
        "--train-size",
        "256",
    ]));
    let all = [
        "data",
        "tiny-python-expr",
        "--seed",
        "7",
        "--train-size",
        "0",
    ];
    let stdout = ok(&rlft(
        &[&all[..], &["-o", h, "--test-size", "300", "--exclude", t]].concat(),
    ));
    assert!(stdout.contains("test rows left out"), "{stdout}");
    let expressions = |dir: &Path, split: &str| -> Vec<String> {
        rlft_data::load_dataset(dir, Some(split))
            .unwrap()
            .iter()
            .map(|r| r["extra_info"]["expression"].as_str().unwrap().to_string())
            .collect()
    };
    let seen: std::collections::HashSet<String> = ["train", "test"]
        .iter()
        .flat_map(|s| expressions(&train, s))
        .collect();
    let kept = expressions(&held, "test");
    assert!(kept.len() > 200 && kept.len() < 300, "{}", kept.len());
    assert!(kept.iter().all(|e| !seen.contains(e)));
    // The rows kept are the seed's own rows, in order, re-indexed from 0.
    let index: Vec<u64> = rlft_data::load_dataset(&held, Some("test"))
        .unwrap()
        .iter()
        .map(|r| r["extra_info"]["index"].as_u64().unwrap())
        .collect();
    assert_eq!(index, (0..kept.len() as u64).collect::<Vec<_>>());
    // Something that is not such a dataset is named.
    let bad = rlft(
        &[
            &all[..],
            &["-o", h, "--overwrite", "--exclude", "/nonexistent"],
        ]
        .concat(),
    );
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("--exclude /nonexistent"),
        "{}",
        stderr(&bad)
    );
}
