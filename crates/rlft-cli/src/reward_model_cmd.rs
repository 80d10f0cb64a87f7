//! `rlft reward-model --config rm.toml`: train a reward model on preference pairs; `rlft score
//! --model RM --data rows.jsonl`: score rows with one.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rlft::config::reward::RewardConfig;
use rlft::reward_model::score::score_dataset;
use rlft::reward_model::{prepare, train};
use rlft::run::offline::summary_json;
use rlft_model::load::LoadOptions;
use rlft_model::score::load_score_model;

use crate::common::parse_device;
use crate::models;
use crate::train_cmd::{self, TrainArgs};

/// `rlft reward-model`.
#[derive(Args, Debug)]
pub struct RewardModelArgs {
    #[command(flatten)]
    pub train: TrainArgs,
}

/// Runs `rlft reward-model`.
pub fn run(a: RewardModelArgs) -> Result<()> {
    let (cfg, summary): (RewardConfig, _) = train_cmd::run(&a.train, prepare, train)?;
    if summary.interrupted || summary.final_dir.is_none() {
        train_cmd::say_stopped(&cfg, summary.global_step);
    }
    println!("{}", summary_json(&summary, SUMMARY));
    Ok(())
}

/// `rlft score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// The reward model: an HF directory of a `*ForSequenceClassification` checkpoint (what
    /// `rlft reward-model` writes to OUTPUT/final), or a PEFT SEQ_CLS adapter directory
    /// (OUTPUT/adapter) with --base.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Base model of an adapter (HF dir, .gguf or a built-in name such as `default`); default:
    /// the adapter's base_model_name_or_path.
    #[arg(long)]
    pub base: Option<String>,
    /// Rows to score (JSONL, Parquet or an HF save_to_disk directory): `chosen` + `rejected`,
    /// `prompt` + `completion`, `messages` or `text`.
    #[arg(long, short = 'd')]
    pub data: PathBuf,
    /// Split of a DatasetDict.
    #[arg(long, default_value = "train")]
    pub split: String,
    /// System message put first in conversations that have none (use the one training used).
    #[arg(long)]
    pub system_prompt: Option<String>,
    /// Write the scores here (JSONL) instead of printing them.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Runs `rlft score`.
pub fn run_score(a: ScoreArgs) -> Result<()> {
    let base = a.base.as_deref().map(models::resolve).transpose()?;
    let opts = LoadOptions {
        device: parse_device(&a.device)?,
        ..Default::default()
    };
    let sm = load_score_model(&a.model, base.as_deref(), &opts)?;
    let ds = rlft_data::load_dataset(&a.data, Some(&a.split))?;
    let (rows, summary) = score_dataset(&sm, &ds, a.system_prompt.as_deref(), a.batch_size)?;
    let mut text = String::new();
    for r in &rows {
        text.push_str(&r.to_string());
        text.push('\n');
    }
    match &a.output {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    let acc = summary
        .accuracy
        .map(|x| format!(", accuracy {x:.4} on {} pairs", summary.pairs))
        .unwrap_or_default();
    eprintln!(
        "scored {} rows with {}: mean score {:.4}{acc}",
        summary.rows,
        a.model.display(),
        summary.mean_score
    );
    if let Some(path) = &a.output {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// The eval figures of the JSON summary line `rlft reward-model` prints at the end
/// ([`summary_json`]).
const SUMMARY: &[(&str, &str)] = &[
    ("initial_eval_accuracy", "eval_accuracy"),
    ("final_eval_accuracy", "eval_accuracy"),
    ("final_eval_loss", "eval_loss"),
    ("final_eval_margin", "eval_margin"),
];
