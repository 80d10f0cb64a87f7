//! The online config's batch arithmetic.
//!
//! Batch arithmetic (TRL's, spelled out):
//! - a *train batch* is `per_device_train_batch_size x gradient_accumulation_steps` completions:
//!   one optimiser step;
//! - a *rollout* (TRL's generation batch) is `generation_batch_size` completions, by default one
//!   train batch; it holds `generation_batch_size / num_generations` prompts with
//!   `num_generations` completions each, and must be a whole number of train batches;
//! - each rollout is used for `generation_batch_size / train batch x num_iterations` optimiser
//!   steps (policy log-probs of the rollout time are kept as "old" log-probs when that is > 1).
//!

use serde::Serialize;

use super::OnlineConfig;

/// The derived batch arithmetic of a config, printed at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchPlan {
    /// Completions per optimiser step (per_device x accumulation).
    pub train_batch: usize,
    /// Completions per rollout.
    pub rollout_completions: usize,
    /// Prompts per rollout.
    pub rollout_prompts: usize,
    /// Optimiser steps per rollout (train batches per rollout x num_iterations).
    pub steps_per_rollout: usize,
    /// Rollouts in the run.
    pub rollouts: usize,
    /// Optimiser steps in the run.
    pub total_steps: usize,
}

impl std::fmt::Display for BatchPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch plan: {} prompts x {} completions = {} completions per rollout; {} \
             completions per optimiser step; {} optimiser step(s) per rollout; {} rollouts = {} \
             optimiser steps",
            self.rollout_prompts,
            self.rollout_completions / self.rollout_prompts.max(1),
            self.rollout_completions,
            self.train_batch,
            self.steps_per_rollout,
            self.rollouts,
            self.total_steps
        )
    }
}

impl OnlineConfig {
    /// Completions per optimiser step.
    pub fn train_batch(&self) -> usize {
        self.args.train_batch()
    }

    /// Completions per rollout.
    pub fn rollout_completions(&self) -> usize {
        if self.generation_batch_size == 0 {
            self.train_batch()
        } else {
            self.generation_batch_size
        }
    }

    /// The batch arithmetic for a dataset of `num_prompts` training prompts.
    pub fn plan(&self, num_prompts: usize) -> BatchPlan {
        let train_batch = self.train_batch();
        let rollout_completions = self.rollout_completions();
        let rollout_prompts = rollout_completions / self.num_generations;
        let steps_per_rollout = rollout_completions / train_batch * self.num_iterations;
        let (rollouts, total_steps) = if self.args.max_steps > 0 {
            let m = self.args.max_steps;
            (m.div_ceil(steps_per_rollout), m)
        } else {
            let per_epoch = num_prompts as f64 / rollout_prompts as f64;
            let r = (per_epoch * self.args.num_train_epochs).ceil().max(1.0) as usize;
            (r, r * steps_per_rollout)
        };
        BatchPlan {
            train_batch,
            rollout_completions,
            rollout_prompts,
            steps_per_rollout,
            rollouts,
            total_steps,
        }
    }
}
