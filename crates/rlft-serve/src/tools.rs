//! Tools in chat requests (OpenAI's `tools` and `tool_choice`): the field checks, which
//! choices are served, the tool list handed to the chat template, and earlier assistant calls
//! put in the shape chat templates expect. Reading calls out of the answer is
//! [`crate::tool_calls`].
//!
//! The model decides whether to call: decoding is not constrained, so `tool_choice`
//! `"required"` and a named function are refused rather than promised.

use rlft_text::{ChatTemplate, Message};
use rlft_tools::CallFormat;
use serde_json::Value;

use crate::error::ApiError;

/// The `tool_choice` strings of OpenAI's API.
pub const TOOL_CHOICES: &[&str] = &["auto", "none", "required"];

/// What the model may do with the request's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides; calls in its answer become `tool_calls` (the default).
    Auto,
    /// No calls: the tools are left out of the prompt and the answer is plain content.
    None,
}

/// The tools of one chat request, resolved against the model's template.
#[derive(Debug, Clone)]
pub struct RequestTools {
    /// The list the template's `tools` variable gets (OpenAI's form, as sent).
    pub schemas: Vec<Value>,
    /// How the model writes calls (from its template).
    pub format: CallFormat,
}

/// Checks `tools`: a list of `{"type": "function", "function": {"name": ..., ...}}`.
pub fn check_tools(v: &Value) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::bad_param("tools", m));
    let Some(list) = v.as_array() else {
        return bad(format!("tools must be a list, got {}", shown(v)));
    };
    for (i, t) in list.iter().enumerate() {
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        if t.get("type").and_then(Value::as_str) != Some("function") || name.is_none() {
            return bad(format!(
                "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \
                 \"description\": ..., \"parameters\": {{...}}}}}}, got {}",
                shown(t)
            ));
        }
        if t["function"]
            .get("parameters")
            .is_some_and(|p| !p.is_object() && !p.is_null())
        {
            return bad(format!(
                "tools[{i}].function.parameters must be a JSON schema object, got {}",
                shown(&t["function"]["parameters"])
            ));
        }
    }
    Ok(())
}

/// Checks the type of `tool_choice`: one of [`TOOL_CHOICES`] or
/// `{"type": "function", "function": {"name": ...}}` (which ones are served: [`choice`]).
pub fn check_tool_choice(v: &Value) -> Result<(), ApiError> {
    let named = v.get("type").and_then(Value::as_str) == Some("function")
        && v.get("function")
            .and_then(|f| f.get("name"))
            .is_some_and(Value::is_string);
    if v.as_str().is_some_and(|s| TOOL_CHOICES.contains(&s)) || named {
        return Ok(());
    }
    Err(ApiError::bad_param(
        "tool_choice",
        format!(
            "tool_choice must be \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \
             \"function\": {{\"name\": ...}}}}, got {}",
            shown(v)
        ),
    ))
}

/// The served choice of a checked `tool_choice` (unset: auto).
pub fn choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    match v.map(Value::as_str) {
        None | Some(Some("auto")) => Ok(ToolChoice::Auto),
        Some(Some("none")) => Ok(ToolChoice::None),
        _ => Err(ApiError::bad_param(
            "tool_choice",
            "tool_choice \"required\" and a named function are not supported: rlft serve does \
             not constrain decoding to a call, the model decides. Send \"auto\" (the default) \
             or \"none\", and ask for the tool in the prompt if it must be called",
        )),
    }
}

/// The tools a request's prompt shows and whose calls are parsed: `None` without tools or with
/// `tool_choice: "none"`. A model whose template does not render tools is refused.
pub fn resolve(
    model: &str,
    template: &ChatTemplate,
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
) -> Result<Option<RequestTools>, ApiError> {
    let choice = choice(tool_choice)?;
    let Some(tools) = tools.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let format = CallFormat::detect(template.source()).ok_or_else(|| {
        ApiError::bad_param(
            "tools",
            format!(
                "the chat template of model `{model}` does not render tools (no `tools` \
                 variable with <tool_call> blocks or Llama 3's JSON calls); serve a model whose \
                 template does (Qwen2.5, Qwen3, Llama 3.1+, e.g. qwen2.5-coder-0.5b) or send \
                 the request without `tools`"
            ),
        )
    })?;
    // "none": a model shown tools tends to call them, and a call cannot be prevented here,
    // so the prompt leaves them out and the answer is not parsed.
    Ok((choice == ToolChoice::Auto).then(|| RequestTools {
        schemas: tools.to_vec(),
        format,
    }))
}

