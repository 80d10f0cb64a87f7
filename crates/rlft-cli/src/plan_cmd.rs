//! `rlft plan [grpo|rloo|ppo|sft|dpo|reward-model|online-dpo] --config X.toml`: the predicted
//! peak memory (RSS) of a run, before it starts, by component and phase (PPO's critic and
//! reward models as components of their own); whether it fits in this machine's available
//! memory, and if not, the config changes that make it fit (`rlft_plan`, from the trainer's
//! declaration in `rlft::plan_shapes`). Without a trainer
//! the config's keys tell it (`crate::plan_detect`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rlft::config::{apply_overrides, read_table};
use rlft::plan_inputs::{critic_model, model, model_rewards, LengthSource, Lengths};
use rlft::plan_shapes::{Models, PlanConfig};
use rlft::trainers::Trainer;
use rlft_plan::{count, estimate, suggest, Environment, ModelDims, Plan, Run, Suggestion, Tuning};
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

/// A phase's name as the JSON spells it (serde's snake_case of [`rlft_plan::Phase`]).
fn phase_name(p: rlft_plan::Phase) -> String {
    let v = serde_json::to_value(p).unwrap_or_default();
    v.as_str().unwrap_or_default().to_string()
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The model's path and metadata (config, tokenizer), without its weights.
fn model_meta(name: &str) -> Result<(PathBuf, rlft_model::load::ModelMetadata)> {
    let path = models::resolve(name)?;
    let meta = rlft_model::load::load_metadata(&path)
        .with_context(|| format!("read the model {}", path.display()))?;
    Ok((path, meta))
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
    // The command's own defaults (RLOO's beta and group size, PPO's critic, Online DPO's
    // pairs...).
    let cfg = PlanConfig::load(trainer, &a.config, &a.set)?;
    let (model_path, meta) = model_meta(&cfg.args().model)?;
    // The lengths from the dataset (unless --worst-case), else the config's limits.
    let lengths = cfg.lengths(&meta.text, !a.worst_case).or_else(|e| {
        let limit = match cfg {
            PlanConfig::Online { .. } => "max_prompt_length",
            _ => "max_length",
        };
        notes.push(format!(
            "the dataset could not be read ({e}); planned for {limit}"
        ));
        cfg.lengths(&meta.text, false)
    })?;
    let policy = model(&meta, false, false);
    let (mut critic, mut rewards) = (None, Vec::new());
    if let PlanConfig::Online { cfg: o, .. } = &cfg {
        critic = critic_model(o, &meta).unwrap_or_else(|e| {
            notes.push(format!(
                "the value model could not be read ({e}); planned the critic as a copy of the \
                 policy's model"
            ));
            Some(model(&meta, true, false))
        });
        rewards = model_rewards(o, &model_path).unwrap_or_else(|e| {
            notes.push(format!(
                "a `type = \"model\"` reward's model could not be read ({e}); planned \
                 without reward models"
            ));
            Vec::new()
        });
    }
    let models = Models {
        policy,
        critic,
        rewards,
    };
    let run = cfg.run(&lengths, &models)?;
    let dims = run.policy.dims;
    // The baseline: what this process holds now (binary, tokenizer, dataset) plus the
    // trainer's runtime.
    let env = Environment {
        baseline_bytes: own_rss().unwrap_or(64 << 20) + RUNTIME_BYTES,
    };
    let plan = estimate(&run, &env)?;
    let available = match a.available_mib {
        Some(m) => Some(m << 20),
        None => mem_available(),
    };
    let budget = available.map(|b| (b as f64 * BUDGET_SHARE) as u64);
    let fits = budget.map(|b| plan.total_bytes <= b);
    // Each candidate is the config with its overrides, declared again by the trainer; one
    // that does not load is never suggested.
    let with = |sets: &[String]| -> Option<PlanConfig> {
        let all: Vec<String> = a.set.iter().chain(sets).cloned().collect();
        PlanConfig::load(trainer, &a.config, &all).ok()
    };
    let suggestions = match budget {
        Some(b) if plan.total_bytes > b => suggest(
            plan.total_bytes,
            b,
            |sets| with(sets).map(|c| c.levers(&lengths)).unwrap_or_default(),
            |sets| -> Result<u64> {
                let Some(c) = with(sets) else {
                    return Ok(u64::MAX);
                };
                Ok(estimate(&c.run(&lengths, &models)?, &env)?.total_bytes)
            },
        )?,
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
            "lengths": lengths,
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
    let text = Text {
        a: &a,
        trainer,
        model_path: &model_path,
        config: &meta.config,
        dims: &dims,
        cfg: &cfg,
        run: &run,
        lengths: &lengths,
        plan: &plan,
    };
    text.print(available, &suggestions, &notes);
    Ok(())
}

fn tuning_text(run: &Run) -> String {
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

/// What the text output reads.
struct Text<'a> {
    a: &'a PlanArgs,
    trainer: Trainer,
    model_path: &'a std::path::Path,
    config: &'a rlft_model::ModelConfig,
    dims: &'a ModelDims,
    cfg: &'a PlanConfig,
    run: &'a Run,
    lengths: &'a Lengths,
    plan: &'a Plan,
}

impl Text<'_> {
    /// The whole text: header, shapes, notes, components, phases and the verdict.
    fn print(&self, available: Option<u64>, suggestions: &[Suggestion], notes: &[String]) {
        let (run, dims) = (self.run, self.dims);
        println!(
            "rlft plan: {} ({}, {}, CPU)",
            self.a.config.display(),
            self.trainer.name().to_uppercase(),
            tuning_text(run)
        );
        println!(
            "model: {}: {}, {} layers, hidden {}, {}/{} heads x {}, intermediate {}, vocab {}, \
             {} parameters",
            self.model_path.display(),
            self.config.family.model_type(),
            dims.layers,
            dims.hidden,
            dims.heads,
            dims.kv_heads,
            dims.head_dim,
            dims.intermediate,
            dims.vocab,
            count(self.plan.parameters)
        );
        self.shapes();
        for n in notes {
            println!("note: {n}");
        }
        println!();
        self.components();
        println!();
        self.phases();
        verdict(self.a, self.plan, available, suggestions);
    }

    /// The run's shapes, by trainer.
    fn shapes(&self) {
        let run = self.run;
        let src = |s: LengthSource| match s {
            LengthSource::Dataset => "the dataset's longest",
            LengthSource::Config => "the config's limit",
        };
        let (b, acc) = (run.micro_batch, run.accumulation);
        match (self.lengths, self.cfg) {
            (Lengths::Grpo(l), PlanConfig::Online { cfg, odpo }) => {
                let g = run.generation.expect("online runs generate");
                let micro = if *odpo {
                    format!("{b} completions ({} prompts x 2)", b / 2)
                } else {
                    b.to_string()
                };
                let shared = match run.update.shared_prompt {
                    Some(_) => {
                        let n = run.update.passes[0].rows;
                        let es = if n == 1 { "" } else { "es" };
                        format!(" (shared prompts: {n} prompt pass{es} per micro-batch)")
                    }
                    None => String::new(),
                };
                println!(
                    "shapes: prompts {} tokens ({}), completions <= {}; rollout {} prompts x {} \
                     = {} completions; micro-batch {micro} x {acc} accumulation{shared}",
                    l.prompt_tokens,
                    src(l.source),
                    cfg.max_completion_length,
                    g.prompts,
                    g.per_prompt,
                    g.prompts * g.per_prompt,
                );
                for r in &run.reward_models {
                    println!(
                        "reward `{}`: a reward model of {} layers, hidden {}, {} parameters; \
                         {} sequences x {} tokens per scoring pass",
                        r.name,
                        r.model.dims.layers,
                        r.model.dims.hidden,
                        count(r.model.parameters()),
                        r.rows,
                        r.tokens
                    );
                }
                if let Some(k) = &run.critic {
                    println!(
                        "critic: {} layers, hidden {}, {} parameters{}, trained as the policy \
                         is ({}); a value pass per rollout and a forward + backward per \
                         micro-batch",
                        k.model.dims.layers,
                        k.model.dims.hidden,
                        count(k.model.parameters()),
                        if k.model.headless {
                            " (a sequence-classification model)"
                        } else {
                            ""
                        },
                        tuning_text(run)
                    );
                }
            }
            (Lengths::Sft(l), _) => println!(
                "shapes: examples {} tokens ({}); micro-batch {b} x {acc} accumulation",
                l.example_tokens,
                src(l.source),
            ),
            (Lengths::Dpo(l), PlanConfig::Dpo(c)) => println!(
                "shapes: prompts {} tokens, completions {} tokens ({}); micro-batch {b} pairs x \
                 {acc} accumulation: {} prompt row{} per pair, chosen + rejected ({} rows) \
                 attending to it; reference: {}",
                l.prompt_tokens,
                l.completion_tokens,
                src(l.source),
                l.prompts_per_pair,
                if l.prompts_per_pair == 1 { "" } else { "s" },
                2 * b,
                match (c.precompute_ref_log_probs, c.args.use_peft) {
                    (true, _) => "precomputed log-probs",
                    (false, true) => "the base with adapters off",
                    (false, false) => "a frozen copy",
                }
            ),
            (Lengths::RewardModel(l), _) => println!(
                "shapes: sequences {} tokens ({}); micro-batch {b} pairs ({} sequences) x {acc} \
                 accumulation; a score head, no LM head",
                l.sequence_tokens,
                src(l.source),
                2 * b,
            ),
            _ => {}
        }
    }

    /// The run's phases a component is alive in, in words when they are all (but loading).
    fn alive(&self, c: &rlft_plan::Component) -> String {
        use rlft_plan::Phase;
        let run_phases: Vec<Phase> = self.plan.phases.iter().map(|p| p.phase).collect();
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
            let names: Vec<String> = alive.iter().map(|&p| phase_name(p)).collect();
            names.join(", ")
        }
    }

    /// The components' table, activations itemised.
    fn components(&self) {
        let plan = self.plan;
        println!(
            "{:<44} {:>8}  {:<22} detail",
            "component", "MiB", "alive in"
        );
        for c in &plan.components {
            let alive = self.alive(c);
            println!(
                "{:<44} {:>8.1}  {alive:<22} {}",
                c.name,
                mib(c.bytes),
                c.detail
            );
            let acts = match c.key {
                "activations" => Some(&plan.activations),
                "critic_activations" => plan.critic_activations.as_ref(),
                _ => None,
            };
            let Some(acts) = acts else {
                continue;
            };
            println!(
                "  {:<42} {:>8.1}  {:<22} {} layers x {:.1} KiB per token{}",
                "layers",
                mib(acts.layers.bytes),
                "",
                acts.layer_count,
                acts.layer_bytes_per_token as f64 / 1024.0,
                if acts.layer_bytes_per_score > 0 {
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

    /// Alive and RSS by phase, the heap's mark and the predicted peak.
    fn phases(&self) {
        let plan = self.plan;
        let row = |f: &dyn Fn(&rlft_plan::PhaseTotal) -> u64, peak: bool| -> String {
            let cells: Vec<String> = plan
                .phases
                .iter()
                .map(|p| {
                    let mark = if peak && p.phase == plan.peak_phase {
                        " (peak)"
                    } else {
                        ""
                    };
                    format!("{} {:.0}{mark}", phase_name(p.phase), mib(f(p)))
                })
                .collect();
            cells.join(" | ")
        };
        println!("alive by phase (MiB): {}", row(&|p| p.live_bytes, false));
        println!("RSS by phase (MiB):   {}", row(&|p| p.rss_bytes, true));
        println!(
            "  (after loading, RSS stays at the heap's high-water mark, {:.0} MiB; buffers of 32 \
             MiB or more are mapped fresh and come on top)",
            mib(plan.heap_high_water_bytes)
        );
        println!(
            "predicted peak RSS: {:.0} MiB ({}), in the {} phase",
            mib(plan.total_bytes),
            gib(plan.total_bytes),
            phase_name(plan.peak_phase)
        );
    }
}

/// Whether the plan fits the available memory, and if not, the suggestions.
fn verdict(a: &PlanArgs, plan: &Plan, available: Option<u64>, suggestions: &[Suggestion]) {
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
