//! The estimate: a run's components, each alive in some phases, and each phase's RSS from the
//! heap's high-water mark (see the crate docs).

use crate::formulas::{activations, generation, no_grad_pass, tensors, Activations, Sized};
use crate::{
    count, Component, Environment, Model, Phase, PhaseTotal, Plan, PlanError, Run, Tuning,
};

/// Every phase but loading.
const AFTER_POLICY_LOAD: &[Phase] = Phase::ALL.split_at(1).1;
/// Every phase once the models are loaded (the optimizer exists).
const AFTER_LOAD: &[Phase] = AFTER_POLICY_LOAD.split_at(1).1;

/// The components, in the order the plan lists them.
#[derive(Default)]
struct Parts(Vec<Component>);

impl Parts {
    /// Adds the component `key` (named as [`name_of`] says) of `size`, alive in `phases`.
    fn add(&mut self, key: &'static str, size: Sized, detail: impl Into<String>, phases: &[Phase]) {
        self.named(key, name_of(key), size, detail, phases)
    }

    /// [`Parts::add`] with a name of its own.
    fn named(
        &mut self,
        key: &'static str,
        name: impl Into<String>,
        size: Sized,
        detail: impl Into<String>,
        phases: &[Phase],
    ) {
        let (name, detail) = (name.into(), detail.into());
        let (bytes, fresh_bytes) = (size.bytes, size.fresh_bytes);
        let phases = phases.to_vec();
        self.0.push(Component {
            key,
            name,
            bytes,
            fresh_bytes,
            detail,
            phases,
        })
    }
}

