//! Chat templates with Hugging Face semantics: a template renders byte-identically to
//! `transformers`' `tokenizer.apply_chat_template(messages, tokenize=False, ...)`.
//!
//! What is reproduced (transformers 5.x `chat_template_utils`):
//! - the Jinja environment: `trim_blocks` and `lstrip_blocks` on, no trailing newline kept,
//!   `loopcontrols`, `namespace()`, `dict()`;
//! - `raise_exception(msg)` -> [`TextError::TemplateRaised`] carrying `msg`;
//! - the `tojson` filter as HF overrides it: `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)` (no HTML escaping, Python's separators and float format);
//! - `strftime_now(fmt)`;
//! - Python string/dict methods (`.strip()`, `.split()`, `.startswith()`, `.items()`, `.get()`...)
//!   through `minijinja-contrib`'s pycompat, and Python's printing of values (`None`, `True`,
//!   `['a', 'b']`, `1e-05`) in `{{ ... }}`;
//! - the `{% generation %}...{% endgeneration %}` tag (rendered as its body);
//! - the context: `messages` (message keys whose value is null dropped, reasoning fields aliased
//!   as transformers does), `tools` and `documents` (None when absent), `add_generation_prompt`,
//!   the named special tokens, and any extra kwargs; `continue_final_message`.
//!
//! Simplified: `strftime_now` formats the current time in UTC (Python uses the local time zone,
//! which is UTC in most containers); the assistant-token mask of `{% generation %}` is not
//! computed.

use crate::error::{Result, TextError};
use crate::jinja::{describe, hf_environment, render_error, rewrite_generation_tags};
use minijinja::value::Value;
use minijinja::Environment;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

