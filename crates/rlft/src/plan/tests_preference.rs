//! The plan of DPO, the reward model, Online DPO and reward models as rewards, by hand on the
//! tiny model of `tests.rs` (vocab 512, hidden 64, intermediate 128, 2 layers, 4 / 2 heads of
//! 16; 106816 parameters, LoRA r=4 on q and v: 1792).

use super::tests::{grpo, lora_qv, tiny, ENV};
use super::*;

/// DPO on micro-batches of `pairs` pairs: prompts of 10 tokens, completions of 5.
fn dpo(tuning: Tuning, pairs: usize, reference: DpoReference) -> RunShape {
    RunShape {
        bf16: false,
        tuning,
        micro_batch: pairs,
        accumulation: 1,
        gradient_checkpointing: false,
        workload: Workload::Dpo(DpoShape {
            prompt_tokens: 10,
            completion_tokens: 5,
            prompts_per_pair: 1,
            reference,
            eval: false,
        }),
    }
}

/// The reward model on micro-batches of `pairs` pairs of sequences of 9 tokens.
fn rm(tuning: Tuning, pairs: usize) -> RunShape {
    RunShape {
        bf16: false,
        tuning,
        micro_batch: pairs,
        accumulation: 1,
        gradient_checkpointing: false,
        workload: Workload::RewardModel(RewardModelShape {
            sequence_tokens: 9,
            eval: false,
        }),
    }
}

#[test]
fn dpo_runs_each_prompt_once_for_both_sides() {
    let run = dpo(lora_qv(), 2, DpoReference::AdaptersOff);
    // 2 prompt rows of 10; 4 completions (chosen, rejected) of 4 inputs over 14 keys; the
    // head over 4 x 5 completion tokens; 4 completions gather the prompt's keys/values.
    let (passes, rows, shared) = run.micro_batch_passes();
    let shapes: Vec<_> = passes.iter().map(|p| (p.rows, p.tokens, p.keys)).collect();
    assert_eq!(shapes, [(2, 10, 10), (4, 4, 14)]);
    assert_eq!((rows, shared), (20, Some((4, 10))));
    let p = estimate(&tiny(), &run, &ENV).unwrap();
    // 36 tokens x 2 layers x 4224 bytes (fused f32, frozen head).
    assert_eq!(p.activations.layers.bytes, 2 * 36 * 4224);
    // keep_end with different prompts per side: a prompt row each.
    let mut two = run.clone();
    if let Workload::Dpo(d) = &mut two.workload {
        d.prompts_per_pair = 2;
    }
    assert_eq!(two.micro_batch_passes().0[0].rows, 4);
    // The same rows as GRPO's micro-batch of 4 completions in groups of 2 (Online DPO's).
    let mut g = grpo(4, true, true);
    g.tuning = lora_qv();
    if let Workload::Grpo(s) = &mut g.workload {
        s.num_generations = 2;
        s.rollout_prompts = 2;
        s.rollout_completions = 4;
    }
    let q = estimate(&tiny(), &g, &ENV).unwrap();
    assert_eq!(q.bytes("activations"), p.bytes("activations"));
    assert_eq!(q.bytes("logprob_pass"), p.bytes("logprob_pass"));
}

