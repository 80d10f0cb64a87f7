//! `rlft bench`: the standard benchmark cases, measured, never guessed, and with
//! `--against-reference` compared case by case with the PyTorch/transformers/TRL reference in
//! the repository's `bench/reference/` (`bench.py --run-case CASE`, `grpo.py`; built by its
//! `setup.sh`) in the same sitting.
//!
//! Each rlft case runs in a fresh process (this executable again, with the hidden `--run-case`
//! flag, printing one `RESULT_JSON {...}` line, as bench.py does), so its peak RSS is its own;
//! with `--against-reference` the reference's run of that case follows at once, so both see the
//! same machine state. The result is a table (or `--json`, also written by `--out`).

mod cases;
mod grpo;
mod offline;
mod reference;
mod report;
mod rounds;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Map, Value};

use crate::common::ModelArgs;
use reference::Reference;

/// Above this share of the CPUs taken by other processes (or by the hypervisor, as steal) during
/// a run, its time is suspect and a warning says so.
pub const INTERFERENCE_WARN_PCT: f64 = 5.0;

/// Benchmark cases (`all` = every case, in the order listed here).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Every case below, in this order.
    All,
    /// Batch of 8 chat prompts (~60 tokens), exactly 32 new tokens each, sampling at T=1
    /// (bench.py `generate`, its batch-8 figures).
    Generate,
    /// Forward + backward of a full fine-tune, batch 8 x 128 random tokens, loss = -mean log-prob
    /// of positions 64..127 (bench.py `fwd_bwd`).
    #[value(name = "fwd_bwd", alias = "fwd-bwd")]
    FwdBwd,
    /// The same with LoRA r=16, alpha 32 on all linear layers, base frozen (bench.py `lora`).
    Lora,
    /// One fused AdamW step over every parameter of the model, lr 1e-6, no weight decay
    /// (bench.py `adamw`, its `step_fused`).
    Adamw,
    /// The no-grad log-prob pass of a reference/old policy over the fwd_bwd batch: a GRPO step's
    /// ref phase (reference: bench.py fwd_bwd's `forward_no_grad`, when fwd_bwd ran earlier in
    /// the same sitting).
    #[value(name = "ref_pass", alias = "ref-pass")]
    RefPass,
    /// GRPO steps in the configuration of the reference's grpo.py (2 prompts x 4 generations,
    /// <= 32 new tokens, beta 0.001, full fine-tune, f32): `--reps` timed steps after one
    /// warm-up step; the reference runs grpo.py for as many steps.
    Grpo,
    /// RLOO steps (`rlft rloo`) of the same shape: 2 prompts x 4 generations, beta 0.001 in the
    /// reward (old-policy and reference passes), RLOO's sequence loss; the reference runs
    /// grpo.py --trainer rloo (TRL's RLOOTrainer) for as many steps.
    Rloo,
    /// PPO steps (`rlft ppo`): 8 prompts x 1 generation, <= 32 new tokens, one PPO epoch, beta
    /// 0.001, a critic started from the model, full fine-tune, f32. No reference (TRL removed
    /// its PPOTrainer).
    Ppo,
    /// DPO steps (`rlft dpo`): 8 conversational pairs per step, beta 0.1, sigmoid loss, a frozen
    /// reference copy scored every step, full fine-tune, f32; the reference runs offline.py
    /// (TRL's DPOTrainer) for as many steps.
    Dpo,
    /// Reward-model steps (`rlft reward-model`): the same 8 pairs per step, a new score head,
    /// full fine-tune, f32; the reference runs offline.py --trainer reward_model (TRL's
    /// RewardTrainer).
    #[value(name = "reward_model", alias = "reward-model")]
    RewardModel,
}

impl Case {
    /// Every case, in the order `all` runs them.
    pub const EVERY: [Case; 10] = [
        Case::Generate,
        Case::FwdBwd,
        Case::Lora,
        Case::Adamw,
        Case::RefPass,
        Case::Grpo,
        Case::Rloo,
        Case::Ppo,
        Case::Dpo,
        Case::RewardModel,
    ];

