//! Environments: a process or HTTP endpoint that runs episodes of several turns with the model
//! (OpenRLHF's agent `reset`/`step`, TRL's `environment_factory`), declared as `[environment]`.
//!
//! Every request is one JSON object (one line on the process's stdin, or a POST body), every
//! answer one JSON object (one stdout line, or the response body):
//!
//! - `{"method": "reset", "episode": "<id>", "seed": <u64>, "row": {<dataset row>}}` ->
//!   `{"observation": "<text>" | null}`: the episode's first observation, which the model reads
//!   as a user message after the row's prompt (`null` or `""`: the prompt alone);
//! - `{"method": "step", "episode": "<id>", "action": "<the model's turn>"}` ->
//!   `{"observation": "<text>" | null, "reward": <number> | null, "done": <bool>}`: the next
//!   user message, an optional reward for this step, and whether the episode is over (`null`
//!   observation also ends it);
//! - `{"method": "close", "episodes": ["<id>", ...]}` -> any JSON (`{}`): the episodes of a
//!   rollout are over; the environment may drop their state.
//!
//! `seed` is derived from the run's seed, so an environment that draws its randomness from it
//! replays a resumed run exactly. Unlike a tool's failure (which the model reads), an
//! environment that fails, answers out of protocol or exceeds `timeout_s` stops the run with
//! [`EnvError`]: an episode it could not run has no honest reward. A hung process is killed.

use std::sync::Mutex;
use std::time::Duration;

use rlft_rewards::external::command::Process;

use crate::endpoint::Endpoint;
use rlft_rewards::http_client::parse_url;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// An `[environment]` table.
///
/// ```toml
/// [environment]
/// type = "command"                  # command | http
/// command = ["python3", "env.py"]   # command: the program and its arguments
/// # url = "http://127.0.0.1:8000/env"  # http: the endpoint
/// timeout_s = 30                    # one request's limit
/// max_turns = 4                     # most environment steps per episode
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSpec {
    /// `command` (a JSON-lines process) or `http` (an endpoint).
    #[serde(rename = "type")]
    pub kind: EnvironmentKind,
    /// `command`: the program and its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// `http`: the endpoint (plain `http://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Seconds one request may take before the run stops (and a process is killed).
    #[serde(default = "thirty")]
    pub timeout_s: f64,
    /// Most environment steps per episode (default: until the environment says done or the
    /// completion budget `max_completion_length` runs out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<usize>,
}

fn thirty() -> f64 {
    30.0
}

/// How an environment is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentKind {
    /// A process speaking JSON lines on stdin/stdout.
    Command,
    /// An HTTP endpoint taking each request as a POST.
    Http,
}

/// An environment that is misconfigured or failed.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The `[environment]` table is invalid.
    #[error("[environment]: {0}")]
    Config(String),
    /// A request failed: the process crashed or hung, the endpoint failed, or the answer is
    /// out of protocol.
    #[error("environment, {request}: {message}")]
    Failed {
        /// Which request (`reset of episode e3`).
        request: String,
        /// What went wrong and how to fix it.
        message: String,
    },
}

/// What one step of an episode gave.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// The next user message; `None` ends the episode.
    pub observation: Option<String>,
    /// This step's reward, if the environment gives one.
    pub reward: Option<f64>,
    /// The episode is over.
    pub done: bool,
}

/// A running (or not yet started) environment.
pub struct Environment {
    transport: Endpoint,
    max_turns: Option<usize>,
}

