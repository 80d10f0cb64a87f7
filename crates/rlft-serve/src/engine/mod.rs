//! The decoding engine: one scheduler thread owns the decode state of every running sequence
//! and runs continuous batching over rlft-model's fused CPU forward ([`decode_fast`]).
//!
//! A caller [`Engine::submit`]s a [`Job`] (prompts as token ids, `n` samples each, sampling
//! rule, seed, stop strings) and reads [`Event`]s from the returned channel as tokens are
//! sampled. Between two decode steps the scheduler admits waiting jobs (their prompts are
//! prefilled together with [`decode_fast::prefill`], which computes the tokens all new prompts
//! start with once) and drops finished or abandoned sequences, so the batch changes shape every
//! step while each sequence computes what it computes alone: every sequence owns its KV cache
//! ([`decode_fast::RowCache`]) and its PRNG stream `(seed, prompt, sample)`, as
//! [`rlft_model::generate`] seeds them. A job alone in the engine therefore produces the tokens
//! `rlft_model::generate` produces for the same request; in a batch the products run over more
//! rows, which changes float summation order only.
//!
//! Simplified: sequences of different models (the base and each LoRA adapter) decode in
//! separate forward calls of the same step; one call mixing adapters per row (S-LoRA) is not
//! implemented.
//!
//! [`decode_fast`]: rlft_model::decode_fast
//! [`decode_fast::prefill`]: rlft_model::decode_fast::prefill
//! [`decode_fast::RowCache`]: rlft_model::decode_fast::RowCache

mod scheduler;
mod seq;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use rlft_model::sampling::Sampled;
use rlft_model::{CausalLm, FinishReason, SamplingParams};
use rlft_text::{ChatTemplate, StopStrings, TextBundle};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

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
struct Shared {
    /// Jobs submitted and not yet admitted.
    queued: AtomicUsize,
    /// Jobs submitted and not yet finished (queued included).
    in_flight: AtomicUsize,
    /// Sequences decoding now.
    running_seqs: AtomicUsize,
    /// New jobs are refused.
    draining: AtomicBool,
}

/// A job on its way to the scheduler.
struct Submitted {
    job: Job,
    events: UnboundedSender<Event>,
}

/// Handle of the scheduler thread; dropping it lets the thread finish its jobs and stop.
pub struct Engine {
    tx: Option<mpsc::Sender<Submitted>>,
    shared: Arc<Shared>,
    config: EngineConfig,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    /// Starts the scheduler thread.
    pub fn start(config: EngineConfig) -> Engine {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let c = config.clone();
        let thread = std::thread::Builder::new()
            .name("rlft-scheduler".into())
            .spawn(move || scheduler::run(rx, s, c))
            .expect("spawn the scheduler thread");
        Engine {
            tx: Some(tx),
            shared,
            config,
            thread: Some(thread),
        }
    }

    /// Queues a job; its events arrive on the returned channel. Dropping the receiver cancels
    /// the job (its sequences leave the batch at the next step).
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Event>, SubmitError> {
        if self.shared.draining.load(Ordering::SeqCst) {
            return Err(SubmitError::Draining);
        }
        if job.rows() > self.config.max_num_seqs {
            return Err(SubmitError::TooManyRows {
                rows: job.rows(),
                max: self.config.max_num_seqs,
            });
        }
        let max = self.config.max_queue;
        self.shared
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q < max).then_some(q + 1)
            })
            .map_err(|_| SubmitError::QueueFull(max))?;
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let (events, rx) = unbounded_channel();
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.send(Submitted { job, events }).is_ok());
        if sent != Some(true) {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Draining);
        }
        Ok(rx)
    }

    /// Refuses new jobs from now on; the submitted ones run to their end.
    pub fn drain(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`Self::drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::SeqCst)
    }

    /// Jobs submitted and not finished yet.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Jobs waiting for room in the batch.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }

    /// Sequences decoding now.
    pub fn running_seqs(&self) -> usize {
        self.shared.running_seqs.load(Ordering::SeqCst)
    }

    /// The engine's limits.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the channel tells the scheduler to stop once its jobs are done.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
