//! Each trainer's declaration to the memory plan: the models it holds and the passes of one
//! micro-batch, as an [`rlft_plan::Run`], and the config keys that lower its memory (the
//! levers [`rlft_plan::suggest`] tries). The lengths and model shapes come from
//! [`crate::plan_inputs`].

use std::path::Path;

use rlft_plan::{
    Change, Critic, Generation, LoraShape, MicroBatch, Model, OptimizerState, Reference,
    RewardScorer, Run, Tuning,
};
use rlft_text::TextBundle;

use crate::config::dpo::DpoConfig;
use crate::config::online::{OnlineConfig, PpoConfig, RlooConfig};
use crate::config::online_dpo::OnlineDpoConfig;
use crate::config::reward::RewardConfig;
use crate::config::sft::SftConfig;
use crate::config::{ConfigError, Optim, TrainerConfig, TrainingArgs};
use crate::plan_inputs::{self, Lengths, ModelReward, PlanInputError, EVAL_BATCH};
use crate::trainers::Trainer;

/// A config loaded with its command's defaults, as the plan reads it.
#[derive(Debug, Clone)]
pub enum PlanConfig {
    /// GRPO, RLOO, PPO; Online DPO as its online view (`odpo`).
    Online {
        /// The online config (boxed: it is much larger than the other configs).
        cfg: Box<OnlineConfig>,
        /// Online DPO (its keys count prompts and name `max_new_tokens`).
        odpo: bool,
    },
    /// SFT.
    Sft(SftConfig),
    /// DPO.
    Dpo(DpoConfig),
    /// The reward model.
    RewardModel(RewardConfig),
}

/// The models a run holds besides what its config says: the policy, PPO's critic, reward
/// models as rewards.
#[derive(Debug, Clone)]
pub struct Models {
    /// The trained model.
    pub policy: Model,
    /// PPO's value model.
    pub critic: Option<Model>,
    /// `[[rewards]] type = "model"`.
    pub rewards: Vec<ModelReward>,
}

impl PlanConfig {
    /// Loads `path` with `sets` for `trainer` (its command's defaults).
    pub fn load(trainer: Trainer, path: &Path, sets: &[String]) -> Result<Self, ConfigError> {
        let online = |cfg| PlanConfig::Online {
            cfg: Box::new(cfg),
            odpo: false,
        };
        Ok(match trainer {
            Trainer::Grpo => online(OnlineConfig::load(path, sets)?),
            Trainer::Rloo => online(RlooConfig::load(path, sets)?.0),
            Trainer::Ppo => online(PpoConfig::load(path, sets)?.0),
            Trainer::OnlineDpo => PlanConfig::Online {
                cfg: Box::new(OnlineDpoConfig::load(path, sets)?.online()),
                odpo: true,
            },
            Trainer::Sft => PlanConfig::Sft(SftConfig::load(path, sets)?),
            Trainer::Dpo => PlanConfig::Dpo(DpoConfig::load(path, sets)?),
            Trainer::RewardModel => PlanConfig::RewardModel(RewardConfig::load(path, sets)?),
        })
    }

    /// The shared settings.
    pub fn args(&self) -> &TrainingArgs {
        match self {
            PlanConfig::Online { cfg, .. } => &cfg.args,
            PlanConfig::Sft(c) => &c.args,
            PlanConfig::Dpo(c) => &c.args,
            PlanConfig::RewardModel(c) => &c.args,
        }
    }

    /// The lengths the run will see: the dataset's (`read_data`), else the config's limits.
    pub fn lengths(&self, text: &TextBundle, read_data: bool) -> Result<Lengths, PlanInputError> {
        Ok(match self {
            PlanConfig::Online { cfg, .. } => {
                Lengths::Grpo(plan_inputs::grpo_lengths(cfg, text, read_data)?)
            }
            PlanConfig::Sft(c) => Lengths::Sft(plan_inputs::sft_lengths(c, text, read_data)?),
            PlanConfig::Dpo(c) => Lengths::Dpo(plan_inputs::dpo_lengths(c, text, read_data)?),
            PlanConfig::RewardModel(c) => {
                Lengths::RewardModel(plan_inputs::reward_model_lengths(c, text, read_data)?)
            }
        })
    }

