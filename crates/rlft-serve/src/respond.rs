//! From engine [`Event`]s to OpenAI's answers: one JSON body, or a stream of chunks as
//! server-sent events ending with `data: [DONE]`.
//!
//! Log-probabilities are [`rlft_model::sampling::sample`]'s: under the temperature-scaled model
//! distribution before top-k/top-p/min-p truncation (greedy reports temperature 1), the
//! quantity a trainer recomputes. With `return_token_ids` (vLLM's extension) each choice also
//! carries `token_ids` (the sampled ids, in stream chunks those of the chunk) and the answer
//! `prompt_token_ids`: with the log-probs, what a trainer needs to score its own rollouts.
//!
//! A chat request with tools gets the calls in the model's text as `message.tool_calls` and
//! `finish_reason: "tool_calls"` ([`crate::tool_calls`]); streamed, text that may be a call is
//! held back and the calls go out as `delta.tool_calls` chunks before the final one.

use std::convert::Infallible;
use std::time::Instant;

use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use rlft_model::sampling::Sampled;
use rlft_model::FinishReason;
use rlft_tools::CallFormat;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine::{Event, Job};
use crate::error::{json_response, ApiError};
use crate::prepare::{Kind, Prepared};
use crate::tool_calls::{call_id, call_json, chat_message, Holdback, StreamEnd};

/// What an answer shares: ids, model name, timing, the request's options.
struct Meta {
    id: String,
    created: u64,
    kind: Kind,
    job: Job,
    logprobs: bool,
    return_token_ids: bool,
    include_usage: bool,
    tool_calls: Option<CallFormat>,
    started: Instant,
    path: &'static str,
}

