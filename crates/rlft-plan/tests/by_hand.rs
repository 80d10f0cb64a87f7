//! The plan's arithmetic on a tiny model, by hand: vocab 512, hidden 64, intermediate 128, 2
//! layers, 4 / 2 heads of 16 (q_dim 64, kv_dim 32), tied, no biases: 106816 parameters; LoRA
//! r=4 on q and v: 1792.

use rlft_plan::formulas::*;
use rlft_plan::*;

fn tiny() -> ModelDims {
    ModelDims {
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
    }
}

fn model(dims: ModelDims) -> Model {
    Model {
        dims,
        score_head: false,
        headless: false,
        source_file_bytes: 1_000,
        decode_block_bytes: 0,
        frozen_blocks: (0, 0),
    }
}

fn lora_qv() -> Tuning {
    Tuning::Lora(LoraShape {
        r: 4,
        modules: vec!["self_attn.q_proj", "self_attn.v_proj"],
        dropout: false,
    })
}

const ENV: Environment = Environment {
    baseline_bytes: 1_000_000,
};
const P: u64 = 106_816;
const T: u64 = 1_792;
/// Fused f32 per token per layer: 4 x (6 h + 3 q + 3 kv + 3 i) + x A^T of q and v (4 x 2 r).
const FUSED_QV: u64 = 4 * (6 * 64 + 3 * 64 + 3 * 32 + 3 * 128) + 4 * 8;

/// SFT-like: `micro` rows of `tokens` inputs, the head over all of them.
fn plain(tuning: Tuning, micro: usize, tokens: usize) -> Run {
    Run::new(
        model(tiny()),
        tuning,
        micro,
        MicroBatch::plain("rows", micro, tokens, micro * tokens),
    )
}

/// GRPO-like: 3 prompts of 10 tokens x 4 completions of 5, micro-batches of 6 in shared
/// prompt passes (2 prompts each); a reference copy with full fine-tuning when `beta`.
fn grpo(tuning: Tuning, beta: bool) -> Run {
    let copy = beta && tuning == Tuning::Full;
    Run {
        unit: "completions",
        micro_batch: 6,
        update: MicroBatch::shared(2, 10, 6, 5),
        scored: beta.then(|| "reference".into()),
        reference: Some(Reference {
            copy,
            detail: String::new(),
        }),
        generation: Some(Generation {
            prompts: 3,
            per_prompt: 4,
            prompt_tokens: 10,
            new_tokens: 5,
        }),
        ..plain(tuning, 6, 1)
    }
}

#[test]
fn parameters_and_caches() {
    let d = tiny();
    // Per layer: q 64x64 + k 32x64 + v 32x64 + o 64x64 + 3 x 128x64 + two norms of 64.
    assert_eq!(d.num_parameters() as u64, 32_768 + 2 * 36_992 + 64);
    assert_eq!(d.largest_tensor(), 32_768);
    // LoRA r=4 on q (64 -> 64) and v (64 -> 32): 4 x (64 + 64) + 4 x (64 + 32) per layer.
    assert_eq!(d.trainable_tensors(&lora_qv()).iter().sum::<u64>(), T);
    assert_eq!(
        d.adapted(&lora_qv()),
        [(64, 64), (32, 64), (64, 64), (32, 64)]
    );
    assert_eq!(kv_cache_bytes(&d, 16, 100, 4), 16 * 2 * 2 * 32 * 100 * 4);
    // 2 prompts of 10 x 4 samples, 6 new: KV 8 rows x 2 layers x 2 x 32 x 16 x 4, two [8, 512]
    // f32 logits, and the prefill's 20 tokens x (4 h + 2 q + 2 kv + 2 i) floats.
    let g = Generation {
        prompts: 2,
        per_prompt: 4,
        prompt_tokens: 10,
        new_tokens: 6,
    };
    assert_eq!(generation(&d, &g, 4).bytes, 65_536 + 32_768 + 56_320);
}

