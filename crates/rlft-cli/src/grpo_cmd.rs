//! `rlft grpo --config grpo.toml`, `rlft eval --config grpo.toml` and
//! `rlft reward test --config grpo.toml --completions file.jsonl`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rlft::config::online::OnlineConfig;
use rlft::config::online_dpo::OnlineDpoConfig;
use rlft::config::TrainerConfig;
use rlft::online::setup::{eval_prompts, reward_set, turns};
use rlft::online::{eval_settings, prepare, train};
use rlft::rollout::eval::{evaluate, sample_reward_parts};
use serde_json::{json, Value};

use crate::common::parse_device;
use crate::models;
use crate::train_cmd::{self, TrainArgs};

/// `rlft grpo`.
#[derive(Args, Debug)]
pub struct GrpoArgs {
    #[command(flatten)]
    pub train: TrainArgs,
}

fn metrics_obj(m: &[(String, f64)]) -> Value {
    let mut o = serde_json::Map::new();
    for (k, v) in m {
        o.insert(k.clone(), json!(v));
    }
    Value::Object(o)
}

/// Runs `rlft grpo`, `rlft rloo` or `rlft ppo`: one trainer, the command's defaults in `C`.
pub fn run<C>(a: GrpoArgs) -> Result<()>
where
    C: TrainerConfig + AsRef<OnlineConfig>,
{
    let (cfg, summary): (C, _) = train_cmd::run(
        &a.train,
        |c: &C, m: &std::path::Path, d: &candle_core::Device| prepare(c.as_ref(), m, d),
        |c: &C, p: &mut rlft::online::Prepared, o: &rlft::run::RunOptions| train(c.as_ref(), p, o),
    )?;
    finish(&cfg, &summary)
}

/// Runs `rlft online-dpo`: the online rollout with pairs ranked by the rewards, the DPO loss.
pub fn run_online_dpo(a: GrpoArgs) -> Result<()> {
    let (cfg, summary): (OnlineDpoConfig, _) =
        train_cmd::run(&a.train, rlft::online_dpo::prepare, rlft::online_dpo::train)?;
    finish(&cfg, &summary)
}

/// After an online run: where a stopped run's checkpoint is, the report, the summary JSON.
fn finish(cfg: &impl TrainerConfig, summary: &rlft::run::RunSummary) -> Result<()> {
    if summary.interrupted || summary.final_dir.is_none() {
        train_cmd::say_stopped(cfg, summary.global_step);
    }
    // The report (summary card, dashboard, rollout cases) from what the run wrote.
    match rlft_report::write_report(&cfg.args().output_dir) {
        Ok(paths) => eprintln!("report: {}", paths.html.display()),
        Err(e) => eprintln!("warning: no report written: {e}"),
    }
    println!(
        "{}",
        json!({
            "global_step": summary.global_step,
            "skipped_steps": summary.skipped_steps,
            "eval_initial": summary.eval_initial.as_deref().map(metrics_obj),
            "eval_final": summary.eval_final.as_deref().map(metrics_obj),
            "final_dir": summary.final_dir,
            "wall_time_s": summary.wall_time_s,
        })
    );
    Ok(())
}

/// `rlft eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The GRPO config whose eval split, rewards and generation settings to use.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Model to score (HF dir, .gguf, a built-in name such as `default` or
    /// `qwen2.5-coder-0.5b`, or a LoRA run's `adapter/` or `checkpoint-N/`, merged over its
    /// base); default: the config's `model`.
    #[arg(long)]
    pub model: Option<String>,
    /// The base model of a LoRA adapter given as --model (default: the adapter's
    /// `base_model_name_or_path`).
    #[arg(long)]
    pub base: Option<String>,
    /// Override a config key (repeatable), e.g. `--set eval_decoding=sampled`; a number picks
    /// an array entry: `--set rewards.0.weight=0.5`.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Write every completion with its rewards to this JSONL file.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Runs `rlft eval`: scores a model on the config's eval prompts with its rewards.