impl Meta {
    fn new(p: &Prepared) -> Meta {
        let prefix = match p.kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        Meta {
            id: format!("{prefix}-{:016x}", crate::engine::random_seed()),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            kind: p.kind,
            job: p.job.clone(),
            logprobs: p.logprobs,
            return_token_ids: p.return_token_ids,
            include_usage: p.include_usage,
            tool_calls: p.tool_calls,
            started: Instant::now(),
            path: match p.kind {
                Kind::Chat => "/v1/chat/completions",
                Kind::Completion => "/v1/completions",
            },
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn prompt_tokens(&self) -> usize {
        self.job.prompts.iter().map(Vec::len).sum()
    }

    fn usage(&self, completion: usize) -> Value {
        let p = self.prompt_tokens();
        json!({"prompt_tokens": p, "completion_tokens": completion, "total_tokens": p + completion})
    }

    /// The text of one token (special tokens shown), as OpenAI's `token` fields give it.
    fn token_text(&self, id: u32) -> String {
        self.job.model.text.decode(&[id], false).unwrap_or_default()
    }

    /// Log-probabilities of `tokens` in the endpoint's shape; `offset` is the completion text
    /// length before them (`text_offset` of completions).
    fn logprobs_json(&self, tokens: &[(Sampled, Vec<Sampled>)], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let lp = |x: f32| if x.is_finite() { x } else { -9999.0 };
        match self.kind {
            Kind::Chat => {
                let entry = |s: &Sampled| {
                    let t = self.token_text(s.token);
                    json!({"token": t, "logprob": lp(s.logprob), "bytes": t.as_bytes()})
                };
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|(s, top)| {
                        let mut e = entry(s);
                        e["top_logprobs"] = top.iter().map(entry).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Completion => {
                let texts: Vec<String> = tokens
                    .iter()
                    .map(|(s, _)| self.token_text(s.token))
                    .collect();
                let mut at = offset;
                let offsets: Vec<usize> = texts
                    .iter()
                    .map(|t| {
                        let o = at;
                        at += t.len();
                        o
                    })
                    .collect();
                let tops: Vec<Value> = tokens
                    .iter()
                    .map(|(_, top)| {
                        let m: serde_json::Map<String, Value> = top
                            .iter()
                            .map(|s| (self.token_text(s.token), json!(lp(s.logprob))))
                            .collect();
                        Value::Object(m)
                    })
                    .collect();
                json!({
                    "tokens": texts,
                    "token_logprobs": tokens.iter().map(|(s, _)| lp(s.logprob)).collect::<Vec<_>>(),
                    "top_logprobs": tops,
                    "text_offset": offsets,
                })
            }
        }
    }

    fn log(&self, completion: usize, outcome: &str) {
        eprintln!(
            "{} model={} prompts={} n={} prompt_tokens={} completion_tokens={} {:.2}s {outcome}",
            self.path,
            self.job.model.name,
            self.job.prompts.len(),
            self.job.n,
            self.prompt_tokens(),
            completion,
            self.started.elapsed().as_secs_f64()
        );
    }
}

fn reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// One choice as it accumulates.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: Vec<(Sampled, Vec<Sampled>)>,
    finish: Option<FinishReason>,
}

/// Waits for every choice and answers with one JSON body.
pub async fn collect(p: Prepared, mut rx: UnboundedReceiver<Event>) -> Response {
    let meta = Meta::new(&p);
    let mut choices: Vec<Choice> = (0..p.job.rows()).map(|_| Choice::default()).collect();
    let mut open = choices.len();
    while open > 0 {
        match rx.recv().await {
            Some(Event::Token {
                choice,
                token,
                top,
                text,
            }) => {
                let c = &mut choices[choice];
                c.text.push_str(&text);
                c.tokens.push((token, top));
            }
            Some(Event::Finished { choice, reason }) => {
                choices[choice].finish = Some(reason);
                open -= 1;
            }
            Some(Event::Failed(msg)) => {
                meta.log(0, "failed");
                return ApiError::internal(msg).into_response();
            }
            None => {
                meta.log(0, "failed");
                return ApiError::internal("the engine stopped before the request finished")
                    .into_response();
            }
        }
    }
    let completion: usize = choices.iter().map(|c| c.tokens.len()).sum();
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = match meta.kind {
                Kind::Chat => {
                    let (message, called) = chat_message(&c.text, meta.tool_calls, call_id);
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": meta.logprobs_json(&c.tokens, 0),
                        "finish_reason": if called { Some("tool_calls") } else { c.finish.map(reason) },
                    })
                }
                Kind::Completion => json!({
                    "index": i,
                    "text": c.text,
                    "logprobs": meta.logprobs_json(&c.tokens, 0),
                    "finish_reason": c.finish.map(reason),
                }),
            };
            if meta.return_token_ids {
                v["token_ids"] = c.tokens.iter().map(|(s, _)| s.token).collect();
            }
            v
        })
        .collect();
    let mut body = json!({
        "id": meta.id,
        "object": meta.object(false),
        "created": meta.created,
        "model": meta.job.model.name,
        "choices": out,
        "usage": meta.usage(completion),
    });
    if meta.return_token_ids {
        body["prompt_token_ids"] = match meta.kind {
            Kind::Chat => json!(meta.job.prompts[0]),
            Kind::Completion => json!(meta.job.prompts),
        };
    }
    meta.log(completion, "ok");
    json_response(axum::http::StatusCode::OK, &body)
}

/// The state of a stream between events.
struct Streamer {
    meta: Meta,
    rx: UnboundedReceiver<Event>,
    open: usize,
    /// Completion text length per choice (`text_offset`).
    sent: Vec<usize>,
    /// Per choice, the text held back while it may be a tool call (requests with tools).
    holds: Vec<Option<Holdback>>,
    completion: usize,
    started: bool,
    done: bool,
}

