//! The importance-sampling correction of server rollouts against TRL 1.16's formula in torch
//! (`scripts/reference/is_correction_golden.py` -> `tests/data/is_correction_golden.json`;
//! TRL `grpo_trainer.py:2660-2709` for the ratio, :2860-2896 for the metrics): every mode,
//! three clip settings, a masked-out completion and a token the sampler did not score.

mod common;

use rlft::algo::is_correction::{is_weights, IsCorrection};
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    mode: String,
    clip_min: Option<f64>,
    clip_max: Option<f64>,
    weights: Vec<Vec<f64>>,
    stats: std::collections::BTreeMap<String, f64>,
}

#[derive(Deserialize)]
struct Golden {
    old: Vec<Vec<f32>>,
    sampling: Vec<Vec<Option<f32>>>,
    keep: Vec<bool>,
    cases: Vec<Case>,
}

#[test]
fn is_correction_matches_trl() {
    let g: Golden = common::golden::load("is_correction_golden.json");
    let samp: Vec<Vec<f32>> = g
        .sampling
        .iter()
        .map(|r| r.iter().map(|x| x.unwrap_or(f32::NAN)).collect())
        .collect();
    assert_eq!(g.cases.len(), 12);
    for c in &g.cases {
        let corr = IsCorrection {
            mode: c.mode.parse().unwrap(),
            clip_min: c.clip_min,
            clip_max: c.clip_max.unwrap_or(f64::INFINITY),
        };
        let what = format!("{} [{:?}, {:?}]", c.mode, c.clip_min, c.clip_max);
        let (w, stats) = is_weights(&g.old, &samp, &g.keep, &corr);
        for (i, (row, want)) in w.iter().zip(&c.weights).enumerate() {
            assert_eq!(row.len(), want.len(), "{what}: row {i}");
            for (a, b) in row.iter().zip(want) {
                assert!(
                    (*a as f64 - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{what}: row {i}: {a} vs TRL {b}"
                );
            }
        }
        for (k, v) in stats.metrics() {
            let want = c.stats[&k];
            assert!(
                (v - want).abs() <= 1e-9 * want.abs().max(1.0),
                "{what}: {k} {v} vs TRL {want}"
            );
        }
    }
}
