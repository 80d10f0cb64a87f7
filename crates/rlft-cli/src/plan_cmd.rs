//! `rlft plan [grpo|rloo|ppo|sft] --config X.toml`: the predicted peak memory (RSS) of a run,
//! before it starts, by component and phase (PPO's critic as components of its own); whether it
//! fits in this machine's available memory, and if not, the config changes that make it fit
//! (`rlft::plan`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rlft::config::grpo::{GrpoConfig, ALIASES, GRPO_KEYS};
use rlft::config::online::{PpoConfig, RlooConfig, ONLINE_ALIASES};
use rlft::config::sft::{SftConfig, SFT_KEYS};
use rlft::config::{apply_overrides, read_table, TrainerConfig};
use rlft::plan::inputs::{GrpoLengths, LengthSource, SftLengths};
use rlft::plan::{
    count, critic_shape, estimate, grpo_lengths, run_shape_grpo, run_shape_sft, sft_lengths,
    suggest, CriticShape, Environment, ModelDims, Plan, RunShape, Suggestion, Tuning, Workload,
};
use serde_json::json;

use crate::default_model;

/// Resident memory of this binary's runtime beyond what `rlft plan` itself holds after reading
/// the tokenizer and the dataset: rayon's and candle's worker threads, the rewards, the
/// trainer's bookkeeping (measured: `docs/memory.md`).
const RUNTIME_BYTES: u64 = 24 << 20;

/// Share of the available memory a plan may use before it counts as not fitting.
const BUDGET_SHARE: f64 = 0.9;

/// Which trainer a config is for.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trainer {
    /// `rlft grpo` configs.
    Grpo,
    /// `rlft rloo` configs (RLOO's defaults: beta 0.05, 2 generations).
    Rloo,
    /// `rlft ppo` configs (PPO's defaults; the critic starts from `model`).
    Ppo,
    /// `rlft sft` configs.
    Sft,
}

impl Trainer {
    /// The command's name.
    fn name(self) -> &'static str {
        match self {
            Trainer::Grpo => "grpo",
            Trainer::Rloo => "rloo",
            Trainer::Ppo => "ppo",
            Trainer::Sft => "sft",
        }
    }
}

/// `rlft plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The trainer the config is for (its defaults apply); default: told apart by its keys
    /// (SFT has max_length, eval_size...; the online ones num_generations, rewards...; among
    /// those, `advantage_estimator = "gae"` or a critic key such as vf_coef or value_model is
    /// ppo, `advantage_estimator = "rloo"` or normalize_advantages is rloo, the rest grpo).
    #[arg(value_enum)]
    pub trainer: Option<Trainer>,
    /// The run's TOML config.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Override a config key, as `rlft grpo` / `rlft sft` take it (repeatable).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Plan for the config's length limits (max_prompt_length, max_length) instead of the
    /// dataset's longest prompt / example (the dataset is then not read).
    #[arg(long)]
    pub worst_case: bool,
    /// Plan for this much memory (MiB) instead of /proc/meminfo's MemAvailable.
    #[arg(long)]
    pub available_mib: Option<u64>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Keys only PPO's critic reads (canonical and aliases): a config with one is for `rlft ppo`.
const CRITIC_KEYS: &[&str] = &[
    "value_model",
    "critic_pretrain",
    "vf_coef",
    "cliprange_value",
    "value_clip",
    "whiten_rewards",
    "lam",
    "lambd",
];

/// Tells the trainers apart by the (top-level) keys only some have, and the online configs by
/// their estimator (`advantage_estimator`, else a critic key for PPO, `normalize_advantages`
/// for RLOO).
fn detect(table: &toml::Table) -> Result<Trainer> {
    let keys: Vec<&str> = table.keys().map(String::as_str).collect();
    let online = detect_online_or_sft(&keys)?;
    if online == Trainer::Sft {
        return Ok(online);
    }
    let estimator = table.get("advantage_estimator").and_then(|v| v.as_str());
    Ok(match estimator {
        Some("gae") => Trainer::Ppo,
        Some("rloo") => Trainer::Rloo,
        Some(_) => Trainer::Grpo,
        None if keys.iter().any(|k| CRITIC_KEYS.contains(k)) => Trainer::Ppo,
        None if keys.contains(&"normalize_advantages") => Trainer::Rloo,
        None => Trainer::Grpo,
    })
}

/// Tells the online (GRPO, RLOO, PPO: answered as `Grpo`) and SFT configs apart by the keys
/// only one of them has.
fn detect_online_or_sft(keys: &[&str]) -> Result<Trainer> {
    let grpo_only = |k: &str| {
        (GRPO_KEYS.contains(&k) && !SFT_KEYS.contains(&k))
            || ALIASES
                .iter()
                .chain(ONLINE_ALIASES)
                .any(|(a, _, _)| *a == k)
            || matches!(
                k,
                "rollout_batch_size" | "train_batch_size" | "num_mini_batches"
            )
    };
    let sft_only = |k: &str| SFT_KEYS.contains(&k) && !GRPO_KEYS.contains(&k);
    let g: Vec<&str> = keys.iter().copied().filter(|k| grpo_only(k)).collect();
    let s: Vec<&str> = keys.iter().copied().filter(|k| sft_only(k)).collect();
    match (g.is_empty(), s.is_empty()) {
        (false, true) => Ok(Trainer::Grpo),
        (true, false) => Ok(Trainer::Sft),
        (true, true) => bail!(
            "cannot tell whether this is a GRPO (RLOO, PPO) or an SFT config (no key only one of \
             them has); say which: `rlft plan grpo --config ...` (or rloo, ppo) or `rlft plan \
             sft --config ...`"
        ),
        (false, false) => bail!(
            "the config has GRPO keys ({}) and SFT keys ({}); say which trainer it is for: \
             `rlft plan grpo --config ...` (or rloo, ppo) or `rlft plan sft --config ...`",
            g.join(", "),
            s.join(", ")
        ),
    }
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
}

