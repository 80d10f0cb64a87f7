//! Tool calls in a model's own chat format, read from the text of one assistant turn.
//!
//! - [`CallFormat::Hermes`] (Qwen2.5, Qwen3, Hermes): `<tool_call>\n{"name": ..., "arguments":
//!   {...}}\n</tool_call>`, any number per turn (Qwen2.5's chat template asks for this form);
//! - [`CallFormat::Llama3`] (Llama 3.1-3.3): the whole turn is one JSON object `{"name": ...,
//!   "parameters": {...}}`, optionally after `<|python_tag|>` (Llama 3.1's template).
//!
//! In either format a turn that is nothing but one call object, bare or in a ```` ```json ````
//! fence, is a call too: Qwen2.5-Coder-0.5B-Instruct writes its calls that way instead of the
//! tags its template asks for.
//!
//! A call that cannot be read is returned as an error, which the trainer turns into a failed
//! call the model sees, never into a crash.

use serde_json::{Map, Value};

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    /// `<tool_call>{json}</tool_call>` blocks.
    Hermes,
    /// A bare JSON object as the whole turn.
    Llama3,
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: Map<String, Value>,
}

impl CallFormat {
    /// The format a chat template renders tools in: the tags or headers its source mentions.
    /// `None` when the template does not render tools at all.
    pub fn detect(template_source: &str) -> Option<CallFormat> {
        if !template_source.contains("tools") {
            return None;
        }
        if template_source.contains("<tool_call>") {
            Some(CallFormat::Hermes)
        } else if template_source.contains("ipython")
            || template_source.contains("<|python_tag|>")
            || template_source.contains("\"parameters\"")
        {
            Some(CallFormat::Llama3)
        } else {
            None
        }
    }

    /// The calls in `turn` (the decoded text of one assistant turn, end token removed), in
    /// order; a malformed one is an `Err` with what is wrong.
    pub fn parse(self, turn: &str) -> Vec<Result<ToolCall, String>> {
        self.split(turn).0
    }

    /// [`CallFormat::parse`] and the text outside the calls: around `<tool_call>` blocks (an
    /// unclosed one runs to the end), nothing for a whole-turn call, the whole turn when it
    /// calls nothing.
    pub fn split(self, turn: &str) -> (Vec<Result<ToolCall, String>>, String) {
        let calls = match self {
            CallFormat::Hermes if turn.contains(HERMES_OPEN) => return hermes(turn),
            CallFormat::Hermes => whole_turn(turn).into_iter().map(Ok).collect(),
            CallFormat::Llama3 => llama3(turn),
        };
        let outside = if calls.is_empty() { turn } else { "" };
        (calls, outside.to_string())
    }
}

/// The tag a Hermes call opens with.
pub const HERMES_OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The `<tool_call>` blocks of `turn` and the text around them.
fn hermes(turn: &str) -> (Vec<Result<ToolCall, String>>, String) {
    let (mut calls, mut outside) = (Vec::new(), String::new());
    let mut rest = turn;
    while let Some(start) = rest.find(HERMES_OPEN) {
        outside.push_str(&rest[..start]);
        let body = &rest[start + HERMES_OPEN.len()..];
        match body.find(CLOSE) {
            Some(end) => {
                calls.push(call_object(body[..end].trim(), "arguments"));
                rest = &body[end + CLOSE.len()..];
            }
            None => {
                calls.push(Err(format!("`{HERMES_OPEN}` without a closing `{CLOSE}`")));
                rest = "";
            }
        }
    }
    outside.push_str(rest);
    (calls, outside)
}

/// The call a turn consists of, bare or in a ```` ```json ```` fence: an object with a
/// `"name"` and its `"arguments"` (or `"parameters"`); anything else is no call.
fn whole_turn(turn: &str) -> Option<ToolCall> {
    let t = turn.trim();
    let t = match t.strip_prefix("```") {
        Some(fenced) => {
            let body = fenced.strip_suffix("```")?;
            body.strip_prefix("json").unwrap_or(body)
        }
        None => t,
    };
    let v: Value = serde_json::from_str(t.trim()).ok()?;
    let o = v.as_object()?;
    (o.contains_key("name") && (o.contains_key("arguments") || o.contains_key("parameters")))
        .then(|| call_value(v, "arguments").ok())
        .flatten()
}

fn llama3(turn: &str) -> Vec<Result<ToolCall, String>> {
    let t = turn.trim();
    let t = t.strip_prefix("<|python_tag|>").unwrap_or(t).trim();
    if !t.starts_with('{') {
        return whole_turn(t).into_iter().map(Ok).collect();
    }
    // Several calls may follow one another, separated by `;`.
    let mut out = Vec::new();
    let mut rest = t;
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => out.push(call_value(v, "parameters")),
            Some(Err(e)) => {
                out.push(Err(format!("the call is not valid JSON: {e}")));
                break;
            }
            None => break,
        }
        let after = rest[stream.byte_offset()..].trim_start();
        rest = match after.strip_prefix(';') {
            Some(r) => r.trim_start(),
            None if after.is_empty() => after,
            None => {
                let shown: String = after.chars().take(40).collect();
                out.push(Err(format!("unexpected text after the call: `{shown}`")));
                break;
            }
        };
    }
    out
}

