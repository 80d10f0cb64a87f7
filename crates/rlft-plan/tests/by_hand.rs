//! The plan's arithmetic on a tiny model, by hand: vocab 512, hidden 64, intermediate 128, 2
//! layers, 4 / 2 heads of 16 (q_dim 64, kv_dim 32), tied, no biases: 106816 parameters; LoRA
//! r=4 on q and v: 1792.

use rlft_plan::formulas::*;
use rlft_plan::*;

const TINY: ModelDims = ModelDims {
    vocab: 512,
    hidden: 64,
    intermediate: 128,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    tied_embeddings: true,
    qkv_bias: false,
    o_bias: false,
    mlp_bias: false,
    qk_norm: false,
};
/// [`TINY`] with an untied LM head.
const UNTIED: ModelDims = ModelDims {
    tied_embeddings: false,
    ..TINY
};
const ENV: Environment = Environment {
    baseline_bytes: 1_000_000,
};
const P: u64 = 106_816;
const T: u64 = 1_792;
/// Fused f32 per token per layer: 4 x (6 h + 3 q + 3 kv + 3 i) + x A^T of q and v (4 x 2 r).
const FUSED_QV: u64 = 4 * (6 * 64 + 3 * 64 + 3 * 32 + 3 * 128) + 4 * 8;
/// Floats of one layer's no-grad temporaries per token: 4 h + 2 q + 2 kv + 3 i.
const NO_GRAD: u64 = 4 * 64 + 2 * 64 + 2 * 32 + 3 * 128;

/// A model of `dims` read from a 1000-byte file; `score`: a score head, `headless`: no LM head.
fn model(dims: ModelDims, score_head: bool, headless: bool) -> Model {
    Model {
        dims,
        score_head,
        headless,
        source_file_bytes: 1_000,
        decode_block_bytes: 0,
        frozen_blocks: (0, 0),
    }
}

fn lora_qv(dropout: bool) -> Tuning {
    let modules = vec!["self_attn.q_proj", "self_attn.v_proj"];
    Tuning::Lora(LoraShape {
        r: 4,
        modules,
        dropout,
    })
}

fn plan(run: &Run) -> Plan {
    estimate(run, &ENV).unwrap()
}

/// Asserts the bytes of each component `(key, bytes)`.
fn check(p: &Plan, want: &[(&str, u64)]) {
    for &(key, bytes) in want {
        assert_eq!(p.bytes(key), bytes, "{key}");
    }
}

fn generation(prompts: usize, per_prompt: usize, prompt_tokens: usize, new: usize) -> Generation {
    Generation {
        prompts,
        per_prompt,
        prompt_tokens,
        new_tokens: new,
    }
}

/// `run` in bf16 (candle's composite kernels).
fn bf16(mut run: Run) -> Run {
    run.bf16 = true;
    run
}

/// SFT-like: `micro` rows of `tokens` inputs, the head over all of them.
fn plain(tuning: Tuning, micro: usize, tokens: usize) -> Run {
    let update = MicroBatch::plain("rows", micro, tokens, micro * tokens);
    Run::new(model(TINY, false, false), tuning, micro, update)
}

/// GRPO-like: 3 prompts of 10 tokens x 4 completions of 5, micro-batches of 6 in shared
/// prompt passes (2 prompts each); a reference copy with full fine-tuning when `beta`.
fn grpo(tuning: Tuning, beta: bool) -> Run {
    let copy = beta && tuning == Tuning::Full;
    let detail = String::new();
    Run {
        unit: "completions",
        micro_batch: 6,
        update: MicroBatch::shared(2, 10, 6, 5),
        scored: beta.then(|| "reference".into()),
        reference: Some(Reference { copy, detail }),
        generation: Some(generation(3, 4, 10, 5)),
        ..plain(tuning, 6, 1)
    }
}

/// PPO: 2 prompts x 1 completion, micro-batch 2, plain rows of 10 + 5 - 1 tokens, an
/// old-policy pass, a critic of `dims` over the same rows.
fn ppo(tuning: Tuning, dims: ModelDims, headless: bool) -> Run {
    let update = MicroBatch::plain("rows", 2, 14, 10);
    let model = model(dims, true, headless);
    Run {
        micro_batch: 2,
        update: update.clone(),
        scored: Some("old".into()),
        generation: Some(generation(2, 1, 10, 5)),
        critic: Some(Critic { model, update }),
        ..plain(tuning, 2, 1)
    }
}

