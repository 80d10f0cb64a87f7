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