#[test]
fn per_token_figures() {
    let d = tiny();
    assert_eq!(
        layer_bytes_per_token(&d, Kernels::Fused, &lora_qv()),
        FUSED_QV
    );
    let Tuning::Lora(l) = lora_qv() else {
        unreachable!()
    };
    let drop = Tuning::Lora(LoraShape { dropout: true, ..l });
    // Dropout: an f32 mask per adapted input (64 + 64).
    assert_eq!(
        layer_bytes_per_token(&d, Kernels::Fused, &drop),
        FUSED_QV + 128 * 4
    );
    // Composite, full: 40 h + 18 q + 15 kv + 8 i; scores apart, 26 bytes each.
    let comp = layer_bytes_per_token(&d, Kernels::Composite, &Tuning::Full);
    assert_eq!(comp, 40 * 64 + 18 * 64 + 15 * 32 + 8 * 128);
    let mut r = plain(Tuning::Full, 2, 8);
    r.bf16 = true;
    let a = estimate(&r, &ENV).unwrap().activations;
    // 2 layers x (16 tokens x comp + 2 rows x 4 heads x 8 x 8 scores x 26).
    assert_eq!(a.layers.bytes, 2 * (16 * comp + 512 * 26));
    assert_eq!(
        (a.kernels, a.head, a.layers.fresh_bytes),
        (Kernels::Composite, HeadKernel::Chunked, 0)
    );
}

#[test]
fn sft_lora_components_by_hand() {
    let p = estimate(&plain(lora_qv(), 2, 8), &ENV).unwrap();
    assert_eq!((p.parameters as u64, p.trainable_parameters as u64), (P, T));
    assert_eq!(p.bytes("weights"), P * 4);
    assert_eq!(p.bytes("trainable"), T * 4);
    assert_eq!(p.bytes("optimizer"), 2 * T * 4);
    // One f32 micro-batch: its gradients are the sums; with accumulation, a second set.
    assert_eq!(p.bytes("gradients"), T * 4);
    let mut acc = plain(lora_qv(), 2, 8);
    acc.accumulation = 2;
    assert_eq!(estimate(&acc, &ENV).unwrap().bytes("gradients"), 2 * T * 4);
    assert!(p.component("reference").is_none());
    // Loading: the 1000-byte file plus the embedding in f32.
    assert_eq!(p.bytes("load_buffers"), 1_000 + 32_768 * 4);
    // Layers 2 x 16 tokens; embeddings, final norm, head rows and the frozen head's input
    // gradient [16, 64]; the head's forward block [16, 512] + [16, 64]; gradients in flight
    // 16 x (3 i + 4 h) floats.
    let acts = 2 * 16 * FUSED_QV + 4 * 4096 + (16 * 512 + 16 * 64) * 4 + 16 * 640 * 4;
    assert_eq!(p.bytes("activations"), acts);
    // Export: merge_lora's 3 f32 buffers of q (64 x 64) and the embedding's write buffer. A
    // checkpoint copies m and v and writes the largest adapter (4 x 64) through two buffers.
    assert_eq!(p.bytes("rollout_model"), 3 * 4096 * 4);
    assert_eq!(p.bytes("export_buffers"), 32_768 * 4);
    assert_eq!(p.bytes("checkpoint_buffers"), 2 * T * 4 + 2 * 256 * 4);
    let base = 1_000_000 + P * 4 + T * 4;
    let live = |ph: Phase| p.phase(ph).unwrap().live_bytes;
    assert_eq!(live(Phase::Load), base + 1_000 + 32_768 * 4);
    assert_eq!(live(Phase::Update), base + 3 * T * 4 + acts);
    // No buffer reaches the mmap threshold: every phase after loading sits at the heap's
    // high-water mark, the update's.
    assert_eq!(
        (p.peak_phase, p.total_bytes, p.heap_high_water_bytes),
        (Phase::Update, live(Phase::Update), live(Phase::Update))
    );
    assert!(p
        .phases
        .iter()
        .all(|x| x.phase == Phase::Load || x.rss_bytes == p.heap_high_water_bytes));
    // A single-token pass: the export outweighs the update.
    assert_eq!(
        estimate(&plain(lora_qv(), 1, 1), &ENV).unwrap().peak_phase,
        Phase::Export
    );
}