    /// The name on the command line and in the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Case::All => "all",
            Case::Generate => "generate",
            Case::FwdBwd => "fwd_bwd",
            Case::Lora => "lora",
            Case::Adamw => "adamw",
            Case::RefPass => "ref_pass",
            Case::Grpo => "grpo",
            Case::Rloo => "rloo",
            Case::Ppo => "ppo",
            Case::Dpo => "dpo",
            Case::RewardModel => "reward_model",
        }
    }

    /// What one timed repetition of the case is.
    pub fn what(self) -> &'static str {
        match self {
            Case::All => "every case",
            Case::Generate => "one generate call: batch 8, 32 new tokens per row",
            Case::FwdBwd => "forward + backward, batch 8 x 128, full fine-tune",
            Case::Lora => "forward + backward, batch 8 x 128, LoRA r16 all-linear",
            Case::Adamw => "one fused AdamW step over all parameters",
            Case::RefPass => "no-grad log-prob pass, batch 8 x 128",
            Case::Grpo => "one GRPO step (2 prompts x 4 generations)",
            Case::Rloo => "one RLOO step (2 prompts x 4 generations, KL in the reward)",
            Case::Ppo => "one PPO step (8 prompts x 1 generation, a critic, 1 epoch)",
            Case::Dpo => "one DPO step (8 pairs, frozen reference pass)",
            Case::RewardModel => "one reward-model step (8 pairs, score head)",
        }
    }

    /// The online trainers' step cases.
    pub fn is_online_step(self) -> bool {
        matches!(self, Case::Grpo | Case::Rloo | Case::Ppo)
    }

    /// The offline preference trainers' step cases.
    pub fn is_offline_step(self) -> bool {
        matches!(self, Case::Dpo | Case::RewardModel)
    }

    /// Cases whose repetitions are trainer steps (one warm-up step, then `--reps` timed).
    pub fn is_step(self) -> bool {
        self.is_online_step() || self.is_offline_step()
    }
}

/// `rlft bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Cases to run, in the order given (none or `all`: generate fwd_bwd lora adamw ref_pass
    /// grpo rloo ppo dpo reward_model). Each runs in a fresh process, so its peak RSS is its own.
    #[arg(value_enum)]
    pub cases: Vec<Case>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// generate: prompts per batch (the reference has batch 8 and 1).
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// generate: new tokens per sequence (end-of-sequence is ignored so every row makes exactly
    /// this many; the reference makes 32).
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Timed repetitions per case (grpo, rloo, ppo: timed steps after one warm-up step); passed
    /// to the reference too.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Untimed warm-up repetitions per case (not grpo, rloo and ppo, which always warm up with
    /// one step); passed to the reference too.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Rounds per case: rlft then the reference, repeated, each a fresh process with `--reps`
    /// timed repetitions; each side's repetitions of all rounds are pooled. On a shared machine
    /// whose speed drifts over minutes this keeps a slow spell from landing on one side only.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// After each rlft case, run the reference's same case (bench.py --run-case CASE, or
    /// grpo.py) and report its median, its peak RSS and the ratio rlft time / reference time
    /// (below 1: rlft is faster). Without the reference venv, says how to build it and runs
    /// rlft's cases alone.
    #[arg(long)]
    pub against_reference: bool,
    /// Directory of the reference scripts (default: `bench/reference` of the repository, looked
    /// up from the current directory, then from the executable's `target/<profile>/`).
    #[arg(long)]
    pub reference_dir: Option<PathBuf>,
    /// Python of the reference venv (default: `~/.cache/rlft/reference/venv/bin/python`, under
    /// `$RLFT_CACHE` when set, where `bash bench/reference/setup.sh` builds it).
    #[arg(long)]
    pub reference_python: Option<String>,
    /// HF directory of the model the reference loads (default: the float32 copy of --model that
    /// `bash bench/reference/setup.sh [MODEL]` dequantises from its GGUF,
    /// `~/.cache/rlft/reference/<name>-hf`: `smollm2-135m-instruct-hf` for the default model,
    /// `qwen2.5-coder-0.5b-instruct-hf` for `qwen2.5-coder-0.5b`, `<file stem>-hf` for a GGUF
    /// path; an HF directory --model itself).
    #[arg(long)]
    pub reference_model: Option<String>,
    /// Print the whole result as JSON (per case: rlft and reference stats, ratio, warnings;
    /// machine: threads, CPU model, git commit, date) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON result to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// grpo, rloo, ppo, dpo, reward_model: override a key of the case's config, as `rlft grpo --set` takes it
    /// (repeatable), e.g. `--grpo-set gradient_checkpointing=true`. The reference keeps its
    /// configuration, so ratios then compare different settings.
    #[arg(long = "grpo-set")]
    pub grpo_set: Vec<String>,
    /// Internal: run one case in this process and print `RESULT_JSON {...}`.
    #[arg(long, value_enum, hide = true)]
    pub run_case: Option<Case>,
}

/// Expands `~/` at the start of a path.
pub fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(h)) => PathBuf::from(h).join(rest),
        _ => PathBuf::from(p),
    }
}

