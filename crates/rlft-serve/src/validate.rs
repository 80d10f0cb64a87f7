//! Request bodies checked field by field before they are read into the [`crate::protocol`]
//! structs, so that a wrong value gets a 400 naming the field and what it takes (`max_tokens
//! must be an integer >= 1, got -1`, `param: "max_tokens"`) instead of serde's message about
//! the whole body. Each endpoint lists its fields with a [`Rule`]; unknown fields are ignored
//! (as OpenAI-compatible servers do) and `null` is the same as leaving a field out. Integers
//! written as whole floats (`16.0`) are taken as integers, as OpenAI's and vLLM's servers do.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::prepare::MAX_TOP_LOGPROBS;
use crate::protocol::{ChatRequest, CompletionRequest, LoadLora, UnloadLora};

/// What a field's value must be.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// An integer in `[min, max]`.
    Int {
        /// Smallest value.
        min: i128,
        /// Largest value.
        max: i128,
    },
    /// A finite number in a range (finite as an `f32`, the type the sampler uses).
    Num {
        /// Lower bound.
        min: f64,
        /// Whether `min` itself is excluded.
        min_open: bool,
        /// Upper bound (`INFINITY`: none).
        max: f64,
    },
    /// `true` or `false`.
    Bool,
    /// A string.
    Str,
    /// A JSON object.
    Object,
    /// A JSON array.
    Array,
    /// A string or a list of strings (`stop`).
    Strings,
    /// `/v1/completions`' `prompt`: text or token ids, one or a batch.
    Prompt,
    /// Chat messages: a list of objects with a string `role`.
    Messages,
    /// `stream_options`: an object whose `include_usage` is a boolean.
    StreamOptions,
    /// `response_format`: an object whose `type` is one of [`RESPONSE_FORMATS`].
    ResponseFormat,
    /// `tools`: a list of function tools ([`crate::tools::check_tools`]).
    Tools,
    /// `tool_choice`: a string or a named function ([`crate::tools::check_tool_choice`]).
    ToolChoice,
}

/// The `response_format.type` values of OpenAI's API (only `text` is served; see
/// [`crate::prepare`]).
pub const RESPONSE_FORMATS: &[&str] = &["text", "json_object", "json_schema"];

/// One field of a request body.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Its name.
    pub name: &'static str,
    /// What it takes.
    pub rule: Rule,
    /// Whether the body must have it.
    pub required: bool,
    /// Said after the range, e.g. what a special value means.
    pub note: &'static str,
}

const fn f(name: &'static str, rule: Rule) -> Field {
    Field {
        name,
        rule,
        required: false,
        note: "",
    }
}

const fn required(name: &'static str, rule: Rule) -> Field {
    Field {
        name,
        rule,
        required: true,
        note: "",
    }
}

const fn noted(name: &'static str, rule: Rule, note: &'static str) -> Field {
    Field {
        name,
        rule,
        required: false,
        note,
    }
}

const fn int(min: i128, max: i128) -> Rule {
    Rule::Int { min, max }
}

const fn num(min: f64, min_open: bool, max: f64) -> Rule {
    Rule::Num { min, min_open, max }
}

const U64: i128 = u64::MAX as i128;
const I64: (i128, i128) = (i64::MIN as i128, i64::MAX as i128);
const TOP: i128 = MAX_TOP_LOGPROBS as i128;
const INF: f64 = f64::INFINITY;

/// The fields `/v1/chat/completions` and `/v1/completions` share ([`crate::protocol::Common`]).
pub const COMMON: &[Field] = &[
    required("model", Rule::Str),
    f("max_tokens", int(1, U64)),
    f("temperature", num(0.0, false, INF)),
    f("top_p", num(0.0, true, 1.0)),
    noted("top_k", int(-1, I64.1), " (-1 or 0: off)"),
    f("min_p", num(0.0, false, 1.0)),
    noted("repetition_penalty", num(0.0, true, INF), " (1: off)"),
    f("n", int(1, U64)),
    f("stop", Rule::Strings),
    f("seed", int(I64.0, I64.1)),
    f("stream", Rule::Bool),
    f("stream_options", Rule::StreamOptions),
    f("ignore_eos", Rule::Bool),
    f("return_token_ids", Rule::Bool),
    f("presence_penalty", num(-2.0, false, 2.0)),
    f("frequency_penalty", num(-2.0, false, 2.0)),
    f("logit_bias", Rule::Object),
    f("response_format", Rule::ResponseFormat),
];

/// The fields only `/v1/chat/completions` has.
pub const CHAT: &[Field] = &[
    required("messages", Rule::Messages),
    f("max_completion_tokens", int(1, U64)),
    f("logprobs", Rule::Bool),
    f("top_logprobs", int(0, TOP)),
    f("add_generation_prompt", Rule::Bool),
    f("continue_final_message", Rule::Bool),
    f("chat_template_kwargs", Rule::Object),
    f("tools", Rule::Tools),
    f("tool_choice", Rule::ToolChoice),
];

