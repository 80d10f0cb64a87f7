//! What every training command shares: its options and the way it runs a trainer (config and
//! overrides, the model, the device, Ctrl-C, resume).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Device;
use clap::Args;
use rlft::config::TrainerConfig;
use rlft::run::RunOptions;
use rlft::TrainerError;
use rlft_train::shutdown::ShutdownFlag;

use crate::common::parse_device;
use crate::models;

/// The options of `rlft sft`, `rlft grpo` and the other trainers.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// TOML config with TRL's names for this trainer (every key, its default and meaning:
    /// crates/rlft/src/config/; examples under examples/).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Override a config key: `--set learning_rate=1e-4 --set lora.r=8` (repeatable); a number
    /// picks an array entry: `--set rewards.0.path=rm/final`.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Continue from the latest checkpoint in output_dir.
    #[arg(long)]
    pub resume: bool,
    /// Stop after this many optimiser steps, at the end of the unit (rollout) that reaches them
    /// (a checkpoint is saved; continue with --resume).
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Loads the config, prepares the trainer and runs it with Ctrl-C and resume wired in.
pub fn run<C, P, S>(
    a: &TrainArgs,
    prepare: impl FnOnce(&C, &Path, &Device) -> Result<P, TrainerError>,
    train: impl FnOnce(&C, &mut P, &RunOptions) -> Result<S, TrainerError>,
) -> Result<(C, S)>
where
    C: TrainerConfig,
{
    let cfg = C::load(&a.config, &a.set)?;
    let model = models::resolve(&cfg.args().model)?;
    let device = parse_device(&a.device)?;
    let shutdown = ShutdownFlag::install().context("install the Ctrl-C handler")?;
    let mut prepared = prepare(&cfg, &model, &device)?;
    let opts = RunOptions {
        resume: a.resume,
        stop_after: a.stop_after,
        shutdown: Some(shutdown),
        progress: true,
    };
    let summary = train(&cfg, &mut prepared, &opts)?;
    Ok((cfg, summary))
}

/// Says where an unfinished run's checkpoint is.
pub fn say_stopped(cfg: &impl TrainerConfig, step: u64) {
    eprintln!(
        "stopped at step {step}: checkpoint saved in {}; continue with --resume",
        cfg.args().output_dir.display()
    );
}