#[test]
fn parameters_and_caches() {
    let d = TINY;
    // Per layer: q 64x64 + k 32x64 + v 32x64 + o 64x64 + 3 x 128x64 + two norms of 64.
    assert_eq!(d.num_parameters() as u64, 32_768 + 2 * 36_992 + 64);
    assert_eq!(d.largest_tensor(), 32_768);
    // LoRA r=4 on q (64 -> 64) and v (64 -> 32): 4 x (64 + 64) + 4 x (64 + 32) per layer.
    let qv = lora_qv(false);
    assert_eq!(d.trainable_tensors(&qv).iter().sum::<u64>(), T);
    assert_eq!(d.adapted(&qv), [(64, 64), (32, 64), (64, 64), (32, 64)]);
    // 2 prompts of 10 x 4 samples, 6 new: KV 8 rows x 2 layers x 2 x 32 x 16 x 4, two [8, 512]
    // f32 logits, and the prefill's 20 tokens x (4 h + 2 q + 2 kv + 2 i) floats.
    let g = generation(2, 4, 10, 6);
    let bytes = formulas::generation(&d, &g, 4).bytes;
    assert_eq!(bytes, 65_536 + 32_768 + 56_320);
}

#[test]
fn per_token_figures() {
    let per_token = |k, t: &Tuning| layer_bytes_per_token(&TINY, k, t);
    assert_eq!(per_token(Kernels::Fused, &lora_qv(false)), FUSED_QV);
    // Dropout: an f32 mask per adapted input (64 + 64).
    let dropout = per_token(Kernels::Fused, &lora_qv(true));
    assert_eq!(dropout, FUSED_QV + 128 * 4);
    // Composite, full: 40 h + 18 q + 15 kv + 8 i; scores apart, 26 bytes each.
    let comp = per_token(Kernels::Composite, &Tuning::Full);
    assert_eq!(comp, 40 * 64 + 18 * 64 + 15 * 32 + 8 * 128);
    let a = plan(&bf16(plain(Tuning::Full, 2, 8))).activations;
    // 2 layers x (16 tokens x comp + 2 rows x 4 heads x 8 x 8 scores x 26).
    assert_eq!(a.layers.bytes, 2 * (16 * comp + 512 * 26));
    let kinds = (a.kernels, a.head, a.layers.fresh_bytes);
    assert_eq!(kinds, (Kernels::Composite, HeadKernel::Chunked, 0));
}

#[test]
fn sft_lora_components_by_hand() {
    let p = plan(&plain(lora_qv(false), 2, 8));
    assert_eq!((p.parameters as u64, p.trainable_parameters as u64), (P, T));
    // Layers 2 x 16 tokens; embeddings, final norm, head rows and the frozen head's input
    // gradient [16, 64]; the head's forward block [16, 512] + [16, 64]; gradients in flight
    // 16 x (3 i + 4 h) floats.
    let acts = 2 * 16 * FUSED_QV + 4 * 4096 + (16 * 512 + 16 * 64) * 4 + 16 * 640 * 4;
    let want = [
        ("weights", P * 4),
        ("trainable", T * 4),
        ("optimizer", 2 * T * 4),
        // One f32 micro-batch: its gradients are the sums.
        ("gradients", T * 4),
        // Loading: the 1000-byte file plus the embedding in f32.
        ("load_buffers", 1_000 + 32_768 * 4),
        ("activations", acts),
        // Export: merge_lora's 3 f32 buffers of q (64 x 64) and the embedding's write buffer.
        ("rollout_model", 3 * 4096 * 4),
        ("export_buffers", 32_768 * 4),
        // A checkpoint copies m and v and writes the largest adapter (4 x 64) through two
        // buffers.
        ("checkpoint_buffers", 2 * T * 4 + 2 * 256 * 4),
    ];
    check(&p, &want);
    // With accumulation, a second set of gradients.
    let mut acc = plain(lora_qv(false), 2, 8);
    acc.accumulation = 2;
    check(&plan(&acc), &[("gradients", 2 * T * 4)]);
    assert!(p.component("reference").is_none());
    let base = 1_000_000 + P * 4 + T * 4;
    let live = |ph: Phase| p.phase(ph).unwrap().live_bytes;
    assert_eq!(live(Phase::Load), base + 1_000 + 32_768 * 4);
    assert_eq!(live(Phase::Update), base + 3 * T * 4 + acts);
    // No buffer reaches the mmap threshold: every phase after loading sits at the heap's
    // high-water mark, the update's.
    let peak = (p.peak_phase, p.total_bytes, p.heap_high_water_bytes);
    let update = live(Phase::Update);
    assert_eq!(peak, (Phase::Update, update, update));
    let at_mark = |x: &PhaseTotal| x.phase == Phase::Load || x.rss_bytes == peak.2;
    assert!(p.phases.iter().all(at_mark));
    // A single-token pass: the export outweighs the update.
    assert_eq!(plan(&plain(lora_qv(false), 1, 1)).peak_phase, Phase::Export);
}

