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
mod types;

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub use types::{random_seed, EngineConfig, Event, Job, ServedModel, SubmitError};
use types::{Shared, Submitted};

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