#[test]
fn dpo_components_by_hand() {
    let d = tiny();
    let params = 106_816u64;
    // LoRA: the base with adapters off, no copy; a reference pass per step (score phase);
    // no generation; the export merges q and v.
    let p = estimate(&d, &dpo(lora_qv(), 2, DpoReference::AdaptersOff), &ENV).unwrap();
    assert_eq!(p.bytes("weights"), params * 4);
    assert_eq!(p.bytes("trainable"), 1_792 * 4);
    assert_eq!(p.bytes("reference"), 0);
    assert!(p.component("reference").is_some());
    assert!(p.component("generation").is_none());
    assert_eq!(p.bytes("rollout_model"), 3 * 4096 * 4);
    let phases: Vec<Phase> = p.phases.iter().map(|x| x.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Load,
            Phase::Score,
            Phase::Update,
            Phase::Checkpoint,
            Phase::Export
        ]
    );
    // The no-grad pass: 36 tokens x (4 h + 2 q + 2 kv + 3 I) floats, the fused head's
    // [20, 512] logits block, and the [20, 64] rows it reads.
    let per_token = (4 * 64 + 2 * 64 + 2 * 32 + 3 * 128) * 4;
    assert_eq!(
        p.bytes("logprob_pass"),
        36 * per_token + 20 * 512 * 4 + 20 * 64 * 4
    );
    // Full fine-tuning: a frozen copy from the policy's load on.
    let f = estimate(&d, &dpo(Tuning::Full, 2, DpoReference::Copy), &ENV).unwrap();
    assert_eq!(f.bytes("reference"), params * 4);
    let r = f.component("reference").unwrap();
    assert!(!r.phases.contains(&Phase::Load) && r.phases.contains(&Phase::Update));
    // Precomputed: no copy; the run is smaller by it.
    let pre = estimate(&d, &dpo(Tuning::Full, 2, DpoReference::Precomputed), &ENV).unwrap();
    assert_eq!(pre.bytes("reference"), 0);
    assert_eq!(
        f.phase(Phase::Update).unwrap().live_bytes - pre.phase(Phase::Update).unwrap().live_bytes,
        params * 4
    );
}

#[test]
fn reward_model_has_a_score_head_and_no_lm_head() {
    // Untied: the 512 x 64 LM head is dropped; the [1, 64] score head is added.
    let d = ModelDims {
        tied_embeddings: false,
        ..tiny()
    };
    let p = estimate(&d, &rm(lora_qv(), 2), &ENV).unwrap();
    assert_eq!(p.parameters, 106_816 + 64);
    assert_eq!(p.bytes("weights"), (106_816 + 64) * 4);
    // The head trains beside the adapters: AdamW and gradients cover 1792 + 64.
    assert_eq!(p.trainable_parameters, 1_792 + 64);
    assert_eq!(p.bytes("optimizer"), 2 * 1_856 * 4);
    assert_eq!(p.bytes("gradients"), 1_856 * 4);
    assert!(p.component("reference").is_none());
    assert!(p.phase(Phase::Score).is_none(), "no eval, no no-grad pass");
    // 2 pairs: 4 rows of 9 tokens = 36; the score head reads 4 rows.
    let a = &p.activations;
    assert_eq!(a.head, HeadKernel::Score);
    assert_eq!(a.head_rows, 4);
    assert_eq!(a.layers.bytes, 2 * 36 * 4224);
    // Embeddings and final norm [36, 64]; head input rows [4, 64]; 4 scores x 12 bytes; its
    // backward's [4, 64]; gradients in flight 36 x 640 floats. No [rows, vocab] logits.
    let extra = 2 * 36 * 64 * 4 + 4 * 64 * 4 + 4 * 12 + 4 * 64 * 4 + 36 * 640 * 4;
    assert_eq!(a.total.bytes, 2 * 36 * 4224 + extra);
    assert!(a.extra.iter().all(|x| !x.name.contains("LM head")));
    // Full fine-tuning: every weight and the head train; the embedding gradient has one
    // [vocab, hidden] partial sum (no tied head).
    let f = estimate(&d, &rm(Tuning::Full, 2), &ENV).unwrap();
    assert_eq!(f.bytes("optimizer"), 2 * (106_816 + 64) * 4);
    assert_eq!(f.bytes("gradients"), (106_816 + 64) * 4);
    let sums = f
        .activations
        .extra
        .iter()
        .find(|x| x.name.starts_with("embedding"))
        .unwrap();
    assert_eq!(sums.size.bytes, 512 * 64 * 4);
    // Eval pairs: a no-grad pass with the score head: 36 tokens of temporaries, 4 x 8 bytes
    // of scores and the [4, 64] rows.
    let mut e = rm(lora_qv(), 2);
    if let Workload::RewardModel(r) = &mut e.workload {
        r.eval = true;
    }
    let ev = estimate(&d, &e, &ENV).unwrap();
    let per_token = (4 * 64 + 2 * 64 + 2 * 32 + 3 * 128) * 4;
    assert_eq!(
        ev.bytes("logprob_pass"),
        36 * per_token + 4 * 8 + 4 * 64 * 4
    );
}

