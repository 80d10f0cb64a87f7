//! What to change when a run does not fit: each lever tried on its own (from the least to the
//! most intrusive), then in pairs, each with its predicted total.

use serde::Serialize;

use super::{
    estimate, DpoReference, Environment, LoraShape, ModelDims, PlanError, RunShape, Tuning,
    Workload,
};

/// A change to the config and what it predicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suggestion {
    /// The change in words, e.g. "per_device_train_batch_size 8 -> 4 with
    /// gradient_accumulation_steps 2 -> 4 (same batch)".
    pub change: String,
    /// The same as `--set key=value` overrides.
    pub sets: Vec<String>,
    /// Predicted peak with the change.
    pub total_bytes: u64,
    /// Whether the change alters what is trained (method, objective or lengths), not only how.
    pub changes_training: bool,
}

/// One candidate setting of a lever.
struct Candidate {
    run: RunShape,
    change: String,
    sets: Vec<String>,
    changes_training: bool,
}

/// The settings of one lever, from the mildest to the strongest.
fn lever(run: &RunShape, which: usize) -> Vec<Candidate> {
    let mut out = Vec::new();
    match which {
        // Smaller micro-batches, more accumulation: the same optimiser batch.
        0 => {
            // Online DPO's key counts prompts, each of two completions.
            let per = if online_dpo(run) { 2 } else { 1 };
            let (b, a) = (run.micro_batch / per, run.accumulation);
            for d in (1..b).rev().filter(|d| b % d == 0) {
                let mut r = run.clone();
                r.micro_batch = d * per;
                r.accumulation = a * (b / d);
                out.push(Candidate {
                    change: format!(
                        "per_device_train_batch_size {b} -> {d} with \
                         gradient_accumulation_steps {a} -> {} (same batch of {})",
                        r.accumulation,
                        b * a
                    ),
                    sets: vec![
                        format!("per_device_train_batch_size={d}"),
                        format!("gradient_accumulation_steps={}", r.accumulation),
                    ],
                    run: r,
                    changes_training: false,
                });
            }
        }
        // One prompt pass per group (same log-probs and gradients, fewer tokens).
        1 => {
            if let Workload::Grpo(g) = &run.workload {
                if !g.share_prompts && !g.online_dpo {
                    let mut r = run.clone();
                    if let Workload::Grpo(g) = &mut r.workload {
                        g.share_prompts = true;
                    }
                    out.push(Candidate {
                        change: "share_prompts = true (same log-probs and gradients)".into(),
                        sets: vec!["share_prompts=true".into()],
                        run: r,
                        changes_training: false,
                    });
                }
            }
        }
        // Recompute layers in the backward instead of keeping their internals.
        2 if !run.gradient_checkpointing => {
            let mut r = run.clone();
            r.gradient_checkpointing = true;
            out.push(Candidate {
                change: "gradient_checkpointing = true (same gradients, ~1 more forward pass \
                         of compute)"
                    .into(),
                sets: vec!["gradient_checkpointing=true".into()],
                run: r,
                changes_training: false,
            });
        }
        // The other precision (bf16 halves weights but runs candle's composites on the CPU,
        // whose activations are larger; f32 the reverse).
        3 => {
            let mut r = run.clone();
            r.bf16 = !run.bf16;
            out.push(Candidate {
                change: if r.bf16 {
                    "bf16 = true (bf16 weights and activations, f32 master weights)".into()
                } else {
                    "bf16 = false (f32: the fused CPU kernels keep fewer activations)".into()
                },
                sets: vec![format!("bf16={}", r.bf16)],
                run: r,
                changes_training: false,
            });
        }
        // LoRA instead of full fine-tuning.
        4 => {
            if matches!(run.tuning, Tuning::Full) {
                let mut r = run.clone();
                r.tuning = Tuning::Lora(LoraShape {
                    r: 16,
                    modules: rlft_model::lora::LORA_MODULES.to_vec(),
                    dropout: false,
                });
                out.push(Candidate {
                    change: "use LoRA: use_peft = true (r 16 on all linear layers)".into(),
                    sets: vec![
                        "use_peft=true".into(),
                        "lora.r=16".into(),
                        "lora.target_modules=[\"all-linear\"]".into(),
                    ],
                    run: r,
                    changes_training: true,
                });
            }
        }
        // No KL term: no reference copy with full fine-tuning.
        5 => {
            if let Workload::Dpo(d) = &run.workload {
                if d.reference == DpoReference::Copy {
                    let mut r = run.clone();
                    if let Workload::Dpo(d) = &mut r.workload {
                        d.reference = DpoReference::Precomputed;
                    }
                    out.push(Candidate {
                        change: "precompute_ref_log_probs = true (the reference's log-probs \
                                 before training, no frozen copy kept)"
                            .into(),
                        sets: vec!["precompute_ref_log_probs=true".into()],
                        run: r,
                        changes_training: false,
                    });
                }
            }
            if let Workload::Grpo(g) = &run.workload {
                // Online DPO needs beta > 0.
                if g.reference && !g.online_dpo && matches!(run.tuning, Tuning::Full) {
                    let mut r = run.clone();
                    if let Workload::Grpo(g) = &mut r.workload {
                        g.reference = false;
                    }
                    out.push(Candidate {
                        change: "beta = 0 (no KL term, no reference copy)".into(),
                        sets: vec!["beta=0".into()],
                        run: r,
                        changes_training: true,
                    });
                }
            }
        }
        // Shorter sequences.
        6 => match &run.workload {
            Workload::Grpo(g) => {
                let mut c = g.completion_tokens / 2;
                while c >= 8 {
                    let mut r = run.clone();
                    if let Workload::Grpo(g) = &mut r.workload {
                        g.completion_tokens = c;
                    }
                    out.push(Candidate {
                        change: format!(
                            "{} {} -> {c}",
                            if g.online_dpo {
                                "max_new_tokens"
                            } else {
                                "max_completion_length"
                            },
                            g.completion_tokens
                        ),
                        sets: vec![if g.online_dpo {
                            format!("max_new_tokens={c}")
                        } else {
                            format!("max_completion_length={c}")
                        }],
                        run: r,
                        changes_training: true,
                    });
                    c /= 2;
                }
            }
            Workload::Sft(s) => {
                let mut t = s.example_tokens / 2;
                while t >= 16 {
                    let mut r = run.clone();
                    if let Workload::Sft(s) = &mut r.workload {
                        s.example_tokens = t;
                    }
                    out.push(Candidate {
                        change: format!(
                            "max_length {} -> {t} (longer examples truncated)",
                            s.example_tokens
                        ),
                        sets: vec![format!("max_length={t}")],
                        run: r,
                        changes_training: true,
                    });
                    t /= 2;
                }
            }
            // Shorter DPO / reward-model lengths cut or drop pairs: not tried.
            Workload::Dpo(_) | Workload::RewardModel(_) => {}
        },
        _ => {}
    }
    out
}

