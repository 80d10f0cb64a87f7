//! `rlft data sampled-preferences --config grpo.toml --output DIR`: preference pairs from a
//! model's own samples, labelled by the config's rewards (`rlft::rollout::pairs`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rlft::config::online::OnlineConfig;
use rlft::config::TrainerConfig;
use rlft::online::setup::{eval_prompts, prompts, reward_set, sampling_settings, EVAL_BATCH};
use rlft::rollout::pairs::{reference_replies, sampled_pairs, PairSettings, SampledPairs};
use rlft_data::synth::{save_splits, SaveFormats};
use rlft_data::{load_dataset, Dataset};

use crate::common::parse_device;
use crate::data_cmd::check_output;
use crate::models;

/// `rlft data sampled-preferences`.
#[derive(Args, Debug)]
pub struct SampledPreferencesArgs {
    /// An online trainer's config (GRPO's keys): its `dataset` split (train pairs) and eval
    /// split (test pairs), `system_prompt`, `num_generations`, sampling (`temperature`,
    /// `top_p`, ...), `max_completion_length` and `[[rewards]]` label the pairs.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Model to sample (HF dir, .gguf, a run's `final/`, `adapter/` or `checkpoint-N/`, or a
    /// built-in name: `rlft fetch-model --list`); default: the config's `model`.
    #[arg(long)]
    pub model: Option<String>,
    /// Output directory: a DatasetDict with `train` and `test` preference rows (`prompt`,
    /// `chosen`, `rejected`, `chosen_reward`, `rejected_reward`, and the prompt rows' columns).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Train prompts to sample, from the start of the split (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_prompts: usize,
    /// Skip prompts whose best and worst completions score within this of each other.
    #[arg(long, default_value_t = 0.0)]
    pub min_gap: f64,
    /// Also write the rows of this preference DatasetDict, split by split (e.g. the pairs of
    /// `rlft data tiny-python-expr --preferences`), after the sampled ones.
    #[arg(long)]
    pub include: Option<PathBuf>,
    /// Reference replies: a preference DatasetDict whose `chosen` replies, matched to the
    /// prompts by prompt split by split, are each prompt's demonstration (e.g. the pairs of
    /// `rlft data tiny-python-expr --preferences`). The rewards score it with the samples, and
    /// the best and the worst sample scoring below it are paired against it as well.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Override a config key (repeatable), e.g. `--set num_generations=4`.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Also write DIR/train.jsonl and DIR/test.jsonl.
    #[arg(long)]
    pub jsonl: bool,
    /// Replace an existing dataset directory at --output.
    #[arg(long)]
    pub overwrite: bool,
}

/// Runs `rlft data sampled-preferences`.
pub fn run(a: SampledPreferencesArgs) -> Result<()> {
    let mut cfg = OnlineConfig::load(&a.config, &a.set)?;
    if let Some(m) = &a.model {
        cfg.args.model = m.clone();
    }
    if cfg.num_generations < 2 {
        bail!(
            "num_generations is {}: a pair needs at least 2 samples per prompt; pass --set \
             num_generations=4",
            cfg.num_generations
        );
    }
    check_output(&a.output, a.overwrite)?;
    let model_path = models::resolve(&cfg.args.model)?;
    let device = parse_device(&a.device)?;
    let loaded = crate::common::load_any(
        &model_path,
        None,
        &rlft_model::load::LoadOptions {
            device: device.clone(),
            dtype: candle_core::DType::F32,
            ..Default::default()
        },
    )?;
    let ds = load_dataset(&cfg.args.dataset, Some(&cfg.args.dataset_split))?;
    let (mut train, _) = prompts(&cfg, &ds, &loaded.text)?;
    if a.max_prompts > 0 {
        train.truncate(a.max_prompts);
    }
    let test = eval_prompts(&cfg, &loaded.text)?;
    let mut rewards = reward_set(&cfg, &model_path, &device)?;
    let settings = PairSettings {
        rollout: sampling_settings(
            &cfg,
            &loaded.generation.eos_token_ids,
            rlft_model::score::pad_id_of(&loaded.generation),
            cfg.args.seed,
        ),
        prompt_column: cfg.rollout.prompt_column.clone(),
        chat: loaded.text.compile_chat_template().is_ok(),
        min_gap: a.min_gap,
        batch: (EVAL_BATCH * 4 / cfg.num_generations).max(1),
    };
    let mut splits = Vec::new();
    for (name, items) in [("train", &train), ("test", &test)] {
        eprintln!(
            "{name}: sampling {} completions for each of {} prompts",
            cfg.num_generations,
            items.len()
        );
        let refs = match &a.reference {
            Some(dir) => {
                let rows = load_dataset(dir, Some(name))
                    .with_context(|| format!("--reference {}: split `{name}`", dir.display()))?
                    .rows;
                let refs =
                    reference_replies(items, &cfg.rollout.prompt_column, settings.chat, &rows)
                        .with_context(|| format!("--reference {}", dir.display()))?;
                eprintln!(
                    "{name}: {} of {} prompts have a reference reply in {}",
                    refs.iter().flatten().count(),
                    items.len(),
                    dir.display()
                );
                refs
            }
            None => Vec::new(),
        };
        let p = sampled_pairs(
            &loaded.model,
            &loaded.text,
            items,
            &refs,
            &mut rewards,
            &settings,
        )?;
        report(name, &p);
        let mut rows = p.rows;
        if let Some(dir) = &a.include {
            let extra = load_dataset(dir, Some(name))
                .with_context(|| format!("--include {}: split `{name}`", dir.display()))?;
            rows.extend(extra.rows);
        }
        splits.push((name, Dataset::from_rows(rows)?));
    }
    let named: Vec<(&str, &Dataset)> = splits.iter().map(|(n, d)| (*n, d)).collect();
    let formats = SaveFormats {
        jsonl: a.jsonl,
        parquet: false,
    };
    save_splits(&a.output, &named, formats)
        .with_context(|| format!("writing {}", a.output.display()))?;
    println!(
        "wrote {} (DatasetDict: train {} rows, test {} rows)",
        a.output.display(),
        splits[0].1.len(),
        splits[1].1.len()
    );
    println!(
        "train a reward model on it: rlft reward-model --config rm.toml --set dataset={}",
        a.output.display()
    );
    Ok(())
}

fn report(name: &str, p: &SampledPairs) {
    println!(
        "{name}: {} prompts, {} completions (mean reward {:.4}), {} pairs ({} against {} \
         reference replies), {} prompts without a sampled pair (all completions scored alike)",
        p.prompts,
        p.completions,
        p.mean_reward,
        p.rows.len(),
        p.reference_rows,
        p.references,
        p.ties
    );
}
