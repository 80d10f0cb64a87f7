//! Pooling the rounds of a case (`rlft bench --rounds N`).
//!
//! On a shared machine the speed drifts over minutes (other tenants of the host take memory
//! bandwidth and turbo headroom). With one rlft run followed by one reference run, a slow minute
//! lands on one side only and moves the ratio by 20-30%. With rounds, a case runs rlft, the
//! reference, rlft, the reference, ... and each side's repetitions of all rounds are pooled: the
//! median then sits in the conditions both sides saw. Each round is a fresh process with its own
//! warm-up; peak RSS is the highest of the rounds.

use serde_json::{json, Value};

use super::report::{stats_ms, RefOutcome};

/// The `reps_ms` of a stats object (`time` of rlft, the summary of the reference).
fn reps_ms(v: &Value) -> Vec<f64> {
    v["reps_ms"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The highest of a number field over the rounds (`null` when none has it).
fn max_of<'a>(vals: impl Iterator<Item = &'a Value>) -> Value {
    vals.filter_map(Value::as_f64)
        .reduce(f64::max)
        .map_or(Value::Null, Value::from)
}

/// Stats (median, min, max, reps) over the pooled `reps_ms` of `stats`.
fn pooled<'a>(stats: impl Iterator<Item = &'a Value>) -> Value {
    let secs: Vec<f64> = stats.flat_map(reps_ms).map(|ms| ms / 1e3).collect();
    stats_ms(&secs)
}

/// rlft's result over its rounds: the pooled repetitions as `time`, the highest peak RSS and
/// interference, each round's median in `round_medians_ms`; other fields from the first round.
/// A failed round (an `error` entry) makes the whole case failed.
pub fn merge_ours(rounds: Vec<Value>) -> Value {
    if rounds.len() == 1 || rounds.iter().any(|r| r.get("error").is_some()) {
        return rounds
            .iter()
            .find(|r| r.get("error").is_some())
            .cloned()
            .unwrap_or_else(|| rounds.into_iter().next().unwrap_or(Value::Null));
    }
    let mut out = rounds[0].clone();
    let time = pooled(rounds.iter().map(|r| &r["time"]));
    out["peak_rss_mib"] = max_of(rounds.iter().map(|r| &r["peak_rss_mib"]));
    for key in ["other_procs_cpu_pct", "steal_pct"] {
        out["interference"][key] = max_of(rounds.iter().map(|r| &r["interference"][key]));
    }
    out["round_medians_ms"] = rounds
        .iter()
        .map(|r| r["time"]["median_ms"].clone())
        .collect();
    out["rounds"] = json!(rounds.len());
    recompute_rates(&mut out["detail"], &time);
    out["time"] = time;
    out
}

/// The reference's outcome over its rounds, pooled like [`merge_ours`] (and the
/// `forward_no_grad` figure a later `ref_pass` reads from the raw result). Any failed round
/// makes the outcome failed.
pub fn merge_reference(rounds: Vec<RefOutcome>) -> RefOutcome {
    if rounds.len() == 1 || rounds.iter().any(|r| r.failed || r.summary.is_none()) {
        let pick = rounds
            .iter()
            .position(|r| r.failed)
            .or_else(|| rounds.iter().position(|r| r.summary.is_none()))
            .unwrap_or(0);
        return rounds.into_iter().nth(pick).unwrap_or(RefOutcome {
            summary: None,
            note: None,
            failed: false,
        });
    }
    let sums: Vec<&Value> = rounds.iter().filter_map(|r| r.summary.as_ref()).collect();
    let mut out = sums[0].clone();
    let time = pooled(sums.iter().copied());
    for key in ["median_ms", "min_ms", "max_ms", "reps_ms"] {
        out[key] = time[key].clone();
    }
    for key in ["peak_rss_mib", "other_procs_cpu_pct", "steal_pct"] {
        out[key] = max_of(sums.iter().map(|s| &s[key]));
    }
    out["round_medians_ms"] = sums.iter().map(|s| s["median_ms"].clone()).collect();
    out["rounds"] = json!(sums.len());
    if out.get("new_tokens_per_s_median").is_some() {
        // Same tokens per call in every round: scale the first round's rate by its median.
        let first = sums[0]["median_ms"].as_f64();
        let rate = sums[0]["new_tokens_per_s_median"].as_f64();
        if let (Some(f), Some(r), Some(m)) = (first, rate, time["median_ms"].as_f64()) {
            out["new_tokens_per_s_median"] = json!(r * f / m);
        }
    }
    if out["raw"].get("forward_no_grad").is_some() {
        out["raw"]["forward_no_grad"] = pooled(sums.iter().map(|s| &s["raw"]["forward_no_grad"]));
    }
    RefOutcome {
        summary: Some(out),
        note: rounds.into_iter().find_map(|r| r.note),
        failed: false,
    }
}

