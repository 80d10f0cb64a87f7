//! Results of `rlft bench`: timing statistics, the per-case entry (rlft, reference, ratio,
//! warnings), machine information, and the table.

use std::path::Path;
use std::process::Command;

use rlft_model::bench::median;
use serde_json::{json, Value};

use super::{Case, INTERFERENCE_WARN_PCT};

/// How the ratio column reads.
pub const RATIO_DEFINITION: &str =
    "rlft median time / reference median time: below 1 means rlft is faster";

/// Median, min, max and every rep of `times_s` (seconds), in ms.
pub fn stats_ms(times_s: &[f64]) -> Value {
    let ms: Vec<f64> = times_s.iter().map(|t| t * 1e3).collect();
    let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({"median_ms": median(&ms), "min_ms": min, "max_ms": max, "reps_ms": ms})
}

/// What the reference side of a case came to.
pub struct RefOutcome {
    /// The reference's summary (see `reference::summarize`), if any.
    pub summary: Option<Value>,
    /// Why there is none, or how it compares.
    pub note: Option<String>,
    /// Whether the reference run failed.
    pub failed: bool,
}

/// One case's entry of the result: what a rep is, rlft's result, the reference's, the ratio of
/// median times, notes and warnings.
pub fn case_entry(case: Case, ours: Value, theirs: RefOutcome, against_reference: bool) -> Value {
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    let pct = |v: &Value| v.as_f64().filter(|p| *p > INTERFERENCE_WARN_PCT);
    let sides = [
        ("rlft's", Some(&ours)),
        ("the reference's", theirs.summary.as_ref()),
    ];
    for (side, v) in sides {
        let Some(v) = v else { continue };
        let i = if v.get("interference").is_some() {
            &v["interference"]
        } else {
            v
        };
        if let Some(p) = pct(&i["other_procs_cpu_pct"]) {
            warnings.push(format!(
                "other processes used {p}% of the CPUs during {side} run: its time is suspect"
            ));
        }
        if let Some(p) = pct(&i["steal_pct"]) {
            warnings.push(format!(
                "the hypervisor took {p}% of the CPUs (steal) during {side} run: its time is \
                 suspect"
            ));
        }
    }
    if let Some(t) = theirs.summary.as_ref() {
        warnings.extend(parity_warnings(case, &ours, t));
    }
    if let Some(n) = theirs.note {
        if theirs.failed {
            warnings.push(n);
        } else {
            notes.push(n);
        }
    }
    let ratio = theirs.summary.as_ref().and_then(|r| {
        let (o, t) = (
            ours["time"]["median_ms"].as_f64()?,
            r["median_ms"].as_f64()?,
        );
        (t > 0.0).then(|| o / t)
    });
    if let Some(src) = theirs.summary.as_ref().and_then(|r| r["source"].as_str()) {
        notes.push(format!("reference: {src}"));
    }
    json!({
        "what": case.what(),
        "rlft": ours,
        "reference": if against_reference { theirs.summary.unwrap_or(Value::Null) } else { Value::Null },
        "ratio": ratio,
        "notes": notes,
        "warnings": warnings,
    })
}

