//! What the run core hands an algorithm's hooks: where the run is ([`Position`]) and the
//! arguments of [`super::Algorithm::next_unit`] and [`super::Algorithm::micro_loss`].

use super::{Metrics, Policy, StepStats};
use crate::data::DataCursor;

/// Where the run is, for an algorithm's hooks.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// Optimiser steps taken so far.
    pub global_step: u64,
    /// Optimiser steps of the whole run.
    pub total_steps: u64,
    /// Fractional epochs done.
    pub epoch: f64,
}

impl From<Position> for rlft_rewards::TrainerState {
    /// What reward functions see as TRL's `trainer_state`.
    fn from(at: Position) -> Self {
        rlft_rewards::TrainerState {
            global_step: at.global_step,
            max_steps: at.total_steps,
            epoch: at.epoch,
        }
    }
}

/// What [`Algorithm::next_unit`] works with.
pub struct UnitContext<'a> {
    /// The policy being trained.
    pub policy: &'a Policy,
    /// The training rows; a unit takes the next ones.
    pub data: &'a mut DataCursor,
    /// Where the run is.
    pub at: Position,
    /// The unit's timed phases.
    pub times: &'a mut Metrics,
}

/// What a micro-batch's loss works with ([`Algorithm::micro_loss`]).
pub struct MicroContext<'a, U> {
    /// The policy being trained.
    pub policy: &'a Policy,
    /// The unit the optimiser step belongs to (a rollout, an offline step).
    pub unit: &'a U,
    /// Every micro-batch of the optimiser step, for normalisers over the whole step.
    pub step: &'a [Vec<usize>],
    /// The micro-batch's row indices.
    pub micro: &'a [usize],
    /// Where diagnostics go.
    pub stats: &'a mut StepStats,
}