#[test]
fn full_fine_tuning_and_bf16() {
    let p = estimate(&plain(Tuning::Full, 2, 8), &ENV).unwrap();
    assert_eq!(
        (
            p.bytes("trainable"),
            p.bytes("optimizer"),
            p.bytes("gradients")
        ),
        (0, 2 * P * 4, P * 4)
    );
    // Loading holds the original and the copies at once.
    assert_eq!(p.bytes("load_buffers"), P * 4);
    // A trainable head keeps lse and its [16, 512] probabilities (within 2^25 elements).
    let head = |p: &Plan| {
        p.activations
            .extra
            .iter()
            .find(|x| x.name.starts_with("LM head (fused)"))
            .unwrap()
            .clone()
    };
    assert_eq!(head(&p).size.bytes, 16 * 4 + 16 * 512 * 4);
    let mut big = plain(Tuning::Full, 2, 8);
    big.policy.dims.vocab = 1 << 22;
    assert_eq!(head(&estimate(&big, &ENV).unwrap()).size.bytes, 16 * 4);
    // bf16: weights and micro-batch gradients halve, AdamW adds an f32 master copy.
    let mut r = plain(Tuning::Full, 2, 8);
    r.bf16 = true;
    let b = estimate(&r, &ENV).unwrap();
    assert_eq!(
        (b.bytes("weights"), b.bytes("master"), b.bytes("gradients")),
        (P * 2, P * 4, P * 2 + P * 4)
    );
}

#[test]
fn grpo_reference_generation_and_merging() {
    let with = estimate(&grpo(Tuning::Full, true), &ENV).unwrap();
    assert_eq!(with.bytes("reference"), P * 4);
    assert!(with.phase(Phase::Score).is_some() && with.phase(Phase::Generate).is_some());
    let without = estimate(&grpo(Tuning::Full, false), &ENV).unwrap();
    assert_eq!(without.bytes("reference"), 0);
    assert!(without.phase(Phase::Score).is_none());
    // Shared prompts: 2 x 10 prompt tokens + 6 x 4 completion inputs; 30 head rows.
    assert_eq!(
        (
            without.activations.micro_batch.tokens(),
            without.activations.micro_batch.head_rows
        ),
        (44, 30)
    );
    // f32 LoRA decodes the adapters itself (only the export merges); bf16 generates from a
    // merged copy.
    let mut r = grpo(lora_qv(), false);
    assert_eq!(
        estimate(&r, &ENV)
            .unwrap()
            .component("rollout_model")
            .unwrap()
            .phases,
        [Phase::Export]
    );
    r.bf16 = true;
    let b = estimate(&r, &ENV).unwrap();
    assert_eq!(b.bytes("rollout_model"), 12_288 * 2 + 3 * 4096 * 4);
    assert!(b
        .component("rollout_model")
        .unwrap()
        .phases
        .contains(&Phase::Generate));
}

#[test]
fn checkpointing_keeps_layer_inputs_and_one_layer() {
    for run in [plain(lora_qv(), 2, 8), grpo(Tuning::Full, true)] {
        let plain_p = estimate(&run, &ENV).unwrap();
        let mut c = run.clone();
        c.gradient_checkpointing = true;
        let ckpt = estimate(&c, &ENV).unwrap();
        let tokens = run.update.tokens() as u64;
        // One layer, both layers' inputs, the leaf copy and the recomputed input copy.
        assert_eq!(
            ckpt.activations.layers.bytes,
            plain_p.activations.layers.bytes / 2 + 4 * tokens * 64 * 4
        );
        assert!(ckpt.bytes("activations") < plain_p.bytes("activations"));
        assert_eq!(ckpt.bytes("optimizer"), plain_p.bytes("optimizer"));
    }
}

