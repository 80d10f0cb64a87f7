//! The estimate: the run's components, each alive in some phases, and each phase's RSS from the
//! heap's high-water mark (see the module docs of [`super`]). The policy's own parts are in
//! [`super::policy`], the run's working buffers in [`super::buffers`].

use super::activations::{Activations, Sized};
use super::{
    buffers, critic, policy, preference, reward, Component, Environment, ModelDims, Phase,
    PhaseTotal, Plan, PlanError, RunShape, Tuning, Workload, AFTER_LOAD, ALL, HEAP_REUSE_FACTOR,
};

/// What every part of the estimate reads: the model, the run, and the sizes they share.
pub(super) struct Derived<'a> {
    /// The model.
    pub(super) dims: &'a ModelDims,
    /// The run.
    pub(super) run: &'a RunShape,
    /// Bytes per weight `w`: 4 (f32) or 2 (bf16).
    pub(super) w: u64,
    /// `rlft reward-model`: the backbone without LM head, a `[1, hidden]` score head.
    pub(super) reward_model: bool,
    /// Elements of every weight tensor ([`preference::model_tensors`]).
    pub(super) weight_elems: Vec<u64>,
    /// Elements of every trainable tensor.
    pub(super) trainable_elems: Vec<u64>,
    /// Parameters `P`.
    pub(super) p: usize,
    /// Trainable parameters `T`.
    pub(super) t: usize,
    /// Full fine-tuning (else LoRA).
    pub(super) full: bool,
    /// `"bf16"` or `"f32"`.
    pub(super) dtype: &'static str,
    /// The policy weights: `P x w`.
    pub(super) weights: Sized,
    /// One f32 buffer per trainable tensor, `T x 4` (AdamW's m or v, the master copy, the
    /// accumulated gradients).
    pub(super) f32_state: Sized,
}

impl<'a> Derived<'a> {
    /// The sizes of `run` on a model of `dims`.
    fn new(dims: &'a ModelDims, run: &'a RunShape) -> Self {
        let w = run.weight_bytes();
        let reward_model = matches!(run.workload, Workload::RewardModel(_));
        let (weight_elems, trainable_elems) =
            preference::model_tensors(dims, &run.tuning, reward_model);
        let p = weight_elems.iter().sum::<u64>() as usize;
        let t = trainable_elems.iter().sum::<u64>() as usize;
        let weights = tensors(&weight_elems, w);
        let f32_state = tensors(&trainable_elems, 4);
        Derived {
            dims,
            run,
            w,
            reward_model,
            weight_elems,
            trainable_elems,
            p,
            t,
            full: matches!(run.tuning, Tuning::Full),
            dtype: if run.bf16 { "bf16" } else { "f32" },
            weights,
            f32_state,
        }
    }
}

/// The components, in the order the plan lists them.
#[derive(Default)]
pub(super) struct Parts(pub(super) Vec<Component>);

impl Parts {
    /// Adds the component `key` of `size`, alive in `phases`.
    pub(super) fn add(
        &mut self,
        key: &'static str,
        name: String,
        size: Sized,
        detail: String,
        phases: &[Phase],
    ) {
        self.0.push(Component {
            key,
            name,
            bytes: size.bytes,
            fresh_bytes: size.fresh_bytes,
            detail,
            phases: phases.to_vec(),
        })
    }
}

/// Tensors of `elems` elements at `bytes` each.
pub(super) fn tensors(elems: &[u64], bytes: u64) -> Sized {
    Sized::of(elems.iter().map(|e| e * bytes))
}

/// Predicts the peak RSS of `run` on a model of `dims` (see the module docs).
///
/// `P` = parameters, `T` = trainable parameters, `w` = 4 (f32) or 2 (bf16) bytes:
/// - weights `P x w`; LoRA adapters `T x 4` (f32 whatever the base);
/// - f32 loads of a GGUF file: the frozen weights' blocks for decoding (GRPO with LoRA: all
///   phases; otherwise while loading);
/// - AdamW `2 x T x 4`; bf16 full fine-tuning also an f32 master copy `T x 4`;
/// - gradients `T x w` (a micro-batch's) + `T x 4` (the accumulated sums, f32); with one
///   micro-batch of f32 gradients only `T x 4` (they become the sums);
/// - GRPO full fine-tuning with `beta > 0`: a reference copy `P x w` (the trainer keeps it when
///   `grpo::setup::passes` says so);
/// - LoRA export (and bf16 rollout/eval): the merged copy of the adapted weights;
/// - PPO's critic: its weights, trainable parameters, AdamW state, gradients, value pass,
///   activations, checkpoint and export buffers ([`critic::components`]);
/// - DPO: a reference copy `P x w` with full fine-tuning (not with
///   `precompute_ref_log_probs`), micro-batches of pairs sharing each prompt pass
///   ([`preference::dpo_passes`]); the reward model: no LM head, a `[1, hidden]` score head
///   ([`preference::model_tensors`], [`preference::reward_model_passes`]);
/// - `[[rewards]] type = "model"`: the reward models' weights and scoring pass
///   ([`reward::components`]);
/// - rollout KV caches: `prompts x G x L x 2 x kv_heads x head_dim x (prompt + completion) x
///   4` (f32) or x 2 (bf16), see [`generation`](super::generation);
/// - activations: [`activations::activations`](super::activations::activations).
///
/// Each phase's RSS is the heap's high-water mark plus the phase's buffers of at least
/// [`MMAP_THRESHOLD`](super::MMAP_THRESHOLD) bytes; the peak is the largest.
pub fn estimate(dims: &ModelDims, run: &RunShape, env: &Environment) -> Result<Plan, PlanError> {
    validate(dims, run)?;
    let d = Derived::new(dims, run);
    let mut c = Parts::default();
    policy::weights(&mut c, &d, env);
    policy::trainable(&mut c, &d);
    policy::optimizer(&mut c, &d);
    policy::reference(&mut c, &d);
    buffers::rollout(&mut c, &d);
    let (acts, scored) = buffers::passes(&mut c, &d);
    buffers::saving(&mut c, &d);
    let (reward_models, critic_activations) = scorers(&mut c, &d, &acts);
    let present = present_phases(
        &run.workload,
        critic_activations.is_some(),
        reward_models,
        scored,
    );
    let (phases, heap_high_water) = phase_totals(&c.0, &present);
    let peak = phases
        .iter()
        .copied()
        .max_by_key(|x| (x.rss_bytes, x.live_bytes, std::cmp::Reverse(x.phase)))
        .expect("load and update are always present");
    Ok(Plan {
        components: c.0,
        phases,
        heap_high_water_bytes: heap_high_water,
        peak_phase: peak.phase,
        total_bytes: peak.rss_bytes,
        activations: acts,
        critic_activations,
        parameters: d.p,
        trainable_parameters: d.t,
    })
}

