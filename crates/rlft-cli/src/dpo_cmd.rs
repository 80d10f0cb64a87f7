//! `rlft dpo --config dpo.toml`: Direct Preference Optimization on preference pairs.

use anyhow::Result;
use clap::Args;
use rlft::config::dpo::DpoConfig;
use rlft::dpo::{prepare, train};
use rlft::run::offline::summary_json;

use crate::train_cmd::{self, TrainArgs};

/// `rlft dpo`.
#[derive(Args, Debug)]
pub struct DpoArgs {
    #[command(flatten)]
    pub train: TrainArgs,
}

/// Runs `rlft dpo`.
pub fn run(a: DpoArgs) -> Result<()> {
    let (cfg, summary): (DpoConfig, _) = train_cmd::run(&a.train, prepare, train)?;
    if summary.interrupted || summary.final_dir.is_none() {
        train_cmd::say_stopped(&cfg, summary.global_step);
    }
    println!("{}", summary_json(&summary, SUMMARY));
    Ok(())
}

/// The eval figures of the JSON summary line `rlft dpo` prints at the end
/// ([`summary_json`]).
const SUMMARY: &[(&str, &str)] = &[
    ("initial_eval_loss", "eval_loss"),
    ("final_eval_loss", "eval_loss"),
    ("initial_eval_accuracy", "eval_rewards/accuracies"),
    ("final_eval_accuracy", "eval_rewards/accuracies"),
    ("final_eval_margin", "eval_rewards/margins"),
];
