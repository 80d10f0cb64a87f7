//! `rlft sft --config sft.toml`: supervised fine-tuning.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rlft::config::sft::SftConfig;
use rlft::sft::{prepare, summary_json, train, RunOptions};
use rlft_train::shutdown::ShutdownFlag;

use crate::common::parse_device;
use crate::default_model;

/// `rlft sft`.
#[derive(Args, Debug)]
pub struct SftArgs {
    /// TOML config (TRL `SFTConfig` names; see `rlft sft --help` and the README).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Override a config key: `--set learning_rate=1e-4 --set lora.r=8` (repeatable).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Continue from the latest checkpoint in output_dir.
    #[arg(long)]
    pub resume: bool,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Runs `rlft sft`.
pub fn run(a: SftArgs) -> Result<()> {
    let cfg = SftConfig::load(&a.config, &a.set)?;
    let model = default_model::resolve(&cfg.model)?;
    let device = parse_device(&a.device)?;
    let shutdown = ShutdownFlag::install().context("install the Ctrl-C handler")?;
    let mut prepared = prepare(&cfg, &model, &device)?;
    let summary = train(
        &cfg,
        &mut prepared,
        &RunOptions {
            resume: a.resume,
            stop_after: None,
            shutdown: Some(shutdown),
            progress: true,
        },
    )?;
    if summary.interrupted {
        eprintln!(
            "interrupted: checkpoint saved in {}; continue with --resume",
            cfg.output_dir.display()
        );
    }
    println!("{}", summary_json(&summary));
    Ok(())
}
