//! Tools a model calls inside a rollout (issue: multi-turn rollouts, TRL's `tools=[...]`).
//!
//! A config declares them as `[[tools]]` tables ([`ToolSpec`]); [`ToolBox`] holds them, gives
//! their JSON schemas to the chat template (its `tools` variable) and answers calls:
//!
//! - `type = "calculator"`: built in, [`calculator`] (a parser; model output is never run);
//! - `type = "command"`: a process started once and kept running, one JSON line per call on its
//!   stdin (`{"name": ..., "arguments": {...}}`), one answer line on its stdout;
//! - `type = "http"`: the same request POSTed to an endpoint, the answer in the body.
//!
//! An answer is a JSON string (the tool's output), `{"content": ...}`, or `{"error": "..."}`
//! for a failed call. Every failure (an unknown tool, bad arguments, a crash, a timeout, an
//! answer out of protocol) becomes a failed call whose message the model reads; none stops the
//! run, and a process that hangs is killed at `timeout_s`. [`parse`] reads the calls out of the
//! model's turn in its chat format. [`environment`] runs episodes of several turns with an
//! external environment (`[environment]`).

pub mod calculator;
mod endpoint;
pub mod environment;
pub mod parse;

use std::sync::Mutex;
use std::time::Duration;

use endpoint::Endpoint;
use rlft_rewards::external::command::Process;
use rlft_rewards::http_client::parse_url;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

pub use environment::{EnvError, Environment, EnvironmentSpec, StepResult};
pub use parse::{CallFormat, ToolCall};

/// What is wrong with a `[[tools]]` list.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// One tool's table is invalid.
    #[error("tool `{tool}`: {message}")]
    Config {
        /// The tool's name (or its type when unnamed).
        tool: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The list as a whole is invalid (two tools of one name).
    #[error("{0}")]
    Set(String),
}

/// One tool of a config.
///
/// ```toml
/// [[tools]]
/// type = "command"                 # calculator | command | http
/// name = "search"                  # the name the model calls (default: the type)
/// description = "Search the docs"  # what the model reads about it
/// parameters = { type = "object", properties = { query = { type = "string" } }, required = ["query"] }
/// command = ["python3", "search_tool.py"]
/// timeout_s = 10
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// `calculator` (built in), `command` or `http`.
    #[serde(rename = "type")]
    pub kind: ToolKind,
    /// The name the model calls it by; default: the type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the model reads about it (required for external tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of its arguments (required for external tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// `command`: the program and its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// `http`: the endpoint (plain `http://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Seconds one call may take before it fails (and a process is killed).
    #[serde(default = "ten")]
    pub timeout_s: f64,
}

fn ten() -> f64 {
    10.0
}

/// The kinds of tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Built in: arithmetic ([`calculator`]).
    Calculator,
    /// A JSON-lines process.
    Command,
    /// An HTTP endpoint.
    Http,
}

impl ToolKind {
    fn name(self) -> &'static str {
        match self {
            ToolKind::Calculator => "calculator",
            ToolKind::Command => "command",
            ToolKind::Http => "http",
        }
    }
}

impl ToolSpec {
    /// The name the model calls it by.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(self.kind.name())
    }
}

/// The answer to one call: what the model reads next, and whether the call failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    /// The tool's output, or for a failed call `error: <what went wrong>`.
    pub content: String,
    /// The call failed (unknown tool, bad arguments, the tool's error, timeout, crash).
    pub failed: bool,
}

impl ToolAnswer {
    fn ok(content: impl Into<String>) -> Self {
        ToolAnswer {
            content: content.into(),
            failed: false,
        }
    }
    fn failed(why: impl std::fmt::Display) -> Self {
        ToolAnswer {
            content: format!("error: {why}"),
            failed: true,
        }
    }
}

enum Runner {
    Calculator,
    External(Box<Endpoint>),
}

struct Tool {
    name: String,
    schema: Value,
    runner: Runner,
}

/// The tools of a run: their schemas for the chat template, and the calls' answers.
pub struct ToolBox {
    tools: Vec<Tool>,
}

const CALCULATOR_DOC: &str = "Evaluate an arithmetic expression (numbers, + - * / // % ** and \
parentheses, with Python's rules) and return its value.";

impl ToolBox {
    /// Validates `specs`; nothing starts until a call needs it.
    pub fn new(specs: &[ToolSpec]) -> Result<Self, ToolError> {
        let mut tools: Vec<Tool> = Vec::with_capacity(specs.len());
        for spec in specs {
            let tool = build(spec)?;
            if tools.iter().any(|t| t.name == tool.name) {
                return Err(ToolError::Set(format!(
                    "two [[tools]] are named `{}`; give each a distinct `name`",
                    tool.name
                )));
            }
            tools.push(tool);
        }
        Ok(ToolBox { tools })
    }

    /// The tools' schemas as chat templates take them (`{"type": "function", "function":
    /// {"name", "description", "parameters"}}`, transformers' form).
    pub fn schemas(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.schema.clone()).collect()
    }

    /// The tools' names, in config order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name.as_str()).collect()
    }

    /// Answers one call; every failure is a failed answer, never an error of the run.
    pub fn call(&self, call: &ToolCall) -> ToolAnswer {
        let Some(tool) = self.tools.iter().find(|t| t.name == call.name) else {
            return ToolAnswer::failed(format!(
                "unknown tool `{}`; the tools are: {}",
                call.name,
                self.names().join(", ")
            ));
        };
        match &tool.runner {
            Runner::Calculator => calculate(&call.arguments),
            Runner::External(endpoint) => external_call(endpoint, call),
        }
    }
}

