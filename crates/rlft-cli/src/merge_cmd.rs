//! `rlft merge`: a base model plus a PEFT LoRA adapter -> one HF directory with the adapter's
//! update folded into the weights (`W += scaling * B @ A`), loadable by transformers (and by
//! rlft) with no PEFT dependency.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rlft_model::export::save_hf_dir;
use rlft_model::lora::merge_lora;
use rlft_model::peft::load_adapter;

use crate::common::{load, ExportArgs, ModelArgs};

/// `rlft merge`.
#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The base model the adapter was trained on (`--model`, `--dtype`, `--device`).
    #[command(flatten)]
    pub model: ModelArgs,
    /// PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`).
    #[arg(long)]
    pub adapter: PathBuf,
    #[command(flatten)]
    pub export: ExportArgs,
}

/// Runs `rlft merge`.
pub fn run_merge(a: MergeArgs) -> Result<()> {
    let opts = a.export.options()?;
    let mut m = load(&a.model)?;
    let cfg = load_adapter(&mut m.model, &a.adapter).with_context(|| {
        format!(
            "loading the adapter {} onto {}",
            a.adapter.display(),
            m.source.display()
        )
    })?;
    let n = merge_lora(&mut m.model)?;
    save_hf_dir(&m.model, &m.text, &m.generation, &a.export.output, &opts)?;
    eprintln!(
        "merged {n} LoRA modules (r {}, lora_alpha {}, {}{}) into {}",
        cfg.r,
        cfg.lora_alpha,
        cfg.target_modules.join(","),
        if cfg.use_rslora { ", rsLoRA" } else { "" },
        a.export.output.display()
    );
    Ok(())
}
