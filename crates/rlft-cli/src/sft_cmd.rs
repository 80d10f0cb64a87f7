//! `rlft sft --config sft.toml`: supervised fine-tuning.

use anyhow::Result;
use clap::Args;
use rlft::config::sft::SftConfig;
use rlft::run::offline::summary_json;
use rlft::sft::{prepare, train};

use crate::train_cmd::{self, TrainArgs};

/// `rlft sft`.
#[derive(Args, Debug)]
pub struct SftArgs {
    #[command(flatten)]
    pub train: TrainArgs,
}

/// Runs `rlft sft`.
pub fn run(a: SftArgs) -> Result<()> {
    let (cfg, summary): (SftConfig, _) = train_cmd::run(&a.train, prepare, train)?;
    if summary.interrupted || summary.final_dir.is_none() {
        train_cmd::say_stopped(&cfg, summary.global_step);
    }
    println!("{}", summary_json(&summary, SUMMARY));
    Ok(())
}

/// The eval figures of the JSON summary line `rlft sft` prints at the end
/// ([`summary_json`]).
const SUMMARY: &[(&str, &str)] = &[
    ("initial_eval_loss", "eval_loss"),
    ("final_eval_loss", "eval_loss"),
];