/// Answers with server-sent events: chunks as tokens arrive, a usage chunk when asked, then
/// `[DONE]`. A client that goes away drops the stream, which cancels the job.
pub fn stream(p: Prepared, rx: UnboundedReceiver<Event>) -> Response {
    let rows = p.job.rows();
    let s = Streamer {
        meta: Meta::new(&p),
        rx,
        open: rows,
        sent: vec![0; rows],
        holds: (0..rows).map(|_| p.tool_calls.map(Holdback::new)).collect(),
        completion: 0,
        started: false,
        done: false,
    };
    let events = stream::unfold(s, |mut s| async move {
        let out = s.next_events().await?;
        Some((out, s))
    })
    .flat_map(stream::iter);
    axum::response::sse::Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

impl Streamer {
    /// The next SSE events; `None` once `[DONE]` went out.
    async fn next_events(&mut self) -> Option<Vec<Result<Sse, Infallible>>> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            if self.meta.kind == Kind::Chat {
                for i in 0..self.sent.len() {
                    let c = json!({"index": i, "delta": {"role": "assistant", "content": ""},
                                   "logprobs": null, "finish_reason": null});
                    out.push(self.chunk(vec![c]));
                }
                return Some(out);
            }
        }
        if self.open == 0 {
            if self.meta.include_usage {
                let mut c = self.chunk_value(Vec::new());
                c["usage"] = self.meta.usage(self.completion);
                out.push(data(&c));
            }
            out.push(Ok(Sse::default().data("[DONE]")));
            self.done = true;
            self.meta.log(self.completion, "ok (stream)");
            return Some(out);
        }
        match self.rx.recv().await {
            Some(Event::Token {
                choice,
                token,
                top,
                text,
            }) => {
                self.completion += 1;
                let text = match &mut self.holds[choice] {
                    Some(h) => h.push(&text),
                    None => text,
                };
                if text.is_empty() && !self.meta.logprobs && !self.meta.return_token_ids {
                    return Some(out);
                }
                let lp = self.meta.logprobs_json(&[(token, top)], self.sent[choice]);
                self.sent[choice] += text.len();
                let mut c = match self.meta.kind {
                    Kind::Chat => json!({"index": choice, "delta": {"content": text},
                                         "logprobs": lp, "finish_reason": null}),
                    Kind::Completion => json!({"index": choice, "text": text,
                                               "logprobs": lp, "finish_reason": null}),
                };
                if self.meta.return_token_ids {
                    c["token_ids"] = json!([token.token]);
                }
                out.push(self.chunk(vec![c]));
            }
            Some(Event::Finished { choice, reason: r }) => {
                self.open -= 1;
                let called = match self.holds[choice].take() {
                    Some(h) => self.release(choice, h.finish(), &mut out),
                    None => false,
                };
                let finish = if called { "tool_calls" } else { reason(r) };
                let c = match self.meta.kind {
                    Kind::Chat => json!({"index": choice, "delta": {}, "logprobs": null,
                                         "finish_reason": finish}),
                    Kind::Completion => json!({"index": choice, "text": "", "logprobs": null,
                                               "finish_reason": reason(r)}),
                };
                out.push(self.chunk(vec![c]));
            }
            Some(Event::Failed(msg)) => return Some(self.fail(msg)),
            None => {
                return Some(
                    self.fail("the engine stopped before the request finished".to_string()),
                )
            }
        }
        Some(out)
    }

    /// The chunks of a held-back end of turn: its content, then one chunk per call (`index`,
    /// `id`, `type`, the function's name and whole arguments). Whether it called tools.
    fn release(
        &self,
        choice: usize,
        end: StreamEnd,
        out: &mut Vec<Result<Sse, Infallible>>,
    ) -> bool {
        if !end.content.is_empty() {
            let c = json!({"index": choice, "delta": {"content": end.content},
                           "logprobs": null, "finish_reason": null});
            out.push(self.chunk(vec![c]));
        }
        for (i, call) in end.calls.iter().enumerate() {
            let mut call = call_json(call, call_id());
            call["index"] = json!(i);
            let c = json!({"index": choice, "delta": {"tool_calls": [call]},
                           "logprobs": null, "finish_reason": null});
            out.push(self.chunk(vec![c]));
        }
        !end.calls.is_empty()
    }

    /// An error chunk (`{"error": ...}`, as vLLM streams it) and `[DONE]`.
    fn fail(&mut self, msg: String) -> Vec<Result<Sse, Infallible>> {
        self.done = true;
        self.meta.log(self.completion, "failed (stream)");
        vec![
            data(&ApiError::internal(msg).body()),
            Ok(Sse::default().data("[DONE]")),
        ]
    }

    fn chunk_value(&self, choices: Vec<Value>) -> Value {
        let mut c = json!({
            "id": self.meta.id,
            "object": self.meta.object(true),
            "created": self.meta.created,
            "model": self.meta.job.model.name,
            "choices": choices,
        });
        if self.meta.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn chunk(&self, choices: Vec<Value>) -> Result<Sse, Infallible> {
        data(&self.chunk_value(choices))
    }
}

fn data(v: &Value) -> Result<Sse, Infallible> {
    Ok(Sse::default().data(v.to_string()))
}

impl Drop for Streamer {
    fn drop(&mut self) {
        if !self.done {
            self.meta
                .log(self.completion, "cancelled (client went away mid-stream)");
        }
    }
}
