//! The online policy-gradient trainers on one code path: GRPO (DeepSeekMath) and its relatives
//! (Dr. GRPO, DAPO, BNPO) as TRL's `GRPOTrainer` defines them, RLOO as TRL's `RLOOTrainer`,
//! REINFORCE++ / -baseline as OpenRLHF's, and PPO's GAE with a critic; `advantage_estimator`
//! selects between them (`rlft grpo`, `rlft rloo`, `rlft ppo` differ only in defaults).
//!
//! - [`setup`]: the policy, reference, prompts, rewards and batch arithmetic of a config;
//! - [`advantages`]: a rollout's advantages under the configured estimator;
//! - [`dynamic`]: dynamic sampling (DAPO), dropping groups without signal;
//! - [`skip`]: zero-advantage rows left out of the training pass where that is exact;
//! - [`critic`]: PPO's value model (`advantage_estimator = "gae"`);
//! - [`trainer`]: the trainer as an [`crate::run::Algorithm`]: a unit is a rollout (generate,
//!   reward, old and reference log-probs, advantages), a micro-batch's loss is
//!   [`crate::algo::grpo_loss`] (RLOO: [`crate::algo::rloo_loss::rloo_loss`]).
//!
//! The maths is in [`crate::algo`], rollouts in [`crate::rollout`], the loop in [`crate::run`].

pub mod advantages;
pub mod critic;
pub mod dynamic;
pub mod setup;
pub mod skip;
pub mod trainer;

pub use setup::{eval_settings, prepare, Prepared};
pub use trainer::{train, train_scoring_every_row, OnlineSummary};