/// The name a component of `key` is listed with.
fn name_of(key: &str) -> &'static str {
    match key {
        "baseline" => "process baseline",
        "weights" => "policy weights",
        "decode_blocks" => "GGUF blocks for decoding",
        "load_buffers" => "loading buffers",
        "reference" => "reference model",
        "generation" => "generation (KV cache)",
        "eval_generation" => "eval generation (KV cache)",
        "activations" => "activations",
        "logprob_pass" => "no-grad log-prob pass",
        "export_buffers" => "export buffers",
        "reward_model_weights" => "reward model weights",
        "reward_model_pass" => "reward model scoring pass",
        "critic_weights" => "critic weights (value model)",
        "critic_load_buffers" => "critic loading buffers",
        "critic_trainable" => "critic trainable copies",
        "critic_values" => "critic value pass (no grad)",
        "critic_activations" => "critic activations",
        "critic_export" => "critic export",
        _ => "",
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// Predicts the peak RSS of `run` (see the crate docs for the model).
pub fn estimate(run: &Run, env: &Environment) -> Result<Plan, PlanError> {
    let dims = &run.policy.dims;
    if run.micro_batch == 0 || run.accumulation == 0 {
        return Err(PlanError::Invalid(
            "per_device_train_batch_size and gradient_accumulation_steps must be >= 1".into(),
        ));
    }
    let zero =
        |d: &crate::ModelDims| d.layers == 0 || d.hidden == 0 || d.vocab == 0 || d.kv_heads == 0;
    if zero(dims) || run.critic.as_ref().is_some_and(|c| zero(&c.model.dims)) {
        return Err(PlanError::Invalid(format!(
            "the model config has a zero dimension: {dims:?}"
        )));
    }
    let mut c = Parts::default();
    let full = matches!(run.tuning, Tuning::Full);
    let (w, dtype) = (run.weight_bytes(), if run.bf16 { "bf16" } else { "f32" });
    let policy = &run.policy;
    let weight_elems = policy.weight_tensors();
    let trainable_elems = policy.trainable_tensors(&run.tuning);
    let (p, t) = (
        policy.parameters(),
        trainable_elems.iter().sum::<u64>() as usize,
    );
    let weights = tensors(&weight_elems, w);
    c.add(
        "baseline",
        Sized::heap(env.baseline_bytes),
        "binary, tokenizer, dataset, threads (measured)",
        &Phase::ALL,
    );
    // LoRA over an f32 GGUF load keeps the frozen matrices in their blocks (no f32 copy).
    let (kept_params, kept_bytes) = policy.frozen_blocks;
    let in_blocks = !run.bf16 && !full && !policy.score_head && kept_bytes > 0;
    if in_blocks {
        let dense = p.saturating_sub(kept_params as usize);
        let detail = format!(
            "frozen base in its GGUF blocks: {} params in {:.0} MiB, {} params x {dtype}",
            count(kept_params as usize),
            mib(kept_bytes),
            count(dense)
        );
        c.add(
            "weights",
            Sized::heap(kept_bytes + dense as u64 * w),
            detail,
            &Phase::ALL,
        );
    } else if policy.score_head {
        let detail = format!(
            "{} params x {dtype}: the backbone (no LM head) and the score head [1, {}]",
            count(p),
            dims.hidden
        );
        c.add("weights", weights, detail, &Phase::ALL);
    } else {
        c.add(
            "weights",
            weights,
            format!("{} params x {dtype}", count(p)),
            &Phase::ALL,
        );
    }
    if !run.bf16 && policy.decode_block_bytes > 0 && !in_blocks {
        // Kept by online LoRA runs (rollouts decode the frozen base from them); dropped after
        // loading when the weights move (full fine-tuning) or nothing decodes.
        let kept = !full && run.generation.is_some();
        let detail = "the frozen weights' Q4_1/Q8_0 blocks, read by the decode kernel";
        c.add(
            "decode_blocks",
            Sized::heap(policy.decode_block_bytes),
            detail,
            if kept { &Phase::ALL } else { &[Phase::Load] },
        );
    }
    let (load, detail) = load_buffers(policy, full, weights, 0);
    c.add("load_buffers", load, detail, &[Phase::Load]);
    let (name, size, detail) = match &run.tuning {
        Tuning::Full => (
            "trainable copies",
            Sized::default(),
            "full fine-tuning: the policy weights are the trainable copies".into(),
        ),
        Tuning::Lora(l) => {
            let head = if policy.score_head {
                " + the score head"
            } else {
                ""
            };
            let detail = format!(
                "r={} on {} modules x {} layers{head}: {} params x f32",
                l.r,
                l.modules.len(),
                dims.layers,
                count(t)
            );
            (
                "trainable copies (LoRA adapters)",
                tensors(&trainable_elems, 4),
                detail,
            )
        }
    };
    c.named("trainable", name, size, detail, &Phase::ALL);
    optimizer(&mut c, run, policy, "", "AdamW m, v");
    if let Some(r) = &run.reference {
        let size = if r.copy { weights } else { Sized::default() };
        c.add(
            "reference",
            size,
            r.detail.clone(),
            if r.copy {
                AFTER_POLICY_LOAD
            } else {
                AFTER_LOAD
            },
        );
    }
    merged_model(&mut c, run);
    let kv_detail = |g: &crate::Generation| {
        let pos = g.prompt_tokens + g.new_tokens;
        format!("{} prompts x {} completions x {pos} positions x {} layers x 2 x {} kv heads x {} x {dtype}, + logits", g.prompts, g.per_prompt, dims.layers, dims.kv_heads, dims.head_dim)
    };
    if let Some(g) = &run.generation {
        c.add(
            "generation",
            generation(dims, g, w),
            kv_detail(g),
            &[Phase::Generate],
        );
    }
    if let Some(e) = &run.eval_generation {
        let detail = format!(
            "{} prompts x {} positions",
            e.prompts,
            e.prompt_tokens + e.new_tokens
        );
        c.add(
            "eval_generation",
            generation(dims, e, w),
            detail,
            &[Phase::Eval],
        );
    }
    let head = policy.head(run.kernels());
    let acts = activations(
        dims,
        &run.tuning,
        run.kernels(),
        head,
        &run.update,
        run.gradient_checkpointing,
    );
    let detail = format!(
        "micro-batch of {} {}: {} tokens x {} layers{} + {} head over {} rows",
        run.micro_batch,
        run.unit,
        run.update.tokens(),
        dims.layers,
        if run.gradient_checkpointing {
            " (checkpointed: layer inputs + one layer)"
        } else {
            ""
        },
        if policy.score_head { "score" } else { "LM" },
        run.update.head_rows
    );
    c.add("activations", acts.total, detail, &[Phase::Update]);
    if let Some(what) = &run.scored {
        let pass = no_grad_pass(dims, run.kernels(), head, &run.update);
        c.add(
            "logprob_pass",
            pass,
            format!("{what}: a micro-batch's forward without graph"),
            &[Phase::Score],
        );
    }
    checkpoint(&mut c, run, policy, "", "the ");
    let mut export = Sized::one(dims.largest_tensor() as u64 * 4);
    if run.bf16 {
        export = export + tensors(&weight_elems, 4);
    }
    let detail = if run.bf16 {
        "the weights converted to f32 for the final export"
    } else {
        "the largest tensor's write buffer"
    };
    c.add("export_buffers", export, detail, &[Phase::Export]);
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
        parameters: p,
        trainable_parameters: t,
    })
}

