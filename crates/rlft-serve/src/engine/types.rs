//! What the engine's handle and its scheduler share: the served model, the job, the events,
//! the limits, and the counters.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rlft_model::sampling::Sampled;
use rlft_model::{CausalLm, FinishReason, SamplingParams};
use rlft_text::{ChatTemplate, StopStrings, TextBundle};
use tokio::sync::mpsc::UnboundedSender;

/// A model the engine decodes with: a network (the base, or the base with one LoRA adapter;
/// both share the base's weights) and its tokenizer.
#[derive(Debug)]
pub struct ServedModel {
    /// The name clients ask for (`model` in a request).
    pub name: String,
    /// The network (f32 on the CPU: the fused decode path).
    pub model: CausalLm,
    /// Tokenizer, special tokens and chat template.
    pub text: Arc<TextBundle>,
    /// The compiled chat template, or why there is none (no template, or it does not compile).
    pub template: Result<Arc<ChatTemplate>, String>,
    /// Generation stops on these ids (from the model's generation config).
    pub eos_token_ids: Vec<u32>,
    /// Sampling defaults of the model (generation_config.json) for unset request fields.
    pub defaults: SamplingParams,
    /// The base model's name, for an adapter.
    pub parent: Option<String>,
    /// Where it was loaded from (model file or adapter directory).
    pub root: PathBuf,
    /// Unix time it was loaded.
    pub created: u64,
}

impl ServedModel {
    /// Context length: prompt + completion tokens.
    pub fn max_model_len(&self) -> usize {
        self.model.config.max_position_embeddings
    }
}

/// One request: `n` samples of every prompt.
#[derive(Debug, Clone)]
pub struct Job {
    /// The model to decode with.
    pub model: Arc<ServedModel>,
    /// Prompt token ids (each non-empty).
    pub prompts: Vec<Vec<u32>>,
    /// Samples per prompt; choice `i` is prompt `i / n`, sample `i % n`.
    pub n: usize,
    /// Most new tokens per sample, at least 1 (prompt + this must fit the context).
    pub max_tokens: usize,
    /// Sampling rule.
    pub sampling: SamplingParams,
    /// Seed of the sample streams: sample `s` of prompt `p` draws from `Rng::new(seed, p, s)`.
    pub seed: u64,
    /// A sample stops when its text contains one of these (the text is cut before it).
    pub stop: StopStrings,
    /// Keep decoding past end-of-sequence ids (only `max_tokens` and stop strings end a sample).
    pub ignore_eos: bool,
    /// `Some(k)`: each token event carries the `k` most likely tokens with their log-probs.
    pub top_logprobs: Option<usize>,
}

impl Job {
    /// Sequences the job decodes at once.
    pub fn rows(&self) -> usize {
        self.prompts.len() * self.n
    }
}

/// What the engine reports about a job, in order per choice.
#[derive(Debug, Clone)]
pub enum Event {
    /// A sampled token of choice `choice`.
    Token {
        /// Choice index (`prompt * n + sample`).
        choice: usize,
        /// The token and its log-probability ([`rlft_model::sampling::sample`]'s).
        token: Sampled,
        /// The most likely tokens when the job asked for them.
        top: Vec<Sampled>,
        /// Completion text this token makes final: empty while the text ends inside a UTF-8
        /// character or could be the start of a stop string; the texts of a choice's token
        /// events concatenate to its completion text (cut before a stop string, special
        /// tokens skipped).
        text: String,
    },
    /// Choice `choice` ended.
    Finished {
        /// Choice index.
        choice: usize,
        /// Why.
        reason: FinishReason,
    },
    /// The job failed (e.g. the forward pass returned an error); no more events follow.
    Failed(String),
}

/// Limits of the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most sequences decoding at once (vLLM's `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Most jobs waiting to start; more are refused ([`SubmitError::QueueFull`]).
    pub max_queue: usize,
    /// Most prompt tokens prefilled between two decode steps (vLLM's
    /// `max_num_batched_tokens`); the first waiting job is admitted whatever its length.
    pub max_num_batched_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 64,
            max_queue: 256,
            max_num_batched_tokens: 2048,
        }
    }
}

/// Why a job was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full.
    #[error("the server is busy: {0} requests are waiting already; retry later")]
    QueueFull(usize),
    /// The engine is shutting down.
    #[error("the server is shutting down and accepts no new requests")]
    Draining,
    /// The job needs more sequences than the engine runs at once.
    #[error(
        "the request needs {rows} sequences (prompts x n) but the server decodes at most {max} at \
         once (--max-num-seqs); lower n or send fewer prompts per request"
    )]
    TooManyRows {
        /// Sequences asked for.
        rows: usize,
        /// `max_num_seqs`.
        max: usize,
    },
}

/// Counters shared by the engine handle and its scheduler.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Jobs submitted and not yet admitted.
    pub queued: AtomicUsize,
    /// Jobs submitted and not yet finished (queued included).
    pub in_flight: AtomicUsize,
    /// Sequences decoding now.
    pub running_seqs: AtomicUsize,
    /// New jobs are refused.
    pub draining: AtomicBool,
}

/// A job on its way to the scheduler.
pub(super) struct Submitted {
    pub job: Job,
    pub events: UnboundedSender<Event>,
}

/// A fresh seed for a request that sets none (time and a counter: different per request).
pub fn random_seed() -> u64 {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let c = COUNTER.fetch_add(1, Ordering::Relaxed) as u64;
    let mut z = t ^ c.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
