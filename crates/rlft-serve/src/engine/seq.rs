//! One decoding sequence (a choice of a job): its KV cache, PRNG stream, tokens and text, and
//! the sampling step that turns its next-token logits into [`Event`]s.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use rlft_model::decode_fast::RowCache;
use rlft_model::sampling::{sample, top_logprobs, Rng};
use rlft_model::FinishReason;
use rlft_text::{IncrementalDecoder, StopMatcher};
use tokio::sync::mpsc::UnboundedSender;

use super::types::{Event, Job};

/// A job the scheduler runs: the request and where its events go.
pub(super) struct Running {
    pub job: Job,
    pub events: UnboundedSender<Event>,
    /// Choices not finished yet.
    pub open: AtomicUsize,
}

impl Running {
    /// Whether the client is gone (the receiver was dropped).
    pub fn abandoned(&self) -> bool {
        self.events.is_closed()
    }
}

/// A sequence being decoded.
pub(super) struct Seq {
    pub run: Arc<Running>,
    /// Choice index in its job.
    pub choice: usize,
    /// Prompt length.
    pub prompt_len: usize,
    /// The KV cache (taken out while a forward call runs).
    pub cache: Option<RowCache>,
    /// Next-token logits, `[vocab]`.
    pub logits: Vec<f32>,
    rng: Rng,
    /// Prompt and completion ids (the repetition penalty looks at them).
    seen: Vec<u32>,
    /// Completion ids.
    pub out: Vec<u32>,
    decoder: IncrementalDecoder,
    matcher: StopMatcher,
    /// Bytes of the matcher's text already sent.
    sent: usize,
    /// Why it ended, once it has.
    pub done: Option<FinishReason>,
}

impl Seq {
    /// Sample `sample` of prompt `prompt` of `job`, with its prefilled cache and logits.
    pub fn new(
        run: Arc<Running>,
        prompt: usize,
        sample: usize,
        cache: RowCache,
        logits: Vec<f32>,
    ) -> Seq {
        let job = &run.job;
        Seq {
            choice: prompt * job.n + sample,
            prompt_len: job.prompts[prompt].len(),
            cache: Some(cache),
            logits,
            rng: Rng::new(job.seed, prompt as u64, sample as u64),
            seen: job.prompts[prompt].clone(),
            matcher: StopMatcher::new(job.stop.clone()),
            out: Vec::new(),
            decoder: IncrementalDecoder::new(true),
            sent: 0,
            done: None,
            run,
        }
    }

    /// Samples the next token from `self.logits` under its job's rule and returns the events it
    /// gives (a token, and the end of the choice when it ends). Text errors of the tokenizer end
    /// the choice with what was decoded so far.
    pub fn step(&mut self) -> Vec<Event> {
        let run = self.run.clone();
        let job = &run.job;
        let s = sample(&self.logits, &self.seen, &job.sampling, &mut self.rng);
        let top = job.top_logprobs.map_or_else(Vec::new, |k| {
            top_logprobs(&self.logits, job.sampling.temperature, k)
        });
        self.out.push(s.token);
        self.seen.push(s.token);
        let tok = &job.model.text.tokenizer;
        let eos = !job.ignore_eos && job.model.eos_token_ids.contains(&s.token);
        let mut hit = None;
        match self.decoder.step(tok, s.token) {
            Ok(Some(piece)) => hit = self.matcher.push(&piece),
            Ok(None) => {}
            Err(_) => self.done = Some(FinishReason::Stop),
        }
        if hit.is_some() || eos {
            self.done = Some(FinishReason::Stop);
        } else if self.out.len() >= job.max_tokens {
            self.done = Some(FinishReason::Length);
        }
        if self.done.is_some() && hit.is_none() {
            // What the decoder still holds (an incomplete character) ends the text.
            if let Ok(Some(rest)) = self.decoder.flush(tok) {
                if self.matcher.push(&rest).is_some() {
                    self.done = Some(FinishReason::Stop);
                }
            }
        }
        let text = self.release(job);
        let mut events = vec![Event::Token {
            choice: self.choice,
            token: s,
            top,
            text,
        }];
        if let Some(reason) = self.done {
            events.push(Event::Finished {
                choice: self.choice,
                reason,
            });
        }
        events
    }

    /// The completion text that became final: all of it once the sequence is done, else all
    /// but a tail that could start a stop string.
    fn release(&mut self, job: &Job) -> String {
        let text = self.matcher.completion();
        let end = if self.done.is_some() {
            text.len()
        } else {
            text.len() - job.stop.holdback(text)
        };
        let out = text.get(self.sent..end).unwrap_or_default().to_string();
        self.sent = self.sent.max(end);
        out
    }

    /// Ends the sequence early (the client left, or the engine failed).
    pub fn abandon(&mut self) {
        self.done.get_or_insert(FinishReason::Stop);
    }
}