/// Loading: the source file, the largest tensor's f32 conversion (and `blocks`, GGUF blocks
/// held until dropped); with full fine-tuning the loaded weights while their trainable copies
/// are made, when that is more.
fn load_buffers(m: &Model, full: bool, weights: Sized, blocks: u64) -> (Sized, String) {
    let file = Sized::one(m.source_file_bytes)
        + Sized::one(m.dims.largest_tensor() as u64 * 4)
        + Sized::heap(blocks);
    if full && weights.bytes > file.bytes {
        return (
            weights,
            "loaded weights while their trainable copies are made".into(),
        );
    }
    let blocks = if blocks > 0 { " + GGUF blocks" } else { "" };
    (
        file,
        format!(
            "source file {:.0} MiB + largest tensor in f32{blocks}",
            mib(m.source_file_bytes)
        ),
    )
}

/// AdamW's state of `m`'s trainable tensors (bf16 full fine-tuning: an f32 master copy
/// `T x 4`; the moments `2 x T x 4`) and its gradients: a micro-batch's `T x w` (LoRA: f32)
/// and the accumulated sums `T x 4`, or only `T x 4` for one micro-batch of f32 gradients
/// (they become the sums). Keys and names take `prefix` (`critic_`).
fn optimizer(c: &mut Parts, run: &Run, m: &Model, prefix: &str, moments: &str) {
    let full = matches!(run.tuning, Tuning::Full);
    let trainable = m.trainable_tensors(&run.tuning);
    let t = trainable.iter().sum::<u64>() as usize;
    let state = tensors(&trainable, 4);
    let key = |k: &'static str| if prefix.is_empty() { k } else { critic_key(k) };
    let name = |n: &str| {
        if prefix.is_empty() {
            n.to_string()
        } else {
            format!("critic {n}")
        }
    };
    if full && run.bf16 {
        c.named(
            key("master"),
            name("master weights"),
            state,
            format!("AdamW's f32 copy of {} bf16 params", count(t)),
            AFTER_LOAD,
        );
    }
    c.named(
        key("optimizer"),
        name("optimizer state"),
        state + state,
        format!("{moments}: 2 x {} x f32", count(t)),
        AFTER_LOAD,
    );
    let grad = m.gradient_tensors(&run.tuning);
    let (tg, gs) = (grad.iter().sum::<u64>() as usize, tensors(&grad, 4));
    let (size, detail) = if full && run.bf16 || run.accumulation > 1 {
        let dtype = if full && run.bf16 { "bf16" } else { "f32" };
        let d = format!(
            "micro-batch grads {} x {dtype} + accumulated sums {} x f32",
            count(tg),
            count(tg)
        );
        (
            tensors(&grad, if full { run.weight_bytes() } else { 4 }) + gs,
            d,
        )
    } else {
        (
            gs,
            format!(
                "one micro-batch: its grads {} x f32 are the sums",
                count(tg)
            ),
        )
    };
    c.named(
        key("gradients"),
        name("gradients"),
        size,
        detail,
        &[Phase::Update],
    );
}

/// The `critic_` key of a policy key.
fn critic_key(k: &str) -> &'static str {
    match k {
        "master" => "critic_master",
        "optimizer" => "critic_optimizer",
        "gradients" => "critic_gradients",
        _ => "critic_checkpoint_buffers",
    }
}

/// A checkpoint copies the optimizer state (and master weights) and writes each tensor through
/// two buffers of the largest trainable tensor in f32.
fn checkpoint(c: &mut Parts, run: &Run, m: &Model, prefix: &str, its: &str) {
    let trainable = m.trainable_tensors(&run.tuning);
    let copies = if matches!(run.tuning, Tuning::Full) && run.bf16 {
        3
    } else {
        2
    };
    let state = tensors(&trainable, 4);
    let largest = trainable.iter().copied().max().unwrap_or(0);
    let size = (0..copies).fold(Sized::times(largest * 4, 2), |a, _| a + state);
    let t = count(trainable.iter().sum::<u64>() as usize);
    let (key, name) = if prefix.is_empty() {
        ("checkpoint_buffers", "checkpoint buffers")
    } else {
        (critic_key("checkpoint"), "critic checkpoint buffers")
    };
    c.named(
        key,
        name,
        size,
        format!("a copy of {its}optimizer state ({copies} x {t} x f32) + write buffers"),
        &[Phase::Checkpoint],
    );
}

