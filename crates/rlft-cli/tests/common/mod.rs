//! Running the built `rlft` binary, shared by the CLI tests (each test binary uses a part).
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `rlft` with `args`.
pub fn rlft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlft"))
        .args(args)
        .output()
        .expect("run rlft")
}

/// Asserts that the run succeeded (else fails with its stderr); returns its stdout.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "rlft failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// As [`ok`], returning stdout followed by stderr (for what commands log to stderr).
pub fn ok_all(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rlft failed: {err}");
    format!("{}{err}", String::from_utf8_lossy(&out.stdout))
}