#[test]
fn full_fine_tuning_and_bf16() {
    let p = plan(&plain(Tuning::Full, 2, 8));
    // Loading holds the original and the copies at once.
    let want = [
        ("trainable", 0),
        ("optimizer", 2 * P * 4),
        ("gradients", P * 4),
        ("load_buffers", P * 4),
    ];
    check(&p, &want);
    // A trainable head keeps lse and its [16, 512] probabilities (within 2^25 elements).
    let head = |p: &Plan| {
        let mut parts = p.activations.extra.iter();
        parts
            .find(|x| x.name.starts_with("LM head (fused)"))
            .unwrap()
            .size
            .bytes
    };
    assert_eq!(head(&p), 16 * 4 + 16 * 512 * 4);
    let mut big = plain(Tuning::Full, 2, 8);
    big.policy.dims.vocab = 1 << 22;
    assert_eq!(head(&plan(&big)), 16 * 4);
    // bf16: weights and micro-batch gradients halve, AdamW adds an f32 master copy.
    let halved = [
        ("weights", P * 2),
        ("master", P * 4),
        ("gradients", P * 2 + P * 4),
    ];
    check(&plan(&bf16(plain(Tuning::Full, 2, 8))), &halved);
    // AdamW's state of bf16 weights: the master as low halves, or bf16 moments and none.
    let state = |s: OptimizerState| {
        let p = plan(&Run {
            optimizer_state: s,
            ..bf16(plain(Tuning::Full, 2, 8))
        });
        let (m, o) = (p.bytes("master"), p.bytes("optimizer"));
        (m, o, p.bytes("checkpoint_buffers"), p.bytes("gradients"))
    };
    let (buffers, grads) = (2 * 32_768 * 4, P * 2 + P * 4);
    let master = (P * 4, 2 * P * 4, buffers + P * 12, grads);
    assert_eq!(state(OptimizerState::F32Master), master);
    let exact = (P * 2, 2 * P * 4, buffers + P * 10, grads);
    assert_eq!(state(OptimizerState::SplitMaster), exact);
    // PyTorch's layout: bf16 moments, no master, bf16 gradient sums.
    let torch = (0, 2 * P * 2, buffers + P * 4, P * 2 + P * 2);
    assert_eq!(state(OptimizerState::Bf16Moments), torch);
    // f32 weights: f32 moments and no master under each.
    let f32_torch = plan(&Run {
        optimizer_state: OptimizerState::Bf16Moments,
        ..plain(Tuning::Full, 2, 8)
    });
    assert_eq!(
        (f32_torch.bytes("master"), f32_torch.bytes("optimizer")),
        (0, 2 * P * 4)
    );
}

#[test]
fn grpo_reference_generation_and_merging() {
    let with = plan(&grpo(Tuning::Full, true));
    check(&with, &[("reference", P * 4)]);
    assert!(with.phase(Phase::Score).is_some() && with.phase(Phase::Generate).is_some());
    let without = plan(&grpo(Tuning::Full, false));
    check(&without, &[("reference", 0)]);
    assert!(without.phase(Phase::Score).is_none());
    // Shared prompts: 2 x 10 prompt tokens + 6 x 4 completion inputs; 30 head rows.
    let mb = &without.activations.micro_batch;
    assert_eq!((mb.tokens(), mb.head_rows), (44, 30));
    // f32 LoRA decodes the adapters itself (only the export merges); bf16 generates from a
    // merged copy.
    let phases = |p: &Plan| p.component("rollout_model").unwrap().phases.clone();
    assert_eq!(phases(&plan(&grpo(lora_qv(false), false))), [Phase::Export]);
    let merged = plan(&bf16(grpo(lora_qv(false), false)));
    check(&merged, &[("rollout_model", 12_288 * 2 + 3 * 4096 * 4)]);
    assert!(phases(&merged).contains(&Phase::Generate));
}

#[test]
fn checkpointing_keeps_layer_inputs_and_one_layer() {
    for run in [plain(lora_qv(false), 2, 8), grpo(Tuning::Full, true)] {
        let plain_p = plan(&run);
        let mut c = run.clone();
        c.gradient_checkpointing = true;
        let ckpt = plan(&c);
        let tokens = run.update.tokens() as u64;
        // One layer, both layers' inputs, the leaf copy and the recomputed input copy.
        let layers = plain_p.activations.layers.bytes / 2 + 4 * tokens * 64 * 4;
        assert_eq!(ckpt.activations.layers.bytes, layers);
        assert!(ckpt.bytes("activations") < plain_p.bytes("activations"));
        assert_eq!(ckpt.bytes("optimizer"), plain_p.bytes("optimizer"));
    }
}