/// `(elements of every adapted weight, merge_lora's f32 delta, weight and sum of the largest)`.
fn merge(m: &Model, tuning: &Tuning, w: u64) -> (Sized, Sized) {
    let merged: Vec<u64> = m
        .dims
        .adapted(tuning)
        .iter()
        .map(|&(o, i)| (o * i) as u64)
        .collect();
    let one = Sized::times(merged.iter().copied().max().unwrap_or(0) * 4, 3);
    (tensors(&merged, w), one)
}

/// The LoRA-merged model: the export merges one tensor at a time as it writes; bf16 rollouts
/// generate from a merged copy (the f32 CPU decoder adds the adapters as it decodes).
fn merged_model(c: &mut Parts, run: &Run) {
    let (copy, one) = merge(&run.policy, &run.tuning, run.weight_bytes());
    let lora = !matches!(run.tuning, Tuning::Full);
    let rollout = [Phase::Eval, Phase::Generate, Phase::Export];
    if run.generation.is_some() && !lora {
        c.named(
            "rollout_model",
            "rollout model",
            Sized::default(),
            "full fine-tuning: generation shares the policy weights",
            &rollout,
        );
    } else if run.generation.is_some() && run.bf16 {
        let params = count((copy.bytes / run.weight_bytes()) as usize);
        let detail =
            format!("generation runs on a copy with the adapters merged: {params} params x bf16");
        c.named(
            "rollout_model",
            "rollout model (LoRA merged)",
            copy + one,
            detail,
            &rollout,
        );
    } else if lora {
        let detail = if run.generation.is_some() {
            "generation adds the adapters to the frozen base as it decodes; the final export merges them one tensor at a time as it writes"
        } else {
            "the final export merges the adapters one tensor at a time as it writes"
        };
        c.named(
            "rollout_model",
            "merged model (export)",
            one,
            detail,
            &[Phase::Export],
        );
    }
}

/// `[[rewards]] type = "model"`: their weights (loaded before the policy, dense in the run's
/// dtype, kept throughout) and the largest scoring pass without graph.
fn reward_models(c: &mut Parts, run: &Run) {
    if run.reward_models.is_empty() {
        return;
    }
    let (mut weights, mut pass, mut names, mut pass_detail) = (
        Sized::default(),
        Sized::default(),
        Vec::new(),
        String::new(),
    );
    for r in &run.reward_models {
        weights = weights + tensors(&r.model.weight_tensors(), run.weight_bytes());
        let base = if r.model.headless {
            ""
        } else {
            " (a causal LM base with its LM head)"
        };
        names.push(format!(
            "`{}` {} params{base}",
            r.name,
            count(r.model.parameters())
        ));
        let mb = crate::MicroBatch::plain("reward model rows", r.rows, r.tokens, r.rows);
        let s = no_grad_pass(&r.model.dims, run.kernels(), crate::HeadKernel::Score, &mb);
        if s.bytes > pass.bytes {
            pass = s;
            pass_detail = format!("`{}`: {} sequences x {} tokens per forward pass without graph, a score per sequence", r.name, r.rows, r.tokens);
        }
    }
    let dtype = if run.bf16 { "bf16" } else { "f32" };
    let detail = format!(
        "{} x {dtype}, loaded before the policy, GGUF blocks dropped",
        names.join(", ")
    );
    c.add("reward_model_weights", weights, detail, &Phase::ALL);
    c.add("reward_model_pass", pass, pass_detail, &[Phase::Reward]);
}