    /// The run the trainer declares for these lengths and models.
    pub fn run(&self, lengths: &Lengths, models: &Models) -> Result<Run, PlanInputError> {
        let a = self.args();
        let tuning = if a.use_peft {
            Tuning::Lora(LoraShape {
                r: a.lora.r,
                modules: rlft_model::lora::resolve_targets(&a.lora.target_modules)?,
                dropout: a.lora.lora_dropout > 0.0,
            })
        } else {
            Tuning::Full
        };
        let full = !a.use_peft;
        let b = a.per_device_train_batch_size;
        let mut run = Run {
            bf16: a.bf16,
            optimizer_state: match a.optim {
                Optim::AdamWF32Master => OptimizerState::F32Master,
                Optim::AdamWExact => OptimizerState::SplitMaster,
                Optim::AdamWTorch => OptimizerState::Bf16Moments,
            },
            unit: "pairs",
            accumulation: a.gradient_accumulation_steps,
            gradient_checkpointing: a.gradient_checkpointing,
            ..Run::new(
                models.policy.clone(),
                tuning,
                b,
                MicroBatch::plain("rows", b, 1, b),
            )
        };
        match (self, lengths) {
            (PlanConfig::Online { cfg, .. }, Lengths::Grpo(l)) => online(&mut run, cfg, l, models),
            (PlanConfig::Sft(c), Lengths::Sft(l)) => {
                // A micro-batch feeds every token but the last of its longest example.
                let t = l
                    .example_tokens
                    .min(c.max_length.max(2))
                    .saturating_sub(1)
                    .max(1);
                run.update = MicroBatch::plain("example rows", b, t, b * t);
                run.scored = l.eval.then(|| "eval loss".into());
                run.unit = "examples";
            }
            (PlanConfig::Dpo(c), Lengths::Dpo(l)) => {
                // `dpo::pair_logps`: each pair's prompt once (twice when `keep_end` left the
                // sides different prompts), chosen and rejected attending to it.
                run.update = MicroBatch::shared(
                    b * l.prompts_per_pair.max(1),
                    l.prompt_tokens,
                    2 * b,
                    l.completion_tokens,
                );
                let (copy, detail) = match (c.precompute_ref_log_probs, full) {
                    (true, _) => (false, "precompute_ref_log_probs: log-probs computed before training, no model kept (a full fine-tuning copy is freed before the optimizer exists)"),
                    (false, true) => (true, "full fine-tuning: a frozen copy of the starting weights, kept"),
                    (false, false) => (false, "LoRA: the base with adapters off, no copy"),
                };
                run.reference = Some(Reference {
                    copy,
                    detail: detail.into(),
                });
                run.scored = Some(match (c.precompute_ref_log_probs, l.eval) {
                    (true, false) => "reference log-probs (precomputed)".into(),
                    (true, true) => "reference log-probs (precomputed), eval".into(),
                    _ => "reference log-probs".into(),
                });
            }
            (PlanConfig::RewardModel(_), Lengths::RewardModel(l)) => {
                // Chosen and rejected as plain rows; the score head reads one row each, and
                // the trainer drops an untied LM head at load.
                run.update =
                    MicroBatch::plain("chosen + rejected rows", 2 * b, l.sequence_tokens, 2 * b);
                run.policy.score_head = true;
                run.policy.headless = true;
                run.scored = l.eval.then(|| "eval scores".into());
            }
            _ => {
                return Err(PlanInputError::Invalid(
                    "the lengths are of another trainer".into(),
                ))
            }
        }
        Ok(run)
    }

