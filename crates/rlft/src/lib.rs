//! # rlft: trainers and the data they eat
//!
//! Above the model runtime (`rlft-model`), the optimiser and checkpoints (`rlft-train`) and the
//! dataset readers (`rlft-data`): how dataset rows become token ids and loss masks, and the
//! trainers built from them.
//!
//! - [`sft_data`]: prompt-completion and conversational rows -> `(input_ids, loss_mask)`, loss on
//!   completion / assistant tokens only, with a length policy that counts what it drops.
//! - [`config`]: typed TOML configs (TRL names; unknown keys name the closest valid one).
//! - [`sft`]: the SFT trainer.
//! - [`plan`]: a run's peak memory, predicted from the config and the model's shape.

pub mod config;
pub mod grpo;
pub mod plan;
pub mod sft;
pub mod sft_data;
pub mod train_setup;