/// Where the two sides did not do the same work, as far as their results show it: generate's
/// prompt lengths (tokenizer and chat template), the trainable parameters of fwd_bwd and lora
/// and the parameters of adamw (the model: a tied or separate LM head, the biases, LoRA's
/// targets). `theirs` is the reference's summary (its raw result in `raw`).
fn parity_warnings(case: Case, ours: &Value, theirs: &Value) -> Vec<String> {
    let (detail, raw) = (&ours["detail"], &theirs["raw"]);
    let batch = format!("batch_{}", detail["batch"]);
    let pairs: Vec<(&str, &Value, &Value)> = match case {
        Case::Generate => vec![(
            "prompt lengths in tokens (tokenizer, chat template)",
            &detail["prompt_lens"],
            &raw[batch.as_str()]["prompt_lens"],
        )],
        Case::FwdBwd | Case::Lora => vec![(
            "trainable parameters",
            &detail["trainable_params"],
            &raw["trainable_params"],
        )],
        Case::Adamw => vec![("parameters", &detail["n_params"], &raw["n_params"])],
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .filter(|(_, o, t)| !o.is_null() && !t.is_null() && o != t)
        .map(|(what, o, t)| {
            format!(
                "rlft and the reference differ in their {what}: {o} vs {t}; they did not run \
                 the same model or inputs, so the ratio compares different work"
            )
        })
        .collect()
}

/// Threads, CPU model, git commit, date and versions, for tracking results over time.
pub fn machine_info() -> Value {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    let repo = [Path::new("."), Path::new(env!("CARGO_MANIFEST_DIR"))]
        .into_iter()
        .find(|d| git(d, &["rev-parse", "--is-inside-work-tree"]).is_some());
    let commit = repo.and_then(|d| git(d, &["rev-parse", "HEAD"]));
    let dirty = repo
        .and_then(|d| git(d, &["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.is_empty());
    json!({
        "threads": super::cases::threads(),
        "rayon_num_threads_env": std::env::var("RAYON_NUM_THREADS").ok(),
        "cpu_model": cpu_model,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "git_commit": commit,
        "git_dirty": dirty,
        "rlft_version": env!("CARGO_PKG_VERSION"),
        "date_utc": utc_now(),
        // The kernels' switches and SIMD level (`rlft inspect --runtime`); the cases' processes
        // inherit this environment.
        "kernels": serde_json::to_value(rlft_kernels::runtime::Runtime::current())
            .unwrap_or(Value::Null),
    })
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_string(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
fn utc_string(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A time in ms, in s from 1 s up.
fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        "-".into()
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.3} ms")
    }
}

/// `min-max` in the unit the median is shown in.
fn fmt_spread(t: &Value) -> String {
    let (med, lo, hi) = (f(&t["median_ms"]), f(&t["min_ms"]), f(&t["max_ms"]));
    if !lo.is_finite() || !hi.is_finite() {
        return "-".into();
    }
    if med >= 1000.0 {
        format!("{:.2}-{:.2} s", lo / 1e3, hi / 1e3)
    } else if med >= 10.0 {
        format!("{lo:.1}-{hi:.1} ms")
    } else {
        format!("{lo:.3}-{hi:.3} ms")
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn fmt_mib(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |m| format!("{m:.0} MiB"))
}

/// A short case-specific figure for the last column.
fn extra(case: &str, o: &Value, r: &Value) -> String {
    let d = &o["detail"];
    match case {
        "generate" => {
            let mut s = format!("{:.1} new tok/s", f(&d["new_tokens_per_s_median"]));
            if let Some(t) = r["new_tokens_per_s_median"].as_f64() {
                s += &format!(" (ref {t:.1})");
            }
            s
        }
        "fwd_bwd" | "lora" => format!(
            "fwd {} + bwd {}",
            fmt_ms(f(&d["of_which_forward"]["median_ms"])),
            fmt_ms(f(&d["of_which_backward"]["median_ms"]))
        ),
        "adamw" => format!("{:.1}M params", f(&d["n_params"]) / 1e6),
        "ref_pass" => format!("{:.0} tok/s", f(&d["tokens_per_s_median"])),
        "grpo" | "rloo" | "ppo" => {
            let p = &d["phase_s_median"];
            let mut s = format!("gen {:.2} s", f(&p["generate"]));
            if case != "grpo" {
                s += &format!(", old {:.2} s", f(&p["old_logprobs"]));
            }
            s += &format!(", ref {:.2} s", f(&p["ref_logprobs"]));
            if case == "ppo" {
                s += &format!(", values {:.2} s", f(&p["values"]));
            }
            s + &format!(", update {:.2} s", f(&p["update"]))
        }
        _ => String::new(),
    }
}

/// Prints the result as a table: one row per case, then the notes and warnings.
pub fn print_table(result: &Value) {
    let m = &result["machine"];
    let s = &result["settings"];
    let with_ref = s["against_reference"].as_bool().unwrap_or(false);
    println!(
        "rlft bench: {} threads, {}, commit {}{}, {}; {} timed reps after {} warm-up{}; peak \
         RSS = VmHWM from the end of loading",
        m["threads"],
        m["cpu_model"].as_str().unwrap_or("unknown CPU"),
        m["git_commit"]
            .as_str()
            .map_or("unknown", |c| &c[..c.len().min(10)]),
        if m["git_dirty"].as_bool() == Some(true) {
            " (modified)"
        } else {
            ""
        },
        m["date_utc"].as_str().unwrap_or(""),
        s["reps"],
        s["warmup"],
        match s["rounds"].as_u64() {
            Some(n) if n > 1 =>
                format!(", x {n} interleaved rounds (rlft, reference, rlft, ...), reps pooled"),
            _ => String::new(),
        },
    );
    let k = &m["kernels"];
    if let Some(t) = k["tuning"].as_object() {
        let on = |f: &str| u8::from(t.get(f).and_then(Value::as_bool).unwrap_or(false));
        println!(
            "kernels: {}, RLFT_SPIN={} RLFT_MALLOC_TUNE={} RLFT_AVX512={} RLFT_OP_TIMES={}",
            k["simd"].as_str().unwrap_or("?"),
            on("spin"),
            on("malloc_tune"),
            on("avx512"),
            on("op_times"),
        );
    }
    let mut header = format!(
        "{:<9} {:>11} {:>19} {:>10}",
        "case", "rlft median", "rlft min-max", "peak RSS"
    );
    if with_ref {
        header += &format!(" {:>10} {:>10} {:>6}", "ref median", "ref RSS", "ratio");
    }
    println!("{header}  notes");
    let mut footer = Vec::new();
    for (name, e) in result["cases"].as_object().into_iter().flatten() {
        let o = &e["rlft"];
        let r = &e["reference"];
        let mut row = if let Some(err) = o["error"].as_str() {
            footer.push(format!("{name}: FAILED: {err}"));
            format!("{name:<9} {:>11} {:>19} {:>10}", "FAILED", "-", "-")
        } else {
            format!(
                "{name:<9} {:>11} {:>19} {:>10}",
                fmt_ms(f(&o["time"]["median_ms"])),
                fmt_spread(&o["time"]),
                fmt_mib(&o["peak_rss_mib"])
            )
        };
        if with_ref {
            let ratio = e["ratio"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:.2}"));
            row += &format!(
                " {:>10} {:>10} {:>6}",
                fmt_ms(f(&r["median_ms"])),
                fmt_mib(&r["peak_rss_mib"]),
                ratio
            );
        }
        println!("{row}  {}", extra(name, o, r));
        for n in e["notes"].as_array().into_iter().flatten() {
            footer.push(format!("{name}: {}", n.as_str().unwrap_or_default()));
        }
        for w in e["warnings"].as_array().into_iter().flatten() {
            footer.push(format!(
                "{name}: WARNING: {}",
                w.as_str().unwrap_or_default()
            ));
        }
    }
    if with_ref {
        println!("ratio = {RATIO_DEFINITION}");
    }
    for w in result["warnings"].as_array().into_iter().flatten() {
        footer.push(format!("WARNING: {}", w.as_str().unwrap_or_default()));
    }
    for line in footer {
        println!("  {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_stats() {
        assert_eq!(utc_string(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_string(951_782_400 + 3_661), "2000-02-29T01:01:01Z");
        assert_eq!(utc_string(1_798_675_200), "2026-12-31T00:00:00Z");
        let s = stats_ms(&[0.003, 0.001, 0.002]);
        assert_eq!(s["median_ms"], 2.0);
        assert_eq!(s["min_ms"], 1.0);
        assert_eq!(s["max_ms"], 3.0);
        assert_eq!(fmt_ms(1234.0), "1.23 s");
        assert_eq!(fmt_ms(12.34), "12.3 ms");
    }

    #[test]
    fn ratio_and_interference_warnings() {
        let ours =
            json!({"time": {"median_ms": 50.0}, "interference": {"other_procs_cpu_pct": 7.5}});
        let theirs = RefOutcome {
            summary: Some(json!({"median_ms": 100.0, "other_procs_cpu_pct": 0.2, "source": "x"})),
            note: None,
            failed: false,
        };
        let e = case_entry(Case::FwdBwd, ours, theirs, true);
        assert_eq!(e["ratio"], 0.5);
        assert_eq!(e["warnings"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn parity_warnings_name_what_differs() {
        let ours =
            json!({"time": {"median_ms": 50.0}, "detail": {"batch": 8, "prompt_lens": [60, 61]}});
        let theirs = |lens: Value| RefOutcome {
            summary: Some(json!({"median_ms": 100.0, "raw": {"batch_8": {"prompt_lens": lens}}})),
            note: None,
            failed: false,
        };
        let same = case_entry(Case::Generate, ours.clone(), theirs(json!([60, 61])), true);
        assert!(same["warnings"].as_array().unwrap().is_empty(), "{same}");
        let differ = case_entry(Case::Generate, ours, theirs(json!([61, 62])), true);
        let w = differ["warnings"].as_array().unwrap();
        assert!(
            w.len() == 1 && w[0].as_str().unwrap().contains("prompt lengths"),
            "{differ}"
        );
    }
}