    /// The levers that lower the memory, in a fixed order (each may be empty): a smaller
    /// micro-batch with more accumulation, shared prompts, activation checkpointing, the other
    /// precision, AdamW's state of bf16 weights, LoRA, no reference copy, shorter sequences; each
    /// lever's settings from the
    /// mildest to the strongest.
    pub fn levers(&self, lengths: &Lengths) -> Vec<Vec<Change>> {
        let a = self.args();
        let odpo = matches!(self, PlanConfig::Online { odpo: true, .. });
        let keep = |change: String, sets: Vec<String>| Change {
            change,
            sets,
            changes_training: false,
        };
        let alter = |change: String, sets: Vec<String>| Change {
            change,
            sets,
            changes_training: true,
        };
        // Online DPO's key counts prompts, each of two completions (its online view's rows).
        let b = a.per_device_train_batch_size / if odpo { 2 } else { 1 };
        let acc = a.gradient_accumulation_steps;
        let micro = (1..b)
            .rev()
            .filter(|d| b.is_multiple_of(*d))
            .map(|d| {
                let acc2 = acc * (b / d);
                let change = format!("per_device_train_batch_size {b} -> {d} with gradient_accumulation_steps {acc} -> {acc2} (same batch of {})", b * acc);
                keep(change, vec![format!("per_device_train_batch_size={d}"), format!("gradient_accumulation_steps={acc2}")])
            })
            .collect();
        let mut share = Vec::new();
        let mut reference = Vec::new();
        let mut shorter = Vec::new();
        match (self, lengths) {
            (PlanConfig::Online { cfg, .. }, _) => {
                if !cfg.share_prompts && !odpo {
                    share.push(keep(
                        "share_prompts = true (same log-probs and gradients)".into(),
                        vec!["share_prompts=true".into()],
                    ));
                }
                // Online DPO needs beta > 0.
                if cfg.beta > 0.0 && !odpo && !a.use_peft {
                    reference.push(alter(
                        "beta = 0 (no KL term, no reference copy)".into(),
                        vec!["beta=0".into()],
                    ));
                }
                let key = if odpo {
                    "max_new_tokens"
                } else {
                    "max_completion_length"
                };
                let mut c = cfg.max_completion_length / 2;
                while c >= 8 {
                    shorter.push(alter(
                        format!("{key} {} -> {c}", cfg.max_completion_length),
                        vec![format!("{key}={c}")],
                    ));
                    c /= 2;
                }
            }
            (PlanConfig::Dpo(c), _) if !c.precompute_ref_log_probs && !a.use_peft => {
                let change = "precompute_ref_log_probs = true (the reference's log-probs before training, no frozen copy kept)";
                reference.push(keep(
                    change.into(),
                    vec!["precompute_ref_log_probs=true".into()],
                ));
            }
            (PlanConfig::Sft(c), Lengths::Sft(l)) => {
                let now = l.example_tokens.min(c.max_length.max(2));
                let mut t = now / 2;
                while t >= 16 {
                    shorter.push(alter(
                        format!("max_length {now} -> {t} (longer examples truncated)"),
                        vec![format!("max_length={t}")],
                    ));
                    t /= 2;
                }
            }
            // Shorter DPO / reward-model lengths cut or drop pairs: not tried.
            _ => {}
        }
        let checkpointing = if a.gradient_checkpointing {
            Vec::new()
        } else {
            vec![keep(
                "gradient_checkpointing = true (same gradients, ~1 more forward pass of compute)"
                    .into(),
                vec!["gradient_checkpointing=true".into()],
            )]
        };
        let precision = keep(
            if a.bf16 {
                "bf16 = false (f32: the fused CPU kernels keep fewer activations)"
            } else {
                "bf16 = true (bf16 weights and activations, f32 master weights)"
            }
            .into(),
            vec![format!("bf16={}", !a.bf16)],
        );
        let mut state = Vec::new();
        if a.bf16 && !a.use_peft && a.optim == Optim::AdamWF32Master {
            state.push(keep(
                "optim = \"adamw_exact\" (the same AdamW values, 2 bytes less per parameter; CPU only)".into(),
                vec!["optim=adamw_exact".into()],
            ));
        }
        if a.bf16 && !a.use_peft && a.optim != Optim::AdamWTorch {
            state.push(alter(
                "optim = \"adamw_torch\" (PyTorch's AdamW: bf16 moments, no master weights)".into(),
                vec!["optim=adamw_torch".into()],
            ));
        }
        let lora = if a.use_peft {
            Vec::new()
        } else {
            let sets = [
                "use_peft=true",
                "lora.r=16",
                "lora.target_modules=[\"all-linear\"]",
            ];
            vec![alter(
                "use LoRA: use_peft = true (r 16 on all linear layers)".into(),
                sets.map(String::from).to_vec(),
            )]
        };
        vec![
            micro,
            share,
            checkpointing,
            vec![precision],
            state,
            lora,
            reference,
            shorter,
        ]
    }
}