const TEMPLATE_NAME: &str = "chat_template";
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The content of a message: plain text, or a list of parts (`{"type": "text", "text": ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Multimodal-style parts, passed to the template as they are.
    Parts(Vec<Json>),
    /// Any other JSON value (e.g. a tool result object), passed as it is.
    Other(Json),
}

impl Content {
    /// The text, when the content is plain text.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(s) => Some(s),
            _ => None,
        }
    }
}

impl From<&str> for Content {
    fn from(s: &str) -> Self {
        Content::Text(s.to_string())
    }
}

impl From<String> for Content {
    fn from(s: String) -> Self {
        Content::Text(s)
    }
}

/// A chat message. Any extra field (`tool_calls`, `name`, `tool_call_id`, `reasoning_content`...)
/// goes in `extra` and reaches the template unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// The text or parts; `None` leaves the key out (an assistant message that only calls tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// Other fields, in order.
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<Content>) -> Self {
        Message {
            role: role.into(),
            content: Some(content.into()),
            extra: Map::new(),
        }
    }
    /// A `system` message.
    pub fn system(content: impl Into<Content>) -> Self {
        Self::new("system", content)
    }
    /// A `user` message.
    pub fn user(content: impl Into<Content>) -> Self {
        Self::new("user", content)
    }
    /// An `assistant` message.
    pub fn assistant(content: impl Into<Content>) -> Self {
        Self::new("assistant", content)
    }
}

/// The named special tokens a template sees as `bos_token`, `eos_token`, `unk_token`, `pad_token`
/// (transformers passes its `special_tokens_map`; unset ones are undefined in the template).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token, e.g. `<|begin_of_text|>`.
    pub bos: Option<String>,
    /// End-of-sequence token, e.g. `<|im_end|>`.
    pub eos: Option<String>,
    /// Unknown token.
    pub unk: Option<String>,
    /// Padding token.
    pub pad: Option<String>,
}

/// Options of one render, mirroring `apply_chat_template`'s arguments.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the header that starts an assistant turn (`<|im_start|>assistant\n`).
    pub add_generation_prompt: bool,
    /// Leave the final message open so the model continues it (cuts the rendered text right
    /// after that message's content). Incompatible with `add_generation_prompt`.
    pub continue_final_message: bool,
    /// `bos_token`, `eos_token`... as the template sees them.
    pub special_tokens: SpecialTokens,
    /// JSON schemas of the tools (`tools` in the template; None when unset).
    pub tools: Option<Vec<Json>>,
    /// RAG documents (`documents` in the template; None when unset).
    pub documents: Option<Vec<Json>>,
    /// Extra template variables (`date_string`, `enable_thinking`...). They override the
    /// special tokens of the same name, as in transformers.
    pub kwargs: Map<String, Json>,
}

/// A compiled chat template. Compile once, render many times; `Send + Sync`.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

fn bad_arg(msg: impl Into<String>) -> TextError {
    TextError::InvalidArgument(msg.into())
}

/// Messages as transformers hands them to the template: JSON objects, keys whose value is null
/// dropped, and `reasoning_content`/`thinking`/`reasoning` aliased (the first non-null one is
/// copied to `thinking`, placed first, and to `reasoning_content`).
fn normalize_messages<M: Serialize>(messages: &[M]) -> Result<Vec<Map<String, Json>>> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let json = serde_json::to_value(message)
            .map_err(|e| bad_arg(format!("message #{i} cannot be serialized: {e}")))?;
        let Json::Object(map) = json else {
            return Err(bad_arg(format!(
                "message #{i} must be an object with `role` and `content`, got {json}"
            )));
        };
        let mut map: Map<String, Json> = map.into_iter().filter(|(_, v)| !v.is_null()).collect();
        if let Some(reasoning) = REASONING_FIELDS.iter().find_map(|k| map.get(*k)).cloned() {
            let mut aliased = Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            aliased.extend(map);
            aliased.insert("reasoning_content".into(), reasoning);
            map = aliased;
        }
        out.push(map);
    }
    Ok(out)
}

/// Appends the continue tag to the final message's content (its last text part for a list);
/// returns the original text, which must survive rendering.
fn tag_final_message(messages: &mut [Map<String, Json>], source: &str) -> Result<String> {
    let last = messages
        .last_mut()
        .ok_or_else(|| bad_arg("continue_final_message is set but the conversation is empty"))?;
    if !source.contains("content") {
        return Err(bad_arg(
            "continue_final_message is set but the template never reads `content`",
        ));
    }
    match last.get_mut("content") {
        Some(Json::String(text)) => {
            let original = text.clone();
            text.push_str(CONTINUE_TAG);
            Ok(original)
        }
        Some(Json::Array(parts)) => {
            for part in parts.iter_mut().rev() {
                if let Some(Json::String(text)) = part.get_mut("text") {
                    let original = text.clone();
                    text.push_str(CONTINUE_TAG);
                    return Ok(original);
                }
            }
            Err(bad_arg(
                "continue_final_message is set but the final message has no text part to continue",
            ))
        }
        _ => Err(bad_arg(
            "continue_final_message is set but the final message has no text `content` to continue",
        )),
    }
}

impl ChatTemplate {
    /// Compiles a chat template (the `chat_template` string of tokenizer_config.json, or the
    /// content of chat_template.jinja).
    pub fn new(source: impl Into<String>) -> Result<Self> {
        let source = source.into();
        let mut env = hf_environment();
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(&source))
            .map_err(|e| TextError::TemplateSyntax {
                message: describe(&e),
                line: e.line(),
            })?;
        Ok(ChatTemplate { env, source })
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation. `messages` are [`Message`]s, `serde_json::Value` objects, or
    /// anything that serializes to `{"role": ..., "content": ..., ...}`.
    pub fn render<M: Serialize>(&self, messages: &[M], opts: &RenderOptions) -> Result<String> {
        if messages.is_empty() {
            return Err(bad_arg(
                "cannot apply a chat template to an empty conversation; pass at least one message",
            ));
        }
        if opts.continue_final_message && opts.add_generation_prompt {
            return Err(bad_arg(
                "continue_final_message and add_generation_prompt are not compatible: use the \
                 first to continue the final message, the second to start a new assistant turn",
            ));
        }
        let mut messages = normalize_messages(messages)?;
        let continued = if opts.continue_final_message {
            Some(tag_final_message(&mut messages, &self.source)?)
        } else {
            None
        };

        let mut ctx = Map::new();
        let specials = &opts.special_tokens;
        for (name, token) in [
            ("bos_token", &specials.bos),
            ("eos_token", &specials.eos),
            ("unk_token", &specials.unk),
            ("pad_token", &specials.pad),
        ] {
            if let Some(token) = token {
                ctx.insert(name.into(), Json::String(token.clone()));
            }
        }
        for (key, value) in &opts.kwargs {
            if matches!(
                key.as_str(),
                "messages" | "tools" | "documents" | "add_generation_prompt"
            ) {
                return Err(bad_arg(format!(
                    "kwarg `{key}` would replace a template argument; set the RenderOptions field instead"
                )));
            }
            ctx.insert(key.clone(), value.clone());
        }
        ctx.insert(
            "messages".into(),
            Json::Array(messages.into_iter().map(Json::Object).collect()),
        );
        ctx.insert(
            "tools".into(),
            opts.tools.clone().map_or(Json::Null, Json::Array),
        );
        ctx.insert(
            "documents".into(),
            opts.documents.clone().map_or(Json::Null, Json::Array),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(opts.add_generation_prompt),
        );

        let template = self.env.get_template(TEMPLATE_NAME).map_err(render_error)?;
        let rendered = template
            .render(Value::from_serialize(&ctx))
            .map_err(render_error)?;
        match continued {
            None => Ok(rendered),
            Some(original) => cut_at_continue_tag(rendered, &original),
        }
    }
}

/// transformers' post-processing of `continue_final_message`: cut at the tag, or just before it
/// minus trailing whitespace when the template trimmed the content.
fn cut_at_continue_tag(rendered: String, original: &str) -> Result<String> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(original.trim()) || !rendered.contains(tag) {
        return Err(bad_arg(
            "continue_final_message is set but the final message does not appear in the rendered \
             chat (the template deletes part of it); check the template and the final message",
        ));
    }
    let at = rendered.rfind(tag).expect("checked above");
    if rendered[at..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..at].to_string())
    } else {
        Ok(rendered[..at].trim_end().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: &[Json], opts: &RenderOptions) -> Result<String> {
        ChatTemplate::new(src)?.render(messages, opts)
    }

    #[test]
    fn python_semantics() {
        let msgs = [serde_json::json!({"role": "user", "content": "  Hi there  "})];
        let opts = RenderOptions::default();
        let src = "{{ messages[0].content.strip() }}|{{ messages[0]['content'].split() }}|\
                   {{ none }}|{{ true }}|{{ 1e-5 }}|{{ [1, 'a'] }}|{{ tools }}|{{ bos_token }}|\
                   {{ 'x'.startswith('x') }}";
        assert_eq!(
            render(src, &msgs, &opts).unwrap(),
            "Hi there|['Hi', 'there']|None|True|1e-05|[1, 'a']|None||True"
        );
    }

    #[test]
    fn whitespace_control_like_hf() {
        let src = "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}\n";
        let msgs = [
            serde_json::json!({"role": "user", "content": "a"}),
            serde_json::json!({"role": "user", "content": "b"}),
        ];
        assert_eq!(
            render(src, &msgs, &RenderOptions::default()).unwrap(),
            "[a]\n[b]\n"
        );
    }

    #[test]
    fn tojson_like_hf() {
        let msgs = [
            serde_json::json!({"role": "user", "content": "<é>", "x": {"b": 1.0, "a": [true, null]}}),
        ];
        let src = "{{ messages[0].content | tojson }} {{ messages[0].x | tojson }} \
                   {{ messages[0].x | tojson(indent=2, sort_keys=true) }} {{ messages[0].x | tojson(separators=(',', ':')) }}";
        assert_eq!(
            render(src, &msgs, &RenderOptions::default()).unwrap(),
            "\"<é>\" {\"b\": 1.0, \"a\": [true, null]} {\n  \"a\": [\n    true,\n    null\n  ],\n  \"b\": 1.0\n} {\"b\":1.0,\"a\":[true,null]}"
        );
    }

    #[test]
    fn raise_exception_carries_message() {
        let msgs = [serde_json::json!({"role": "user", "content": "a"})];
        let err = render(
            "{{ raise_exception('only ' ~ 'assistant') }}",
            &msgs,
            &RenderOptions::default(),
        )
        .unwrap_err();
        match err {
            TextError::TemplateRaised { message } => assert_eq!(message, "only assistant"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn syntax_error_has_line() {
        let err = ChatTemplate::new("line one\n{% if x %}\n{{ y }").unwrap_err();
        match &err {
            TextError::TemplateSyntax { line, .. } => assert_eq!(*line, Some(3)),
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("line 3"), "{err}");
    }

    #[test]
    fn generation_tags_loops_namespace_and_kwargs() {
        let src = "{%- set ns = namespace(n=0) %}{% for m in messages %}{% if loop.last %}{% break %}{% endif %}\
                   {%- set ns.n = ns.n + 1 %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}\
                   {{ ns.n }}{{ date_string }}";
        let msgs = [
            serde_json::json!({"role": "user", "content": "a"}),
            serde_json::json!({"role": "user", "content": "b"}),
        ];
        let mut opts = RenderOptions::default();
        opts.kwargs.insert("date_string".into(), "26 Jul".into());
        assert_eq!(render(src, &msgs, &opts).unwrap(), "a126 Jul");
        assert_eq!(
            rewrite_generation_tags("{%- generation -%}x{% endgeneration%}{% generations %}"),
            "{%- if true -%}x{% endif%}{% generations %}"
        );
    }

    #[test]
    fn continue_final_message_like_hf() {
        let src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}";
        let trimmed = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}";
        let msgs = [Message::user("Hi"), Message::assistant("The answer is ")];
        let opts = RenderOptions {
            continue_final_message: true,
            ..Default::default()
        };
        let t = ChatTemplate::new(src).unwrap();
        assert_eq!(
            t.render(&msgs, &opts).unwrap(),
            "<user>Hi</s><assistant>The answer is "
        );
        let t = ChatTemplate::new(trimmed).unwrap();
        assert_eq!(
            t.render(&msgs, &opts).unwrap(),
            "<user>Hi</s><assistant>The answer is"
        );
        let both = RenderOptions {
            add_generation_prompt: true,
            ..opts
        };
        assert!(t.render(&msgs, &both).is_err());
    }

    #[test]
    fn null_fields_dropped_and_reasoning_aliased() {
        let msgs = [
            serde_json::json!({"role": "assistant", "content": "x", "tool_calls": null, "reasoning": "r"}),
        ];
        let src = "{{ messages[0] }}";
        assert_eq!(
            render(src, &msgs, &RenderOptions::default()).unwrap(),
            "{'thinking': 'r', 'role': 'assistant', 'content': 'x', 'reasoning': 'r', 'reasoning_content': 'r'}"
        );
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
        assert_send_sync::<crate::TextBundle>();
    }

    #[test]
    fn messages_deserialize_from_openai_style_json() {
        let msgs: Vec<Message> = serde_json::from_value(serde_json::json!([
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            {"role": "tool", "content": {"result": 1}},
            {"role": "user", "content": "hi", "name": "bob"}
        ]))
        .unwrap();
        assert_eq!(msgs[0].content, None);
        assert!(matches!(msgs[1].content, Some(Content::Other(_))));
        assert_eq!(
            msgs[2].content.as_ref().and_then(Content::as_text),
            Some("hi")
        );
        let src = "{% for m in messages %}{{ 'content' in m }}{{ m.name }};{% endfor %}";
        assert_eq!(
            ChatTemplate::new(src)
                .unwrap()
                .render(&msgs, &RenderOptions::default())
                .unwrap(),
            "False;True;Truebob;"
        );
    }

    #[test]
    fn typed_messages_serialize_like_dicts() {
        let mut m = Message::assistant("");
        m.extra.insert(
            "tool_calls".into(),
            serde_json::json!([{"function": {"name": "f"}}]),
        );
        let parts = Message::user(Content::Parts(vec![
            serde_json::json!({"type": "text", "text": "hi"}),
        ]));
        let src = "{{ messages[0].tool_calls[0].function.name }}{{ messages[1].content[0].text }}";
        assert_eq!(
            ChatTemplate::new(src)
                .unwrap()
                .render(&[m, parts], &RenderOptions::default())
                .unwrap(),
            "fhi"
        );
    }
}
