//! GRPO: Group Relative Policy Optimization (DeepSeekMath) and its relatives (Dr. GRPO, DAPO,
//! BNPO), as TRL's `GRPOTrainer` defines them: `rlft grpo --config grpo.toml`.
//!
//! - [`setup`]: the policy, reference, prompts, rewards and batch arithmetic of a config;
//! - [`trainer`]: GRPO as an [`crate::run::Algorithm`]: a unit is a rollout (generate, reward,
//!   advantages, old and reference log-probs), a micro-batch's loss is [`crate::algo::grpo_loss`].
//!
//! The maths is in [`crate::algo`], rollouts in [`crate::rollout`], the loop in [`crate::run`].

pub mod setup;
pub mod trainer;

pub use setup::{eval_settings, prepare, Prepared};
pub use trainer::{train, GrpoSummary};