/// Rejects runs without a micro-batch or a step, and models with a zero dimension.
fn validate(dims: &ModelDims, run: &RunShape) -> Result<(), PlanError> {
    if run.micro_batch == 0 || run.accumulation == 0 {
        return Err(PlanError::Invalid(
            "per_device_train_batch_size and gradient_accumulation_steps must be >= 1".into(),
        ));
    }
    if dims.layers == 0 || dims.hidden == 0 || dims.vocab == 0 || dims.kv_heads == 0 {
        return Err(PlanError::Invalid(format!(
            "the model config has a zero dimension: {dims:?}"
        )));
    }
    Ok(())
}

/// GRPO's scorers besides the rewards: `[[rewards]] type = "model"` reward models
/// ([`reward::components`]), then PPO's critic ([`critic::components`], beside the policy's
/// activations `acts`). Returns whether there are reward models, and the critic's activations.
fn scorers(c: &mut Parts, d: &Derived, acts: &Activations) -> (bool, Option<Activations>) {
    let run = d.run;
    let critic = match &run.workload {
        Workload::Grpo(g) => g
            .critic
            .as_ref()
            .map(|k| critic::components(k, run, g, acts)),
        _ => None,
    };
    let reward_models = match &run.workload {
        Workload::Grpo(g) if !g.reward_models.is_empty() => {
            c.0.extend(reward::components(
                &g.reward_models,
                run,
                g.rollout_completions,
            ));
            true
        }
        _ => false,
    };
    let critic_activations = critic.map(|(parts, a)| {
        c.0.extend(parts);
        a
    });
    (reward_models, critic_activations)
}

/// The phases a run has, in order: PPO's with a `critic`, eval generation with GRPO eval
/// prompts, generation with GRPO, reward scoring with `reward_models`, a no-grad pass when
/// something is `scored`; load, update, checkpoint and export always.
fn present_phases(
    workload: &Workload,
    critic: bool,
    reward_models: bool,
    scored: Option<&str>,
) -> Vec<Phase> {
    ALL.into_iter()
        .filter(|ph| match ph {
            Phase::CriticLoad | Phase::Values | Phase::CriticExport => critic,
            Phase::Eval => {
                matches!(workload, Workload::Grpo(g) if g.eval.is_some())
            }
            Phase::Generate => matches!(workload, Workload::Grpo(_)),
            Phase::Reward => reward_models,
            Phase::Score => scored.is_some(),
            _ => true,
        })
        .collect()
}

/// Each `present` phase's totals over `components`, and the heap's high-water mark (the
/// largest live bytes outside fresh buffers of any phase). A phase's RSS is that mark plus its
/// fresh buffers, less the fresh buffers of the components allocated anew in it (alive in fewer
/// phases than the optimizer state) when the heap's free memory is at least
/// [`HEAP_REUSE_FACTOR`] times them; the load phase's is its own live bytes.
fn phase_totals(components: &[Component], present: &[Phase]) -> (Vec<PhaseTotal>, u64) {
    // Per phase: all bytes, bytes in fresh buffers, and fresh bytes of the components that
    // live in this phase only (allocated anew in it).
    let sums = |phase: Phase| {
        components
            .iter()
            .filter(|x| x.phases.contains(&phase))
            .fold((0u64, 0u64, 0u64), |(b, f, tf), x| {
                let transient = x.phases.len() < AFTER_LOAD.len();
                let t = if transient { x.fresh_bytes } else { 0 };
                (b + x.bytes, f + x.fresh_bytes, tf + t)
            })
    };
    let heap_high_water = present
        .iter()
        .map(|&ph| {
            let (b, f, _) = sums(ph);
            b - f
        })
        .max()
        .unwrap_or(0);
    let phases = present
        .iter()
        .map(|&phase| {
            let (live, fresh, transient) = sums(phase);
            // A phase's own large buffers fit in what the heap holds free from earlier phases
            // when there is room to spare; otherwise they are mapped on top of it.
            let free = heap_high_water - (live - fresh);
            let on_top = if free >= HEAP_REUSE_FACTOR * transient {
                fresh - transient
            } else {
                fresh
            };
            PhaseTotal {
                phase,
                live_bytes: live,
                fresh_bytes: fresh,
                // Loading comes first: only its own heap is there.
                rss_bytes: if phase == Phase::Load {
                    live
                } else {
                    (heap_high_water + on_top).max(live)
                },
            }
        })
        .collect();
    (phases, heap_high_water)
}