/// The online family's declaration (`online::setup`): rollouts of `G` completions per prompt
/// (eval generation of up to [`EVAL_BATCH`] prompts), a micro-batch of completions in shared
/// prompt passes or as plain rows, reference and old-policy passes, PPO's critic over plain
/// rows, reward models scoring each rollout.
fn online(run: &mut Run, cfg: &OnlineConfig, l: &plan_inputs::GrpoLengths, models: &Models) {
    let plan = cfg.plan(1);
    let passes = crate::online::setup::passes(cfg, &plan);
    let (b, g) = (run.micro_batch, cfg.num_generations.max(1));
    let (p, c) = (l.prompt_tokens, cfg.max_completion_length);
    run.unit = "completions";
    run.generation = Some(Generation {
        prompts: plan.rollout_prompts,
        per_prompt: cfg.num_generations,
        prompt_tokens: p,
        new_tokens: c,
    });
    run.eval_generation = l.eval.map(|e| Generation {
        prompts: e.prompts.min(EVAL_BATCH),
        per_prompt: 1,
        prompt_tokens: e.prompt_tokens,
        new_tokens: c,
    });
    run.update = if cfg.share_prompts {
        MicroBatch::shared(
            prompts_per_micro_batch(b, g, plan.rollout_completions),
            p,
            b,
            c,
        )
    } else {
        MicroBatch::plain("prompt + completion rows", b, p + c - 1, b * c)
    };
    run.update.temperature_scaled = cfg.rollout.temperature != 1.0;
    let detail = match (passes.reference, run.tuning == Tuning::Full) {
        (true, true) => "beta > 0 with full fine-tuning: the initial weights, kept",
        (true, false) => "LoRA: the base with adapters off, no copy",
        (false, _) => "beta = 0: none",
    };
    run.reference = Some(Reference {
        copy: passes.reference && run.tuning == Tuning::Full,
        detail: detail.into(),
    });
    run.scored = (passes.reference || passes.old).then(|| "reference/old log-probs".into());
    run.critic = models.critic.clone().map(|model| Critic {
        model,
        update: MicroBatch::plain(
            "critic: prompt + completion rows",
            b,
            p + c.max(1) - 1,
            b * c,
        ),
    });
    run.reward_models = models
        .rewards
        .iter()
        .map(|r| RewardScorer {
            name: r.name.clone(),
            model: r.model.clone(),
            rows: r.batch_size.max(1).min(plan.rollout_completions.max(1)),
            tokens: if r.max_length > 0 {
                (p + c).min(r.max_length)
            } else {
                p + c
            }
            .max(1),
        })
        .collect();
}