/// The messages as templates read them: each assistant call's `function.arguments`, a JSON
/// string in OpenAI's API, parsed into its object (transformers and vLLM do the same; Qwen2.5's
/// template writes `arguments | tojson`, which would quote a string a second time).
pub fn template_messages(messages: &[Message]) -> Result<Vec<Message>, ApiError> {
    let mut out = messages.to_vec();
    for (i, m) in out.iter_mut().enumerate() {
        let Some(Value::Array(calls)) = m.extra.get_mut("tool_calls") else {
            continue;
        };
        for (j, call) in calls.iter_mut().enumerate() {
            let args = match call.get_mut("function") {
                Some(f) => f.get_mut("arguments"),
                None => call.get_mut("arguments"),
            };
            let Some(args) = args else { continue };
            let Value::String(s) = &*args else { continue };
            *args = serde_json::from_str(s).map_err(|e| {
                ApiError::bad_param(
                    "messages",
                    format!(
                        "messages[{i}].tool_calls[{j}].function.arguments is not valid JSON \
                         ({e}); send the arguments the model's call had, as a JSON string of \
                         an object such as \"{{\\\"x\\\": 1}}\""
                    ),
                )
            })?;
        }
    }
    Ok(out)
}

/// The value as JSON, shortened.
fn shown(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn calc() -> Value {
        json!({"type": "function", "function": {"name": "calculator", "description": "math",
               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}})
    }

    #[test]
    fn tools_and_choices_are_checked_with_what_they_take() {
        assert!(check_tools(&json!([calc()])).is_ok());
        for bad in [
            json!([{"name": "calculator"}]),
            json!([{"type": "function", "function": {}}]),
        ] {
            let e = check_tools(&bad).unwrap_err();
            assert_eq!(e.param, Some("tools"));
            assert!(e
                .message
                .starts_with("tools[0] must be {\"type\": \"function\""));
        }
        let e = check_tools(
            &json!([calc(), {"type": "function", "function": {"name": "f", "parameters": 3}}]),
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("tools[1].function.parameters"),
            "{}",
            e.message
        );

        for ok in [json!("auto"), json!("none"), json!("required")] {
            assert!(check_tool_choice(&ok).is_ok());
        }
        let named = json!({"type": "function", "function": {"name": "calculator"}});
        assert!(check_tool_choice(&named).is_ok());
        assert!(check_tool_choice(&json!("always")).is_err());
        assert_eq!(choice(None).unwrap(), ToolChoice::Auto);
        assert_eq!(choice(Some(&json!("none"))).unwrap(), ToolChoice::None);
        for refused in [json!("required"), named] {
            let e = choice(Some(&refused)).unwrap_err();
            assert!(e.message.contains("Send \"auto\""), "{}", e.message);
        }
    }

    #[test]
    fn templates_without_tools_are_refused_and_none_drops_the_tools() {
        let qwen = ChatTemplate::new(include_str!(
            "../../rlft-text/tests/data/templates/qwen2.5-instruct.jinja"
        ))
        .unwrap();
        let plain =
            ChatTemplate::new("{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
        let tools = [calc()];
        let r = resolve("q", &qwen, Some(&tools), None).unwrap().unwrap();
        assert_eq!(r.format, CallFormat::Hermes);
        assert!(resolve("q", &qwen, Some(&tools), Some(&json!("none")))
            .unwrap()
            .is_none());
        assert!(resolve("q", &qwen, Some(&[]), None).unwrap().is_none());
        let e = resolve("plain", &plain, Some(&tools), None).unwrap_err();
        assert_eq!(e.param, Some("tools"));
        assert!(e.message.contains("model `plain` does not render tools"));
        assert!(resolve("plain", &plain, None, None).unwrap().is_none());
    }

    #[test]
    fn string_arguments_become_objects_for_the_template() {
        let msgs: Vec<Message> = serde_json::from_value(json!([
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
             "type": "function",
             "function": {"name": "calculator", "arguments": "{\"expression\": \"2+3\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        ]))
        .unwrap();
        let out = template_messages(&msgs).unwrap();
        assert_eq!(
            out[1].extra["tool_calls"][0]["function"]["arguments"],
            json!({"expression": "2+3"})
        );
        let qwen = ChatTemplate::new(include_str!(
            "../../rlft-text/tests/data/templates/qwen2.5-instruct.jinja"
        ))
        .unwrap();
        let text = qwen.render(&out, &Default::default()).unwrap();
        assert!(
            text.contains(
                "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+3\"}}\n</tool_call>"
            ),
            "{text}"
        );
        assert!(
            text.contains("<tool_response>\n5\n</tool_response>"),
            "{text}"
        );

        let mut bad = msgs.clone();
        bad[1].extra["tool_calls"][0]["function"]["arguments"] = json!("{oops");
        let e = template_messages(&bad).unwrap_err();
        assert!(
            e.message
                .starts_with("messages[1].tool_calls[0].function.arguments is not valid JSON"),
            "{}",
            e.message
        );
    }
}
