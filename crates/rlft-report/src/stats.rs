//! Series out of metric rows, their summaries, and number formatting shared by every output.

use crate::run::MetricRow;

/// `(step, value)` points of one metric, in logged order; values may be non-finite.
pub type Points = Vec<(f64, f64)>;

/// The points of `key` over the rows that have it.
pub fn series(rows: &[MetricRow], key: &str) -> Points {
    rows.iter()
        .filter_map(|r| r.get(key).map(|v| (r.step as f64, v)))
        .collect()
}

/// The last logged value (non-finite included: a NaN at the end is news).
pub fn last(points: &[(f64, f64)]) -> Option<f64> {
    points.last().map(|p| p.1)
}

/// The first logged value.
pub fn first(points: &[(f64, f64)]) -> Option<f64> {
    points.first().map(|p| p.1)
}

/// Mean of the finite values; `None` when there are none.
pub fn mean_finite(points: &[(f64, f64)]) -> Option<f64> {
    let finite: Vec<f64> = points
        .iter()
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .collect();
    (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
}

/// How many values are non-finite.
pub fn count_non_finite(points: &[(f64, f64)]) -> usize {
    points.iter().filter(|p| !p.1.is_finite()).count()
}

/// The rolling-mean window for `n` points: about a tenth of the run, 2 to 50 steps.
pub fn rolling_window(n: usize) -> usize {
    (n / 10).clamp(2, 50)
}

/// Trailing mean over the last `window` finite values, one point per finite input point.
pub fn rolling_mean(points: &[(f64, f64)], window: usize) -> Points {
    let finite: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.1.is_finite()).collect();
    let window = window.max(1);
    let mut sum = 0.0;
    let mut out = Vec::with_capacity(finite.len());
    for (i, &(x, y)) in finite.iter().enumerate() {
        sum += y;
        if i >= window {
            sum -= finite[i - window].1;
        }
        out.push((x, sum / (i + 1).min(window) as f64));
    }
    out
}

/// One reward function, or one part of one (`format`, `accuracy`), as logged under `rewards/`.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardComponent {
    /// Short display name: the part (`format`), or `fn/part` when two functions share a part
    /// name, or the function name for a function without parts.
    pub label: String,
    /// Training key, `rewards/<fn>[/<part>]/mean`.
    pub key: String,
    /// Eval key, `eval/rewards/<fn>[/<part>]/mean`.
    pub eval_key: String,
}

/// The reward components worth a panel and a card row: every part of every function, and the
/// functions without parts when there are several functions (a single function without parts
/// is the reward itself).
pub fn reward_components(rows: &[MetricRow]) -> Vec<RewardComponent> {
    let mut names: Vec<&str> = Vec::new();
    for row in rows {
        for (key, _) in &row.values {
            if let Some(mid) = key
                .strip_prefix("rewards/")
                .and_then(|k| k.strip_suffix("/mean"))
            {
                if !mid.is_empty() && !names.contains(&mid) {
                    names.push(mid);
                }
            }
        }
    }
    let functions: Vec<&str> = names.iter().filter(|n| !n.contains('/')).copied().collect();
    let parts: Vec<&str> = names.iter().filter(|n| n.contains('/')).copied().collect();
    let fn_of = |part: &str| part.split('/').next().unwrap_or(part).to_owned();
    let part_of = |part: &str| part.split_once('/').map_or(part, |p| p.1).to_owned();
    let mut out = Vec::new();
    for f in &functions {
        let own: Vec<&str> = parts.iter().filter(|p| fn_of(p) == *f).copied().collect();
        if own.is_empty() && functions.len() > 1 {
            out.push(component(f.to_string(), f));
        }
        for p in own {
            let shared = parts.iter().filter(|q| part_of(q) == part_of(p)).count() > 1;
            let label = if shared { p.to_owned() } else { part_of(p) };
            out.push(component(label, p));
        }
    }
    // Parts whose function mean was never logged.
    for p in parts
        .iter()
        .filter(|p| !functions.contains(&fn_of(p).as_str()))
    {
        out.push(component(p.to_string(), p));
    }
    out
}

fn component(label: String, mid: &str) -> RewardComponent {
    RewardComponent {
        label,
        key: format!("rewards/{mid}/mean"),
        eval_key: format!("eval/rewards/{mid}/mean"),
    }
}

/// A number for a table: 3 significant-ish decimals, scientific for tiny values, `NaN`/`inf`.
pub fn fmt_num(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// A signed difference: `+0.412`, `-3.1`.
pub fn fmt_delta(d: f64) -> String {
    if d.is_finite() && d >= 0.0 {
        format!("+{}", fmt_num(d))
    } else {
        fmt_num(d)
    }
}

/// Seconds as `42.0 s`, `3 min 20 s`, `1 h 05 min`.
pub fn fmt_duration(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return fmt_num(s);
    }
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {:02} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{} h {:02} min",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

/// MiB as `512 MiB` or `1.25 GiB`.
pub fn fmt_mib(m: f64) -> String {
    if m >= 1024.0 {
        format!("{:.2} GiB", m / 1024.0)
    } else {
        format!("{m:.0} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64, kv: &[(&str, f64)]) -> MetricRow {
        MetricRow {
            step,
            values: kv.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn rolling_mean_skips_non_finite_and_trails() {
        let p = vec![(1.0, 1.0), (2.0, f64::NAN), (3.0, 3.0), (4.0, 5.0)];
        assert_eq!(
            rolling_mean(&p, 2),
            vec![(1.0, 1.0), (3.0, 2.0), (4.0, 4.0)]
        );
        assert_eq!(mean_finite(&p), Some(3.0));
        assert_eq!(count_non_finite(&p), 1);
    }

    #[test]
    fn components_prefer_parts_and_disambiguate() {
        let rows = [row(
            1,
            &[
                ("rewards/rule/mean", 0.5),
                ("rewards/rule/format/mean", 1.0),
                ("rewards/rule/accuracy/mean", 0.0),
                ("rewards/len/mean", 0.2),
                ("rewards/other/format/mean", 0.3),
            ],
        )];
        let labels: Vec<String> = reward_components(&rows)
            .into_iter()
            .map(|c| c.label)
            .collect();
        assert_eq!(labels, ["rule/format", "accuracy", "len", "other/format"]);
        // A single function without parts is the reward itself: no component.
        assert!(reward_components(&[row(1, &[("rewards/rule/mean", 0.5)])]).is_empty());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_num(0.123456), "0.123");
        assert_eq!(fmt_num(0.001), "1.00e-3");
        assert_eq!(fmt_num(f64::NAN), "NaN");
        assert_eq!(fmt_delta(0.5), "+0.500");
        assert_eq!(fmt_duration(200.0), "3 min 20 s");
        assert_eq!(fmt_mib(2048.0), "2.00 GiB");
    }
}