#[test]
fn gguf_blocks_live_where_they_are_read() {
    // Live bytes the blocks add to each phase.
    let extra = |mut run: Run| -> Vec<(Phase, u64)> {
        let without = plan(&run);
        run.policy.decode_block_bytes = 50_000;
        let before = |ph| without.phase(ph).unwrap().live_bytes;
        let with = plan(&run).phases.into_iter();
        with.map(|x| (x.phase, x.live_bytes - before(x.phase)))
            .collect()
    };
    // Online LoRA decodes the frozen base from its blocks: kept throughout.
    let online = extra(grpo(lora_qv(false), false));
    assert!(online.iter().all(|&(_, b)| b == 50_000));
    // Full fine-tuning and runs that never decode: only while loading.
    for run in [grpo(Tuning::Full, true), plain(lora_qv(false), 2, 8)] {
        let at_load = |&(ph, b): &(Phase, u64)| b == if ph == Phase::Load { 50_000 } else { 0 };
        assert!(extra(run).iter().all(at_load));
    }
    // LoRA over the blocks themselves: the frozen matrices counted as blocks, no f32 copy.
    let mut r = plain(lora_qv(false), 2, 8);
    r.policy.frozen_blocks = (73_728, 40_000);
    check(&plan(&r), &[("weights", 40_000 + (P - 73_728) * 4)]);
}

#[test]
fn bad_shapes_are_errors() {
    let e = estimate(&plain(Tuning::Full, 0, 8), &ENV).unwrap_err();
    assert!(e.to_string().contains("per_device_train_batch_size"), "{e}");
    let mut z = plain(Tuning::Full, 1, 8);
    z.policy.dims.layers = 0;
    assert!(estimate(&z, &ENV).is_err());
}

#[test]
fn large_buffers_come_on_top_of_the_heap() {
    // A 65536 x 128 f32 embedding is 32 MiB: mapped fresh, as its AdamW moments, the
    // reference copy and the export's write buffer.
    let mut run = grpo(Tuning::Full, true);
    run.policy.dims.vocab = 65_536;
    run.policy.dims.hidden = 128;
    let embed = MMAP_THRESHOLD;
    let p = plan(&run);
    let fresh = |k: &str| p.component(k).unwrap().fresh_bytes;
    let keys = ["weights", "optimizer", "reference", "export_buffers"];
    assert_eq!(keys.map(fresh), [embed, 2 * embed, embed, embed]);
    let up = p.phase(Phase::Update).unwrap();
    assert_eq!(up.live_bytes - up.fresh_bytes, p.heap_high_water_bytes);
    // The export's buffer finds too little free heap (under twice its size): on top.
    let ex = p.phase(Phase::Export).unwrap();
    assert!(p.heap_high_water_bytes - (ex.live_bytes - ex.fresh_bytes) < 2 * embed);
    assert_eq!(ex.rss_bytes, p.heap_high_water_bytes + ex.fresh_bytes);
    assert!(p.phases.iter().all(|x| x.rss_bytes >= x.live_bytes));
}