/// The cases to run: as given, duplicates dropped; none or `all` = every case.
fn selected(cases: &[Case]) -> Vec<Case> {
    if cases.is_empty() || cases.contains(&Case::All) {
        return Case::EVERY.to_vec();
    }
    let mut out = Vec::new();
    for &c in cases {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Runs `rlft bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(case) = a.run_case {
        return cases::run_case(case, &a);
    }
    let cases = selected(&a.cases);
    let model_path = crate::models::resolve(&a.model.model)?;
    let reference = if a.against_reference {
        match Reference::locate(&a) {
            Ok(r) => Some(r),
            Err(msg) => {
                eprintln!("warning: {msg}; running rlft's cases only");
                None
            }
        }
    } else {
        None
    };
    let mut warnings: Vec<String> = Vec::new();
    if let Some(r) = reference
        .as_ref()
        .filter(|r| r.model_given() && !crate::models::is_default(&a.model.model))
    {
        warnings.push(format!(
            "the reference loads --reference-model {}, not a conversion of {} made by \
             bench/reference/setup.sh: ratios compare the same model only if it is one",
            r.model().display(),
            a.model.model
        ));
    }
    let mut results = Map::new();
    let mut failed = Vec::new();
    for case in cases.iter().copied() {
        let (mut ours_rounds, mut theirs_rounds) = (Vec::new(), Vec::new());
        for round in 1..=a.rounds {
            let of = if a.rounds > 1 {
                format!(" (round {round} of {})", a.rounds)
            } else {
                String::new()
            };
            eprintln!("== {}: rlft{of}", case.name());
            let ours = match run_child(case, &a, &model_path) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("error: rlft bench {}: {e:#}", case.name());
                    json!({"error": format!("{e:#}")})
                }
            };
            let failed_round = ours.get("error").is_some();
            ours_rounds.push(ours);
            // ref_pass has no reference run of its own (its figure is fwd_bwd's, already
            // pooled over fwd_bwd's rounds): look it up once.
            if case != Case::RefPass || round == 1 {
                theirs_rounds.push(match &reference {
                    Some(r) => r.run_case(case, &a, &results),
                    None => report::RefOutcome {
                        summary: None,
                        note: None,
                        failed: false,
                    },
                });
            }
            if failed_round {
                break;
            }
        }
        let ours = rounds::merge_ours(ours_rounds);
        if ours.get("error").is_some() {
            failed.push(case.name());
        }
        let theirs = rounds::merge_reference(theirs_rounds);
        let entry = report::case_entry(case, ours, theirs, a.against_reference);
        for w in entry["warnings"].as_array().into_iter().flatten() {
            eprintln!(
                "warning: {}: {}",
                case.name(),
                w.as_str().unwrap_or_default()
            );
        }
        results.insert(case.name().into(), entry);
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let result = json!({
        "machine": report::machine_info(),
        "settings": {
            "cases": cases.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "reps": a.reps,
            "warmup": a.warmup,
            "rounds": a.rounds,
            "model": a.model.model,
            "model_path": model_path,
            "dtype": a.model.dtype,
            "device": a.model.device,
            "against_reference": a.against_reference,
            "reference": reference.as_ref().map(Reference::describe),
        },
        "ratio": report::RATIO_DEFINITION,
        "cases": results,
        "warnings": warnings,
    });
    let text = serde_json::to_string_pretty(&result)?;
    if let Some(out) = &a.out {
        std::fs::write(out, format!("{text}\n"))
            .with_context(|| format!("write {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if a.json {
        println!("{text}");
    } else {
        report::print_table(&result);
    }
    if !failed.is_empty() {
        bail!("{} case(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// Runs one rlft case in a fresh process of this executable and parses its result line.
fn run_child(case: Case, a: &BenchArgs, model: &std::path::Path) -> Result<Value> {
    let exe = std::env::current_exe().context("locate the rlft executable")?;
    let out = Command::new(exe)
        .arg("bench")
        .args(["--run-case", case.name()])
        .arg("--model")
        .arg(model)
        .args(["--dtype", &a.model.dtype, "--device", &a.model.device])
        .args([
            "--reps",
            &a.reps.to_string(),
            "--warmup",
            &a.warmup.to_string(),
        ])
        .args(["--batch", &a.batch.to_string()])
        .args(["--new-tokens", &a.new_tokens.to_string()])
        .args(a.grpo_set.iter().flat_map(|s| ["--grpo-set", s.as_str()]))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("run the case's process")?;
    if !out.status.success() {
        bail!(
            "its process failed ({}); see the messages above",
            out.status
        );
    }
    result_line(&String::from_utf8_lossy(&out.stdout)).context("no RESULT_JSON line in its output")
}

/// The JSON of the last `RESULT_JSON {...}` line of a case's output.
pub fn result_line(stdout: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT_JSON "))
        .and_then(|l| serde_json::from_str(l).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_keeps_order_and_expands_all() {
        assert_eq!(selected(&[]), Case::EVERY.to_vec());
        assert_eq!(selected(&[Case::Lora, Case::All]), Case::EVERY.to_vec());
        assert_eq!(
            selected(&[Case::Lora, Case::FwdBwd, Case::Lora]),
            vec![Case::Lora, Case::FwdBwd]
        );
    }

    #[test]
    fn parses_the_last_result_line() {
        let out = "noise\nRESULT_JSON {\"a\": 1}\nmore\nRESULT_JSON {\"a\": 2}\n";
        assert_eq!(result_line(out).unwrap()["a"], 2);
        assert!(result_line("nothing").is_none());
    }
}
