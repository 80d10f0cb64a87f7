//! The scheduler loop: admit waiting jobs (prefill), sample a token for every sequence, send the
//! events, drop finished sequences, run one decode step per model; repeat until idle.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use rayon::prelude::*;
use rlft_model::decode_fast::{self, RowCache};

use super::seq::{Running, Seq};
use super::types::{EngineConfig, Event, Shared, Submitted};

/// Rows start with room for this many new tokens (or their whole budget if smaller) and grow
/// by doubling ([`RowCache::reserve`]), so a request that never uses its `max_tokens` never
/// pays for it.
const FIRST_ROOM: usize = 128;

/// The scheduler thread: waits for work, then runs the batch (on the rayon pool, as generation
/// does) until nothing is left; returns when the engine handle is dropped and all is done.
pub(super) fn run(rx: mpsc::Receiver<Submitted>, shared: Arc<Shared>, config: EngineConfig) {
    let mut state = State {
        waiting: VecDeque::new(),
        seqs: Vec::new(),
        shared,
        config,
        closed: false,
    };
    let mut rx = rx;
    loop {
        // Idle: block (outside the pool, whose workers would otherwise spin) for the next job.
        match rx.recv() {
            Ok(s) => state.waiting.push_back(s),
            Err(_) => return,
        }
        // The receiver is not `Sync`: it moves to the pool worker and back.
        (state, rx) = rlft_kernels::pool::on_pool(move || {
            state.run_until_idle(&rx);
            (state, rx)
        });
        if state.closed {
            return;
        }
    }
}

struct State {
    /// Jobs submitted and not admitted yet, oldest first.
    waiting: VecDeque<Submitted>,
    /// Sequences decoding, in admission order.
    seqs: Vec<Seq>,
    shared: Arc<Shared>,
    config: EngineConfig,
    /// The engine handle is gone.
    closed: bool,
}

