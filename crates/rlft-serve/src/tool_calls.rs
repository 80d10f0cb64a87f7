//! From the text a model generated to OpenAI's `tool_calls`: which calls it holds
//! ([`rlft_tools::CallFormat::parse`]), the text left as `content`, and, for streams, the text
//! held back while it may still turn out to be a call ([`Holdback`]).
//!
//! A turn counts as calling tools only when every call in it parses; a malformed one leaves the
//! whole text as content (no `tool_calls`), so a client sees what the model wrote instead of an
//! error. Streamed and plain answers split a text the same way.

use rlft_tools::parse::HERMES_OPEN as OPEN;
use rlft_tools::{CallFormat, ToolCall};
use serde_json::{json, Value};

/// What a whole-turn call (bare JSON, a ```` ```json ```` fence, Llama 3.1's tag) starts with.
const WHOLE_TURN_STARTS: [&str; 3] = ["{", "```", "<|python_tag|>"];

/// An assistant turn that calls tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The text outside the calls, trailing whitespace dropped; `None` when nothing is left.
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

/// The calls in `text`; `None` when it holds none or one is malformed (the text is then all
/// content).
pub fn split(format: CallFormat, text: &str) -> Option<Reply> {
    let (parsed, outside) = format.split(text);
    if parsed.is_empty() {
        return None;
    }
    let calls: Vec<ToolCall> = parsed.into_iter().collect::<Result<_, _>>().ok()?;
    // Tagged calls leave the text around them; any other form is the whole turn.
    let rest = outside.trim_end();
    let content = (!rest.trim_start().is_empty()).then(|| rest.to_string());
    Some(Reply { content, calls })
}

/// A fresh call id, `call_` and 24 hex digits (OpenAI's ids are `call_` and 24 characters).
pub fn call_id() -> String {
    let a = crate::engine::random_seed();
    let b = crate::engine::random_seed();
    format!("call_{a:016x}{:08x}", b as u32)
}

/// One call in OpenAI's shape: `{"id", "type": "function", "function": {"name", "arguments"}}`,
/// the arguments as a JSON string.
pub fn call_json(call: &ToolCall, id: String) -> Value {
    json!({
        "id": id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": Value::Object(call.arguments.clone()).to_string(),
        },
    })
}

/// The `message` of a non-streamed chat choice for `text`, and whether it calls tools
/// (`finish_reason` is then `"tool_calls"`). `format` is `None` when the request parses no
/// calls; `new_id` names each call.
pub fn chat_message(
    text: &str,
    format: Option<CallFormat>,
    mut new_id: impl FnMut() -> String,
) -> (Value, bool) {
    match format.and_then(|f| split(f, text)) {
        Some(reply) => {
            let calls: Vec<Value> = reply.calls.iter().map(|c| call_json(c, new_id())).collect();
            (
                json!({"role": "assistant", "content": reply.content, "tool_calls": calls}),
                true,
            )
        }
        None => (json!({"role": "assistant", "content": text}), false),
    }
}

/// The text of one streamed choice, held back while it may be a call.
///
/// Until something but whitespace arrives, everything waits; a turn that starts like a
/// whole-turn call (`{`, a fence, `<|python_tag|>`) is held to the end; otherwise text flows,
/// except a tail that may begin `<tool_call>` (or trailing whitespace, which the reply drops
/// when a call follows), and from a `<tool_call>` on everything is held. At the end the held
/// text is split as [`split`] splits the whole turn, so a stream gives what a plain answer does.
#[derive(Debug, Clone)]
pub struct Holdback {
    format: CallFormat,
    /// The whole text so far (sent and held).
    text: String,
    /// How much of `text` went out.
    sent: usize,
    /// Everything from here on waits for the end.
    to_end: bool,
}

/// What a finished stream still sends.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEnd {
    /// Content not sent yet (empty: none).
    pub content: String,
    /// The calls; empty when the turn called nothing.
    pub calls: Vec<ToolCall>,
}

impl Holdback {
    /// A choice whose calls are written in `format`.
    pub fn new(format: CallFormat) -> Holdback {
        Holdback {
            format,
            text: String::new(),
            sent: 0,
            to_end: false,
        }
    }

    /// Adds newly decoded text; returns the content that can be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.to_end {
            return String::new();
        }
        let held = &self.text[self.sent..];
        if self.sent == 0 {
            let t = held.trim_start();
            if t.is_empty() {
                return String::new();
            }
            if WHOLE_TURN_STARTS.iter().any(|s| t.starts_with(s)) {
                self.to_end = true;
                return String::new();
            }
            if WHOLE_TURN_STARTS.iter().any(|s| s.starts_with(t)) {
                return String::new();
            }
        }
        let mut keep = held.len();
        if self.format == CallFormat::Hermes {
            if let Some(at) = held.find(OPEN) {
                keep = at;
                self.to_end = true;
            } else {
                keep -= partial_suffix(held, OPEN);
            }
        }
        let ready = held[..keep].trim_end();
        let out = ready.to_string();
        self.sent += out.len();
        out
    }

    /// The end of the turn: the content still held and the calls, split as [`split`] does.
    pub fn finish(self) -> StreamEnd {
        let held = &self.text[self.sent..];
        match split(self.format, &self.text) {
            Some(reply) => {
                // What went out is the start of `reply.content`; the rest is what is left of it.
                let content = reply
                    .content
                    .as_deref()
                    .and_then(|c| c.get(self.sent..))
                    .unwrap_or("")
                    .to_string();
                StreamEnd {
                    content,
                    calls: reply.calls,
                }
            }
            None => StreamEnd {
                content: held.to_string(),
                calls: Vec::new(),
            },
        }
    }
}