/// Distinct prompts in the worst micro-batch of `b` completions of a rollout of `n`, in
/// contiguous groups of `g` (micro-batches are consecutive runs).
pub fn prompts_per_micro_batch(b: usize, g: usize, n: usize) -> usize {
    let b = b.max(1);
    (0..n.max(b))
        .step_by(b)
        .map(|s| (s + b - 1) / g - s / g + 1)
        .max()
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::online_dpo::OnlineDpoConfig;
    use crate::plan_inputs::{model_dims, DpoLengths, LengthSource};

    fn tiny_model() -> Model {
        let c = rlft_model::tiny::tiny_config(rlft_model::Family::Qwen2);
        Model {
            dims: model_dims(&c),
            score_head: false,
            headless: false,
            source_file_bytes: 0,
            decode_block_bytes: 0,
            frozen_blocks: (0, 0),
        }
    }

    #[test]
    fn dims_count_every_familys_parameters() {
        for fam in [
            rlft_model::Family::Llama,
            rlft_model::Family::Qwen2,
            rlft_model::Family::Qwen3,
        ] {
            let c = rlft_model::tiny::tiny_config(fam);
            assert_eq!(
                model_dims(&c).num_parameters(),
                c.num_parameters(),
                "{fam:?}"
            );
        }
    }

    #[test]
    fn prompts_per_micro_batch_of_contiguous_groups() {
        // Groups of 4 in micro-batches of 6: [0, 6) spans prompts 0-1, [6, 12) prompts 1-2.
        assert_eq!(prompts_per_micro_batch(6, 4, 12), 2);
        assert_eq!(prompts_per_micro_batch(4, 4, 12), 1);
        assert_eq!(prompts_per_micro_batch(12, 4, 12), 3);
    }

    #[test]
    fn dpo_declares_its_pairs_reference_and_keys() {
        let dpo = |extra: &str| {
            let t = format!("dataset = \"d\"\nper_device_train_batch_size = 2\n{extra}");
            PlanConfig::Dpo(DpoConfig::from_table(t.parse().unwrap(), "t.toml").unwrap())
        };
        let l = Lengths::Dpo(DpoLengths {
            prompt_tokens: 10,
            completion_tokens: 5,
            prompts_per_pair: 1,
            eval: false,
            source: LengthSource::Dataset,
        });
        let models = Models {
            policy: tiny_model(),
            critic: None,
            rewards: Vec::new(),
        };
        // Full fine-tuning: a frozen copy, which precomputing the log-probs spares (keeping
        // the training); never beta = 0.
        let full = dpo("use_peft = false");
        let run = full.run(&l, &models).unwrap();
        assert!(run.reference.as_ref().unwrap().copy);
        // 2 prompt rows of 10; 4 completions of 4 inputs over 14 keys; the head over 4 x 5.
        let shapes: Vec<_> = run
            .update
            .passes
            .iter()
            .map(|p| (p.rows, p.tokens, p.keys))
            .collect();
        assert_eq!(
            (shapes, run.update.head_rows),
            (vec![(2, 10, 10), (4, 4, 14)], 20)
        );
        let levers = full.levers(&l);
        assert_eq!(levers[6][0].sets, ["precompute_ref_log_probs=true"]);
        assert!(!levers[6][0].changes_training);
        // AdamW's state is a lever of bf16 weights only: the split master keeps the training.
        assert!(levers[4].is_empty());
        let bf16 = dpo("use_peft = false\nbf16 = true").levers(&l);
        let state: Vec<_> = bf16[4]
            .iter()
            .map(|c| (c.sets[0].as_str(), c.changes_training))
            .collect();
        assert_eq!(
            state,
            [("optim=adamw_exact", false), ("optim=adamw_torch", true)]
        );
        assert!(levers
            .iter()
            .flatten()
            .all(|c| c.sets.iter().all(|s| !s.starts_with("beta"))));
        let pre = dpo("use_peft = false\nprecompute_ref_log_probs = true")
            .run(&l, &models)
            .unwrap();
        assert!(!pre.reference.unwrap().copy);
        // LoRA: the base with adapters off.
        assert!(
            !dpo("use_peft = true")
                .run(&l, &models)
                .unwrap()
                .reference
                .unwrap()
                .copy
        );
    }

    #[test]
    fn online_dpo_levers_count_prompts_and_name_its_keys() {
        let t = "per_device_train_batch_size = 4\ndataset = \"d.jsonl\"\n[[rewards]]\ntype = \"boxed_accuracy\"\n";
        let o = OnlineDpoConfig::from_table(t.parse().unwrap(), "t.toml").unwrap();
        let cfg = PlanConfig::Online {
            cfg: Box::new(o.online()),
            odpo: true,
        };
        let l = Lengths::Sft(crate::plan_inputs::SftLengths {
            example_tokens: 2,
            eval: false,
            source: LengthSource::Config,
        });
        let levers = cfg.levers(&l);
        // 4 prompts (8 completions) -> 2 prompts x 2 accumulation.
        assert_eq!(
            levers[0][0].sets,
            [
                "per_device_train_batch_size=2",
                "gradient_accumulation_steps=2"
            ]
        );
        let all: Vec<&String> = levers.iter().flatten().flat_map(|c| &c.sets).collect();
        assert!(all.iter().any(|k| k.starts_with("max_new_tokens")));
        assert!(all.iter().all(|k| !k.starts_with("beta")
            && !k.starts_with("share_prompts")
            && !k.starts_with("max_completion_length")));
    }
}