fn call_object(json: &str, args_key: &str) -> Result<ToolCall, String> {
    let v: Value =
        serde_json::from_str(json).map_err(|e| format!("the call is not valid JSON: {e}"))?;
    call_value(v, args_key)
}

/// `{"name": ..., "<args_key>" | "arguments" | "parameters": {...} or a JSON string}`.
fn call_value(v: Value, args_key: &str) -> Result<ToolCall, String> {
    let Value::Object(mut o) = v else {
        return Err("the call is not a JSON object with a \"name\"".into());
    };
    // OpenAI's nesting: {"type": "function", "function": {"name", "arguments"}}.
    if let Some(Value::Object(f)) = o.remove("function") {
        o = f;
    }
    let name = match o.remove("name") {
        Some(Value::String(n)) if !n.trim().is_empty() => n.trim().to_string(),
        _ => return Err("the call has no \"name\" string".into()),
    };
    let args = [args_key, "arguments", "parameters"]
        .iter()
        .find_map(|k| o.remove(*k))
        .unwrap_or(Value::Object(Map::new()));
    let arguments = match args {
        Value::Object(a) => a,
        // Some models write the arguments as a JSON string, as OpenAI's API carries them.
        Value::String(s) => match serde_json::from_str(&s) {
            Ok(Value::Object(a)) => a,
            _ => return Err(format!("the arguments of `{name}` are not a JSON object")),
        },
        _ => return Err(format!("the arguments of `{name}` are not a JSON object")),
    };
    Ok(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(name: &str, args: Value) -> Result<ToolCall, String> {
        Ok(ToolCall {
            name: name.into(),
            arguments: args.as_object().unwrap().clone(),
        })
    }

    #[test]
    fn hermes_calls_in_order_and_errors_in_place() {
        let turn = "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+3\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": \"{\\\"expression\\\": \\\"4*5\\\"}\"}\n</tool_call>\n<tool_call>{\"name\": calculator}</tool_call><tool_call>{\"name\": \"x\"";
        let calls = CallFormat::Hermes.parse(turn);
        assert_eq!(calls.len(), 4);
        assert_eq!(calls[0], ok("calculator", json!({"expression": "2+3"})));
        assert_eq!(calls[1], ok("calculator", json!({"expression": "4*5"})));
        assert!(calls[2].as_ref().unwrap_err().contains("not valid JSON"));
        assert!(calls[3].as_ref().unwrap_err().contains("without a closing"));
        assert!(CallFormat::Hermes
            .parse("The answer is \\boxed{5}.")
            .is_empty());
    }

    /// Qwen2.5-Coder-0.5B's own forms (sampled from it): a fenced or bare call object as the
    /// whole turn. JSON that is not a call, or text around it, is no call.
    #[test]
    fn whole_turn_calls() {
        let want = ok("calculator", json!({"expression": "(9 + 13)"}));
        for turn in [
            "```json\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"(9 + 13)\"}}\n```",
            "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"(9 + 13)\"}}",
            "```\n{\n  \"name\": \"calculator\",\n  \"arguments\": {\n    \"expression\": \"(9 + 13)\"\n  }\n}\n```",
        ] {
            assert_eq!(CallFormat::Hermes.parse(turn), vec![want.clone()], "{turn}");
            assert_eq!(CallFormat::Llama3.parse(turn), vec![want.clone()], "{turn}");
        }
        for turn in [
            "```json\n{\"answer\": 22}\n```",
            "Call: {\"name\": \"calculator\", \"arguments\": {}}",
            "```json\n{\"name\": \"calculator\", \"arguments\": {}}",
        ] {
            assert!(CallFormat::Hermes.parse(turn).is_empty(), "{turn}");
        }
    }

    #[test]
    fn llama3_json_turns() {
        let f = CallFormat::Llama3;
        assert_eq!(
            f.parse(
                "<|python_tag|>{\"name\": \"calc\", \"parameters\": {\"expression\": \"1+1\"}}"
            ),
            vec![ok("calc", json!({"expression": "1+1"}))]
        );
        let two = f.parse("{\"name\": \"a\", \"parameters\": {}}; {\"type\": \"function\", \"function\": {\"name\": \"b\", \"arguments\": {\"x\": 1}}}");
        assert_eq!(two, vec![ok("a", json!({})), ok("b", json!({"x": 1}))]);
        assert!(f.parse("The answer is 4.").is_empty());
        assert!(f.parse("{\"name\": \"a\", ").pop().unwrap().is_err());
        assert!(f.parse("{\"parameters\": {}}").pop().unwrap().is_err());
        assert!(f
            .parse("{\"name\": \"a\"} and more")
            .pop()
            .unwrap()
            .is_err());
    }

    #[test]
    fn format_from_the_template() {
        let qwen = include_str!("../../rlft-text/tests/data/templates/qwen2.5-instruct.jinja");
        let llama = include_str!("../../rlft-text/tests/data/templates/llama-3.1-instruct.jinja");
        assert_eq!(CallFormat::detect(qwen), Some(CallFormat::Hermes));
        assert_eq!(CallFormat::detect(llama), Some(CallFormat::Llama3));
        assert_eq!(
            CallFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
            None
        );
    }
}