#[test]
fn ppo_critic_by_hand() {
    let p = plan(&ppo(lora_qv(false), TINY, false));
    // The decoder and the [1, 64] score head; its own adapters; AdamW and the gradients also
    // over the head. Value pass: 28 tokens x NO_GRAD floats, the head's [10, 64] rows and 10
    // values. Its saved tensors count; its working set (head gradient, gradients in flight)
    // is under the policy's, which runs apart from it.
    let want = [
        ("critic_weights", (P + 64) * 4),
        ("critic_load_buffers", 1_000 + 32_768 * 4),
        ("critic_trainable", T * 4),
        ("critic_optimizer", 2 * (T + 64) * 4),
        ("critic_gradients", (T + 64) * 4),
        ("critic_values", 28 * NO_GRAD * 4 + 10 * 64 * 4 + 80),
        (
            "critic_activations",
            2 * 28 * FUSED_QV + 2 * 28 * 64 * 4 + 10 * 64 * 4 + 10 * 12,
        ),
        ("critic_checkpoint_buffers", 2 * (T + 64) * 4 + 2 * 256 * 4),
        ("critic_export", 12_288 * 4 + 3 * 4096 * 4 + 32_768 * 4),
    ];
    check(&p, &want);
    let a = p.critic_activations.as_ref().unwrap();
    assert_eq!(a.working_set.bytes, 10 * 64 * 4 + 28 * 640 * 4);
    let has = |ph: Phase, key: &str| p.component(key).unwrap().phases.contains(&ph);
    assert!(!has(Phase::CriticExport, "export_buffers") && !has(Phase::Export, "critic_export"));
    assert!(!has(Phase::Load, "critic_weights") && !has(Phase::CriticLoad, "critic_optimizer"));
    // Full fine-tuning, untied: a causal-LM critic keeps its lm_head without a gradient; a
    // sequence-classification one has none. bf16 adds its master copy.
    let pu = P + 32_768;
    let causal = plan(&ppo(Tuning::Full, UNTIED, false));
    let (weights, gradients) = ((pu + 64) * 4, (P + 64) * 4);
    check(
        &causal,
        &[("critic_weights", weights), ("critic_gradients", gradients)],
    );
    let headless = ppo(Tuning::Full, UNTIED, true);
    check(&plan(&headless), &[("critic_weights", (P + 64) * 4)]);
    check(&plan(&bf16(headless)), &[("critic_master", (P + 64) * 4)]);
    // Checkpointing covers the policy only; a smaller critic is planned with its own shape.
    let mut ck = ppo(Tuning::Full, UNTIED, false);
    ck.gradient_checkpointing = true;
    let unchanged = causal.bytes("critic_activations");
    check(&plan(&ck), &[("critic_activations", unchanged)]);
    let small = plan(&ppo(lora_qv(false), ModelDims { layers: 1, ..TINY }, false));
    assert_eq!(
        small.critic_activations.unwrap().layers.bytes,
        28 * FUSED_QV
    );
}

#[test]
fn score_models_and_reward_models() {
    // The reward-model trainer: no LM head (untied one dropped), a trainable [1, 64] head.
    let mut rm = plain(lora_qv(false), 4, 9);
    rm.policy = model(UNTIED, true, true);
    rm.update.head_rows = 4;
    let p = plan(&rm);
    let counts = (p.parameters as u64, p.trainable_parameters as u64);
    assert_eq!(counts, (P + 64, T + 64));
    assert_eq!(p.activations.head, HeadKernel::Score);
    assert!(p
        .activations
        .extra
        .iter()
        .all(|x| !x.name.contains("LM head")));
    // A reward as a reward: its weights in every phase, a scoring pass of 8 x 15 tokens.
    let mut run = grpo(Tuning::Full, true);
    let (name, model, rows, tokens) = ("rm".to_string(), model(TINY, true, true), 8, 15);
    run.reward_models = vec![RewardScorer {
        name,
        model,
        rows,
        tokens,
    }];
    let (p, q) = (plan(&run), plan(&grpo(Tuning::Full, true)));
    let added = |x: &PhaseTotal| p.phase(x.phase).unwrap().live_bytes - x.live_bytes;
    assert!(q.phases.iter().all(|x| added(x) == (P + 64) * 4));
    check(
        &p,
        &[("reward_model_pass", 120 * NO_GRAD * 4 + 8 * 8 + 8 * 64 * 4)],
    );
    assert!(q.phase(Phase::Reward).is_none() && p.phase(Phase::Reward).is_some());
}

#[test]
fn suggestions_search_levers_then_pairs() {
    let change = |s: &str, t: bool| Change {
        change: s.into(),
        sets: vec![s.into()],
        changes_training: t,
    };
    // Each setting lowers the total by its number; "big" only with "b".
    let total = |sets: &[String]| -> Result<u64, ()> {
        let cut = |s: &String| {
            s.trim_start_matches(char::is_alphabetic)
                .parse()
                .unwrap_or(0)
        };
        Ok(100 - sets.iter().map(cut).sum::<u64>())
    };
    let levers = |_: &[String]| {
        let a = vec![change("a5", false), change("a20", false)];
        vec![a, vec![change("b30", true)]]
    };
    // The mildest setting of each lever that fits.
    let s = suggest(100, 85, levers, total).unwrap();
    let fits: Vec<_> = s
        .iter()
        .map(|x| (x.change.as_str(), x.total_bytes))
        .collect();
    assert_eq!(fits, [("a20", 80), ("b30", 70)]);
    // None fits alone: the strongest of one with the mildest of a later one.
    let s = suggest(100, 55, levers, total).unwrap();
    let pair = (s[0].sets.clone(), s[0].total_bytes, s[0].changes_training);
    assert_eq!(pair, (vec!["a20".to_string(), "b30".into()], 50, true));
    assert!(suggest(100, 1, levers, total).unwrap().is_empty());
}
