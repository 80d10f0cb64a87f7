//! Rollout metrics (TRL's names) and the health signs a GRPO run warns about.

use rlft_rewards::Scores;

pub use crate::run::Metrics;

fn mean_std(v: &[f64]) -> (f64, f64) {
    let xs: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let m = xs.iter().sum::<f64>() / xs.len() as f64;
    if xs.len() < 2 {
        return (m, 0.0);
    }
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64;
    (m, var.sqrt())
}

/// Reward metrics of one rollout: `reward` (mean over the scored samples: an unscorable one,
/// every function `None`, stays out, as TRL's `nanmean`), `reward_std` (mean of the group
/// stds that are defined, i.e. of groups with two or more scored samples),
/// `rewards/<fn>/mean|std` (over the samples where the function applies),
/// `rewards/<fn>/<part>/mean`, and `failures/<fn>` when a function fell back to its default.
/// `prefix` is "" for training and "eval/" for eval.
pub fn reward_metrics(
    prefix: &str,
    names: &[String],
    scores: &Scores,
    group_std: &[f64],
) -> Metrics {
    let mut out = Metrics::new();
    let totals: Vec<f64> = scores
        .totals()
        .into_iter()
        .map(|t| t.unwrap_or(f64::NAN))
        .collect();
    let (m, _) = mean_std(&totals);
    out.push((format!("{prefix}reward"), m));
    let stds: Vec<f64> = group_std
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .collect();
    if !stds.is_empty() {
        out.push((
            format!("{prefix}reward_std"),
            stds.iter().sum::<f64>() / stds.len() as f64,
        ));
    }
    for (name, f) in names.iter().zip(&scores.per_function) {
        let vals: Vec<f64> = f.scores.iter().map(|s| s.unwrap_or(f64::NAN)).collect();
        let (m, s) = mean_std(&vals);
        out.push((format!("{prefix}rewards/{name}/mean"), m));
        out.push((format!("{prefix}rewards/{name}/std"), s));
        for (part, v) in &f.parts {
            out.push((format!("{prefix}rewards/{name}/{part}/mean"), mean_std(v).0));
        }
    }
    for (name, &n) in names.iter().zip(&scores.failures) {
        if n > 0 {
            out.push((format!("{prefix}failures/{name}"), n as f64));
        }
    }
    out
}

/// Completion-length metrics: `completions/mean_length|min_length|max_length|clipped_ratio`.
pub fn length_metrics(prefix: &str, lens: &[usize], truncated: &[bool]) -> Metrics {
    let n = lens.len().max(1) as f64;
    vec![
        (
            format!("{prefix}completions/mean_length"),
            lens.iter().sum::<usize>() as f64 / n,
        ),
        (
            format!("{prefix}completions/min_length"),
            lens.iter().copied().min().unwrap_or(0) as f64,
        ),
        (
            format!("{prefix}completions/max_length"),
            lens.iter().copied().max().unwrap_or(0) as f64,
        ),
        (
            format!("{prefix}completions/clipped_ratio"),
            truncated.iter().filter(|&&t| t).count() as f64 / n,
        ),
    ]
}

/// The metrics of a scored rollout: rewards (with the group stds), the fraction of groups whose
/// rewards do not vary (`frac_reward_zero_std`) and completion lengths.
pub fn rollout_metrics(
    names: &[String],
    scores: &Scores,
    group_std: &[f64],
    frac_zero_std: f64,
    samples: &[super::Sample],
) -> Metrics {
    let mut metrics = reward_metrics("", names, scores, group_std);
    metrics.push(("frac_reward_zero_std".into(), frac_zero_std));
    let lens: Vec<usize> = samples.iter().map(|s| s.completion_ids.len()).collect();
    let trunc: Vec<bool> = samples.iter().map(|s| s.truncated).collect();
    metrics.extend(length_metrics("", &lens, &trunc));
    metrics
}