#[test]
fn gguf_blocks_live_where_they_are_read() {
    let extra = |mut run: Run| -> Vec<(Phase, u64)> {
        let without = estimate(&run, &ENV).unwrap();
        run.policy.decode_block_bytes = 50_000;
        let with = estimate(&run, &ENV).unwrap();
        with.phases
            .iter()
            .map(|x| {
                (
                    x.phase,
                    x.live_bytes - without.phase(x.phase).unwrap().live_bytes,
                )
            })
            .collect()
    };
    // Online LoRA decodes the frozen base from its blocks: kept throughout.
    assert!(extra(grpo(lora_qv(), false))
        .iter()
        .all(|&(_, b)| b == 50_000));
    // Full fine-tuning and runs that never decode: only while loading.
    for run in [grpo(Tuning::Full, true), plain(lora_qv(), 2, 8)] {
        assert!(extra(run)
            .iter()
            .all(|&(ph, b)| b == if ph == Phase::Load { 50_000 } else { 0 }));
    }
    // LoRA over the blocks themselves: the frozen matrices counted as blocks, no f32 copy.
    let mut r = plain(lora_qv(), 2, 8);
    r.policy.frozen_blocks = (73_728, 40_000);
    assert_eq!(
        estimate(&r, &ENV).unwrap().bytes("weights"),
        40_000 + (P - 73_728) * 4
    );
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
    let p = estimate(&run, &ENV).unwrap();
    let fresh = |k: &str| p.component(k).unwrap().fresh_bytes;
    assert_eq!(
        (
            fresh("weights"),
            fresh("optimizer"),
            fresh("reference"),
            fresh("export_buffers")
        ),
        (embed, 2 * embed, embed, embed)
    );
    let up = p.phase(Phase::Update).unwrap();
    assert_eq!(up.live_bytes - up.fresh_bytes, p.heap_high_water_bytes);
    // The export's buffer finds too little free heap (under twice its size): on top.
    let ex = p.phase(Phase::Export).unwrap();
    assert!(p.heap_high_water_bytes - (ex.live_bytes - ex.fresh_bytes) < 2 * embed);
    assert_eq!(ex.rss_bytes, p.heap_high_water_bytes + ex.fresh_bytes);
    assert!(p.phases.iter().all(|x| x.rss_bytes >= x.live_bytes));
}

/// PPO: 2 prompts x 1 completion, micro-batch 2, plain rows of 10 + 5 - 1 tokens, an
/// old-policy pass, a critic of `dims` over the same rows.
fn ppo(tuning: Tuning, dims: ModelDims, headless: bool) -> Run {
    let update = MicroBatch::plain("rows", 2, 14, 10);
    Run {
        micro_batch: 2,
        update: update.clone(),
        scored: Some("old".into()),
        generation: Some(Generation {
            prompts: 2,
            per_prompt: 1,
            prompt_tokens: 10,
            new_tokens: 5,
        }),
        critic: Some(Critic {
            model: Model {
                score_head: true,
                headless,
                ..model(dims)
            },
            update,
        }),
        ..plain(tuning, 2, 1)
    }
}

#[test]
fn ppo_critic_by_hand() {
    let p = estimate(&ppo(lora_qv(), tiny(), false), &ENV).unwrap();
    // The decoder and the [1, 64] score head; its own adapters; AdamW and the gradients also
    // over the head.
    assert_eq!(p.bytes("critic_weights"), (P + 64) * 4);
    assert_eq!(p.bytes("critic_load_buffers"), 1_000 + 32_768 * 4);
    assert_eq!(p.bytes("critic_trainable"), T * 4);
    assert_eq!(
        (p.bytes("critic_optimizer"), p.bytes("critic_gradients")),
        (2 * (T + 64) * 4, (T + 64) * 4)
    );
    // Value pass: 28 tokens x (4 h + 2 q + 2 kv + 3 i) floats, the head's [10, 64] rows and
    // 10 values.
    assert_eq!(
        p.bytes("critic_values"),
        28 * (4 * 64 + 2 * 64 + 2 * 32 + 3 * 128) * 4 + 10 * 64 * 4 + 80
    );
    // Its saved tensors count; its working set (head gradient, gradients in flight) is under
    // the policy's, which runs apart from it.
    let a = p.critic_activations.as_ref().unwrap();
    assert_eq!(a.working_set.bytes, 10 * 64 * 4 + 28 * 640 * 4);
    assert_eq!(
        p.bytes("critic_activations"),
        2 * 28 * FUSED_QV + 2 * 28 * 64 * 4 + 10 * 64 * 4 + 10 * 12
    );
    assert_eq!(
        p.bytes("critic_checkpoint_buffers"),
        2 * (T + 64) * 4 + 2 * 256 * 4
    );
    assert_eq!(
        p.bytes("critic_export"),
        12_288 * 4 + 3 * 4096 * 4 + 32_768 * 4
    );
    let has = |ph: Phase, key: &str| p.component(key).unwrap().phases.contains(&ph);
    assert!(!has(Phase::CriticExport, "export_buffers") && !has(Phase::Export, "critic_export"));
    assert!(!has(Phase::Load, "critic_weights") && !has(Phase::CriticLoad, "critic_optimizer"));
    // Full fine-tuning, untied: a causal-LM critic keeps its lm_head without a gradient; a
    // sequence-classification one has none. bf16 adds its master copy.
    let d = ModelDims {
        tied_embeddings: false,
        ..tiny()
    };
    let pu = P + 32_768;
    let causal = estimate(&ppo(Tuning::Full, d, false), &ENV).unwrap();
    assert_eq!(
        (
            causal.bytes("critic_weights"),
            causal.bytes("critic_gradients")
        ),
        ((pu + 64) * 4, (P + 64) * 4)
    );
    assert_eq!(
        estimate(&ppo(Tuning::Full, d, true), &ENV)
            .unwrap()
            .bytes("critic_weights"),
        (P + 64) * 4
    );
    let mut b = ppo(Tuning::Full, d, true);
    b.bf16 = true;
    assert_eq!(
        estimate(&b, &ENV).unwrap().bytes("critic_master"),
        (P + 64) * 4
    );
    // Checkpointing covers the policy only; a smaller critic is planned with its own shape.
    let mut ck = ppo(Tuning::Full, d, false);
    ck.gradient_checkpointing = true;
    assert_eq!(
        estimate(&ck, &ENV).unwrap().bytes("critic_activations"),
        causal.bytes("critic_activations")
    );
    let small = estimate(
        &ppo(
            lora_qv(),
            ModelDims {
                layers: 1,
                ..tiny()
            },
            false,
        ),
        &ENV,
    )
    .unwrap();
    assert_eq!(
        small.critic_activations.unwrap().layers.bytes,
        28 * FUSED_QV
    );
}

