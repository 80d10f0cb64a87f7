//! Dynamic sampling (DAPO, arXiv:2503.14476 section 3.2; verl `algorithm.filter_groups`,
//! OpenRLHF `dynamic_filtering`): a prompt whose completions all score the same gives every
//! group estimator a zero advantage, so it costs a forward and backward pass for no signal.
//! Such groups are dropped and more prompts are sampled until the rollout holds
//! `rollout_prompts` groups with signal, at most `max_num_gen_batches` generation batches;
//! past that cap the rollout is topped up with dropped groups (and the metrics say how many),
//! so every optimiser step keeps its batch size.

use rlft_rewards::{RewardOutput, Scores};

use crate::algo::estimators::groups_with_signal;
use crate::rollout::Sample;
use crate::run::Metrics;

/// One generation batch: its samples (groups contiguous) and their scores.
pub struct GenBatch {
    /// Samples, `num_generations` per prompt.
    pub samples: Vec<Sample>,
    /// Their scores.
    pub scores: Scores,
    /// The rewards the filter reads (shaped as the estimators see them).
    pub rewards: Vec<f64>,
}

/// Accumulates generation batches until enough groups carry signal.
pub struct Filter {
    want: usize,
    group: usize,
    kept: Vec<(usize, usize)>,
    dropped: Vec<(usize, usize)>,
    batches: Vec<GenBatch>,
}

impl Filter {
    /// A filter that wants `want` groups of `group` completions.
    pub fn new(want: usize, group: usize) -> Self {
        Filter {
            want,
            group,
            kept: Vec::new(),
            dropped: Vec::new(),
            batches: Vec::new(),
        }
    }

    /// Adds a generation batch; true once enough groups with signal are in.
    pub fn add(&mut self, b: GenBatch) -> bool {
        let k = self.batches.len();
        for (g, keep) in groups_with_signal(&b.rewards, self.group)
            .into_iter()
            .enumerate()
        {
            if keep {
                self.kept.push((k, g));
            } else {
                self.dropped.push((k, g));
            }
        }
        self.batches.push(b);
        self.full()
    }

    /// Whether enough groups with signal are in.
    pub fn full(&self) -> bool {
        self.kept.len() >= self.want
    }

    /// The rollout: the first `want` groups with signal, topped up with dropped ones, and the
    /// metrics `dynamic_sampling/{gen_batches, filtered_frac, topped_up}`.
    pub fn finish(self) -> (Vec<Sample>, Scores, Metrics) {
        let generated = self.kept.len() + self.dropped.len();
        let mut picks: Vec<(usize, usize)> = self.kept.iter().take(self.want).copied().collect();
        let topped = self.want.saturating_sub(picks.len());
        picks.extend(self.dropped.iter().take(topped).copied());
        let metrics = vec![
            (
                "dynamic_sampling/gen_batches".into(),
                self.batches.len() as f64,
            ),
            (
                "dynamic_sampling/filtered_frac".into(),
                self.dropped.len() as f64 / generated.max(1) as f64,
            ),
            ("dynamic_sampling/topped_up".into(), topped as f64),
        ];
        let rows: Vec<(usize, usize)> = picks
            .iter()
            .flat_map(|&(b, g)| (g * self.group..(g + 1) * self.group).map(move |i| (b, i)))
            .collect();
        let mut batches = self.batches;
        let scores = select_scores(&batches, &rows);
        let samples = rows
            .iter()
            .map(|&(b, i)| std::mem::replace(&mut batches[b].samples[i], placeholder()))
            .collect();
        (samples, scores, metrics)
    }
}

fn placeholder() -> Sample {
    Sample::new(0, Vec::new(), String::new(), false)
}

/// The scores of `rows` (`(batch, sample)` pairs) as one [`Scores`].
fn select_scores(batches: &[GenBatch], rows: &[(usize, usize)]) -> Scores {
    let first = &batches[0].scores;
    let per_function = (0..first.per_function.len())
        .map(|f| RewardOutput {
            scores: rows
                .iter()
                .map(|&(b, i)| batches[b].scores.per_function[f].scores[i])
                .collect(),
            parts: first.per_function[f]
                .parts
                .iter()
                .enumerate()
                .map(|(p, (name, _))| {
                    let v = rows
                        .iter()
                        .map(|&(b, i)| batches[b].scores.per_function[f].parts[p].1[i])
                        .collect();
                    (name.clone(), v)
                })
                .collect(),
        })
        .collect();
    Scores {
        per_function,
        total: rows
            .iter()
            .map(|&(b, i)| batches[b].scores.total[i])
            .collect(),
        failures: (0..first.failures.len())
            .map(|f| batches.iter().map(|b| b.scores.failures[f]).sum())
            .collect(),
        errors: (0..first.errors.len())
            .map(|f| batches.iter().find_map(|b| b.scores.errors[f].clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(rewards: &[f64], tag: u32) -> GenBatch {
        let samples = rewards
            .iter()
            .enumerate()
            .map(|(i, _)| Sample::new(i / 2, vec![tag, i as u32], String::new(), false))
            .collect();
        GenBatch {
            samples,
            scores: Scores {
                per_function: vec![RewardOutput::from_scores(rewards.to_vec())],
                total: rewards.to_vec(),
                failures: vec![0],
                errors: vec![None],
            },
            rewards: rewards.to_vec(),
        }
    }

    #[test]
    fn keeps_groups_with_signal_and_tops_up() {
        // Groups of 2; want 2 groups. Batch 0: [1,1] dropped, [0,1] kept.
        let mut f = Filter::new(2, 2);
        assert!(!f.add(batch(&[1.0, 1.0, 0.0, 1.0], 0)));
        // Batch 1: [0,0] dropped, [1,0] kept: full.
        assert!(f.add(batch(&[0.0, 0.0, 1.0, 0.0], 1)));
        let (s, sc, m) = f.finish();
        let ids: Vec<Vec<u32>> = s.iter().map(|x| x.completion_ids.clone()).collect();
        assert_eq!(ids, vec![vec![0, 2], vec![0, 3], vec![1, 2], vec![1, 3]]);
        assert_eq!(sc.total, vec![0.0, 1.0, 1.0, 0.0]);
        assert_eq!(m[1].1, 0.5);
        // Cap reached with one group of signal: topped up with the first dropped group.
        let mut f = Filter::new(2, 2);
        f.add(batch(&[1.0, 1.0, 0.0, 1.0], 0));
        let (s, sc, m) = f.finish();
        assert_eq!(s.len(), 4);
        assert_eq!(sc.total, vec![0.0, 1.0, 1.0, 1.0]);
        assert_eq!(m[2].1, 1.0);
    }
}
