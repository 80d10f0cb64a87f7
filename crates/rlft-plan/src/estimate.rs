//! The estimate: a run's components, each alive in some phases, and each phase's RSS from the
//! heap's high-water mark (see the crate docs).

use crate::formulas::{activations, generation, no_grad_pass, tensors, Activations, Sized};
use crate::{count, Component, Critic, Environment, MicroBatch, Model, ModelDims};
use crate::{OptimizerState, Phase, PhaseTotal, Plan, PlanError, Run, Tuning};

/// Every phase.
const ALL: &[Phase] = &Phase::ALL;
/// Every phase but loading.
const AFTER_POLICY_LOAD: &[Phase] = Phase::ALL.split_at(1).1;
/// Every phase once the models are loaded (the optimizer exists).
const AFTER_LOAD: &[Phase] = AFTER_POLICY_LOAD.split_at(1).1;

/// `(key, name)` of the components; the critic's keys are the policy's with `critic_`.
const NAMES: &[(&str, &str)] = &[
    ("baseline", "process baseline"),
    ("weights", "policy weights"),
    ("trainable", "trainable copies"),
    ("decode_blocks", "GGUF blocks for decoding"),
    ("load_buffers", "loading buffers"),
    ("master", "master weights"),
    ("optimizer", "optimizer state"),
    ("gradients", "gradients"),
    ("reference", "reference model"),
    ("generation", "generation (KV cache)"),
    ("eval_generation", "eval generation (KV cache)"),
    ("activations", "activations"),
    ("logprob_pass", "no-grad log-prob pass"),
    ("checkpoint_buffers", "checkpoint buffers"),
    ("export_buffers", "export buffers"),
    ("reward_model_weights", "reward model weights"),
    ("reward_model_pass", "reward model scoring pass"),
    ("critic_weights", "critic weights (value model)"),
    ("critic_load_buffers", "critic loading buffers"),
    ("critic_trainable", "critic trainable copies"),
    ("critic_master", "critic master weights"),
    ("critic_optimizer", "critic optimizer state"),
    ("critic_gradients", "critic gradients"),
    ("critic_values", "critic value pass (no grad)"),
    ("critic_activations", "critic activations"),
    ("critic_checkpoint_buffers", "critic checkpoint buffers"),
    ("critic_export", "critic export"),
];