#[test]
fn score_models_and_reward_models() {
    // The reward-model trainer: no LM head (untied one dropped), a trainable [1, 64] head.
    let mut rm = plain(lora_qv(), 4, 9);
    rm.policy = Model {
        score_head: true,
        headless: true,
        ..model(ModelDims {
            tied_embeddings: false,
            ..tiny()
        })
    };
    rm.update.head_rows = 4;
    let p = estimate(&rm, &ENV).unwrap();
    assert_eq!(
        (p.parameters as u64, p.trainable_parameters as u64),
        (P + 64, T + 64)
    );
    assert_eq!(p.activations.head, HeadKernel::Score);
    assert!(p
        .activations
        .extra
        .iter()
        .all(|x| !x.name.contains("LM head")));
    // A reward as a reward: its weights in every phase, a scoring pass of 8 x 15 tokens.
    let mut run = grpo(Tuning::Full, true);
    let scorer = Model {
        score_head: true,
        headless: true,
        ..model(tiny())
    };
    run.reward_models = vec![RewardScorer {
        name: "rm".into(),
        model: scorer,
        rows: 8,
        tokens: 15,
    }];
    let (p, q) = (
        estimate(&run, &ENV).unwrap(),
        estimate(&grpo(Tuning::Full, true), &ENV).unwrap(),
    );
    for x in &q.phases {
        assert_eq!(
            p.phase(x.phase).unwrap().live_bytes - x.live_bytes,
            (P + 64) * 4
        );
    }
    let pass = 120 * (4 * 64 + 2 * 64 + 2 * 32 + 3 * 128) * 4 + 8 * 8 + 8 * 64 * 4;
    assert_eq!(p.bytes("reward_model_pass"), pass);
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
                .parse::<u64>()
                .unwrap_or(0)
        };
        Ok(100 - sets.iter().map(cut).sum::<u64>())
    };
    let levers = |_: &[String]| {
        vec![
            vec![change("a5", false), change("a20", false)],
            vec![change("b30", true)],
        ]
    };
    // The mildest setting of each lever that fits.
    let s = suggest(100, 85, levers, total).unwrap();
    assert_eq!(
        s.iter()
            .map(|x| (x.change.as_str(), x.total_bytes))
            .collect::<Vec<_>>(),
        [("a20", 80), ("b30", 70)]
    );
    // None fits alone: the strongest of one with the mildest of a later one.
    let s = suggest(100, 55, levers, total).unwrap();
    assert_eq!(
        (s[0].sets.clone(), s[0].total_bytes, s[0].changes_training),
        (vec!["a20".to_string(), "b30".into()], 50, true)
    );
    assert!(suggest(100, 1, levers, total).unwrap().is_empty());
}