fn build(spec: &ToolSpec) -> Result<Tool, ToolError> {
    let name = spec.display_name().trim().to_string();
    let bad = |m: String| ToolError::Config {
        tool: name.clone(),
        message: m,
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || "_-.".contains(c))
    {
        return Err(bad(
            "`name` must be a non-empty identifier (letters, digits, `_`, `-`, `.`)".into(),
        ));
    }
    if !(spec.timeout_s > 0.0 && spec.timeout_s < 1e9) {
        return Err(bad(format!(
            "timeout_s must be a positive number of seconds below 1e9 (got {})",
            spec.timeout_s
        )));
    }
    let external = spec.kind != ToolKind::Calculator;
    let (description, parameters) = match (&spec.description, &spec.parameters) {
        (d, p) if !external => (
            d.clone().unwrap_or_else(|| CALCULATOR_DOC.into()),
            p.clone().unwrap_or_else(|| {
                json!({"type": "object", "properties": {"expression": {"type": "string",
                "description": "The expression, e.g. (3 + 4) * 5"}}, "required": ["expression"]})
            }),
        ),
        (Some(d), Some(p)) => (d.clone(), p.clone()),
        _ => {
            return Err(bad(
                "an external tool needs `description` (what the model reads about it) and \
                 `parameters` (the JSON schema of its arguments, e.g. parameters = { type = \
                 \"object\", properties = { query = { type = \"string\" } }, required = \
                 [\"query\"] })"
                    .into(),
            ))
        }
    };
    if !parameters.is_object() {
        return Err(bad("`parameters` must be a JSON schema object".into()));
    }
    let misplaced = match spec.kind {
        ToolKind::Calculator => (!spec.command.is_empty() || spec.url.is_some())
            .then_some("`command` and `url` belong to command and http tools"),
        ToolKind::Command => spec.url.is_some().then_some("`url` belongs to http tools"),
        ToolKind::Http => {
            (!spec.command.is_empty()).then_some("`command` belongs to command tools")
        }
    };
    if let Some(m) = misplaced {
        return Err(bad(format!("{m}; remove it or change `type`")));
    }
    let runner = match spec.kind {
        ToolKind::Calculator => Runner::Calculator,
        ToolKind::Command => {
            if spec.command.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(bad(
                    "`command` is empty; give the program and its arguments, e.g. command = \
                     [\"python3\", \"tool.py\"]"
                        .into(),
                ));
            }
            let shown = format!("`{}`", spec.command.join(" "));
            let argv = spec.command.clone();
            let p = Process::new(name.clone(), argv, shown, "command", spec.timeout_s)
                .map_err(|e| bad(e.to_string()))?;
            Runner::External(Box::new(Endpoint::Command(Mutex::new(
                p.named("tool", "calls"),
            ))))
        }
        ToolKind::Http => {
            let url = spec.url.as_deref().unwrap_or("").trim().to_string();
            if url.is_empty() {
                return Err(bad(
                    "`url` is missing, e.g. url = \"http://127.0.0.1:8000/tool\"".into(),
                ));
            }
            let endpoint = parse_url(&url).map_err(bad)?;
            Runner::External(Box::new(Endpoint::Http {
                endpoint,
                url,
                timeout: Duration::from_secs_f64(spec.timeout_s),
            }))
        }
    };
    let schema = json!({"type": "function", "function": {
        "name": name, "description": description, "parameters": parameters}});
    Ok(Tool {
        name,
        schema,
        runner,
    })
}

fn calculate(args: &Map<String, Value>) -> ToolAnswer {
    let expr = match args.get("expression") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => {
            return ToolAnswer::failed(
                "the calculator takes {\"expression\": \"<arithmetic, e.g. (3 + 4) * 5>\"}",
            )
        }
    };
    match calculator::evaluate(&expr) {
        Ok(v) => ToolAnswer::ok(v.to_string()),
        Err(e) => ToolAnswer::failed(e),
    }
}

fn request(call: &ToolCall) -> Vec<u8> {
    serde_json::to_vec(&json!({"name": call.name, "arguments": call.arguments}))
        .expect("JSON values serialise")
}

/// Reads an answer: a JSON string, `{"content": ...}` or `{"error": "..."}`.
fn answer(text: &str) -> Result<ToolAnswer, String> {
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| {
        format!(
            "the tool answered `{}`, which is not JSON ({e}); answer a JSON string, \
             {{\"content\": ...}} or {{\"error\": \"...\"}}",
            text.chars().take(120).collect::<String>()
        )
    })?;
    Ok(match v {
        Value::String(s) => ToolAnswer::ok(s),
        Value::Object(mut o) if o.contains_key("error") => match o.remove("error") {
            Some(Value::String(e)) => ToolAnswer::failed(e),
            Some(e) => ToolAnswer::failed(e),
            None => unreachable!("checked above"),
        },
        Value::Object(mut o) if o.contains_key("content") => match o.remove("content") {
            Some(Value::String(s)) => ToolAnswer::ok(s),
            Some(other) => ToolAnswer::ok(other.to_string()),
            None => unreachable!("checked above"),
        },
        other => ToolAnswer::ok(other.to_string()),
    })
}

fn external_call(endpoint: &Endpoint, call: &ToolCall) -> ToolAnswer {
    let result = endpoint.exchange(request(call)).and_then(|l| answer(&l));
    result.unwrap_or_else(|e| {
        endpoint.reset(); // the next call starts a fresh process
        ToolAnswer::failed(e)
    })
}
