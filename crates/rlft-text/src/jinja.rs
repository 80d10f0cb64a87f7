//! The Jinja environment of transformers' chat templates, rebuilt on minijinja: the
//! `ImmutableSandboxedEnvironment` settings, HF's `tojson`, `raise_exception` and `strftime_now`,
//! Jinja2's `attr`, Python's printing of values, and the `{% generation %}` tag.

use crate::error::TextError;
use crate::pyfmt;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error as JinjaError, ErrorKind};

/// The error `raise_exception` returns, recognised when mapping errors.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn raise_exception(message: Value) -> std::result::Result<Value, JinjaError> {
    let message = message
        .as_str()
        .map_or_else(|| message.to_string(), str::to_string);
    Err(JinjaError::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: String) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    pyfmt::strftime(&format, now)
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, JinjaError> {
    let ensure_ascii = match kwargs.get::<Option<Value>>("ensure_ascii")? {
        Some(v) => Some(v),
        None => ensure_ascii,
    }
    .is_some_and(|v| v.is_true());
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    JinjaError::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be an int or a string, not {v}"),
                    )
                })?;
                Some(" ".repeat(n.max(0) as usize))
            }
        },
    };
    let mut opts = pyfmt::JsonOpts::new(indent);
    opts.ensure_ascii = ensure_ascii;
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match (
                parts.first().and_then(|p| p.as_str()),
                parts.get(1).and_then(|p| p.as_str()),
            ) {
                (Some(item), Some(key)) if parts.len() == 2 => {
                    opts.item_sep = item.to_string();
                    opts.key_sep = key.to_string();
                }
                _ => {
                    return Err(JinjaError::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    }
    opts.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    pyfmt::to_json(value, &opts).map(Value::from)
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (transformers' AssistantTracker tags) as
/// `{% if true %}` / `{% endif %}`, keeping their whitespace-control markers, so trim_blocks and
/// lstrip_blocks act on them exactly as on the original block tags.
pub(crate) fn rewrite_generation_tags(source: &str) -> String {
    fn keyword_at(s: &str, word: &str) -> bool {
        s.starts_with(word)
            && s[word.len()..]
                .chars()
                .next()
                .is_some_and(|c| !(c.is_alphanumeric() || c == '_'))
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        let mut start = 2;
        if tag[start..].starts_with(['-', '+']) {
            start += 1;
        }
        let ws = tag[start..].len() - tag[start..].trim_start().len();
        let word_at = start + ws;
        let after = &tag[word_at..];
        let (word, replacement) = if keyword_at(after, "endgeneration") {
            ("endgeneration", "endif")
        } else if keyword_at(after, "generation") {
            ("generation", "if true")
        } else {
            out.push_str("{%");
            rest = &tag[2..];
            continue;
        };
        out.push_str(&tag[..word_at]);
        out.push_str(replacement);
        rest = &tag[word_at + word.len()..];
    }
    out.push_str(rest);
    out
}

/// Jinja2's `attr` filter reads an attribute, never an item: on a dict (a JSON object) it finds no
/// attribute named like a key and gives undefined. Other values (namespace, loop) are read as
/// usual. Simplified: `namespace()` objects are maps here too, so `ns | attr('x')` is undefined.
fn attr(value: &Value, name: &str) -> std::result::Result<Value, JinjaError> {
    if value.kind() == minijinja::value::ValueKind::Map {
        return Ok(Value::UNDEFINED);
    }
    value.get_attr(name)
}

fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> std::result::Result<(), JinjaError> {
    let mut text = String::new();
    if pyfmt::write_py_str(value, &mut text) {
        out.write_str(&text).map_err(JinjaError::from)
    } else {
        minijinja::escape_formatter(out, state, value)
    }
}

/// The minijinja environment configured like transformers' `ImmutableSandboxedEnvironment`.
pub(crate) fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_filter("attr", attr);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

pub(crate) fn describe(err: &JinjaError) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

pub(crate) fn render_error(err: JinjaError) -> TextError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return TextError::TemplateRaised {
                message: raised.0.clone(),
            };
        }
        source = e.source();
    }
    TextError::TemplateRender {
        message: describe(&err),
        line: err.line(),
    }
}
