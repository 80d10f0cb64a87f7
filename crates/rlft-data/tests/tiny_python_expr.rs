//! The tiny_python_expr generator against the Python reference, byte for byte: the seed fixture
//! `tests/fixtures/tiny_python_expr/dataset_seed42_128_32.jsonl` (defaults) and goldens for other
//! options, all written by `scripts/reference/tiny_python_expr_reference.py`.

use std::path::PathBuf;

use rlft_data::synth::tiny_python_expr::{generate, Op, Split, TinyPythonExprOptions};
use rlft_data::synth::{write_python_jsonl, SaveFormats};
use rlft_data::{load_dataset, read_jsonl, DataError};

#[path = "../../../tests/fixtures.rs"]
mod fixtures;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Asserts equal text, naming the first differing line.
fn assert_same_bytes(got: &str, want: &str, what: &str) {
    if got == want {
        return;
    }
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "{what}: line {} differs", i + 1);
    }
    panic!(
        "{what}: {} lines generated, {} expected",
        got.lines().count(),
        want.lines().count()
    );
}

#[test]
fn defaults_reproduce_the_seed_fixture() {
    let want = fixtures::read_fixture(fixtures::TINY_PYTHON_EXPR_DATASET);
    let ds = generate(&TinyPythonExprOptions::default()).unwrap();
    assert_eq!((ds.train.len(), ds.test.len()), (128, 32));
    assert_same_bytes(&ds.to_jsonl(), &want, "seed 42, 128/32");
}

#[test]
fn seed_7_matches_the_python_reference() {
    let want = std::fs::read_to_string(data("tiny_python_expr_seed7_50_20.jsonl")).unwrap();
    let opts = TinyPythonExprOptions {
        seed: 7,
        train_size: 50,
        test_size: 20,
        ..Default::default()
    };
    assert_same_bytes(&generate(&opts).unwrap().to_jsonl(), &want, "seed 7, 50/20");
}

#[test]
fn all_operators_match_the_python_reference() {
    let want = std::fs::read_to_string(data("tiny_python_expr_seed3_allops_40_15.jsonl")).unwrap();
    let opts = TinyPythonExprOptions {
        seed: 3,
        train_size: 40,
        test_size: 15,
        operators: Op::parse_list("+,-,*,//,%,**").unwrap(),
        max_depth: 4,
        leaf_max: 12,
        value_max: 500,
        ..Default::default()
    };
    let ds = generate(&opts).unwrap();
    assert_same_bytes(&ds.to_jsonl(), &want, "seed 3, all operators");
    for op in ["//", "%", "**"] {
        let used = ds
            .train
            .iter()
            .any(|r| r.expression.contains(&format!(" {op} ")));
        assert!(used, "no {op} in the train split");
    }
}

#[test]
fn splits_are_distinct_and_indexed() {
    let ds = generate(&TinyPythonExprOptions {
        seed: 1,
        train_size: 300,
        test_size: 100,
        ..Default::default()
    })
    .unwrap();
    for split in [Split::Train, Split::Test] {
        let records = ds.records(split);
        let unique: std::collections::HashSet<_> = records.iter().map(|r| &r.expression).collect();
        assert_eq!(unique.len(), records.len());
        for (i, r) in records.iter().enumerate() {
            assert_eq!((r.index, r.split), (i, split));
            assert!((0..=200).contains(&r.answer));
        }
    }
}

#[test]
fn an_impossible_size_stops_with_a_clear_error() {
    // Leaves 0..=2 and one `+` level: 3 leaves + 9 sums = 12 distinct expressions at most.
    let opts = TinyPythonExprOptions {
        train_size: 13,
        operators: vec![Op::Add],
        max_depth: 1,
        leaf_max: 2,
        ..Default::default()
    };
    let err = generate(&opts).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::SynthExhausted {
                found: 12,
                wanted: 13,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("lower the train size or widen the range"),
        "{msg}"
    );
    // One fewer fits.
    let ok = generate(&TinyPythonExprOptions {
        train_size: 12,
        test_size: 12,
        ..opts
    })
    .unwrap();
    assert_eq!(ok.train.len(), 12);
}

#[test]
fn options_that_reject_almost_everything_stop_instead_of_hanging() {
    // Leaves 0..=2 but every operator result must be at least 14: nearly every try fails, and
    // a depth-5 row could cost (2 * 64)^5 nodes.
    let opts = TinyPythonExprOptions {
        operators: vec![Op::Add],
        max_depth: 5,
        leaf_max: 2,
        value_min: 14,
        ..Default::default()
    };
    let start = std::time::Instant::now();
    let msg = generate(&opts).unwrap_err().to_string();
    assert!(
        msg.contains("the options reject almost every expression"),
        "{msg}"
    );
    assert!(start.elapsed().as_secs() < 60);
}

#[test]
fn invalid_options_are_named() {
    let bad = |o: TinyPythonExprOptions| generate(&o).unwrap_err().to_string();
    let base = TinyPythonExprOptions::default;
    assert!(bad(TinyPythonExprOptions {
        operators: vec![],
        ..base()
    })
    .contains("operators is empty"));
    assert!(bad(TinyPythonExprOptions {
        max_depth: 0,
        ..base()
    })
    .contains("max_depth"));
    let msg = bad(TinyPythonExprOptions {
        value_min: 5,
        value_max: 4,
        ..base()
    });
    assert!(msg.contains("value_min 5 is above value_max 4"), "{msg}");
}

#[test]
fn saves_a_dataset_dict_and_python_style_jsonl() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tpe");
    let ds = generate(&TinyPythonExprOptions {
        train_size: 10,
        test_size: 4,
        ..Default::default()
    })
    .unwrap();
    let formats = SaveFormats {
        jsonl: true,
        parquet: true,
    };
    let written = ds.save(&dir, formats).unwrap();
    assert_eq!(written.len(), 5, "{written:?}");
    for (split, n) in [("train", 10), ("test", 4)] {
        let want: Vec<_> = ds
            .to_dataset(if split == "train" {
                Split::Train
            } else {
                Split::Test
            })
            .rows;
        let from_dict = load_dataset(&dir, Some(split)).unwrap();
        assert_eq!(from_dict.len(), n);
        assert_eq!(from_dict.rows, want, "{split} from the DatasetDict");
        assert_eq!(
            read_jsonl(&dir.join(format!("{split}.jsonl")))
                .unwrap()
                .rows,
            want
        );
        let parquet = load_dataset(dir.join(format!("{split}.parquet")), None).unwrap();
        assert_eq!(parquet.rows, want, "{split} from Parquet");
    }
    let text = std::fs::read_to_string(dir.join("train.jsonl")).unwrap();
    assert!(
        text.starts_with("{\"data_source\": \"tiny_python_expr\", \"prompt\": "),
        "{text}"
    );
    assert_eq!(
        text + &std::fs::read_to_string(dir.join("test.jsonl")).unwrap(),
        ds.to_jsonl()
    );
    // Saving again replaces the dataset directory.
    ds.save(&dir, SaveFormats::default()).unwrap();
    assert!(!dir.join("train.jsonl").exists());
}

#[test]
fn python_jsonl_writer_rejects_non_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let err =
        write_python_jsonl(tmp.path().join("x.jsonl"), &[serde_json::json!([1])]).unwrap_err();
    assert!(err.to_string().contains("row 0"), "{err}");
}