/// The fields only `/v1/completions` has.
pub const COMPLETION: &[Field] = &[
    required("prompt", Rule::Prompt),
    noted(
        "logprobs",
        int(0, TOP),
        " (the number of most likely tokens to report)",
    ),
    f("echo", Rule::Bool),
    f("suffix", Rule::Str),
    f("best_of", int(1, U64)),
];

/// `/v1/load_lora_adapter`.
pub const LOAD_LORA: &[Field] = &[
    required("lora_name", Rule::Str),
    required("lora_path", Rule::Str),
    f("load_inplace", Rule::Bool),
];

/// `/v1/unload_lora_adapter`.
pub const UNLOAD_LORA: &[Field] = &[required("lora_name", Rule::Str)];

/// A request body with its field rules.
pub trait Checked: DeserializeOwned {
    /// The field lists that apply (several: shared and own fields).
    const FIELDS: &'static [&'static [Field]];
}

impl Checked for ChatRequest {
    const FIELDS: &'static [&'static [Field]] = &[COMMON, CHAT];
}

impl Checked for CompletionRequest {
    const FIELDS: &'static [&'static [Field]] = &[COMMON, COMPLETION];
}

impl Checked for LoadLora {
    const FIELDS: &'static [&'static [Field]] = &[LOAD_LORA];
}

impl Checked for UnloadLora {
    const FIELDS: &'static [&'static [Field]] = &[UNLOAD_LORA];
}

/// Parses a body: JSON, then every listed field checked, then the struct.
pub fn parse<T: Checked>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    let Some(body) = v.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            shown(&v)
        )));
    };
    for field in T::FIELDS.iter().flat_map(|l| l.iter()) {
        check_field(body, field)?;
    }
    serde_json::from_value(v).map_err(|e| {
        ApiError::bad_request(format!("the request body does not fit this endpoint: {e}"))
    })
}

/// Checks one field of `body` (and rewrites a whole float into an integer).
pub fn check_field(body: &mut Map<String, Value>, field: &Field) -> Result<(), ApiError> {
    let name = field.name;
    let v = match body.get_mut(name) {
        None | Some(Value::Null) if field.required => {
            return Err(ApiError::bad_param(
                name,
                format!("{name} is required: {}", describe(field)),
            ))
        }
        None | Some(Value::Null) => return Ok(()),
        Some(v) => v,
    };
    let wrong = |v: &Value| {
        ApiError::bad_param(
            name,
            format!("{name} must be {}, got {}", describe(field), shown(v)),
        )
    };
    let ok = match field.rule {
        Rule::Int { min, max } => match as_int(v) {
            Some(i) if (min..=max).contains(&i) => {
                *v = int_value(i);
                true
            }
            _ => false,
        },
        Rule::Num { min, min_open, max } => v.as_f64().is_some_and(|x| {
            let above = if min_open { x > min } else { x >= min };
            above && x <= max && (x as f32).is_finite()
        }),
        Rule::Bool => v.is_boolean(),
        Rule::Str => v.is_string(),
        Rule::Object => v.is_object(),
        Rule::Array => v.is_array(),
        Rule::Strings => is_strings(v),
        Rule::Prompt => is_prompt(v),
        Rule::Messages => return check_messages(v),
        Rule::StreamOptions => return check_stream_options(v),
        Rule::ResponseFormat => return check_response_format(v),
        Rule::Tools => return crate::tools::check_tools(v),
        Rule::ToolChoice => return crate::tools::check_tool_choice(v),
    };
    if ok {
        Ok(())
    } else {
        Err(wrong(&*v))
    }
}

/// What `field` takes, in words.
pub fn describe(field: &Field) -> String {
    let what = match field.rule {
        Rule::Int { min, max } if max >= I64.1 && min > I64.0 => format!("an integer >= {min}"),
        Rule::Int { min, max } => format!("an integer between {min} and {max}"),
        Rule::Num { min, min_open, max } => {
            let lo = if min_open { ">" } else { ">=" };
            match (max.is_infinite(), min_open) {
                (true, _) => format!("a number {lo} {min}"),
                (false, true) => format!("a number > {min} and <= {max}"),
                (false, false) => format!("a number between {min} and {max}"),
            }
        }
        Rule::Bool => "true or false".into(),
        Rule::Str => "a string".into(),
        Rule::Object => "a JSON object".into(),
        Rule::Array => "a list".into(),
        Rule::Strings => "a string or a list of strings".into(),
        Rule::Prompt => {
            "a string, a list of strings, a list of token ids or a list of lists of token ids"
                .into()
        }
        Rule::Messages => "a list of messages, each an object with a string `role`".into(),
        Rule::StreamOptions => "an object such as {\"include_usage\": true}".into(),
        Rule::ResponseFormat => format!(
            "an object whose `type` is one of {}",
            quoted_list(RESPONSE_FORMATS)
        ),
        Rule::Tools => "a list of {\"type\": \"function\", \"function\": {...}} tools".into(),
        Rule::ToolChoice => format!(
            "one of {} or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
            quoted_list(crate::tools::TOOL_CHOICES)
        ),
    };
    format!("{what}{}", field.note)
}

