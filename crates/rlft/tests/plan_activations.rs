//! The memory plan's activation figures (`rlft_plan::formulas::layer_bytes_per_token` and
//! `SCORE_BYTES`), measured: what a training forward keeps alive for its backward, per token
//! per decoder layer, on tiny random models of every family, f32 (the fused kernels) and bf16
//! (candle's composites), full fine-tuning and LoRA with and without dropout.
//!
//! How: this binary's global allocator counts live bytes. A forward with graph, up to the
//! log-probs the loss reads, keeps what its backward needs; the bytes alive after it less those
//! before are its activations. Differences cancel everything but the layers' share: between 1
//! and 3 layers (the embeddings, final norm and head are the same) and between sequence
//! lengths (per-layer constants cancel). With three lengths the per-layer bytes of a row
//! `a t + c heads t^2` give both the per-token figure `a` and, where attention materialises its
//! scores, the per-score figure `c`.
//!
//! When a kernel keeps more or less, this test fails and names the figure to change in
//! `rlft-plan` (then re-measure the default model: `scripts/plan-check.sh`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

use candle_core::{DType, Device, Tensor};
use rlft::plan_inputs::model_dims;
use rlft_model::lora::{attach_lora, LoraConfig};
use rlft_model::tiny::{random_model, tiny_config};
use rlft_model::trainable::{make_trainable, next_token_batch, sequence_logprobs};
use rlft_model::Family;
use rlft_plan::formulas::{layer_bytes_per_token, Kernels, SCORE_BYTES};
use rlft_plan::{LoraShape, Tuning};

/// The system allocator, counting the bytes it has handed out and not taken back.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call goes to `System` with the caller's arguments unchanged; the counter is
// only a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller keeps `GlobalAlloc::alloc`'s contract.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as i64, Ordering::SeqCst);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            LIVE.fetch_add(l.size() as i64, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller keeps `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size() as i64, Ordering::SeqCst);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller keeps `GlobalAlloc::realloc`'s contract.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::SeqCst);
        }
        q
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Rows per batch.
const ROWS: usize = 2;
/// Sequence lengths: three, for the quadratic term.
const LENGTHS: [usize; 3] = [16, 32, 48];

/// A case: the family, bf16 (else f32), and LoRA on every linear (`Some(dropout)`) or full
/// fine-tuning (`None`).
#[derive(Debug, Clone, Copy)]
struct Case {
    family: Family,
    /// The family's tiny config with as many kv heads as query heads and a wider MLP (so
    /// that q, kv, h and intermediate widths all differ between the shapes).
    mha: bool,
    bf16: bool,
    lora: Option<bool>,
}

/// Bytes a training forward over `ROWS x t` tokens keeps alive on a model of `layers` layers.
fn kept(case: Case, layers: usize, t: usize) -> i64 {
    let mut c = config(case);
    c.num_hidden_layers = layers;
    let dtype = if case.bf16 { DType::BF16 } else { DType::F32 };
    let mut model = random_model(c, 7, dtype, &Device::Cpu).unwrap();
    let _vars = match case.lora {
        Some(dropout) => {
            let cfg = LoraConfig {
                r: 4,
                lora_dropout: if dropout { 0.1 } else { 0.0 },
                target_modules: vec!["all-linear".into()],
                ..LoraConfig::default()
            };
            attach_lora(&mut model, &cfg).unwrap()
        }
        None => make_trainable(&mut model, |_| true).unwrap(),
    };
    let ids: Vec<Vec<u32>> = (0..ROWS)
        .map(|r| {
            (0..=t)
                .map(|j| (3 + (r * 31 + j * 17) % 250) as u32)
                .collect()
        })
        .collect();
    let nt = next_token_batch(&ids, &[1; ROWS], 2, &Device::Cpu).unwrap();
    // The head reads one row per sequence: the same in every case.
    let targets = nt.targets.narrow(1, t - 1, 1).unwrap();
    let before = LIVE.load(Ordering::SeqCst);
    let lp: Tensor = sequence_logprobs(&model, &nt.batch, &targets, true).unwrap();
    let after = LIVE.load(Ordering::SeqCst);
    drop(lp);
    after - before
}