#[test]
fn reward_models_of_online_runs_by_hand() {
    let d = tiny();
    let base = grpo(6, true, true);
    let mut run = base.clone();
    if let Workload::Grpo(g) = &mut run.workload {
        g.reward_models = vec![ModelRewardShape {
            name: "rm".into(),
            model: preference::score_model(&d),
            batch_size: 8,
            tokens: 15,
        }];
    }
    let p = estimate(&d, &run, &ENV).unwrap();
    let q = estimate(&d, &base, &ENV).unwrap();
    // The backbone (tied: nothing dropped) and its head, f32, loaded before the policy.
    assert_eq!(p.bytes("reward_model_weights"), (106_816 + 64) * 4);
    for x in &q.phases {
        assert_eq!(
            p.phase(x.phase).unwrap().live_bytes - x.live_bytes,
            (106_816 + 64) * 4,
            "{:?}",
            x.phase
        );
    }
    // Scoring: 8 of the 12 completions per pass, 15 tokens each: 120 tokens of temporaries,
    // 8 scores (8 bytes each) and the [8, 64] rows the head reads.
    let per_token = (4 * 64 + 2 * 64 + 2 * 32 + 3 * 128) * 4;
    let pass = 120 * per_token + 8 * 8 + 8 * 64 * 4;
    assert_eq!(p.bytes("reward_model_pass"), pass);
    // Its phase holds what the score phase holds, with the scoring pass for the log-prob pass.
    let live = |ph: Phase| p.phase(ph).unwrap().live_bytes;
    assert_eq!(
        live(Phase::Reward) - pass,
        live(Phase::Score) - p.bytes("logprob_pass")
    );
    assert!(q.phase(Phase::Reward).is_none());
}

#[test]
fn suggestions_use_each_trainers_keys() {
    let d = tiny();
    // DPO with a frozen copy: precomputing the reference log-probs keeps the training.
    let run = dpo(Tuning::Full, 2, DpoReference::Copy);
    let pre = estimate(&d, &dpo(Tuning::Full, 2, DpoReference::Precomputed), &ENV).unwrap();
    let s = suggest(&d, &run, &ENV, pre.total_bytes).unwrap();
    let x = s
        .iter()
        .find(|x| x.sets == ["precompute_ref_log_probs=true"])
        .expect("precompute suggested");
    assert!(!x.changes_training);
    assert_eq!(x.total_bytes, pre.total_bytes);
    assert!(s.iter().all(|x| x.sets != ["beta=0"]));
    // Online DPO counts prompts: 8 completions are 4 prompts; halving gives 2 prompts (4
    // completions) x 2 accumulation, and lengths are max_new_tokens.
    let mut o = grpo(8, true, true);
    if let Workload::Grpo(g) = &mut o.workload {
        g.num_generations = 2;
        g.rollout_prompts = 4;
        g.rollout_completions = 8;
        g.online_dpo = true;
        g.completion_tokens = 64;
    }
    o.accumulation = 1;
    let mut half = o.clone();
    half.micro_batch = 4;
    half.accumulation = 2;
    let want = estimate(&d, &half, &ENV).unwrap().total_bytes;
    let s = suggest(&d, &o, &ENV, want).unwrap();
    let first = &s[0];
    assert_eq!(
        first.sets,
        [
            "per_device_train_batch_size=2",
            "gradient_accumulation_steps=2"
        ]
    );
    assert_eq!(first.total_bytes, want);
    let all: Vec<&String> = s.iter().flat_map(|x| &x.sets).collect();
    assert!(all.iter().all(|k| !k.starts_with("beta=")
        && !k.starts_with("share_prompts")
        && !k.starts_with("max_completion_length")));
}