fn quoted_list(items: &[&str]) -> String {
    let q: Vec<String> = items.iter().map(|s| format!("\"{s}\"")).collect();
    q.join(", ")
}

/// The value as JSON, shortened.
fn shown(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

/// An integer, or a float with no fractional part.
fn as_int(v: &Value) -> Option<i128> {
    if let Some(i) = v.as_i64() {
        return Some(i.into());
    }
    if let Some(u) = v.as_u64() {
        return Some(u.into());
    }
    let x = v.as_f64()?;
    (x.fract() == 0.0 && x.abs() < 1.8e19).then_some(x as i128)
}

fn int_value(i: i128) -> Value {
    match (i64::try_from(i), u64::try_from(i)) {
        (Ok(i), _) => Value::from(i),
        (_, Ok(u)) => Value::from(u),
        _ => Value::Null, // outside every range a rule allows
    }
}

fn is_strings(v: &Value) -> bool {
    match v {
        Value::String(_) => true,
        Value::Array(a) => a.iter().all(Value::is_string),
        _ => false,
    }
}

fn is_token_ids(v: &Value) -> bool {
    let id = |x: &Value| x.as_u64().is_some_and(|t| t <= u64::from(u32::MAX));
    v.as_array().is_some_and(|a| a.iter().all(id))
}

fn is_prompt(v: &Value) -> bool {
    match v {
        Value::String(_) => true,
        Value::Array(a) if a.iter().all(Value::is_string) => true,
        Value::Array(_) if is_token_ids(v) => true,
        Value::Array(a) => a.iter().all(is_token_ids),
        _ => false,
    }
}

fn check_messages(v: &Value) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::bad_param("messages", m));
    let Some(list) = v.as_array() else {
        return bad(format!(
            "messages must be a list of messages, got {}",
            shown(v)
        ));
    };
    for (i, m) in list.iter().enumerate() {
        if !m.get("role").is_some_and(Value::is_string) {
            return bad(format!(
                "messages[{i}] must be an object with a string `role` (e.g. {{\"role\": \"user\", \
                 \"content\": \"Hi\"}}), got {}",
                shown(m)
            ));
        }
        if let Err(e) = serde_json::from_value::<rlft_text::Message>(m.clone()) {
            return bad(format!("messages[{i}]: {e}"));
        }
    }
    Ok(())
}

fn check_stream_options(v: &Value) -> Result<(), ApiError> {
    let field = f("stream_options", Rule::StreamOptions);
    let usage = v.get("include_usage").unwrap_or(&Value::Null);
    if !v.is_object() || !(usage.is_null() || usage.is_boolean()) {
        return Err(ApiError::bad_param(
            "stream_options",
            format!(
                "stream_options must be {}, got {}",
                describe(&field),
                shown(v)
            ),
        ));
    }
    Ok(())
}

fn check_response_format(v: &Value) -> Result<(), ApiError> {
    let kind = v.get("type").and_then(Value::as_str);
    if kind.is_some_and(|k| RESPONSE_FORMATS.contains(&k)) {
        return Ok(());
    }
    let got = v.get("type").map_or_else(|| shown(v), shown);
    Err(ApiError::bad_param(
        "response_format",
        format!(
            "response_format.type must be one of {}, got {got}",
            quoted_list(RESPONSE_FORMATS)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(extra: Value) -> Value {
        let mut v = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    }

    fn err<T: Checked + std::fmt::Debug>(v: &Value) -> ApiError {
        parse::<T>(v.to_string().as_bytes()).unwrap_err()
    }

    #[test]
    fn a_valid_body_parses_and_whole_floats_are_integers() {
        let v = chat(
            json!({"max_tokens": 16.0, "temperature": 0, "top_k": -1, "seed": -3,
                            "stop": ["a", "b"], "stream": null, "response_format": {"type": "text"}}),
        );
        let r: ChatRequest = parse(v.to_string().as_bytes()).unwrap();
        assert_eq!(r.common.max_tokens, Some(16));
        assert_eq!(r.common.seed, Some(-3));
        assert_eq!(r.common.stream, None);
    }

    #[test]
    fn max_tokens_minus_one_names_the_field_and_the_range() {
        let e = err::<ChatRequest>(&chat(json!({"max_tokens": -1})));
        assert_eq!(e.param, Some("max_tokens"));
        assert_eq!(e.message, "max_tokens must be an integer >= 1, got -1");
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn bodies_that_are_not_objects_or_not_json_are_refused() {
        let e = parse::<ChatRequest>(b"[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{}", e.message);
        let e = parse::<ChatRequest>(b"{\"model\": ").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = err::<ChatRequest>(&json!({"messages": []}));
        assert_eq!(
            (e.param, e.message.as_str()),
            (Some("model"), "model is required: a string")
        );
    }
}