/// The key of the policy's component `k`, or with `critic` the critic's.
fn key(critic: bool, k: &'static str) -> &'static str {
    let of = |e: &&(&'static str, &str)| e.0.strip_prefix("critic_") == Some(k);
    NAMES.iter().find(of).filter(|_| critic).map_or(k, |e| e.0)
}

/// `text` when `on`, else nothing: the optional parts of a detail.
fn when(on: bool, text: &str) -> &str {
    if on {
        text
    } else {
        ""
    }
}

/// The components, in the order the plan lists them.
#[derive(Default)]
struct Parts(Vec<Component>);

impl Parts {
    /// Adds the component `key` (named as [`NAMES`] says, or by the caller through the
    /// returned reference) of `size`, alive in `phases`.
    fn add(
        &mut self,
        key: &'static str,
        size: Sized,
        detail: impl Into<String>,
        phases: &[Phase],
    ) -> &mut Component {
        let name = NAMES.iter().find(|e| e.0 == key).map_or("", |e| e.1);
        self.0.push(Component {
            key,
            name: name.into(),
            bytes: size.bytes,
            fresh_bytes: size.fresh_bytes,
            detail: detail.into(),
            phases: phases.to_vec(),
        });
        self.0.last_mut().expect("just pushed")
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// Predicts the peak RSS of `run` (see the crate docs for the model).
pub fn estimate(run: &Run, env: &Environment) -> Result<Plan, PlanError> {
    let (policy, dims) = (&run.policy, &run.policy.dims);
    if run.micro_batch == 0 || run.accumulation == 0 {
        let e = "per_device_train_batch_size and gradient_accumulation_steps must be >= 1";
        return Err(PlanError::Invalid(e.into()));
    }
    let zero = |d: &ModelDims| d.layers == 0 || d.hidden == 0 || d.vocab == 0 || d.kv_heads == 0;
    if zero(dims) || run.critic.as_ref().is_some_and(|c| zero(&c.model.dims)) {
        let e = format!("the model config has a zero dimension: {dims:?}");
        return Err(PlanError::Invalid(e));
    }
    let mut c = Parts::default();
    let full = matches!(run.tuning, Tuning::Full);
    let (w, dtype) = (run.weight_bytes(), run.dtype());
    let p = policy.parameters();
    let t = policy.trainable_tensors(&run.tuning).iter().sum::<u64>() as usize;
    let weights = tensors(&policy.weight_tensors(), w);
    let baseline = "binary, tokenizer, dataset, threads (measured)";
    c.add("baseline", Sized::heap(env.baseline_bytes), baseline, ALL);
    // LoRA over an f32 GGUF load keeps the frozen matrices in their blocks (no f32 copy).
    let (kept_params, kept_bytes) = policy.frozen_blocks;
    let in_blocks = !run.bf16 && !full && !policy.score_head && kept_bytes > 0;
    let (size, d) = if in_blocks {
        let dense = p.saturating_sub(kept_params as usize);
        let (kept, kept_mib, dense_n) =
            (count(kept_params as usize), mib(kept_bytes), count(dense));
        let d = format!(
            "frozen base in its GGUF blocks: {kept} params in {kept_mib:.0} MiB, {dense_n} params \
             x {dtype}"
        );
        (Sized::heap(kept_bytes + dense as u64 * w), d)
    } else {
        let (h, params) = (dims.hidden, count(p));
        let head = format!(": the backbone (no LM head) and the score head [1, {h}]");
        let head = when(policy.score_head, &head);
        (weights, format!("{params} params x {dtype}{head}"))
    };
    c.add("weights", size, d, ALL);
    if !run.bf16 && policy.decode_block_bytes > 0 && !in_blocks {
        // Kept by online LoRA runs (rollouts decode the frozen base from them); dropped after
        // loading when the weights move (full fine-tuning) or nothing decodes.
        let kept = !full && run.generation.is_some();
        let d = "the frozen weights' Q4_1/Q8_0 blocks, read by the decode kernel";
        let blocks = Sized::heap(policy.decode_block_bytes);
        let phases = if kept { ALL } else { &[Phase::Load] };
        c.add("decode_blocks", blocks, d, phases);
    }
    training(&mut c, run, policy, false, weights);
    if let Some(r) = &run.reference {
        let (size, phases) = match r.copy {
            true => (weights, AFTER_POLICY_LOAD),
            false => (Sized::default(), AFTER_LOAD),
        };
        c.add("reference", size, r.detail.clone(), phases);
    }
    merged_model(&mut c, run);
    if let Some(g) = &run.generation {
        let (pos, kv) = (g.prompt_tokens + g.new_tokens, dims.kv_heads);
        let d = format!(
            "{} prompts x {} completions x {pos} positions x {} layers x 2 x {kv} kv heads x {} \
             x {dtype}, + logits",
            g.prompts, g.per_prompt, dims.layers, dims.head_dim
        );
        c.add("generation", generation(dims, g, w), d, &[Phase::Generate]);
    }
    if let Some(e) = &run.eval_generation {
        let (prompts, positions) = (e.prompts, e.prompt_tokens + e.new_tokens);
        let d = format!("{prompts} prompts x {positions} positions");
        c.add("eval_generation", generation(dims, e, w), d, &[Phase::Eval]);
    }
    let (kernels, mb) = (run.kernels(), &run.update);
    let checkpointing = run.gradient_checkpointing;
    let acts = activations(run, policy, mb, checkpointing);
    let ckpt = when(checkpointing, " (checkpointed: layer inputs + one layer)");
    let (n, unit, tokens, rows) = (run.micro_batch, run.unit, mb.tokens(), mb.head_rows);
    let (layers, lm) = (dims.layers, if policy.score_head { "score" } else { "LM" });
    let d = format!(
        "micro-batch of {n} {unit}: {tokens} tokens x {layers} layers{ckpt} + {lm} head over \
         {rows} rows"
    );
    c.add("activations", acts.total, d, &[Phase::Update]);
    if let Some(what) = &run.scored {
        let d = format!("{what}: a micro-batch's forward without graph");
        let pass = no_grad_pass(policy, kernels, mb);
        c.add("logprob_pass", pass, d, &[Phase::Score]);
    }
    checkpoint(&mut c, run, policy, false);
    let d = match run.bf16 {
        true => "the weights converted to f32 for the final export",
        false => "the largest tensor's write buffer",
    };
    c.add("export_buffers", export(policy, run), d, &[Phase::Export]);
    reward_models(&mut c, run);
    let critic_activations = run.critic.as_ref().map(|k| critic(&mut c, run, k, &acts));
    let present: Vec<Phase> = Phase::ALL
        .into_iter()
        .filter(|ph| match ph {
            Phase::CriticLoad | Phase::Values | Phase::CriticExport => run.critic.is_some(),
            Phase::Eval => run.eval_generation.is_some(),
            Phase::Generate => run.generation.is_some(),
            Phase::Reward => !run.reward_models.is_empty(),
            Phase::Score => run.scored.is_some(),
            _ => true,
        })
        .collect();
    let (phases, heap_high_water_bytes) = phase_totals(&c.0, &present);
    let peak = phases
        .iter()
        .copied()
        .max_by_key(|x| (x.rss_bytes, x.live_bytes, std::cmp::Reverse(x.phase)))
        .expect("load and update are always present");
    Ok(Plan {
        components: c.0,
        phases,
        heap_high_water_bytes,
        peak_phase: peak.phase,
        total_bytes: peak.rss_bytes,
        activations: acts,
        critic_activations,
        parameters: p,
        trainable_parameters: t,
    })
}

/// A trained model's loading buffers, trainable copies, AdamW state and gradients: the
/// policy's, or with `critic` the critic's (its own adapters, its score head trained in place).
fn training(c: &mut Parts, run: &Run, m: &Model, critic: bool, weights: Sized) {
    let full = matches!(run.tuning, Tuning::Full);
    let (load, d) = load_buffers(m, full, weights, critic && !run.bf16);
    let phase = [Phase::Load, Phase::CriticLoad][usize::from(critic)];
    c.add(key(critic, "load_buffers"), load, d, &[phase]);
    let layers = m.dims.layers;
    let (size, d) = match &run.tuning {
        Tuning::Full => {
            let whose = ["the policy weights are the", "the critic's weights are its"];
            let whose = whose[usize::from(critic)];
            (
                Sized::default(),
                format!("full fine-tuning: {whose} trainable copies"),
            )
        }
        Tuning::Lora(l) => {
            let shape = format!("r={} on {} modules x {layers} layers", l.r, l.modules.len());
            if critic {
                let d = format!("its own LoRA adapters, {shape}, x f32 (the head trains in place)");
                (tensors(&m.dims.trainable_tensors(&run.tuning), 4), d)
            } else {
                let t = m.trainable_tensors(&run.tuning);
                let (head, params) = (when(m.score_head, " + the score head"), count_of(&t));
                (
                    tensors(&t, 4),
                    format!("{shape}{head}: {params} params x f32"),
                )
            }
        }
    };
    let phases = [ALL, AFTER_POLICY_LOAD][usize::from(critic)];
    let part = c.add(key(critic, "trainable"), size, d, phases);
    if !full && !critic {
        part.name.push_str(" (LoRA adapters)");
    }
    optimizer(c, run, m, critic);
}

/// `count` of the elements of `tensors`.
fn count_of(tensors: &[u64]) -> String {
    count(tensors.iter().sum::<u64>() as usize)
}

/// Loading: the source file, the largest tensor's f32 conversion (and with `blocks` the GGUF
/// blocks); with full fine-tuning the loaded weights while their copies are made, when more.
fn load_buffers(m: &Model, full: bool, weights: Sized, blocks: bool) -> (Sized, String) {
    let blocks = if blocks { m.decode_block_bytes } else { 0 };
    let largest = Sized::one(m.dims.largest_tensor() as u64 * 4);
    let file = Sized::one(m.source_file_bytes) + largest + Sized::heap(blocks);
    if full && weights.bytes > file.bytes {
        let d = "loaded weights while their trainable copies are made";
        return (weights, d.into());
    }
    let blocks = when(blocks > 0, " + GGUF blocks");
    let file_mib = mib(m.source_file_bytes);
    let d = format!("source file {file_mib:.0} MiB + largest tensor in f32{blocks}");
    (file, d)
}

/// Bytes per trainable element of AdamW's moments (each) and master weights: f32 moments and
/// no master unless the weights are bf16 (full fine-tuning), where `optimizer_state` decides.
fn state_bytes(run: &Run) -> (u64, u64, &'static str) {
    if !(matches!(run.tuning, Tuning::Full) && run.bf16) {
        return (4, 0, "");
    }
    match run.optimizer_state {
        OptimizerState::F32Master => (4, 4, "an f32 copy"),
        OptimizerState::SplitMaster => (4, 2, "16-bit low halves"),
        OptimizerState::Bf16Moments => (2, 0, ""),
    }
}

/// AdamW's state of `m`'s trainable tensors (the moments; with bf16 full fine-tuning a master
/// as `optimizer_state` says) and its gradients: a micro-batch's and the accumulated sums, or
/// one set for both.
fn optimizer(c: &mut Parts, run: &Run, m: &Model, critic: bool) {
    let full_bf16 = matches!(run.tuning, Tuning::Full) && run.bf16;
    let trainable = m.trainable_tensors(&run.tuning);
    let (moment, master, what) = state_bytes(run);
    let t = count_of(&trainable);
    if master > 0 {
        let d = format!("AdamW's master weights of {t} bf16 params: {what}");
        c.add(
            key(critic, "master"),
            tensors(&trainable, master),
            d,
            AFTER_LOAD,
        );
    }
    let of = when(critic, " (the policy's optimizer)");
    let dtype = if moment == 2 { "bf16" } else { "f32" };
    let d = format!("AdamW m, v{of}: 2 x {t} x {dtype}");
    let state = tensors(&trainable, moment);
    c.add(key(critic, "optimizer"), state + state, d, AFTER_LOAD);
    let grad = m.gradient_tensors(&run.tuning);
    let (tg, sums) = (count_of(&grad), tensors(&grad, 4));
    let (size, d) = if full_bf16 || run.accumulation > 1 {
        let (dtype, bytes) = if full_bf16 { ("bf16", 2) } else { ("f32", 4) };
        // PyTorch's layout sums bf16 gradients in bf16.
        let (sums, sum_dtype) = if moment == 2 {
            (tensors(&grad, 2), "bf16")
        } else {
            (sums, "f32")
        };
        let d = format!("micro-batch grads {tg} x {dtype} + accumulated sums {tg} x {sum_dtype}");
        (tensors(&grad, bytes) + sums, d)
    } else {
        let d = format!("one micro-batch: its grads {tg} x f32 are the sums");
        (sums, d)
    };
    c.add(key(critic, "gradients"), size, d, &[Phase::Update]);
}

/// A checkpoint copies the optimizer state (and master weights) and writes each tensor through
/// two buffers of the largest trainable tensor in f32.
fn checkpoint(c: &mut Parts, run: &Run, m: &Model, critic: bool) {
    let trainable = m.trainable_tensors(&run.tuning);
    let (moment, master, _) = state_bytes(run);
    let largest = trainable.iter().copied().max().unwrap_or(0);
    let size = Sized::times(largest * 4, 2) + tensors(&trainable, 2 * moment + master);
    let (t, its) = (count_of(&trainable), if critic { "its" } else { "the" });
    let per = 2 * moment + master;
    let d = format!("a copy of {its} optimizer state ({t} x {per} bytes) + write buffers");
    let key = key(critic, "checkpoint_buffers");
    c.add(key, size, d, &[Phase::Checkpoint]);
}

/// The final export's buffers: the largest tensor's, and with bf16 the weights in f32.
fn export(m: &Model, run: &Run) -> Sized {
    let f32s = run.bf16.then(|| tensors(&m.weight_tensors(), 4));
    Sized::one(m.dims.largest_tensor() as u64 * 4) + f32s.unwrap_or_default()
}

/// `(elements of every adapted weight, merge_lora's f32 delta, weight and sum of the largest)`.
fn merge(m: &Model, tuning: &Tuning, w: u64) -> (Sized, Sized) {
    let adapted = m.dims.adapted(tuning);
    let merged: Vec<u64> = adapted.iter().map(|&(o, i)| (o * i) as u64).collect();
    let largest = merged.iter().copied().max().unwrap_or(0);
    (tensors(&merged, w), Sized::times(largest * 4, 3))
}

/// The LoRA-merged model: the export merges one tensor at a time as it writes; bf16 rollouts
/// generate from a merged copy (the f32 CPU decoder adds the adapters as it decodes).
fn merged_model(c: &mut Parts, run: &Run) {
    let (copy, one) = merge(&run.policy, &run.tuning, run.weight_bytes());
    let lora = !matches!(run.tuning, Tuning::Full);
    let generates = run.generation.is_some();
    let rollout: &[Phase] = &[Phase::Eval, Phase::Generate, Phase::Export];
    let (name, size, d, phases) = if generates && !lora {
        let d = "full fine-tuning: generation shares the policy weights";
        ("rollout model", Sized::default(), d.to_string(), rollout)
    } else if generates && run.bf16 {
        let params = count((copy.bytes / run.weight_bytes()) as usize);
        let d =
            format!("generation runs on a copy with the adapters merged: {params} params x bf16");
        ("rollout model (LoRA merged)", copy + one, d, rollout)
    } else if lora {
        let d = match generates {
            true => {
                "generation adds the adapters to the frozen base as it decodes; the final export \
                 merges them one tensor at a time as it writes"
            }
            false => "the final export merges the adapters one tensor at a time as it writes",
        };
        ("merged model (export)", one, d.into(), &[Phase::Export][..])
    } else {
        return;
    };
    c.add("rollout_model", size, d, phases).name = name.into();
}

/// `[[rewards]] type = "model"`: their weights (loaded before the policy, dense in the run's
/// dtype, kept throughout) and the largest scoring pass without graph.
fn reward_models(c: &mut Parts, run: &Run) {
    if run.reward_models.is_empty() {
        return;
    }
    let (mut weights, mut pass) = (Sized::default(), Sized::default());
    let (mut names, mut pass_d) = (Vec::new(), String::new());
    for r in &run.reward_models {
        weights = weights + tensors(&r.model.weight_tensors(), run.weight_bytes());
        let base = when(!r.model.headless, " (a causal LM base with its LM head)");
        let (name, params) = (&r.name, count(r.model.parameters()));
        names.push(format!("`{name}` {params} params{base}"));
        let mb = MicroBatch::plain("reward model rows", r.rows, r.tokens, r.rows);
        let s = no_grad_pass(&r.model, run.kernels(), &mb);
        if s.bytes > pass.bytes {
            let (rows, tokens) = (r.rows, r.tokens);
            pass = s;
            pass_d = format!(
                "`{name}`: {rows} sequences x {tokens} tokens per forward pass without graph, a \
                 score per sequence"
            );
        }
    }
    let (names, dtype) = (names.join(", "), run.dtype());
    let d = format!("{names} x {dtype}, loaded before the policy, GGUF blocks dropped");
    c.add("reward_model_weights", weights, d, ALL);
    c.add("reward_model_pass", pass, pass_d, &[Phase::Reward]);
}

/// PPO's critic: a second model (dense, score head) trained in the policy's AdamW; its saved
/// tensors sit beside the policy's, but the two backward passes run one after the other, so
/// only the larger working set counts (`policy`'s or its own). Returns its activations.
fn critic(c: &mut Parts, run: &Run, k: &Critic, policy: &Activations) -> Activations {
    let (m, dims, mb, kernels) = (&k.model, &k.model.dims, &k.update, run.kernels());
    let weights = tensors(&m.weight_tensors(), run.weight_bytes());
    let lm = when(m.unused_lm_head(), " (with its unused lm_head)");
    let (params, dtype, h) = (count(m.parameters()), run.dtype(), dims.hidden);
    let d = format!(
        "{params} params x {dtype}: the decoder{lm} and the score head [1, {h}]; GGUF blocks \
         dropped"
    );
    c.add("critic_weights", weights, d, AFTER_POLICY_LOAD);
    training(c, run, m, true, weights);
    let values = no_grad_pass(m, kernels, mb);
    let (rows, tokens) = mb.passes.first().map_or((0, 0), |p| (p.rows, p.tokens));
    let d = format!(
        "per rollout, micro-batches of {rows} rows x {tokens} tokens through the critic without \
         graph"
    );
    c.add("critic_values", values, d, &[Phase::Values]);
    let acts = activations(run, m, mb, false);
    let (ours, theirs) = (acts.working_set, policy.working_set);
    let overlap = std::cmp::min_by_key(ours, theirs, |s| s.bytes);
    let fresh = acts.total.fresh_bytes.saturating_sub(overlap.fresh_bytes);
    let size = Sized::new(acts.total.bytes - overlap.bytes, fresh);
    let (n, tokens, layers, rows) = (run.micro_batch, mb.tokens(), dims.layers, mb.head_rows);
    let d = format!(
        "micro-batch of {n}: {tokens} tokens x {layers} layers (never checkpointed) + score head \
         over {rows} rows; its backward's working set ({:.1} MiB) runs apart from the policy's, \
         only the larger counts",
        mib(ours.bytes)
    );
    c.add("critic_activations", size, d, &[Phase::Update]);
    checkpoint(c, run, m, true);
    let (copy, one) = merge(m, &run.tuning, run.weight_bytes());
    let merged = when(copy.bytes > 0, ": the adapters merged into a copy");
    let buffers = match run.bf16 {
        true => ", the weights converted to f32",
        false => ", the largest tensor's write buffer",
    };
    let d = format!("critic/ as an HF directory{merged}{buffers}");
    let size = copy + one + export(m, run);
    c.add("critic_export", size, d, &[Phase::CriticExport]);
    acts
}

/// Each `present` phase's totals over `components`, and the heap's high-water mark; a
/// component alive in fewer phases than the optimizer is new in them (see the crate docs).
fn phase_totals(components: &[Component], present: &[Phase]) -> (Vec<PhaseTotal>, u64) {
    let sums = |phase: Phase| {
        let alive = components.iter().filter(|x| x.phases.contains(&phase));
        alive.fold((0u64, 0u64, 0u64), |(b, f, tf), x| {
            let transient = x.fresh_bytes * u64::from(x.phases.len() < AFTER_LOAD.len());
            (b + x.bytes, f + x.fresh_bytes, tf + transient)
        })
    };
    let heap = |ph| sums(ph).0 - sums(ph).1;
    let heap_high_water = present.iter().map(|&ph| heap(ph)).max().unwrap_or(0);
    let phases = present.iter().map(|&phase| {
        let (live, fresh, transient) = sums(phase);
        let free = heap_high_water - (live - fresh);
        let reuse = free >= crate::HEAP_REUSE_FACTOR * transient;
        let on_top = if reuse { fresh - transient } else { fresh };
        let rss_bytes = match phase {
            Phase::Load => live,
            _ => (heap_high_water + on_top).max(live),
        };
        PhaseTotal {
            phase,
            live_bytes: live,
            fresh_bytes: fresh,
            rss_bytes,
        }
    });
    (phases.collect(), heap_high_water)
}