/// The metrics of multi-turn rollouts under `prefix`: with tools, TRL's
/// `tools/call_frequency` (calls per completion) and `tools/failure_frequency` (failed calls
/// per call, 0 without calls), as its GRPOTrainer computes them; with an environment,
/// `env/steps` (steps per episode) and `env/done_frequency` (episodes the environment ended).
pub fn turn_metrics(prefix: &str, samples: &[super::Sample], turns: &super::Turns) -> Metrics {
    let traces: Vec<&super::TurnTrace> = samples.iter().filter_map(|s| s.turns.as_ref()).collect();
    let sum = |f: fn(&super::TurnTrace) -> usize| traces.iter().map(|t| f(t)).sum::<usize>();
    let per_sample = |x: usize| x as f64 / samples.len().max(1) as f64;
    let mut out = Metrics::new();
    if turns.has_tools() {
        let (calls, failures) = (sum(|t| t.calls), sum(|t| t.failures));
        out.push((format!("{prefix}tools/call_frequency"), per_sample(calls)));
        let failure = if calls > 0 {
            failures as f64 / calls as f64
        } else {
            0.0
        };
        out.push((format!("{prefix}tools/failure_frequency"), failure));
    }
    if turns.has_environment() {
        out.push((format!("{prefix}env/steps"), per_sample(sum(|t| t.steps))));
        let done = sum(|t| usize::from(t.done));
        out.push((format!("{prefix}env/done_frequency"), per_sample(done)));
    }
    out
}

/// A warning with its likely fix.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthWarning {
    /// Short identifier (`zero_reward_std`, `kl_high`, `format_up_accuracy_down`,
    /// `all_truncated`; a skipped step is the run core's warning).
    pub kind: &'static str,
    /// What happened and what to try.
    pub message: String,
}

/// Watches the metrics of successive steps for GRPO's failure signs. Each sign warns once
/// when it appears and again only after it has cleared.
#[derive(Debug, Clone)]
pub struct HealthMonitor {
    kl_threshold: f64,
    zero_std_steps: usize,
    zero_std_streak: usize,
    active: Vec<&'static str>,
    format: Vec<f64>,
    accuracy: Vec<f64>,
}

/// Steps compared by the format-vs-accuracy sign (this many recent against as many before).
const TREND_WINDOW: usize = 5;

impl HealthMonitor {
    /// A monitor with the config's thresholds.
    pub fn new(kl_threshold: f64, zero_std_steps: usize) -> Self {
        HealthMonitor {
            kl_threshold,
            zero_std_steps: zero_std_steps.max(1),
            zero_std_streak: 0,
            active: Vec::new(),
            format: Vec::new(),
            accuracy: Vec::new(),
        }
    }

    fn edge(
        &mut self,
        kind: &'static str,
        on: bool,
        message: impl FnOnce() -> String,
    ) -> Option<HealthWarning> {
        let was = self.active.contains(&kind);
        if on && !was {
            self.active.push(kind);
            return Some(HealthWarning {
                kind,
                message: message(),
            });
        }
        if !on && was {
            self.active.retain(|k| *k != kind);
        }
        None
    }

