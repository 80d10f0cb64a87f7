//! Sample rollout cases picked from `samples.jsonl`: what the model wrote at the first and the
//! last logged train steps, the best and worst rewarded train completions, and eval samples at
//! the first and last eval steps.

use crate::run::Sample;

/// Samples shown per group.
const PER_GROUP: usize = 3;

/// A titled group of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseGroup {
    /// Heading (`First logged step (1)`).
    pub title: String,
    /// One line on what the group is.
    pub about: String,
    /// The samples.
    pub samples: Vec<Sample>,
}

fn steps_of<'a>(samples: &'a [Sample], split: &str) -> impl Iterator<Item = u64> + 'a {
    let split = split.to_owned();
    samples
        .iter()
        .filter(move |s| s.split == split)
        .map(|s| s.step)
}

fn at_step(samples: &[Sample], split: &str, step: u64) -> Vec<Sample> {
    samples
        .iter()
        .filter(|s| s.split == split && s.step == step)
        .take(PER_GROUP)
        .cloned()
        .collect()
}

fn group(title: String, about: &str, samples: Vec<Sample>) -> Option<CaseGroup> {
    (!samples.is_empty()).then(|| CaseGroup {
        title,
        about: about.into(),
        samples,
    })
}

/// Picks the case groups; groups without samples are left out.
pub fn pick_cases(samples: &[Sample]) -> Vec<CaseGroup> {
    let mut groups = Vec::new();
    let (first, last) = (
        steps_of(samples, "train").min(),
        steps_of(samples, "train").max(),
    );
    if let Some(f) = first {
        groups.extend(group(
            format!("First logged step ({f})"),
            "What the model wrote before training had much effect.",
            at_step(samples, "train", f),
        ));
    }
    if let Some(l) = last.filter(|l| Some(*l) != first) {
        groups.extend(group(
            format!("Last logged step ({l})"),
            "What the model writes at the end of training.",
            at_step(samples, "train", l),
        ));
    }
    groups.extend(best_and_worst(samples));
    let (ef, el) = (
        steps_of(samples, "eval").min(),
        steps_of(samples, "eval").max(),
    );
    if let Some(f) = ef {
        groups.extend(group(
            format!("Eval at step {f}"),
            "Eval prompts at the first eval.",
            at_step(samples, "eval", f),
        ));
    }
    if let Some(l) = el.filter(|l| Some(*l) != ef) {
        groups.extend(group(
            format!("Eval at step {l}"),
            "Eval prompts at the last eval.",
            at_step(samples, "eval", l),
        ));
    }
    groups
}

/// The best and the worst rewarded train samples (latest first among ties); when every logged
/// reward is the same, one group without samples that says so.
fn best_and_worst(samples: &[Sample]) -> Vec<CaseGroup> {
    let mut ranked: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.split == "train" && s.reward.is_finite())
        .collect();
    ranked.sort_by(|a, b| b.reward.total_cmp(&a.reward).then(b.step.cmp(&a.step)));
    let (Some(hi), Some(lo)) = (ranked.first(), ranked.last()) else {
        return Vec::new();
    };
    if hi.reward == lo.reward {
        return vec![CaseGroup {
            title: "Best and worst rewards".into(),
            about: format!(
                "Every logged train completion has reward {}: no reward spread to learn from \
                 in what was logged.",
                crate::stats::fmt_num(hi.reward)
            ),
            samples: Vec::new(),
        }];
    }
    let best: Vec<Sample> = ranked
        .iter()
        .take(PER_GROUP)
        .map(|s| (*s).clone())
        .collect();
    let mut worst = ranked.clone();
    worst.sort_by(|a, b| a.reward.total_cmp(&b.reward).then(b.step.cmp(&a.step)));
    let worst: Vec<Sample> = worst
        .into_iter()
        .filter(|s| ranked.len() > PER_GROUP || !best.contains(s))
        .take(PER_GROUP)
        .cloned()
        .collect();
    let mut out: Vec<CaseGroup> = group(
        "Best rewards".into(),
        "Highest-rewarded train completions (latest first among ties).",
        best,
    )
    .into_iter()
    .collect();
    out.extend(group(
        "Worst rewards".into(),
        "Lowest-rewarded train completions (latest first among ties).",
        worst,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(step: u64, split: &str, reward: f64) -> Sample {
        Sample {
            step,
            split: split.into(),
            prompt: format!("p{step}"),
            completion: format!("c{reward}"),
            reward,
            rewards: Vec::new(),
            advantage: None,
            completion_tokens: None,
            truncated: None,
        }
    }

    fn titles(g: &[CaseGroup]) -> Vec<&str> {
        g.iter().map(|g| g.title.as_str()).collect()
    }

    #[test]
    fn groups_in_order() {
        let samples = [
            s(1, "train", 0.0),
            s(1, "train", 0.5),
            s(5, "train", 1.0),
            s(9, "train", 0.2),
            s(9, "train", f64::NAN),
            s(0, "eval", 0.1),
            s(9, "eval", 0.9),
        ];
        let g = pick_cases(&samples);
        assert_eq!(
            titles(&g),
            [
                "First logged step (1)",
                "Last logged step (9)",
                "Best rewards",
                "Worst rewards",
                "Eval at step 0",
                "Eval at step 9"
            ]
        );
        let rewards = |i: usize| g[i].samples.iter().map(|s| s.reward).collect::<Vec<_>>();
        assert_eq!(rewards(2), [1.0, 0.5, 0.2]);
        assert_eq!(rewards(3), [0.0, 0.2, 0.5]);
    }

    #[test]
    fn one_reward_for_all_is_said_once() {
        let g = pick_cases(&[s(1, "train", 0.0), s(2, "train", 0.0)]);
        assert_eq!(
            titles(&g),
            [
                "First logged step (1)",
                "Last logged step (2)",
                "Best and worst rewards"
            ]
        );
        assert!(g[2].samples.is_empty() && g[2].about.contains("reward 0"));
        assert!(pick_cases(&[]).is_empty());
    }
}
