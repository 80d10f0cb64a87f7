//! `rlft plan [grpo|rloo|ppo|sft|dpo|reward-model|online-dpo] --config X.toml`: the predicted
//! peak memory (RSS) of a run, before it starts, by component and phase (PPO's critic and
//! reward models as components of their own); whether it fits in this machine's available
//! memory, and if not, the config changes that make it fit (`rlft::plan`). Without a trainer
//! the config's keys tell it (`crate::plan_detect`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rlft::config::dpo::DpoConfig;
use rlft::config::online::OnlineConfig;
use rlft::config::online::{PpoConfig, RlooConfig};
use rlft::config::online_dpo::OnlineDpoConfig;
use rlft::config::reward::RewardConfig;
use rlft::config::sft::SftConfig;
use rlft::config::{apply_overrides, read_table, TrainerConfig};
use rlft::plan::inputs::{DpoLengths, GrpoLengths, LengthSource, RewardModelLengths, SftLengths};
use rlft::plan::{
    count, critic_shape, dpo_lengths, estimate, grpo_lengths, model_rewards, reward_model_lengths,
    run_shape_dpo, run_shape_grpo, run_shape_online_dpo, run_shape_reward_model, run_shape_sft,
    sft_lengths, suggest, CriticShape, DpoReference, Environment, ModelDims, Plan, RunShape,
    Suggestion, Tuning, Workload,
};
use rlft::trainers::Trainer;
use serde_json::json;

use crate::models;

/// Resident memory of this binary's runtime beyond what `rlft plan` itself holds after reading
/// the tokenizer and the dataset: rayon's and candle's worker threads, the rewards, the
/// trainer's bookkeeping (measured: `docs/memory.md`).
const RUNTIME_BYTES: u64 = 24 << 20;

/// Share of the available memory a plan may use before it counts as not fitting.
const BUDGET_SHARE: f64 = 0.9;

/// `rlft plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The trainer the config is for (grpo, rloo, ppo, sft, dpo, reward-model, online-dpo; its
    /// defaults apply). Default: the one trainer whose
    /// config takes all its keys (num_generations... online; packing SFT; precompute_ref_log_probs
    /// or a DPO loss_type such as "sigmoid" DPO; center_rewards_coefficient the reward model;
    /// rewards with max_new_tokens online-dpo); among the online ones
    /// `advantage_estimator = "gae"` or a critic key such as vf_coef is ppo,
    /// `advantage_estimator = "rloo"` or normalize_advantages rloo, the rest grpo. When the keys
    /// fit several (max_length alone: sft, dpo or reward-model), name the trainer.
    #[arg(value_name = "TRAINER")]
    pub trainer: Option<Trainer>,
    /// The run's TOML config.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Override a config key, as the trainer's command takes it (repeatable).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Plan for the config's length limits (max_prompt_length, max_length) instead of the
    /// dataset's longest prompt / example / pair (the dataset is then not read).
    #[arg(long)]
    pub worst_case: bool,
    /// Plan for this much memory (MiB) instead of /proc/meminfo's MemAvailable.
    #[arg(long)]
    pub available_mib: Option<u64>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

fn proc_kib(file: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(file).ok()?;
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
}

/// This process's resident bytes.
fn own_rss() -> Option<u64> {
    proc_kib("/proc/self/status", "VmRSS:").map(|k| k << 10)
}

