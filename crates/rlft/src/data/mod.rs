//! Dataset rows -> what the trainers consume, shared by every algorithm:
//!
//! - [`prompts`]: chat-templated prompt ids for the online trainers (GRPO and the algorithms
//!   that sample completions);
//! - [`preferences`]: `prompt` / `chosen` / `rejected` rows (standard or conversational, the
//!   prompt extracted when implicit) -> rendered texts and reward-model pairs;
//! - [`dpo`]: preference rows -> tokenized DPO pairs with TRL's length limits;
//! - [`sft`]: prompt-completion and conversational rows -> `(input_ids, loss_mask)` for SFT;
//! - [`DataCursor`]: a seeded, resumable walk over a dataset's rows, epoch by epoch.

pub mod dpo;
pub mod preferences;
pub mod prompts;
pub mod sft;

use rlft_data::{load_dataset, train_test_split, Dataset};
use rlft_train::checkpoint::DataPosition;
use serde::{Deserialize, Serialize};

use crate::config::TrainingArgs;
use crate::error::Result;

/// The train and eval datasets of an offline trainer's settings: `eval_dataset` (with
/// `eval_split`), else `dataset`'s `eval_split`, else `eval_size` rows held out of `dataset`
/// (a fraction when < 1, a count otherwise; 0 = no eval data), shuffled by `seed`.
pub fn train_eval_datasets(
    args: &TrainingArgs,
    eval_size: f64,
) -> Result<(Dataset, Option<Dataset>)> {
    let full = load_dataset(&args.dataset, Some(&args.dataset_split))?;
    Ok(match (&args.eval_dataset, &args.eval_split) {
        (Some(p), split) => (full, Some(load_dataset(p, split.as_deref())?)),
        (None, Some(split)) => (full, Some(load_dataset(&args.dataset, Some(split))?)),
        (None, None) if eval_size > 0.0 => {
            let parts = if eval_size >= 1.0 {
                train_test_split(&full, eval_size as usize, args.seed)?
            } else {
                train_test_split(&full, eval_size, args.seed)?
            };
            (parts.train, Some(parts.test))
        }
        (None, None) => (full, None),
    })
}

/// What to do with rows longer than their limit (`truncation`, `prompt_truncation`); both are
/// counted and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthPolicy {
    /// Cut to the limit: an SFT example keeps its first tokens, a prompt its last ones (so the
    /// generation prompt at its end survives).
    Truncate,
    /// Leave the row out.
    Drop,
}

/// Where a trainer is in its data: a shuffled order per epoch (deterministic from the seed), so
/// a checkpoint's [`DataPosition`] resumes at exactly the next row.
#[derive(Debug, Clone)]
pub struct DataCursor {
    len: usize,
    seed: u64,
    pos: DataPosition,
    order: Vec<usize>,
}

/// Shuffled order of `epoch` over `n` items.
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    rlft_data::split::permutation(n, seed.wrapping_add(epoch.wrapping_mul(0x9E37_79B9)))
}

impl DataCursor {
    /// A cursor over `len` items at `pos` (the default position starts epoch 0).
    pub fn new(len: usize, seed: u64, pos: DataPosition) -> Self {
        DataCursor {
            len,
            seed,
            order: epoch_order(len, seed, pos.epoch),
            pos,
        }
    }

    /// The next `n` item indices, reshuffling at each epoch end.
    pub fn take(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if self.pos.index as usize >= self.len {
                self.pos.epoch += 1;
                self.pos.index = 0;
                self.order = epoch_order(self.len, self.seed, self.pos.epoch);
            }
            out.push(self.order[self.pos.index as usize]);
            self.pos.index += 1;
        }
        out
    }

    /// The position to checkpoint.
    pub fn position(&self) -> DataPosition {
        self.pos
    }

    /// Fractional epochs done (`epoch + index / len`), as `trainer_state.json` reports it.
    pub fn epoch(&self) -> f64 {
        self.pos.epoch as f64 + self.pos.index as f64 / self.len.max(1) as f64
    }
}