impl Environment {
    /// Validates `spec`; the process starts on the first request.
    pub fn new(spec: &EnvironmentSpec) -> Result<Self, EnvError> {
        let bad = |m: &str| EnvError::Config(m.to_string());
        if !(spec.timeout_s > 0.0 && spec.timeout_s < 1e9) {
            return Err(EnvError::Config(format!(
                "timeout_s must be a positive number of seconds below 1e9 (got {})",
                spec.timeout_s
            )));
        }
        if spec.max_turns == Some(0) {
            return Err(bad(
                "max_turns = 0 leaves no step; give at least 1, or leave it out",
            ));
        }
        let transport = match spec.kind {
            EnvironmentKind::Command => {
                if spec.url.is_some() {
                    return Err(bad("`url` belongs to type = \"http\"; remove it"));
                }
                if spec.command.first().is_none_or(|p| p.trim().is_empty()) {
                    return Err(bad(
                        "`command` is empty; give the program and its arguments, e.g. command \
                         = [\"python3\", \"env.py\"]",
                    ));
                }
                let shown = format!("`{}`", spec.command.join(" "));
                let p = Process::new(
                    "environment".into(),
                    spec.command.clone(),
                    shown,
                    "command",
                    spec.timeout_s,
                )
                .map_err(|e| EnvError::Config(e.detail()))?;
                Endpoint::Command(Mutex::new(p.named("environment", "requests")))
            }
            EnvironmentKind::Http => {
                if !spec.command.is_empty() {
                    return Err(bad("`command` belongs to type = \"command\"; remove it"));
                }
                let url = spec.url.as_deref().unwrap_or("").trim().to_string();
                if url.is_empty() {
                    return Err(bad(
                        "`url` is missing, e.g. url = \"http://127.0.0.1:8000/env\"",
                    ));
                }
                Endpoint::Http {
                    endpoint: parse_url(&url).map_err(EnvError::Config)?,
                    url,
                    timeout: Duration::from_secs_f64(spec.timeout_s),
                }
            }
        };
        Ok(Environment {
            transport,
            max_turns: spec.max_turns,
        })
    }

    /// Most steps per episode (`None`: no limit but the completion budget).
    pub fn max_turns(&self) -> Option<usize> {
        self.max_turns
    }

    /// Starts episode `episode` on dataset row `row`: its first observation (`None`: none).
    pub fn reset(&self, episode: &str, seed: u64, row: &Value) -> Result<Option<String>, EnvError> {
        let req = json!({"method": "reset", "episode": episode, "seed": seed, "row": row});
        let what = || format!("reset of episode {episode}");
        let answer = self.request(&req, &what)?;
        let obs = match &answer {
            Value::Object(o) => o.get("observation").unwrap_or(&Value::Null),
            other => other,
        };
        observation(obs).map_err(|m| failed(&what, m, &answer))
    }

    /// Plays `action` (the model's turn) in episode `episode`.
    pub fn step(&self, episode: &str, action: &str) -> Result<StepResult, EnvError> {
        let req = json!({"method": "step", "episode": episode, "action": action});
        let what = || format!("step of episode {episode}");
        let answer = self.request(&req, &what)?;
        let Value::Object(o) = &answer else {
            return Err(failed(&what, "not an object".into(), &answer));
        };
        let observation = observation(o.get("observation").unwrap_or(&Value::Null))
            .map_err(|m| failed(&what, m, &answer))?;
        let reward = match o.get("reward") {
            None | Some(Value::Null) => None,
            Some(r) => Some(r.as_f64().filter(|r| r.is_finite()).ok_or_else(|| {
                failed(
                    &what,
                    "`reward` must be a finite number or null".into(),
                    &answer,
                )
            })?),
        };
        let done = match o.get("done") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(failed(
                    &what,
                    "`done` must be true or false".into(),
                    &answer,
                ));
            }
        };
        Ok(StepResult {
            observation,
            reward,
            done,
        })
    }

    /// Tells the environment that `episodes` are over.
    pub fn close(&self, episodes: &[String]) -> Result<(), EnvError> {
        if episodes.is_empty() {
            return Ok(());
        }
        let req = json!({"method": "close", "episodes": episodes});
        self.request(&req, &|| "close".to_string()).map(|_| ())
    }

    fn request(&self, req: &Value, what: &dyn Fn() -> String) -> Result<Value, EnvError> {
        let body = serde_json::to_vec(req).expect("JSON values serialise");
        let text = self
            .transport
            .exchange(body)
            .map_err(|message| EnvError::Failed {
                request: what(),
                message,
            })?;
        serde_json::from_str(text.trim()).map_err(|e| EnvError::Failed {
            request: what(),
            message: format!(
                "the answer `{}` is not JSON ({e}); answer one JSON object per request",
                excerpt(&text)
            ),
        })
    }
}

fn observation(v: &Value) -> Result<Option<String>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err("`observation` must be a string or null".into()),
    }
}

fn failed(what: &dyn Fn() -> String, why: String, answer: &Value) -> EnvError {
    EnvError::Failed {
        request: what(),
        message: format!(
            "{why}, in the answer `{}`; a reset answers {{\"observation\": \"...\"}}, a step \
             {{\"observation\": \"...\" | null, \"reward\": <number> | null, \"done\": <bool>}}",
            excerpt(&answer.to_string())
        ),
    }
}

fn excerpt(s: &str) -> String {
    let t: String = s.trim().chars().take(160).collect();
    if t.len() < s.trim().len() {
        format!("{t}...")
    } else {
        t
    }
}