/// The model's path and metadata (config, tokenizer), without its weights.
fn model(name: &str) -> Result<(PathBuf, rlft_model::load::ModelMetadata)> {
    let path = default_model::resolve(name)?;
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
        None => detect(&table)?,
    };
    let mut notes: Vec<String> = Vec::new();
    let (run, lengths, model_path, meta) = match trainer {
        Trainer::Grpo | Trainer::Rloo | Trainer::Ppo => {
            // The command's own defaults (RLOO's beta and group size, PPO's critic...).
            let cfg = match trainer {
                Trainer::Rloo => RlooConfig::load(&a.config, &a.set)?.0,
                Trainer::Ppo => PpoConfig::load(&a.config, &a.set)?.0,
                _ => GrpoConfig::load(&a.config, &a.set)?,
            };
            let (model_path, meta) = model(&cfg.args.model)?;
            let l = match grpo_lengths(&cfg, &meta.text, !a.worst_case) {
                Ok(l) => l,
                Err(e) => {
                    notes.push(format!(
                        "the dataset could not be read ({e}); planned for max_prompt_length"
                    ));
                    grpo_lengths(&cfg, &meta.text, false)?
                }
            };
            let critic = match critic_shape(&cfg, &meta) {
                Ok(c) => c,
                Err(e) => {
                    notes.push(format!(
                        "the value model could not be read ({e}); planned the critic as a copy \
                         of the policy's model"
                    ));
                    Some(CriticShape {
                        dims: ModelDims::from_config(&meta.config),
                        headless: false,
                        source_file_bytes: meta.largest_file_bytes,
                        decode_block_bytes: meta.decode_block_bytes,
                    })
                }
            };
            (
                run_shape_grpo(&cfg, &l, critic)?,
                Lengths::Grpo(l),
                model_path,
                meta,
            )
        }
        Trainer::Sft => {
            let cfg = SftConfig::load(&a.config, &a.set)?;
            let (model_path, meta) = model(&cfg.args.model)?;
            let l = match sft_lengths(&cfg, &meta.text, !a.worst_case) {
                Ok(l) => l,
                Err(e) => {
                    notes.push(format!(
                        "the dataset could not be read ({e}); planned for max_length"
                    ));
                    sft_lengths(&cfg, &meta.text, false)?
                }
            };
            (run_shape_sft(&cfg, &l)?, Lengths::Sft(l), model_path, meta)
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
                run.micro_batch,
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
        _ => {}
    }
    for n in notes {
        println!("note: {n}");
    }
    println!();
    let phase_list = |c: &rlft::plan::Component| -> String {
        use rlft::plan::Phase;
        if c.phases.len() >= 5 {
            if c.phases.contains(&Phase::Load) {
                "all".into()
            } else if c.phases.contains(&Phase::CriticLoad) {
                "from critic_load".into()
            } else {
                "all but load".into()
            }
        } else {
            c.phases
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

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn detects_the_trainer_from_keys() {
        let t = |s: &str| detect(&table(s));
        assert_eq!(
            t("num_generations = 4\ndataset = 'd'").unwrap(),
            Trainer::Grpo
        );
        assert_eq!(t("rollout_batch_size = 2").unwrap(), Trainer::Grpo);
        assert_eq!(t("max_length = 64\nuse_peft = true").unwrap(), Trainer::Sft);
        let e = t("dataset = 'd'\nlearning_rate = 1e-5").unwrap_err();
        assert!(e.to_string().contains("rlft plan grpo"), "{e}");
        let e = t("max_length = 64\nbeta = 0.1").unwrap_err();
        assert!(e.to_string().contains("beta") && e.to_string().contains("max_length"));
        // The online family: the estimator, else a critic key (ppo) or RLOO's own key.
        assert_eq!(t("advantage_estimator = 'gae'").unwrap(), Trainer::Ppo);
        assert_eq!(t("advantage_estimator = 'rloo'").unwrap(), Trainer::Rloo);
        assert_eq!(
            t("advantage_estimator = 'reinforce_baseline'\nvf_coef = 0.1").unwrap(),
            Trainer::Grpo
        );
        assert_eq!(t("kl_coef = 0.0\nvf_coef = 0.1").unwrap(), Trainer::Ppo);
        assert_eq!(t("normalize_advantages = false").unwrap(), Trainer::Rloo);
        assert_eq!(
            t("kl_coef = 0.05\nnum_generations = 4").unwrap(),
            Trainer::Grpo
        );
    }

    #[test]
    fn detects_the_example_configs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for (file, want) in [
            ("cpu.toml", Trainer::Grpo),
            ("cpu_rloo.toml", Trainer::Rloo),
            ("cpu_ppo.toml", Trainer::Ppo),
            ("cpu_reinforce_baseline.toml", Trainer::Grpo),
        ] {
            let path = root.join("examples/tiny_python_expr").join(file);
            assert_eq!(detect(&read_table(&path).unwrap()).unwrap(), want, "{file}");
        }
    }
}
