//! The plan's arithmetic on a tiny model, by hand.

use super::activations::{layer_saved, layer_size};
use super::*;

/// vocab 512, hidden 64, intermediate 128, 2 layers, 4 heads / 2 kv heads of 16: q_dim 64,
/// kv_dim 32; tied embeddings, no biases, no q/k norms.
pub(super) fn tiny() -> ModelDims {
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

pub(super) fn lora_qv() -> Tuning {
    Tuning::Lora(LoraShape {
        r: 4,
        modules: vec!["self_attn.q_proj", "self_attn.v_proj"],
        dropout: false,
    })
}

fn sft(tuning: Tuning, micro: usize, example_tokens: usize) -> RunShape {
    RunShape {
        bf16: false,
        tuning,
        micro_batch: micro,
        accumulation: 1,
        gradient_checkpointing: false,
        workload: Workload::Sft(SftShape {
            example_tokens,
            eval: false,
        }),
    }
}

pub(super) const ENV: Environment = Environment {
    baseline_bytes: 1_000_000,
    source_file_bytes: 1_000,
    decode_block_bytes: 0,
    frozen_blocks: (0, 0),
};

#[test]
fn parameter_counts() {
    let d = tiny();
    // Linears per layer: q 64x64 + k 32x64 + v 32x64 + o 64x64 + 3 x 128x64 = 36864; two norms
    // of 64: 36992 per layer. Embedding 512 x 64 = 32768 (tied head), final norm 64.
    assert_eq!(d.layer_params(), 36_992);
    assert_eq!(d.num_parameters(), 32_768 + 2 * 36_992 + 64);
    assert_eq!(d.largest_tensor(), 32_768);
    // LoRA r=4 on q (64 -> 64) and v (64 -> 32): 4 x (64 + 64) + 4 x (64 + 32) = 896 per layer.
    assert_eq!(lora_qv().trainable_params(&d), 2 * 896);
    // Merging copies q and v: 4096 + 2048 per layer.
    assert_eq!(lora_qv().merged_params(&d), 2 * 6144);
    assert_eq!(Tuning::Full.trainable_params(&d), d.num_parameters());
    // The same counts as the model config, for every family (biases, q/k norms, untied heads).
    for fam in [
        rlft_model::Family::Llama,
        rlft_model::Family::Qwen2,
        rlft_model::Family::Qwen3,
    ] {
        let c = rlft_model::tiny::tiny_config(fam);
        assert_eq!(
            ModelDims::from_config(&c).num_parameters(),
            c.num_parameters(),
            "{fam:?}"
        );
    }
}

#[test]
fn kv_cache_and_generation() {
    let d = tiny();
    // 16 rows x 2 layers x 2 (k, v) x 32 x 100 positions x 4 bytes.
    assert_eq!(kv_cache_bytes(&d, 16, 100, 4), 16 * 2 * 2 * 32 * 100 * 4);
    // 2 prompts of 10 tokens x 4 samples, 6 new tokens: KV of 8 rows x 2 layers x 2 x 32 x 16
    // positions x 4 bytes (65536),
    // two [8, 512] f32 logits (32768), and the larger of the prefill buffers (20 tokens x
    // (4*64 + 2*64 + 2*32 + 2*128) floats = 56320) and the prompts' caches (2 x 2 x 2 x 32 x 10
    // x 4 = 10240).
    assert_eq!(
        generation(&d, 2, 4, 10, 6, 4).bytes,
        65_536 + 32_768 + 56_320
    );
}

#[test]
fn layer_activations_per_token() {
    let d = tiny();
    // Fused f32: 6 h + 3 q_dim + 3 kv_dim + 3 intermediate floats = 384 + 192 + 96 + 384 =
    // 1056 floats = 4224 bytes per token.
    let fused = layer_saved(&d, Kernels::Fused, &lora_qv());
    assert_eq!(fused.iter().map(|t| t.bytes_per_token).sum::<usize>(), 4224);
    assert!(fused.iter().all(|t| t.bytes_per_score == 0));
    // Dropout adds one f32 mask per adapted module input (64 + 64).
    let drop = Tuning::Lora(LoraShape {
        dropout: true,
        ..match lora_qv() {
            Tuning::Lora(l) => l,
            Tuning::Full => unreachable!(),
        }
    });
    let with_masks: usize = layer_saved(&d, Kernels::Fused, &drop)
        .iter()
        .map(|t| t.bytes_per_token)
        .sum();
    assert_eq!(with_masks, 4224 + 128 * 4);
    // Composite bf16, full fine-tuning: two norms of 16 bytes x h, projections 2 bytes x
    // (q + k + v), RoPE 4.5 x 2 bytes x (q_dim + kv_dim), v's contiguous copy 2 x kv_dim,
    // attention out and its copy 2 x 2 x q_dim, residual path 2 x 2 x 4 h (o out, residual,
    // down out, residual), MLP 4 x 2 x I; and 26 bytes per score.
    let comp = layer_saved(&d, Kernels::Composite, &Tuning::Full);
    let per_token: usize = comp.iter().map(|t| t.bytes_per_token).sum();
    let want =
        2 * 16 * 64 + 2 * (64 + 32 + 32) + 9 * (64 + 32) + 2 * 32 + 4 * 64 + 8 * 64 + 8 * 128;
    assert_eq!(per_token, want);
    assert_eq!(comp.iter().map(|t| t.bytes_per_score).sum::<usize>(), 26);
    // Scores count rows x heads x tokens x keys: 2 rows x 4 heads x 8 x 8 = 512.
    let pass = [Pass {
        name: "x",
        rows: 2,
        tokens: 8,
        keys: 8,
    }];
    let size = layer_size(&d, &comp, &pass);
    assert_eq!(size.bytes, 16 * want as u64 + 512 * 26);
    // All far below the mmap threshold: nothing fresh.
    assert_eq!(size.fresh_bytes, 0);
}

#[test]
fn sft_lora_components_by_hand() {
    let d = tiny();
    // Micro-batch of 2 examples of 9 tokens: 8 inputs each, 16 tokens, 16 head rows.
    let run = sft(lora_qv(), 2, 9);
    let p = estimate(&d, &run, &ENV).unwrap();
    let params = 106_816u64;
    let t = 1_792u64;
    assert_eq!(p.parameters as u64, params);
    assert_eq!(p.trainable_parameters as u64, t);
    assert_eq!(p.bytes("weights"), params * 4);
    assert_eq!(p.bytes("trainable"), t * 4);
    assert_eq!(p.bytes("optimizer"), 2 * t * 4);
    // One f32 micro-batch: its gradients are the sums; with accumulation, a second set.
    assert_eq!(p.bytes("gradients"), t * 4);
    let mut accumulated = sft(lora_qv(), 2, 9);
    accumulated.accumulation = 2;
    let a = estimate(&d, &accumulated, &ENV).unwrap();
    assert_eq!(a.bytes("gradients"), t * 4 + t * 4);
    assert!(p.component("reference").is_none());
    // Loading: the 1000-byte file plus the 512 x 64 embedding in f32.
    assert_eq!(p.bytes("load_buffers"), 1_000 + 32_768 * 4);
    // Activations: layers 2 x 16 tokens x 4224; embeddings, final norm, head input rows and
    // the frozen head's [16, 64] input gradient: 4 x 16 x 64 x 4; the head's forward block
    // [16, 512] + [16, 64] floats; gradients in flight 16 x (3 x 128 + 4 x 64) floats.
    let acts = 2 * 16 * 4224 + 4 * 4096 + (16 * 512 + 16 * 64) * 4 + 16 * 640 * 4;
    assert_eq!(p.activations.total.bytes, acts);
    assert_eq!(p.bytes("activations"), acts);
    // Export: the merge's f32 temporaries of one tensor at a time (3 x the largest adapted
    // linear, q's 64 x 64), and the embedding's write buffer.
    assert_eq!(p.bytes("rollout_model"), 3 * 4096 * 4);
    assert_eq!(p.bytes("export_buffers"), 32_768 * 4);
    // A checkpoint copies m and v and writes the largest adapter (4 x 64) through two buffers.
    assert_eq!(p.bytes("checkpoint_buffers"), 2 * t * 4 + 2 * 256 * 4);
    let base = 1_000_000 + params * 4 + t * 4;
    let phase = |ph: Phase| p.phase(ph).unwrap().live_bytes;
    assert_eq!(phase(Phase::Load), base + 1_000 + 32_768 * 4);
    assert_eq!(phase(Phase::Update), base + 2 * t * 4 + t * 4 + acts);
    assert_eq!(
        phase(Phase::Export),
        base + 2 * t * 4 + 3 * 4096 * 4 + 32_768 * 4
    );
    // The update is the largest phase. No buffer reaches the
    // mmap threshold, so every phase after loading sits at the heap's high-water mark, the
    // largest phase total.
    assert_eq!(p.peak_phase, Phase::Update);
    assert_eq!(p.total_bytes, phase(Phase::Update));
    assert_eq!(p.heap_high_water_bytes, phase(Phase::Update));
    assert!(p
        .phases
        .iter()
        .all(|x| x.phase == Phase::Load || x.rss_bytes == p.heap_high_water_bytes));
    // With a single-token example pass, the export's buffers outweigh the update.
    let short = estimate(&d, &sft(lora_qv(), 1, 2), &ENV).unwrap();
    assert_eq!(short.peak_phase, Phase::Export);
}

#[test]
fn full_fine_tuning_keeps_copies() {
    let d = tiny();
    let p = estimate(&d, &sft(Tuning::Full, 2, 9), &ENV).unwrap();
    let params = 106_816u64;
    // Trainable copies replace the weights; the SFT trainer frees the loaded ones.
    assert_eq!(p.bytes("trainable"), 0);
    assert_eq!(p.bytes("reference"), 0);
    assert_eq!(p.bytes("optimizer"), 2 * params * 4);
    assert_eq!(p.bytes("gradients"), params * 4);
    // Loading holds the original and the copies at once.
    assert_eq!(p.bytes("load_buffers"), params * 4);
    // bf16: weights and gradients halve, AdamW adds an f32 master copy.
    let mut r = sft(Tuning::Full, 2, 9);
    r.bf16 = true;
    let b = estimate(&d, &r, &ENV).unwrap();
    assert_eq!(b.bytes("weights"), params * 2);
    assert_eq!(b.bytes("master"), params * 4);
    assert_eq!(b.bytes("gradients"), params * 2 + params * 4);
    assert_eq!(b.activations.kernels, Kernels::Composite);
    assert_eq!(b.activations.head, HeadKernel::Chunked);
}

pub(super) fn grpo(micro: usize, share: bool, beta: bool) -> RunShape {
    RunShape {
        bf16: false,
        tuning: Tuning::Full,
        micro_batch: micro,
        accumulation: 12 / micro,
        gradient_checkpointing: false,
        workload: Workload::Grpo(GrpoShape {
            num_generations: 4,
            rollout_prompts: 3,
            rollout_completions: 12,
            prompt_tokens: 10,
            completion_tokens: 5,
            reference: beta,
            old_logprobs: false,
            share_prompts: share,
            temperature_scaled: false,
            eval: None,
            critic: None,
            reward_models: Vec::new(),
            online_dpo: false,
        }),
    }
}

#[test]
fn grpo_passes_and_reference() {
    let d = tiny();
    // Groups of 4 in micro-batches of 6: [0, 6) spans prompts 0-1, [6, 12) prompts 1-2.
    assert_eq!(grpo(6, true, false).prompts_per_micro_batch(), 2);
    assert_eq!(grpo(4, true, false).prompts_per_micro_batch(), 1);
    assert_eq!(grpo(12, true, false).prompts_per_micro_batch(), 3);
    // Shared: 2 prompt rows of 10, then 6 completions of 4 inputs over 14 keys; 30 head rows.
    let (passes, rows, shared) = grpo(6, true, false).micro_batch_passes();
    assert_eq!(
        passes
            .iter()
            .map(|p| (p.rows, p.tokens, p.keys))
            .collect::<Vec<_>>(),
        [(2, 10, 10), (6, 4, 14)]
    );
    assert_eq!((rows, shared), (30, Some((6, 10))));
    // Unshared: 6 rows of prompt + completion - 1 = 14 tokens.
    let (passes, rows, shared) = grpo(6, false, false).micro_batch_passes();
    assert_eq!(passes[0].total_tokens(), 6 * 14);
    assert_eq!((rows, shared), (30, None));
    // beta > 0 with full fine-tuning: a reference copy and a no-grad pass.
    let p = estimate(&d, &grpo(6, true, true), &ENV).unwrap();
    assert_eq!(p.bytes("reference"), 106_816 * 4);
    assert!(p.phases.iter().any(|x| x.phase == Phase::Score));
    let p0 = estimate(&d, &grpo(6, true, false), &ENV).unwrap();
    assert_eq!(p0.bytes("reference"), 0);
    assert!(!p0.phases.iter().any(|x| x.phase == Phase::Score));
    // Sharing the prompt pass keeps fewer activations than prompt + completion rows.
    let unshared = estimate(&d, &grpo(6, false, false), &ENV).unwrap();
    assert!(p0.activations.layers.bytes < unshared.activations.layers.bytes);
}

#[test]
fn checkpointing_keeps_layer_inputs_and_one_layer() {
    let d = tiny();
    for run in [
        sft(lora_qv(), 2, 9),
        grpo(6, true, true),
        grpo(6, false, false),
    ] {
        let plain = estimate(&d, &run, &ENV).unwrap();
        let mut c = run.clone();
        c.gradient_checkpointing = true;
        let ckpt = estimate(&d, &c, &ENV).unwrap();
        let (passes, _, _) = run.micro_batch_passes();
        let tokens: u64 = passes.iter().map(|p| p.total_tokens() as u64).sum();
        let one_layer = plain.activations.layers.bytes / d.layers as u64;
        // Inputs of both layers, the leaf copy and the recomputed input copy: 4 x [tokens, 64].
        assert_eq!(
            ckpt.activations.layers.bytes,
            one_layer + (d.layers as u64 + 2) * tokens * 64 * 4
        );
        assert!(ckpt.bytes("activations") <= plain.bytes("activations"));
        // Everything else is unchanged.
        assert_eq!(ckpt.bytes("weights"), plain.bytes("weights"));
        assert_eq!(ckpt.bytes("optimizer"), plain.bytes("optimizer"));
    }
    // Suggested when activations make the run too big, as a change that keeps the training.
    let mut big = sft(Tuning::Full, 8, 512);
    big.accumulation = 1;
    let p = estimate(&d, &big, &ENV).unwrap();
    let mut c = big.clone();
    c.gradient_checkpointing = true;
    let fits = estimate(&d, &c, &ENV).unwrap().total_bytes;
    assert!(fits < p.total_bytes);
    let s = suggest(&d, &big, &ENV, fits).unwrap();
    let ck = s
        .iter()
        .find(|s| s.sets == ["gradient_checkpointing=true"])
        .expect("checkpointing suggested");
    assert!(!ck.changes_training);
    assert_eq!(ck.total_bytes, fits);
}

#[test]
fn lora_rollouts_merge_only_in_bf16() {
    let d = tiny();
    let mut run = grpo(6, true, false);
    run.tuning = lora_qv();
    // f32: the fused decoder adds the adapters as it decodes; only the export merges.
    let p = estimate(&d, &run, &ENV).unwrap();
    assert_eq!(
        p.component("rollout_model").unwrap().phases,
        [Phase::Export]
    );
    // bf16 generates from a merged copy.
    run.bf16 = true;
    let b = estimate(&d, &run, &ENV).unwrap();
    let phases = &b.component("rollout_model").unwrap().phases;
    assert!(phases.contains(&Phase::Generate) && phases.contains(&Phase::Eval));
}

#[test]
fn gguf_decode_blocks_live_where_they_are_read() {
    let d = tiny();
    let env = Environment {
        decode_block_bytes: 50_000,
        ..ENV
    };
    let phases = |run: &RunShape| -> Vec<(Phase, u64)> {
        let with = estimate(&d, run, &env).unwrap();
        let without = estimate(&d, run, &ENV).unwrap();
        assert_eq!(with.bytes("decode_blocks"), 50_000);
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
    // GRPO with LoRA: rollouts decode the frozen base from its blocks, kept throughout.
    let mut lora = grpo(6, true, false);
    lora.tuning = lora_qv();
    assert!(phases(&lora).iter().all(|&(_, extra)| extra == 50_000));
    // Full fine-tuning and SFT: only while loading.
    for run in [grpo(6, true, true), sft(lora_qv(), 2, 9)] {
        for (phase, extra) in phases(&run) {
            assert_eq!(
                extra,
                if phase == Phase::Load { 50_000 } else { 0 },
                "{phase:?}"
            );
        }
    }
    // bf16 loads keep no blocks.
    let mut bf16 = lora.clone();
    bf16.bf16 = true;
    assert!(estimate(&d, &bf16, &env)
        .unwrap()
        .component("decode_blocks")
        .is_none());
}

#[test]
fn suggestions_fit_the_budget() {
    let d = tiny();
    let run = sft(Tuning::Full, 8, 257);
    let total = estimate(&d, &run, &ENV).unwrap().total_bytes;
    // A budget a bit under the current total: a smaller micro-batch with more accumulation
    // (same batch) fits, and is offered first.
    let budget = total - total / 20;
    let s = suggest(&d, &run, &ENV, budget).unwrap();
    assert!(!s.is_empty());
    let first = &s[0];
    assert!(
        first
            .change
            .starts_with("per_device_train_batch_size 8 -> 4"),
        "{first:?}"
    );
    assert_eq!(
        first.sets,
        [
            "per_device_train_batch_size=4",
            "gradient_accumulation_steps=2"
        ]
    );
    assert!(first.total_bytes <= budget && !first.changes_training);
    let mut smaller = run.clone();
    smaller.micro_batch = 4;
    smaller.accumulation = 2;
    assert_eq!(
        first.total_bytes,
        estimate(&d, &smaller, &ENV).unwrap().total_bytes
    );
    // Every suggestion's total is within the budget; nothing fits in 1 byte.
    assert!(s.iter().all(|x| x.total_bytes <= budget));
    assert!(suggest(&d, &run, &ENV, 1).unwrap().is_empty());
}

#[test]
fn bad_shapes_are_errors() {
    let d = tiny();
    let e = estimate(&d, &sft(Tuning::Full, 0, 9), &ENV).unwrap_err();
    assert!(e.to_string().contains("per_device_train_batch_size"), "{e}");
    let mut z = tiny();
    z.layers = 0;
    assert!(estimate(&z, &sft(Tuning::Full, 1, 9), &ENV).is_err());
}

#[test]
fn large_buffers_come_on_top_of_the_heap() {
    // A 65536 x 128 f32 embedding is 32 MiB: at the mmap threshold, mapped fresh. So are its
    // AdamW moments, gradient, sums, reference copy and the export's write buffer.
    let d = ModelDims {
        vocab: 65_536,
        hidden: 128,
        ..tiny()
    };
    let embed = 65_536 * 128 * 4;
    assert_eq!(embed, MMAP_THRESHOLD);
    let run = grpo(6, true, true);
    let p = estimate(&d, &run, &ENV).unwrap();
    assert_eq!(p.component("weights").unwrap().fresh_bytes, embed);
    assert_eq!(p.component("optimizer").unwrap().fresh_bytes, 2 * embed);
    assert_eq!(p.component("reference").unwrap().fresh_bytes, embed);
    assert_eq!(p.component("export_buffers").unwrap().fresh_bytes, embed);
    for x in &p.phases {
        assert!(x.rss_bytes >= x.live_bytes, "{x:?}");
        if x.phase != Phase::Load {
            assert!(x.rss_bytes >= p.heap_high_water_bytes, "{x:?}");
        }
    }
    // The update holds the heap's high-water mark (activations and gradients); the export's
    // buffer finds too little free heap (less than twice its size) and is mapped on top:
    // RSS = high-water mark + every fresh buffer of the phase.
    let up = p.phase(Phase::Update).unwrap();
    assert_eq!(up.live_bytes - up.fresh_bytes, p.heap_high_water_bytes);
    let ex = p.phase(Phase::Export).unwrap();
    assert!(p.heap_high_water_bytes - (ex.live_bytes - ex.fresh_bytes) < 2 * embed);
    assert_eq!(ex.rss_bytes, p.heap_high_water_bytes + ex.fresh_bytes);
    assert!(ex.rss_bytes > ex.live_bytes);
}

#[test]
fn trainable_head_keeps_small_probabilities() {
    let head = |p: &Plan| {
        p.activations
            .extra
            .iter()
            .find(|x| x.name.starts_with("LM head (fused): log-sum-exp"))
            .map(|x| (x.name.clone(), x.size.bytes))
            .unwrap()
    };
    // 16 head rows of a 512 vocabulary: lse [16] and the probabilities [16, 512] (f32).
    let p = estimate(&tiny(), &sft(Tuning::Full, 2, 9), &ENV).unwrap();
    let (name, bytes) = head(&p);
    assert!(name.contains("probabilities"), "{name}");
    assert_eq!(bytes, 16 * 4 + 16 * 512 * 4);
    // 16 x 2^22 is over the 2^25 limit: the backward recomputes, only lse is kept.
    let mut d = tiny();
    d.vocab = 1 << 22;
    let p = estimate(&d, &sft(Tuning::Full, 2, 9), &ENV).unwrap();
    let (name, bytes) = head(&p);
    assert!(!name.contains("probabilities"), "{name}");
    assert_eq!(bytes, 16 * 4);
    // A frozen head (LoRA) keeps its input gradient, never the probabilities.
    let p = estimate(&tiny(), &sft(lora_qv(), 2, 9), &ENV).unwrap();
    assert!(p
        .activations
        .extra
        .iter()
        .all(|x| !x.name.contains("probabilities")));
}

/// PPO on the tiny model: 2 prompts x 1 completion per rollout, micro-batch 2, unshared rows of
/// 10 prompt + 5 completion tokens, an old-policy pass, a critic of the policy's shape.
fn ppo(tuning: Tuning, critic_dims: ModelDims, headless: bool) -> RunShape {
    RunShape {
        bf16: false,
        tuning,
        micro_batch: 2,
        accumulation: 1,
        gradient_checkpointing: false,
        workload: Workload::Grpo(GrpoShape {
            num_generations: 1,
            rollout_prompts: 2,
            rollout_completions: 2,
            prompt_tokens: 10,
            completion_tokens: 5,
            reference: false,
            old_logprobs: true,
            share_prompts: false,
            temperature_scaled: false,
            eval: None,
            critic: Some(CriticShape {
                dims: critic_dims,
                headless,
                source_file_bytes: 1_000,
                decode_block_bytes: 0,
            }),
            reward_models: Vec::new(),
            online_dpo: false,
        }),
    }
}

#[test]
fn ppo_critic_lora_by_hand() {
    let d = tiny();
    let p = estimate(&d, &ppo(lora_qv(), tiny(), false), &ENV).unwrap();
    // The decoder's 106816 params and the score head's 64, f32.
    assert_eq!(p.bytes("critic_weights"), (106_816 + 64) * 4);
    assert_eq!(p.bytes("critic_load_buffers"), 1_000 + 32_768 * 4);
    // Its own adapters (as the policy's: 1792) in f32; AdamW and the gradients (one f32
    // micro-batch: the sums) also cover the head.
    assert_eq!(p.bytes("critic_trainable"), 1_792 * 4);
    assert_eq!(p.bytes("critic_optimizer"), 2 * (1_792 + 64) * 4);
    assert_eq!(p.bytes("critic_gradients"), (1_792 + 64) * 4);
    // Value pass: 2 rows x 14 tokens = 28 tokens x (4 h + 2 q + 2 kv + 3 I) floats, the
    // [10, 64] rows the head reads and 10 values (f32 + masked).
    let per_token = (4 * 64 + 2 * 64 + 2 * 32 + 3 * 128) * 4;
    assert_eq!(
        p.bytes("critic_values"),
        28 * per_token + 10 * 64 * 4 + 10 * 8
    );
    // Update: 2 layers x 28 tokens x 4224 bytes, embeddings and final norm [28, 64], the
    // head's input rows [10, 64] and scores (10 x 12 bytes); its backward's working set (the
    // head's input gradient [10, 64], gradients in flight 28 x 640 floats) is smaller than the
    // policy's, which runs apart from it: not counted.
    let a = p.critic_activations.as_ref().unwrap();
    assert_eq!(a.head, HeadKernel::Score);
    assert_eq!(a.layers.bytes, 2 * 28 * 4224);
    assert_eq!(a.working_set.bytes, 10 * 64 * 4 + 28 * 640 * 4);
    assert!(a.working_set.bytes < p.activations.working_set.bytes);
    let saved = 2 * 28 * 4224 + 2 * 28 * 64 * 4 + 10 * 64 * 4 + 10 * 12;
    assert_eq!(p.bytes("critic_activations"), saved);
    assert_eq!(a.total.bytes, saved + a.working_set.bytes);
    // A checkpoint copies its AdamW state (and writes its largest tensor, q's A 4 x 64... the
    // head [1, 64] and adapters are all 256 elements or fewer).
    assert_eq!(
        p.bytes("critic_checkpoint_buffers"),
        2 * (1_792 + 64) * 4 + 2 * 256 * 4
    );
    // Export: the merged q and v of both layers, merge_lora's temporaries, the write buffer.
    assert_eq!(
        p.bytes("critic_export"),
        12_288 * 4 + 3 * 4096 * 4 + 32_768 * 4
    );
    // Its phases: the policy's export is over when the critic's runs, and the reverse.
    let has = |ph: Phase, key: &str| p.component(key).unwrap().phases.contains(&ph);
    assert!(
        !has(Phase::CriticExport, "rollout_model") && !has(Phase::CriticExport, "export_buffers")
    );
    assert!(!has(Phase::Export, "critic_export"));
    assert!(!has(Phase::Load, "critic_weights") && has(Phase::CriticLoad, "critic_weights"));
    assert!(!has(Phase::CriticLoad, "optimizer") && !has(Phase::CriticLoad, "critic_optimizer"));
    let live = |ph: Phase| p.phase(ph).unwrap().live_bytes;
    let without =
        |ph: Phase, keys: &[&str]| live(ph) - keys.iter().map(|k| p.bytes(k)).sum::<u64>();
    assert_eq!(
        without(Phase::Values, &["critic_values"]),
        without(Phase::Score, &["logprob_pass"])
    );
    assert_eq!(
        live(Phase::Update) - live(Phase::Values) + p.bytes("critic_values"),
        p.bytes("activations")
            + p.bytes("gradients")
            + p.bytes("critic_activations")
            + p.bytes("critic_gradients")
    );
    // Without a critic: none of it.
    let mut grpo_like = ppo(lora_qv(), tiny(), false);
    if let Workload::Grpo(g) = &mut grpo_like.workload {
        g.critic = None;
    }
    let q = estimate(&d, &grpo_like, &ENV).unwrap();
    assert!(q.components.iter().all(|c| !c.key.starts_with("critic")));
    assert!(q.critic_activations.is_none());
    for ph in [Phase::CriticLoad, Phase::Values, Phase::CriticExport] {
        assert!(q.phase(ph).is_none(), "{ph:?}");
    }
    assert_eq!(q.bytes("activations"), p.bytes("activations"));
    assert!(p.total_bytes > q.total_bytes);
}

#[test]
fn ppo_critic_full_fine_tuning() {
    // Untied embeddings: a causal-LM critic keeps its lm_head (trainable, never given a
    // gradient); a sequence-classification one has none.
    let d = ModelDims {
        tied_embeddings: false,
        ..tiny()
    };
    let params = 106_816 + 32_768;
    let causal = estimate(&d, &ppo(Tuning::Full, d, false), &ENV).unwrap();
    assert_eq!(causal.bytes("critic_weights"), (params + 64) * 4);
    assert_eq!(causal.bytes("critic_trainable"), 0);
    assert_eq!(causal.bytes("critic_optimizer"), 2 * (params + 64) * 4);
    assert_eq!(causal.bytes("critic_gradients"), (params + 64 - 32_768) * 4);
    // Loading holds the loaded weights while their trainable copies are made.
    assert_eq!(causal.bytes("critic_load_buffers"), (params + 64) * 4);
    let headless = estimate(&d, &ppo(Tuning::Full, d, true), &ENV).unwrap();
    assert_eq!(headless.bytes("critic_weights"), (params - 32_768 + 64) * 4);
    assert_eq!(
        headless.bytes("critic_gradients"),
        (params - 32_768 + 64) * 4
    );
    // The critic's embedding gradient: one [vocab, hidden] partial sum (no tied head).
    let a = causal.critic_activations.as_ref().unwrap();
    let sums = a
        .extra
        .iter()
        .find(|x| x.name.starts_with("embedding"))
        .unwrap();
    assert_eq!(sums.size.bytes, 512 * 64 * 4);
    // bf16: an f32 master copy of the critic too, and bf16 micro-batch gradients.
    let mut bf16 = ppo(Tuning::Full, d, true);
    bf16.bf16 = true;
    bf16.accumulation = 2;
    let b = estimate(&d, &bf16, &ENV).unwrap();
    let t = params - 32_768 + 64;
    assert_eq!(b.bytes("critic_master"), t * 4);
    assert_eq!(b.bytes("critic_gradients"), t * 2 + t * 4);
    assert_eq!(
        b.critic_activations.as_ref().unwrap().kernels,
        Kernels::Composite
    );
    // The policy's reference copy is kept from the policy's load on: alive while the critic
    // loads (unlike AdamW's state, made after).
    let mut with_ref = ppo(Tuning::Full, d, false);
    if let Workload::Grpo(g) = &mut with_ref.workload {
        g.reference = true;
    }
    let r = estimate(&d, &with_ref, &ENV).unwrap();
    let phases = &r.component("reference").unwrap().phases;
    assert!(phases.contains(&Phase::CriticLoad) && !phases.contains(&Phase::Load));
    assert!(!r
        .component("optimizer")
        .unwrap()
        .phases
        .contains(&Phase::CriticLoad));
    // Checkpointing covers the policy only: the critic keeps every layer.
    let mut ckpt = ppo(Tuning::Full, d, false);
    ckpt.gradient_checkpointing = true;
    let c = estimate(&d, &ckpt, &ENV).unwrap();
    assert_eq!(
        c.bytes("critic_activations"),
        causal.bytes("critic_activations")
    );
    assert!(c.bytes("activations") < causal.bytes("activations"));
}

#[test]
fn a_smaller_critic_is_planned_with_its_own_shape() {
    let d = tiny();
    let small = ModelDims {
        layers: 1,
        ..tiny()
    };
    let p = estimate(&d, &ppo(lora_qv(), small, false), &ENV).unwrap();
    assert_eq!(p.bytes("critic_weights"), (32_768 + 36_992 + 64 + 64) * 4);
    assert_eq!(p.bytes("critic_trainable"), 896 * 4);
    assert_eq!(
        p.critic_activations.as_ref().unwrap().layers.bytes,
        28 * 4224
    );
}