/// The length of the longest end of `text` that is a proper start of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn calc(expr: &str) -> ToolCall {
        let mut arguments = Map::new();
        arguments.insert("expression".into(), json!(expr));
        ToolCall {
            name: "calculator".into(),
            arguments,
        }
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("call_{n}")
        }
    }

    const TAGGED: &str = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*4\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+2\"}}\n</tool_call>\n";

    #[test]
    fn tagged_calls_keep_the_text_around_them() {
        let r = split(CallFormat::Hermes, TAGGED).unwrap();
        assert_eq!(r.content.as_deref(), Some("Let me compute."));
        assert_eq!(r.calls, vec![calc("17*4"), calc("2+2")]);
        let only = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}\n</tool_call>";
        assert_eq!(split(CallFormat::Hermes, only).unwrap().content, None);
    }

    #[test]
    fn whole_turn_calls_have_no_content() {
        for text in [
            "```json\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*4\"}}\n```",
            "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17*4\"}}",
        ] {
            for f in [CallFormat::Hermes, CallFormat::Llama3] {
                let r = split(f, text).unwrap();
                assert_eq!((r.content, r.calls), (None, vec![calc("17*4")]), "{text}");
            }
        }
    }

    #[test]
    fn plain_and_malformed_text_stays_content() {
        for text in [
            "The answer is 68.",
            "<tool_call>{\"name\": calculator}</tool_call>",
            "Sure: <tool_call>{\"name\": \"calculator\", \"arguments\": {}}",
            "```json\n{\"answer\": 68}\n```",
        ] {
            assert_eq!(split(CallFormat::Hermes, text), None, "{text}");
            let (m, called) = chat_message(text, Some(CallFormat::Hermes), ids());
            assert!(!called);
            assert_eq!(m, json!({"role": "assistant", "content": text}));
        }
    }

    #[test]
    fn the_message_in_openai_shape() {
        let (m, called) = chat_message(TAGGED, Some(CallFormat::Hermes), ids());
        assert!(called);
        assert_eq!(
            m,
            json!({"role": "assistant", "content": "Let me compute.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calculator",
                 "arguments": "{\"expression\":\"17*4\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "calculator",
                 "arguments": "{\"expression\":\"2+2\"}"}},
            ]})
        );
        let whole = "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}";
        let (m, called) = chat_message(whole, Some(CallFormat::Hermes), ids());
        assert!(called && m["content"].is_null(), "{m}");
        // Without tools in the request nothing is parsed.
        let (m, called) = chat_message(whole, None, ids());
        assert!(!called);
        assert_eq!(m["content"], whole);
        let (a, b) = (call_id(), call_id());
        assert!(a.starts_with("call_") && a.len() == 29 && a != b, "{a} {b}");
    }

    /// Streams `text` in pieces of `step` characters: what went out at once and the end.
    fn stream(text: &str, step: usize) -> (String, StreamEnd) {
        let mut h = Holdback::new(CallFormat::Hermes);
        let chars: Vec<char> = text.chars().collect();
        let mut sent = String::new();
        for piece in chars.chunks(step) {
            sent.push_str(&h.push(&piece.iter().collect::<String>()));
        }
        (sent, h.finish())
    }

    #[test]
    fn streams_split_as_plain_answers_do() {
        let texts = [
            TAGGED,
            "  \n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}",
            "```json\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}\n```",
            "The answer is 68.\n\nDone.  ",
            "`x` is <tool_ca not a call",
            "Sure: <tool_call>{\"name\": \"calculator\", \"arguments\": {}}",
            "a < b <tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1\"}}\n</tool_call> then text",
            "",
            " ",
        ];
        for text in texts {
            let (m, _) = chat_message(text, Some(CallFormat::Hermes), ids());
            let want_content = m["content"].as_str().unwrap_or("").to_string();
            let want_calls = split(CallFormat::Hermes, text).map_or(vec![], |r| r.calls);
            for step in [1, 2, 3, 7, 1000] {
                let (sent, end) = stream(text, step);
                assert_eq!(sent + &end.content, want_content, "{text:?} step {step}");
                assert_eq!(end.calls, want_calls, "{text:?} step {step}");
            }
        }
    }

    #[test]
    fn text_flows_until_a_call_may_start() {
        let mut h = Holdback::new(CallFormat::Hermes);
        assert_eq!(h.push("Hello"), "Hello");
        assert_eq!(h.push(" world <tool"), " world");
        assert_eq!(h.push("box> here"), " <toolbox> here");
        assert_eq!(h.push(" <tool_call>{"), "");
        assert_eq!(h.push("\"x\": 1} more"), "");
        let mut h = Holdback::new(CallFormat::Hermes);
        assert_eq!(h.push("{\"answer\""), "");
        assert_eq!(h.push(": 1}"), "");
        assert_eq!(h.finish().content, "{\"answer\": 1}");
        let mut h = Holdback::new(CallFormat::Llama3);
        assert_eq!(h.push("``"), "");
        assert_eq!(h.push("x`` <tool_call>"), "``x`` <tool_call>");
    }
}
