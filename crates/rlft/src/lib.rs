//! # rlft: trainers and the data they eat
//!
//! Above the model runtime (`rlft-model`), the optimiser and checkpoints (`rlft-train`), the
//! dataset readers (`rlft-data`) and the rewards (`rlft-rewards`):
//!
//! - [`config`]: typed TOML configs; [`config::TrainingArgs`] (transformers'
//!   `TrainingArguments` names) is shared by every algorithm's config, flattened into its TOML.
//! - [`data`]: dataset rows -> prompts, SFT examples; the resumable data cursor.
//! - [`algo`]: the pure maths (advantages, clipped policy loss with KL), pinned to TRL.
//! - [`rollout`]: generation, scoring with the rewards, no-grad log-prob passes, eval; shared by
//!   the online algorithms.
//! - [`run`]: the run core every trainer plugs into ([`run::Algorithm`]): loop, optimiser step,
//!   checkpoints and exact resume, eval cadence, metrics, Ctrl-C, export, summary.
//! - [`sft`], [`online`], [`online_dpo`], [`reward_model`], [`dpo`]: the trainers, each a small
//!   [`run::Algorithm`]; [`online`] is the whole online family (GRPO, RLOO, REINFORCE++, PPO with
//!   its critic in [`online::critic`]), which `rlft grpo`, `rloo` and `ppo` configure.
//! - [`trainers`]: the one list of trainers (names, config keys) the CLI reads.
//! - [`plan_inputs`], [`plan_shapes`]: what the memory plan (`rlft-plan`) reads of a config:
//!   lengths and model shapes, and each trainer's declaration of its models and passes.
//! - [`error`]: [`TrainerError`], the one error type of the trainers.

pub mod algo;
pub mod config;
pub mod data;
pub mod dpo;
pub mod error;
pub mod online;
pub mod online_dpo;
pub mod plan_inputs;
pub mod plan_shapes;
pub mod reward_model;
pub mod rollout;
pub mod run;
pub mod sft;
pub mod trainers;

pub use error::TrainerError;