    /// Looks at one step's metrics (by name); returns the warnings to print.
    pub fn observe(&mut self, step: u64, metrics: &[(String, f64)]) -> Vec<HealthWarning> {
        let get = |k: &str| metrics.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        let find = |pat: &[&str]| {
            metrics
                .iter()
                .find(|(n, _)| {
                    n.starts_with("rewards/")
                        && n.ends_with("/mean")
                        && pat.iter().any(|p| n.to_lowercase().contains(p))
                })
                .map(|(_, v)| *v)
        };
        let mut out = Vec::new();
        let std = get("reward_std").unwrap_or(f64::NAN);
        if std.is_finite() && std < 1e-6 {
            self.zero_std_streak += 1;
        } else {
            self.zero_std_streak = 0;
        }
        let n = self.zero_std_steps;
        let streak = self.zero_std_streak;
        out.extend(self.edge("zero_reward_std", streak >= n, || {
            format!(
                "step {step}: reward_std has been ~0 for {streak} steps: every completion of a \
                 group gets the same reward, so advantages are 0 and nothing is learned. Raise \
                 temperature or num_generations, or give partial credit (e.g. a format reward)"
            )
        }));
        if let Some(kl) = get("kl").filter(|k| k.is_finite()) {
            let th = self.kl_threshold;
            out.extend(self.edge("kl_high", kl > th, || {
                format!(
                    "step {step}: KL to the reference is {kl:.3} (> {th}): the policy is \
                     drifting fast. Lower learning_rate or raise beta"
                )
            }));
        }
        if let (Some(f), Some(a)) = (find(&["format"]), find(&["accuracy", "correct"])) {
            self.format.push(f);
            self.accuracy.push(a);
        }
        let trend = |v: &[f64]| -> Option<f64> {
            (v.len() >= 2 * TREND_WINDOW).then(|| {
                let recent = &v[v.len() - TREND_WINDOW..];
                let before = &v[v.len() - 2 * TREND_WINDOW..v.len() - TREND_WINDOW];
                (recent.iter().sum::<f64>() - before.iter().sum::<f64>()) / TREND_WINDOW as f64
            })
        };
        let hacking = matches!(
            (trend(&self.format), trend(&self.accuracy)),
            (Some(f), Some(a)) if f > 0.1 && a < -0.05
        );
        out.extend(self.edge("format_up_accuracy_down", hacking, || {
            format!(
                "step {step}: the format reward rises while accuracy falls (last {TREND_WINDOW} \
                 steps vs the {TREND_WINDOW} before): likely reward hacking. Lower the format \
                 reward's weight or check that the accuracy reward parses the answer"
            )
        }));
        let clipped = get("completions/clipped_ratio").unwrap_or(0.0);
        out.extend(self.edge("all_truncated", clipped >= 1.0, || {
            format!(
                "step {step}: every completion hit max_completion_length: rewards may never see \
                 a finished answer. Raise max_completion_length, add a length penalty, or set \
                 mask_truncated_completions = true"
            )
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn warnings_fire_once_per_episode() {
        let mut h = HealthMonitor::new(0.5, 3);
        let zero = m(&[("reward_std", 0.0)]);
        assert!(h.observe(1, &zero).is_empty());
        assert!(h.observe(2, &zero).is_empty());
        let w = h.observe(3, &zero);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].kind, "zero_reward_std");
        assert!(h.observe(4, &zero).is_empty());
        assert!(h.observe(5, &m(&[("reward_std", 0.3)])).is_empty());
        let w = h.observe(
            6,
            &m(&[
                ("reward_std", 0.3),
                ("kl", 0.9),
                ("completions/clipped_ratio", 1.0),
            ]),
        );
        let kinds: Vec<&str> = w.iter().map(|w| w.kind).collect();
        assert_eq!(kinds, vec!["kl_high", "all_truncated"]);
    }

    #[test]
    fn format_up_accuracy_down_is_reward_hacking() {
        let mut h = HealthMonitor::new(1.0, 5);
        let mut fired = false;
        for i in 0..10 {
            let (f, a) = if i < 5 { (0.2, 0.5) } else { (0.9, 0.3) };
            let w = h.observe(
                i,
                &m(&[
                    ("reward_std", 0.5),
                    ("rewards/fmt/format/mean", f),
                    ("rewards/x/accuracy/mean", a),
                ]),
            );
            fired |= w.iter().any(|w| w.kind == "format_up_accuracy_down");
        }
        assert!(fired);
    }

    #[test]
    fn length_metrics_count_truncation() {
        let l = length_metrics("", &[3, 5, 10], &[false, false, true]);
        assert_eq!(l[0].1, 6.0);
        assert_eq!((l[1].1, l[2].1), (3.0, 10.0));
        assert!((l[3].1 - 1.0 / 3.0).abs() < 1e-12);
    }
}
