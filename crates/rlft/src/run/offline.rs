//! What the offline trainers (SFT, reward models, DPO) share: a unit is one optimiser step's
//! micro-batches of dataset rows, and the step count follows from epochs or `max_steps`.

use crate::config::TrainingArgs;
use crate::data::DataCursor;

/// Optimiser steps of a run over `rows` rows: `max_steps` when set, else `num_train_epochs`
/// epochs of `train_batch()` rows per step (at least 1).
pub fn total_steps(args: &TrainingArgs, rows: usize) -> usize {
    if args.max_steps > 0 {
        return args.max_steps;
    }
    let per_epoch = rows.div_ceil(args.train_batch().max(1));
    ((per_epoch as f64) * args.num_train_epochs).ceil().max(1.0) as usize
}

/// The next optimiser step's micro-batches: `gradient_accumulation_steps` of
/// `per_device_train_batch_size` rows each.
pub fn next_step_rows(args: &TrainingArgs, data: &mut DataCursor) -> Vec<Vec<usize>> {
    (0..args.gradient_accumulation_steps)
        .map(|_| data.take(args.per_device_train_batch_size))
        .collect()
}