const LEVERS: usize = 7;

fn online_dpo(run: &RunShape) -> bool {
    matches!(&run.workload, Workload::Grpo(g) if g.online_dpo)
}

fn total(dims: &ModelDims, run: &RunShape, env: &Environment) -> Result<u64, PlanError> {
    Ok(estimate(dims, run, env)?.total_bytes)
}

/// Changes that bring the predicted peak of `run` to at most `budget_bytes`: the mildest
/// setting of each lever that fits on its own (micro-batch size, shared prompts, activation
/// checkpointing, precision, LoRA, beta, lengths, in that order), and when none does, pairs of levers. Empty when nothing
/// tried fits.
pub fn suggest(
    dims: &ModelDims,
    run: &RunShape,
    env: &Environment,
    budget_bytes: u64,
) -> Result<Vec<Suggestion>, PlanError> {
    let current = total(dims, run, env)?;
    let mut out = Vec::new();
    for l in 0..LEVERS {
        for c in lever(run, l) {
            let t = total(dims, &c.run, env)?;
            if t <= budget_bytes && t < current {
                out.push(Suggestion {
                    change: c.change,
                    sets: c.sets,
                    total_bytes: t,
                    changes_training: c.changes_training,
                });
                break;
            }
        }
    }
    if !out.is_empty() {
        return Ok(out);
    }
    // Pairs: the strongest setting of one lever, then the mildest of another that fits.
    for a in 0..LEVERS {
        let Some(first) = lever(run, a).pop() else {
            continue;
        };
        for b in (a + 1)..LEVERS {
            for c in lever(&first.run, b) {
                let t = total(dims, &c.run, env)?;
                if t <= budget_bytes {
                    let mut sets = first.sets.clone();
                    sets.extend(c.sets);
                    out.push(Suggestion {
                        change: format!("{}, and {}", first.change, c.change),
                        sets,
                        total_bytes: t,
                        changes_training: first.changes_training || c.changes_training,
                    });
                    break;
                }
            }
        }
    }
    out.sort_by_key(|s| (s.changes_training, s.total_bytes));
    out.truncate(4);
    Ok(out)
}