/// The machine's available memory.
fn mem_available() -> Option<u64> {
    proc_kib("/proc/meminfo", "MemAvailable:").map(|k| k << 10)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Lengths of the config's run, from the dataset unless `worst_case` or it cannot be read.
enum Lengths {
    Grpo(GrpoLengths),
    Sft(SftLengths),
    Dpo(DpoLengths),
    RewardModel(RewardModelLengths),
}

/// The model's path and metadata (config, tokenizer), without its weights.
fn model(name: &str) -> Result<(PathBuf, rlft_model::load::ModelMetadata)> {
    let path = models::resolve(name)?;
    let meta = rlft_model::load::load_metadata(&path)
        .with_context(|| format!("read the model {}", path.display()))?;
    Ok((path, meta))
}

/// PPO's critic of `cfg` (none without `value_model`); when the value model cannot be read,
/// a copy of the policy's model, with a note.
fn critic(
    cfg: &OnlineConfig,
    meta: &rlft_model::load::ModelMetadata,
    notes: &mut Vec<String>,
) -> Option<CriticShape> {
    match critic_shape(cfg, meta) {
        Ok(c) => c,
        Err(e) => {
            notes.push(format!(
                "the value model could not be read ({e}); planned the critic as a copy of the \
                 policy's model"
            ));
            Some(CriticShape {
                dims: ModelDims::from_config(&meta.config),
                headless: false,
                source_file_bytes: meta.largest_file_bytes,
                decode_block_bytes: meta.decode_block_bytes,
            })
        }
    }
}

/// The run's lengths from its dataset (unless `worst_case`), else from the config's `limit`
/// with a note saying why.
fn lengths<L>(
    worst_case: bool,
    limit: &str,
    notes: &mut Vec<String>,
    of: impl Fn(bool) -> Result<L, rlft::plan::PlanError>,
) -> Result<L, rlft::plan::PlanError> {
    of(!worst_case).or_else(|e| {
        notes.push(format!(
            "the dataset could not be read ({e}); planned for {limit}"
        ));
        of(false)
    })
}

/// Runs `rlft plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    let mut table = read_table(&a.config)?;
    apply_overrides(&mut table, &a.set)?;
    let trainer = match a.trainer {
        Some(t) => t,
        None => crate::plan_detect::detect(&table)?,
    };
    let mut notes: Vec<String> = Vec::new();
    let (run, lengths, model_path, meta) = match trainer {
        Trainer::Grpo | Trainer::Rloo | Trainer::Ppo | Trainer::OnlineDpo => {
            // The command's own defaults (RLOO's beta and group size, PPO's critic, Online
            // DPO's pairs...).
            let odpo = match trainer {
                Trainer::OnlineDpo => Some(OnlineDpoConfig::load(&a.config, &a.set)?),
                _ => None,
            };
            let cfg = match (trainer, &odpo) {
                (_, Some(o)) => o.online(),
                (Trainer::Rloo, _) => RlooConfig::load(&a.config, &a.set)?.0,
                (Trainer::Ppo, _) => PpoConfig::load(&a.config, &a.set)?.0,
                _ => OnlineConfig::load(&a.config, &a.set)?,
            };
            let (model_path, meta) = model(&cfg.args.model)?;
            let l = lengths(a.worst_case, "max_prompt_length", &mut notes, |from_data| {
                grpo_lengths(&cfg, &meta.text, from_data)
            })?;
            let rewards = match model_rewards(&cfg, &model_path, &l) {
                Ok(r) => r,
                Err(e) => {
                    notes.push(format!(
                        "a `type = \"model\"` reward's model could not be read ({e}); planned \
                         without reward models"
                    ));
                    Vec::new()
                }
            };
            let run = match &odpo {
                Some(o) => run_shape_online_dpo(o, &l, rewards)?,
                None => run_shape_grpo(&cfg, &l, critic(&cfg, &meta, &mut notes), rewards)?,
            };
            (run, Lengths::Grpo(l), model_path, meta)
        }
        Trainer::Sft => {
            let cfg = SftConfig::load(&a.config, &a.set)?;
            let (model_path, meta) = model(&cfg.args.model)?;
            let l = lengths(a.worst_case, "max_length", &mut notes, |from_data| {
                sft_lengths(&cfg, &meta.text, from_data)
            })?;
            (run_shape_sft(&cfg, &l)?, Lengths::Sft(l), model_path, meta)
        }
        Trainer::Dpo => {
            let cfg = DpoConfig::load(&a.config, &a.set)?;
            let (model_path, meta) = model(&cfg.args.model)?;
            let l = lengths(a.worst_case, "max_length", &mut notes, |from_data| {
                dpo_lengths(&cfg, &meta.text, from_data)
            })?;
            (run_shape_dpo(&cfg, &l)?, Lengths::Dpo(l), model_path, meta)
        }
        Trainer::RewardModel => {
            let cfg = RewardConfig::load(&a.config, &a.set)?;
            let (model_path, meta) = model(&cfg.args.model)?;
            let l = lengths(a.worst_case, "max_length", &mut notes, |from_data| {
                reward_model_lengths(&cfg, &meta.text, from_data)
            })?;
            let run = run_shape_reward_model(&cfg, &l)?;
            (run, Lengths::RewardModel(l), model_path, meta)
        }
    };
    let dims = ModelDims::from_config(&meta.config);
    // The baseline: what this process holds now (binary, tokenizer, dataset) plus the
    // trainer's runtime.
    let own = own_rss().unwrap_or(64 << 20);
    let env = Environment {
        baseline_bytes: own + RUNTIME_BYTES,
        source_file_bytes: meta.largest_file_bytes,
        decode_block_bytes: meta.decode_block_bytes,
        frozen_blocks: meta.frozen_blocks,
    };
    let plan = estimate(&dims, &run, &env)?;
    let available = match a.available_mib {
        Some(m) => Some(m << 20),
        None => mem_available(),
    };
    let budget = available.map(|b| (b as f64 * BUDGET_SHARE) as u64);
    let fits = budget.map(|b| plan.total_bytes <= b);
    let suggestions = match budget {
        Some(b) if plan.total_bytes > b => suggest(&dims, &run, &env, b)?,
        _ => Vec::new(),
    };
    if a.json {
        let v = json!({
            "config": a.config,
            "trainer": trainer.name(),
            "model": {
                "path": model_path,
                "dims": dims,
                "parameters": plan.parameters,
            },
            "lengths": match &lengths {
                Lengths::Grpo(l) => serde_json::to_value(l)?,
                Lengths::Sft(l) => serde_json::to_value(l)?,
                Lengths::Dpo(l) => serde_json::to_value(l)?,
                Lengths::RewardModel(l) => serde_json::to_value(l)?,
            },
            "run": run,
            "environment": env,
            "plan": plan,
            "total_bytes": plan.total_bytes,
            "total_mib": mib(plan.total_bytes),
            "available_bytes": available,
            "budget_bytes": budget,
            "fits": fits,
            "suggestions": suggestions,
            "notes": notes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_text(
        &a,
        trainer,
        &model_path,
        &meta.config,
        &dims,
        &run,
        &lengths,
        &plan,
        available,
        &suggestions,
        &notes,
    );
    Ok(())
}

fn tuning_text(run: &RunShape) -> String {
    let dtype = if run.bf16 { "bf16" } else { "f32" };
    match &run.tuning {
        Tuning::Full => format!("full fine-tuning, {dtype}"),
        Tuning::Lora(l) => format!(
            "LoRA r={} on {} module{}, {dtype}",
            l.r,
            l.modules.len(),
            if l.modules.len() == 1 { "" } else { "s" }
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn print_text(
    a: &PlanArgs,
    trainer: Trainer,
    model_path: &std::path::Path,
    config: &rlft_model::ModelConfig,
    dims: &ModelDims,
    run: &RunShape,
    lengths: &Lengths,
    plan: &Plan,
    available: Option<u64>,
    suggestions: &[Suggestion],
    notes: &[String],
) {
    let name = trainer.name().to_uppercase();
    println!(
        "rlft plan: {} ({name}, {}, CPU)",
        a.config.display(),
        tuning_text(run)
    );
    println!(
        "model: {}: {}, {} layers, hidden {}, {}/{} heads x {}, intermediate {}, vocab {}, {} \
         parameters",
        model_path.display(),
        config.family.model_type(),
        dims.layers,
        dims.hidden,
        dims.heads,
        dims.kv_heads,
        dims.head_dim,
        dims.intermediate,
        dims.vocab,
        count(plan.parameters)
    );
    let src = |s: LengthSource| match s {
        LengthSource::Dataset => "the dataset's longest",
        LengthSource::Config => "the config's limit",
    };
    match (lengths, &run.workload) {
        (Lengths::Grpo(l), Workload::Grpo(g)) => {
            println!(
                "shapes: prompts {} tokens ({}), completions <= {}; rollout {} prompts x {} = \
                 {} completions; micro-batch {} x {} accumulation{}",
                l.prompt_tokens,
                src(l.source),
                g.completion_tokens,
                g.rollout_prompts,
                g.num_generations,
                g.rollout_completions,
                if g.online_dpo {
                    format!(
                        "{} completions ({} prompts x 2)",
                        run.micro_batch,
                        run.micro_batch / 2
                    )
                } else {
                    run.micro_batch.to_string()
                },
                run.accumulation,
                if g.share_prompts {
                    format!(
                        " (shared prompts: {} prompt pass{} per micro-batch)",
                        run.prompts_per_micro_batch(),
                        if run.prompts_per_micro_batch() == 1 {
                            ""
                        } else {
                            "es"
                        }
                    )
                } else {
                    String::new()
                }
            );
            for r in &g.reward_models {
                println!(
                    "reward `{}`: a reward model of {} layers, hidden {}, {} parameters; \
                     {} sequences x {} tokens per scoring pass",
                    r.name,
                    r.model.dims.layers,
                    r.model.dims.hidden,
                    count(r.model.parameters()),
                    r.batch_size,
                    r.tokens
                );
            }
            if let Some(k) = &g.critic {
                println!(
                    "critic: {} layers, hidden {}, {} parameters{}, trained as the policy is \
                     ({}); a value pass per rollout and a forward + backward per micro-batch",
                    k.dims.layers,
                    k.dims.hidden,
                    count(k.parameters()),
                    if k.headless {
                        " (a sequence-classification model)"
                    } else {
                        ""
                    },
                    tuning_text(run)
                );
            }
        }
        (Lengths::Sft(l), Workload::Sft(_)) => println!(
            "shapes: examples {} tokens ({}); micro-batch {} x {} accumulation",
            l.example_tokens,
            src(l.source),
            run.micro_batch,
            run.accumulation
        ),
        (Lengths::Dpo(l), Workload::Dpo(d)) => println!(
            "shapes: prompts {} tokens, completions {} tokens ({}); micro-batch {} pairs x {} \
             accumulation: {} prompt row{} per pair, chosen + rejected ({} rows) attending to \
             it; reference: {}",
            l.prompt_tokens,
            l.completion_tokens,
            src(l.source),
            run.micro_batch,
            run.accumulation,
            d.prompts_per_pair,
            if d.prompts_per_pair == 1 { "" } else { "s" },
            2 * run.micro_batch,
            match d.reference {
                DpoReference::AdaptersOff => "the base with adapters off",
                DpoReference::Copy => "a frozen copy",
                DpoReference::Precomputed => "precomputed log-probs",
            }
        ),
        (Lengths::RewardModel(l), Workload::RewardModel(_)) => println!(
            "shapes: sequences {} tokens ({}); micro-batch {} pairs ({} sequences) x {} \
             accumulation; a score head, no LM head",
            l.sequence_tokens,
            src(l.source),
            run.micro_batch,
            2 * run.micro_batch,
            run.accumulation
        ),
        _ => {}
    }
    for n in notes {
        println!("note: {n}");
    }
    println!();
    // The run's phases a component is alive in, in words when they are all (but loading).
    let phase_list = |c: &rlft::plan::Component| -> String {
        use rlft::plan::Phase;
        let run_phases: Vec<Phase> = plan.phases.iter().map(|p| p.phase).collect();
        let alive: Vec<Phase> = run_phases
            .iter()
            .copied()
            .filter(|p| c.phases.contains(p))
            .collect();
        let but = |skip: &[Phase]| -> Vec<Phase> {
            run_phases
                .iter()
                .copied()
                .filter(|p| !skip.contains(p))
                .collect()
        };
        let critic = run_phases.contains(&Phase::CriticLoad);
        if alive.len() >= 3 && alive == run_phases {
            "all".into()
        } else if alive.len() >= 3 && alive == but(&[Phase::Load]) {
            if critic {
                "from critic_load"
            } else {
                "all but load"
            }
            .into()
        } else if alive.len() >= 3 && critic && alive == but(&[Phase::Load, Phase::CriticLoad]) {
            "all but load".into()
        } else {
            alive
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    println!(
        "{:<44} {:>8}  {:<22} detail",
        "component", "MiB", "alive in"
    );
    for c in &plan.components {
        println!(
            "{:<44} {:>8.1}  {:<22} {}",
            c.name,
            mib(c.bytes),
            phase_list(c),
            c.detail
        );
        let acts = match c.key {
            "activations" => Some(&plan.activations),
            "critic_activations" => plan.critic_activations.as_ref(),
            _ => None,
        };
        if let Some(acts) = acts {
            let per_token: usize = acts.layer_tensors.iter().map(|t| t.bytes_per_token).sum();
            println!(
                "  {:<42} {:>8.1}  {:<22} {} layers x {:.1} KiB per token{}",
                "layers",
                mib(acts.layers.bytes),
                "",
                acts.layer_count,
                per_token as f64 / 1024.0,
                if acts.layer_tensors.iter().any(|t| t.bytes_per_score > 0) {
                    " + attention scores"
                } else {
                    ""
                }
            );
            for x in &acts.extra {
                println!("  {:<42} {:>8.1}", x.name, mib(x.size.bytes));
            }
        }
    }
    println!();
    let row = |f: &dyn Fn(&rlft::plan::PhaseTotal) -> u64, peak: bool| -> String {
        plan.phases
            .iter()
            .map(|p| {
                format!(
                    "{} {:.0}{}",
                    p.phase.name(),
                    mib(f(p)),
                    if peak && p.phase == plan.peak_phase {
                        " (peak)"
                    } else {
                        ""
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(" | ")
    };
    println!("alive by phase (MiB): {}", row(&|p| p.live_bytes, false));
    println!("RSS by phase (MiB):   {}", row(&|p| p.rss_bytes, true));
    println!(
        "  (after loading, RSS stays at the heap's high-water mark, {:.0} MiB; buffers of 32 MiB \
         or more are mapped fresh and come on top)",
        mib(plan.heap_high_water_bytes)
    );
    println!(
        "predicted peak RSS: {:.0} MiB ({}), in the {} phase",
        mib(plan.total_bytes),
        gib(plan.total_bytes),
        plan.peak_phase.name()
    );
    let Some(avail) = available else {
        println!("available memory: unknown (no /proc/meminfo); pass --available-mib");
        return;
    };
    let budget = (avail as f64 * BUDGET_SHARE) as u64;
    let share = plan.total_bytes as f64 / avail as f64 * 100.0;
    let source = if a.available_mib.is_some() {
        "--available-mib"
    } else {
        "MemAvailable"
    };
    if plan.total_bytes <= budget {
        println!(
            "available: {} ({source}): fits, {share:.0}% of it",
            gib(avail)
        );
        return;
    }
    println!(
        "available: {} ({source}): {} ({share:.0}% of it; the plan keeps {:.0}% as the limit)",
        gib(avail),
        if plan.total_bytes > avail {
            "does NOT fit"
        } else {
            "too tight"
        },
        BUDGET_SHARE * 100.0
    );
    if suggestions.is_empty() {
        println!(
            "no single change tried fits in {}: use a smaller model or a machine with more \
             memory",
            gib(budget)
        );
        return;
    }
    println!("to fit in {}:", gib(budget));
    for s in suggestions {
        println!(
            "  - {}: {}{}\n      {}",
            s.change,
            gib(s.total_bytes),
            if s.changes_training {
                " (changes what is trained)"
            } else {
                ""
            },
            s.sets
                .iter()
                .map(|x| format!("--set '{x}'"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}