/// Rates in rlft's `detail` that follow from the time (generate's new tokens per second).
fn recompute_rates(detail: &mut Value, time: &Value) {
    let (Some(batch), Some(new), Some(med), Some(min)) = (
        detail["batch"].as_f64(),
        detail["new_tokens_per_seq"].as_f64(),
        time["median_ms"].as_f64(),
        time["min_ms"].as_f64(),
    ) else {
        return;
    };
    detail["new_tokens_per_s_median"] = json!(batch * new / (med / 1e3));
    detail["new_tokens_per_s_best"] = json!(batch * new / (min / 1e3));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(reps: &[f64], rss: f64, steal: f64) -> Value {
        let secs: Vec<f64> = reps.iter().map(|r| r / 1e3).collect();
        json!({
            "case": "generate", "time": stats_ms(&secs), "peak_rss_mib": rss,
            "interference": {"other_procs_cpu_pct": 0.0, "steal_pct": steal},
            "detail": {"batch": 8, "new_tokens_per_seq": 32},
        })
    }

    #[test]
    fn rlft_rounds_pool_their_reps() {
        let m = merge_ours(vec![
            ours(&[100.0, 300.0, 200.0], 700.0, 0.5),
            ours(&[400.0, 500.0, 600.0], 710.0, 2.0),
        ]);
        assert_eq!(m["time"]["reps_ms"].as_array().unwrap().len(), 6);
        assert_eq!(m["time"]["median_ms"], json!(350.0));
        assert_eq!(m["time"]["min_ms"], json!(100.0));
        assert_eq!(m["peak_rss_mib"], json!(710.0));
        assert_eq!(m["interference"]["steal_pct"], json!(2.0));
        assert_eq!(m["round_medians_ms"], json!([200.0, 500.0]));
        assert_eq!(m["rounds"], json!(2));
        // 256 tokens in 0.35 s.
        let rate = m["detail"]["new_tokens_per_s_median"].as_f64().unwrap();
        assert!((rate - 256.0 / 0.35).abs() < 1e-9);
        // One round is passed through; a failed round fails the case.
        let one = ours(&[1.0], 1.0, 0.0);
        assert_eq!(merge_ours(vec![one.clone()]), one);
        let failed = merge_ours(vec![one, json!({"error": "boom"})]);
        assert_eq!(failed["error"], json!("boom"));
    }

    fn theirs(reps: &[f64], fng: &[f64]) -> RefOutcome {
        let secs: Vec<f64> = reps.iter().map(|r| r / 1e3).collect();
        let t = stats_ms(&secs);
        let f: Vec<f64> = fng.iter().map(|r| r / 1e3).collect();
        RefOutcome {
            summary: Some(json!({
                "source": "bench.py", "median_ms": t["median_ms"], "min_ms": t["min_ms"],
                "max_ms": t["max_ms"], "reps_ms": t["reps_ms"], "peak_rss_mib": reps[0],
                "other_procs_cpu_pct": 0.1, "steal_pct": null,
                "raw": {"forward_no_grad": stats_ms(&f)},
            })),
            note: None,
            failed: false,
        }
    }

    #[test]
    fn reference_rounds_pool_their_reps_and_forward_no_grad() {
        let m = merge_reference(vec![
            theirs(&[10.0, 30.0], &[1.0, 2.0]),
            theirs(&[20.0, 40.0], &[3.0, 4.0]),
        ]);
        let s = m.summary.unwrap();
        assert_eq!(s["median_ms"], json!(25.0));
        assert_eq!(s["reps_ms"].as_array().unwrap().len(), 4);
        assert_eq!(s["peak_rss_mib"], json!(20.0));
        assert_eq!(s["steal_pct"], Value::Null);
        assert_eq!(s["raw"]["forward_no_grad"]["median_ms"], json!(2.5));
        assert!(!m.failed);
        // A failed round fails the outcome.
        let bad = RefOutcome {
            summary: None,
            note: Some("reference failed".into()),
            failed: true,
        };
        let m = merge_reference(vec![theirs(&[1.0], &[1.0]), bad]);
        assert!(m.failed && m.summary.is_none());
    }
}