impl State {
    fn run_until_idle(&mut self, rx: &mpsc::Receiver<Submitted>) {
        loop {
            loop {
                match rx.try_recv() {
                    Ok(s) => self.waiting.push_back(s),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.closed = true;
                        break;
                    }
                }
            }
            self.drop_abandoned();
            self.admit();
            if self.seqs.is_empty() {
                if self.waiting.is_empty() {
                    return;
                }
                continue;
            }
            self.sample();
            self.retire();
            self.decode();
        }
    }

    /// Forgets waiting jobs and stops sequences whose client is gone.
    fn drop_abandoned(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.events.is_closed());
        let gone = before - self.waiting.len();
        self.shared.queued.fetch_sub(gone, Ordering::SeqCst);
        self.shared.in_flight.fetch_sub(gone, Ordering::SeqCst);
        for s in &mut self.seqs {
            if s.run.abandoned() {
                s.abandon();
            }
        }
        self.retire();
    }

    /// Admits waiting jobs, oldest first, while they fit (sequences and prompt tokens), and
    /// prefills them: one [`decode_fast::prefill`] per model over all their prompts.
    fn admit(&mut self) {
        let mut rows = self.seqs.len();
        let mut tokens = 0;
        let mut admitted: Vec<Arc<Running>> = Vec::new();
        while let Some(next) = self.waiting.front() {
            let r = next.job.rows();
            let t: usize = next.job.prompts.iter().map(Vec::len).sum();
            let first = admitted.is_empty();
            if rows + r > self.config.max_num_seqs && !(first && rows == 0) {
                break;
            }
            if !first && tokens + t > self.config.max_num_batched_tokens {
                break;
            }
            let s = self.waiting.pop_front().expect("front exists");
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            rows += r;
            tokens += t;
            let open = AtomicUsize::new(s.job.rows());
            admitted.push(Arc::new(Running {
                job: s.job,
                events: s.events,
                open,
            }));
        }
        // One prefill per model, in order of first appearance.
        while let Some(first) = admitted.first().cloned() {
            let model = first.job.model.clone();
            let (same, rest): (Vec<_>, Vec<_>) = admitted
                .into_iter()
                .partition(|r| Arc::ptr_eq(&r.job.model, &model));
            admitted = rest;
            self.prefill(&model.model, same);
        }
        self.shared
            .running_seqs
            .store(self.seqs.len(), Ordering::SeqCst);
    }

    /// Prefills the prompts of `runs` (all on `model`) and adds their sequences.
    fn prefill(&mut self, model: &rlft_model::CausalLm, runs: Vec<Arc<Running>>) {
        let prompts: Vec<Vec<u32>> = runs
            .iter()
            .flat_map(|r| r.job.prompts.iter().cloned())
            .collect();
        let room = runs
            .iter()
            .map(|r| r.job.max_tokens.min(FIRST_ROOM))
            .max()
            .unwrap_or(0);
        let (caches, logits) = match decode_fast::prefill(model, &prompts, room) {
            Ok(x) => x,
            Err(e) => {
                for r in &runs {
                    self.fail(r, &format!("prefill failed: {e}"));
                }
                return;
            }
        };
        let mut at = 0;
        for r in runs {
            for p in 0..r.job.prompts.len() {
                for s in 0..r.job.n {
                    let seq = Seq::new(r.clone(), p, s, caches[at].clone(), logits[at].clone());
                    self.seqs.push(seq);
                }
                at += 1;
            }
        }
    }

    /// Samples one token for every sequence (in parallel) and sends the events.
    fn sample(&mut self) {
        let _t = rlft_kernels::op_time::span("serve: sample");
        let events: Vec<Vec<Event>> = self
            .seqs
            .par_iter_mut()
            .map(|s| {
                if s.done.is_some() {
                    Vec::new()
                } else {
                    s.step()
                }
            })
            .collect();
        for (s, ev) in self.seqs.iter_mut().zip(events) {
            for e in ev {
                if s.run.events.send(e).is_err() {
                    s.abandon();
                }
            }
        }
    }

    /// Removes finished sequences; a job whose last choice ended is done. The running count is
    /// stored before the jobs are counted out, so a client that sees `in_flight` reach 0 also
    /// sees no running sequence of them.
    fn retire(&mut self) {
        let mut done_jobs = 0;
        self.seqs.retain(|s| {
            if s.done.is_none() {
                return true;
            }
            let left = s
                .run
                .open
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |o| o.checked_sub(1));
            if left == Ok(1) {
                done_jobs += 1;
            }
            false
        });
        self.shared
            .running_seqs
            .store(self.seqs.len(), Ordering::SeqCst);
        self.shared.in_flight.fetch_sub(done_jobs, Ordering::SeqCst);
    }

    /// Feeds every sequence its last token: one forward call per model, caches grown first
    /// when full.
    fn decode(&mut self) {
        let _t = rlft_kernels::op_time::span("serve: decode step");
        let mut todo: Vec<usize> = (0..self.seqs.len()).collect();
        while let Some(&first) = todo.first() {
            let model = self.seqs[first].run.job.model.clone();
            let (same, rest): (Vec<usize>, Vec<usize>) = todo
                .into_iter()
                .partition(|&i| Arc::ptr_eq(&self.seqs[i].run.job.model, &model));
            todo = rest;
            let mut caches: Vec<RowCache> = Vec::with_capacity(same.len());
            let mut tokens: Vec<Vec<u32>> = Vec::with_capacity(same.len());
            for &i in &same {
                let s = &mut self.seqs[i];
                let mut c = s.cache.take().expect("cache is home between steps");
                if c.len() + 1 > c.capacity() {
                    let budget = s.prompt_len + s.run.job.max_tokens;
                    c.reserve(&model.model, (2 * c.capacity()).clamp(c.len() + 1, budget));
                }
                caches.push(c);
                tokens.push(vec![*s.out.last().expect("sampled before decoding")]);
            }
            let result = decode_fast::forward(&model.model, &mut caches, &tokens);
            for (&i, c) in same.iter().zip(caches) {
                self.seqs[i].cache = Some(c);
            }
            match result {
                Ok(logits) => {
                    for (&i, l) in same.iter().zip(logits) {
                        self.seqs[i].logits = l;
                    }
                }
                Err(e) => {
                    // These sequences end; the next `retire` removes them and counts their
                    // jobs out.
                    let msg = format!("decode step failed: {e}");
                    for &i in &same {
                        let _ = self.seqs[i].run.events.send(Event::Failed(msg.clone()));
                        self.seqs[i].abandon();
                    }
                }
            }
        }
    }

    /// Tells the client of a job that has no sequence yet that it failed, and counts it out.
    fn fail(&self, run: &Running, msg: &str) {
        let _ = run.events.send(Event::Failed(msg.to_string()));
        if run.open.swap(0, Ordering::SeqCst) > 0 {
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
