//! The tiny_python_expr launch script refuses `SKIP_DATASET_BUILD=1` without a dataset and says
//! how to build one (before building or downloading anything).

use std::path::Path;
use std::process::Command;

#[test]
fn skip_dataset_build_without_dataset_says_how_to_build_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let missing = tempfile::tempdir().unwrap();
    let data = missing.path().join("nothing-here");
    let out = Command::new("bash")
        .arg(root.join("examples/tiny_python_expr/run.sh"))
        .env("SKIP_DATASET_BUILD", "1")
        .env("DATA_DIR", &data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SKIP_DATASET_BUILD=1"), "{err}");
    assert!(err.contains("rlft data tiny-python-expr --output"), "{err}");
}