/// PPO's critic: a second model (GGUF blocks dropped, dense) with a score head, trained as the
/// policy is in the same AdamW, over plain rows; its saved tensors sit beside the policy's
/// until the summed loss is dropped, while the two backward passes run one after the other,
/// so only the larger working set counts (`policy`). Returns its activations.
fn critic(c: &mut Parts, run: &Run, k: &crate::Critic, policy: &Activations) -> Activations {
    let (m, dims, w) = (&k.model, &k.model.dims, run.weight_bytes());
    let full = matches!(run.tuning, Tuning::Full);
    let dtype = if run.bf16 { "bf16" } else { "f32" };
    let weights = tensors(&m.weight_tensors(), w);
    let lm = if m.unused_lm_head() {
        " (with its unused lm_head)"
    } else {
        ""
    };
    let detail = format!(
        "{} params x {dtype}: the decoder{lm} and the score head [1, {}]; GGUF blocks dropped",
        count(m.parameters()),
        dims.hidden
    );
    c.add("critic_weights", weights, detail, AFTER_POLICY_LOAD);
    let (load, detail) = load_buffers(
        m,
        full,
        weights,
        if run.bf16 { 0 } else { m.decode_block_bytes },
    );
    c.add("critic_load_buffers", load, detail, &[Phase::CriticLoad]);
    let (size, detail) = match &run.tuning {
        Tuning::Full => (
            Sized::default(),
            "full fine-tuning: the critic's weights are its trainable copies".to_string(),
        ),
        Tuning::Lora(l) => {
            let detail = format!("its own LoRA adapters, r={} on {} modules x {} layers, x f32 (the head trains in place)", l.r, l.modules.len(), dims.layers);
            (tensors(&dims.trainable_tensors(&run.tuning), 4), detail)
        }
    };
    c.add("critic_trainable", size, detail, AFTER_POLICY_LOAD);
    optimizer(c, run, m, "critic_", "AdamW m, v (the policy's optimizer)");
    let values = no_grad_pass(dims, run.kernels(), crate::HeadKernel::Score, &k.update);
    let (rows, tokens) = k
        .update
        .passes
        .first()
        .map_or((0, 0), |p| (p.rows, p.tokens));
    let detail = format!("per rollout, micro-batches of {rows} rows x {tokens} tokens through the critic without graph");
    c.add("critic_values", values, detail, &[Phase::Values]);
    let acts = activations(
        dims,
        &run.tuning,
        run.kernels(),
        crate::HeadKernel::Score,
        &k.update,
        false,
    );
    let overlap = if acts.working_set.bytes <= policy.working_set.bytes {
        acts.working_set
    } else {
        policy.working_set
    };
    let size = Sized {
        bytes: acts.total.bytes - overlap.bytes,
        fresh_bytes: acts.total.fresh_bytes.saturating_sub(overlap.fresh_bytes),
    };
    let detail = format!(
        "micro-batch of {}: {} tokens x {} layers (never checkpointed) + score head over {} rows; its backward's working set ({:.1} MiB) runs apart from the policy's, only the larger counts",
        run.micro_batch,
        k.update.tokens(),
        dims.layers,
        k.update.head_rows,
        mib(acts.working_set.bytes)
    );
    c.add("critic_activations", size, detail, &[Phase::Update]);
    checkpoint(c, run, m, "critic_", "its ");
    let (copy, one) = merge(m, &run.tuning, w);
    let mut export = copy + one + Sized::one(dims.largest_tensor() as u64 * 4);
    if run.bf16 {
        export = export + tensors(&m.weight_tensors(), 4);
    }
    let merged = if copy.bytes > 0 {
        ": the adapters merged into a copy"
    } else {
        ""
    };
    let buffers = if run.bf16 {
        ", the weights converted to f32"
    } else {
        ", the largest tensor's write buffer"
    };
    c.add(
        "critic_export",
        export,
        format!("critic/ as an HF directory{merged}{buffers}"),
        &[Phase::CriticExport],
    );
    acts
}

/// Each `present` phase's totals over `components`, and the heap's high-water mark (the
/// largest live bytes outside fresh buffers of any phase). A phase's RSS is that mark plus its
/// fresh buffers, less the fresh buffers of the components allocated anew in it (alive in
/// fewer phases than the optimizer state) when the heap's free memory is at least
/// [`HEAP_REUSE_FACTOR`](crate::HEAP_REUSE_FACTOR) times them; the load phase's is its own
/// live bytes (it comes first).
fn phase_totals(components: &[Component], present: &[Phase]) -> (Vec<PhaseTotal>, u64) {
    let sums = |phase: Phase| {
        components
            .iter()
            .filter(|x| x.phases.contains(&phase))
            .fold((0u64, 0u64, 0u64), |(b, f, tf), x| {
                let transient = if x.phases.len() < AFTER_LOAD.len() {
                    x.fresh_bytes
                } else {
                    0
                };
                (b + x.bytes, f + x.fresh_bytes, tf + transient)
            })
    };
    let heap_high_water = present
        .iter()
        .map(|&ph| sums(ph).0 - sums(ph).1)
        .max()
        .unwrap_or(0);
    let phases = present
        .iter()
        .map(|&phase| {
            let (live, fresh, transient) = sums(phase);
            let free = heap_high_water - (live - fresh);
            let on_top = if free >= crate::HEAP_REUSE_FACTOR * transient {
                fresh - transient
            } else {
                fresh
            };
            let rss_bytes = if phase == Phase::Load {
                live
            } else {
                (heap_high_water + on_top).max(live)
            };
            PhaseTotal {
                phase,
                live_bytes: live,
                fresh_bytes: fresh,
                rss_bytes,
            }
        })
        .collect();
    (phases, heap_high_water)
}