/// The model config of `case`.
fn config(case: Case) -> rlft_model::ModelConfig {
    let mut c = tiny_config(case.family);
    if case.mha {
        c.num_key_value_heads = c.num_attention_heads;
        c.intermediate_size = 192;
    }
    c
}

/// `(bytes per token per layer, bytes per (head, query, key) per layer)`, measured.
fn measure(case: Case) -> (f64, f64) {
    // Once first: lazily built tables, pools and per-thread buffers are not the forward's.
    for t in LENGTHS {
        kept(case, 1, t);
        kept(case, 3, t);
    }
    // A pool worker that joins in for the first time allocates its own scratch buffers in
    // the measured window (how many do depends on the load of the machine): the least of a few
    // runs is the forward's own.
    let least = |layers: usize, t: usize| (0..3).map(|_| kept(case, layers, t)).min().unwrap();
    // Per-layer bytes of the batch at each length: the difference of 3 and 1 layers, halved.
    let g: Vec<f64> = LENGTHS
        .iter()
        .map(|&t| (least(3, t) - least(1, t)) as f64 / 2.0)
        .collect();
    let (t, heads) = (
        LENGTHS.map(|x| x as f64),
        config(case).num_attention_heads as f64,
    );
    // g(t) = k + ROWS (a t + c heads t^2); the lengths are evenly spaced by d.
    let d = t[1] - t[0];
    let second = g[2] - 2.0 * g[1] + g[0];
    let c = second / (2.0 * d * d) / (ROWS as f64 * heads);
    let slope = (g[1] - g[0]) / d / ROWS as f64;
    let a = slope - c * heads * (t[0] + t[1]);
    (a, c)
}

#[test]
fn activation_figures_match_the_kernels() {
    assert_eq!(
        rlft_plan::formulas::HEAD_CHUNK as usize,
        rlft_model::trainable::LOGPROB_CHUNK
    );
    assert_eq!(
        rlft_plan::formulas::FUSED_HEAD_KEEP as usize,
        rlft_kernels::fused::head::KEEP_PROBS
    );
    let mut report = Vec::new();
    let mut bad = Vec::new();
    let shapes = [
        (Family::Llama, false),
        (Family::Llama, true),
        (Family::Qwen2, false),
        (Family::Qwen3, false),
    ];
    for (family, mha) in shapes {
        for bf16 in [false, true] {
            for lora in [None, Some(false), Some(true)] {
                let case = Case {
                    family,
                    mha,
                    bf16,
                    lora,
                };
                let dims = model_dims(&config(case));
                let tuning = match lora {
                    Some(dropout) => Tuning::Lora(LoraShape {
                        r: 4,
                        modules: dims.linears().iter().map(|x| x.0).collect(),
                        dropout,
                    }),
                    None => Tuning::Full,
                };
                let kernels = if bf16 {
                    Kernels::Composite
                } else {
                    Kernels::Fused
                };
                let want = layer_bytes_per_token(&dims, kernels, &tuning) as f64;
                let want_score = if bf16 { SCORE_BYTES as f64 } else { 0.0 };
                let (a, c) = measure(case);
                let line = format!(
                    "{case:?}: per token per layer {a:.1} bytes measured, {want} planned \
                     ({:+.1}%); per score {c:.2} measured, {want_score} planned",
                    (want - a) / a * 100.0
                );
                eprintln!("{line}");
                if (want - a).abs() > TOLERANCE * a || (want_score - c).abs() > 0.5 {
                    bad.push(line.clone());
                }
                report.push(line);
            }
        }
    }
    assert!(
        bad.is_empty(),
        "activation figures off (change rlft_plan::formulas::layer_bytes_per_token or \
         SCORE_BYTES):\n{}",
        bad.join("\n")
    );
}

/// The per-token figure may differ from the measurement by this share. It is stated in
/// multiples of the model's widths (hidden, q, kv, intermediate) and leaves out what is
/// narrower: the composite q/k norms' per-head statistics (32 bytes per token per layer on the
/// tiny Qwen3, 0.3%). Every other case measures exactly its figure.
const TOLERANCE: f64 = 0.01;