pub fn run_eval(a: EvalArgs) -> Result<()> {
    let mut cfg = OnlineConfig::load(&a.config, &a.set)?;
    if let Some(m) = a.model {
        cfg.args.model = m;
    }
    let model_path = models::resolve(&cfg.args.model)?;
    let device = parse_device(&a.device)?;
    let loaded = crate::common::load_any(
        &model_path,
        a.base.as_deref(),
        &rlft_model::load::LoadOptions {
            device,
            dtype: candle_core::DType::F32,
            ..Default::default()
        },
    )?;
    let items = eval_prompts(&cfg, &loaded.text)?;
    if items.is_empty() {
        bail!(
            "no eval prompts: set `eval_dataset` or `eval_split`, or use a DatasetDict with a \
             `test` split"
        );
    }
    let mut rewards = reward_set(&cfg, &model_path, &loaded.model.device().clone())?;
    let pad_id = rlft_model::score::pad_id_of(&loaded.generation);
    let settings = eval_settings(&cfg, &loaded.generation.eos_token_ids, pad_id);
    let t = std::time::Instant::now();
    let turns = turns(&cfg, &loaded.text)?;
    let r = evaluate(
        &loaded.model,
        &loaded.text,
        &items,
        &mut rewards,
        &settings,
        turns.as_ref(),
    )?;
    let names = rewards.names();
    if let Some(path) = &a.output {
        let mut out = String::new();
        for (i, s) in r.samples.iter().enumerate() {
            let parts: serde_json::Map<String, Value> = sample_reward_parts(&names, &r.scores, i)
                .into_iter()
                .map(|(k, v)| (k, json!(v)))
                .collect();
            let mut line = json!({
                    "prompt": s.prompt_item(&items).text,
                    "completion": s.text,
                    "reward": r.scores.is_scored(i).then_some(r.scores.total[i]),
                    "rewards": parts,
                    "completion_tokens": s.completion_ids.len(),
                    "truncated": s.truncated,
            });
            if let Some(turns) = &turns {
                let t = s.turns.as_ref();
                line["transcript"] = json!(t.map_or(&s.text, |t| &t.transcript));
                if turns.has_tools() {
                    line["tool_calls"] = json!(t.map_or(0, |t| t.calls));
                    line["tool_failures"] = json!(t.map_or(0, |t| t.failures));
                }
                if turns.has_environment() {
                    line["environment_steps"] = json!(t.map_or(0, |t| t.steps));
                    line["environment_reward"] = json!(t.and_then(|t| t.environment_reward));
                }
            }
            out.push_str(&line.to_string());
            out.push('\n');
        }
        std::fs::write(path, out).with_context(|| format!("write {}", path.display()))?;
    }
    let mut m = metrics_obj(&r.metrics);
    m["eval/prompts"] = json!(items.len());
    m["eval/seconds"] = json!(t.elapsed().as_secs_f64());
    println!("{}", serde_json::to_string_pretty(&m)?);
    Ok(())
}

/// `rlft reward ...`.
#[derive(Args, Debug)]
pub struct RewardArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: RewardCommand,
}

/// Reward subcommands.
#[derive(Subcommand, Debug)]
pub enum RewardCommand {
    /// Score completions with a config's rewards, without a model or training.
    Test(RewardTestArgs),
}

/// `rlft reward test`.
#[derive(Args, Debug)]
pub struct RewardTestArgs {
    /// Config whose `[[rewards]]` (and `reward_weights`) to use.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// JSONL with one object per line: `completion` (string), optional `prompt` and
    /// `completion_ids` (token ids), and the dataset columns the rewards read (e.g. `answer`, or
    /// `reward_model` with `ground_truth`).
    #[arg(long)]
    pub completions: PathBuf,
    /// Override a config key (repeatable).
    #[arg(long = "set")]
    pub set: Vec<String>,
}

/// Runs `rlft reward test`: prints one JSON line per completion and a summary.
pub fn run_reward(a: RewardArgs) -> Result<()> {
    let RewardCommand::Test(a) = a.command;
    let cfg = OnlineConfig::load(&a.config, &a.set)?;
    // A `model` reward's adapter `base` may name the config's `model`: resolve it only then.
    let model_path = if cfg
        .rollout
        .rewards
        .iter()
        .any(|r| r.kind.type_name() == "model")
    {
        models::resolve(&cfg.args.model)?
    } else {
        PathBuf::from(&cfg.args.model)
    };
    let mut rewards = reward_set(&cfg, &model_path, &candle_core::Device::Cpu)?;
    let text = std::fs::read_to_string(&a.completions)
        .with_context(|| format!("read {}", a.completions.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).with_context(|| {
            format!("{} line {}: not valid JSON", a.completions.display(), i + 1)
        })?;
        if !v.get("completion").is_some_and(Value::is_string) {
            bail!(
                "{} line {}: needs a string field `completion` (and the columns your rewards \
                 read)",
                a.completions.display(),
                i + 1
            );
        }
        rows.push(v);
    }
    if rows.is_empty() {
        bail!("{} has no completions", a.completions.display());
    }
    // Token ids only where the file gives them (a `python` reward's `completion_ids`).
    let ids: Vec<Vec<u32>> = rows
        .iter()
        .map(|r| {
            r.get("completion_ids")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default()
        })
        .collect();
    let samples: Vec<rlft_rewards::Sample<'_>> = rows
        .iter()
        .zip(&ids)
        .map(|(r, ids)| rlft_rewards::Sample {
            prompt: r.get("prompt").and_then(Value::as_str).unwrap_or(""),
            completion: r["completion"].as_str().unwrap_or(""),
            row: r,
            completion_ids: ids,
            completion_tokens: ids.len(),
            truncated: false,
            environment_reward: None,
        })
        .collect();
    let scores = rewards.score(&samples)?;
    let names = rewards.names();
    for (i, _) in rows.iter().enumerate() {
        let parts: serde_json::Map<String, Value> = sample_reward_parts(&names, &scores, i)
            .into_iter()
            .map(|(k, v)| (k, json!(v)))
            .collect();
        println!(
            "{}",
            json!({"index": i, "reward": scores.is_scored(i).then_some(scores.total[i]), "rewards": parts})
        );
    }
    let mean = scores.total.iter().sum::<f64>() / scores.total.len() as f64;
    eprintln!(
        "{} completions, mean reward {mean:.4}; failures per function: {:?}",
        rows.len(),
        names.iter().zip(&scores.failures).collect::<Vec<_>>()
    );
    Ok(())
}
