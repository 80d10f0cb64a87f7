//! Reward specs as a config file writes them, and [`build_reward`], which validates one and
//! builds the function.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::external::command::CommandReward;
use crate::external::http::HttpReward;
use crate::external::python::PythonReward;
use crate::format::{compile, IncrementalFormat, RegexFormat, StrictFormat};
use crate::rules::{
    BoxedAccuracy, EnvironmentReward, Length, Overlong, PythonExprRule, Repetition,
};
use crate::{Reward, RewardError};

/// One reward function of a trainer config: common keys plus the keys of its `type`.
///
/// ```toml
/// [[rewards]]
/// type = "python_expr_rule"   # which function (see `RewardKind`)
/// name = "seed"               # optional; default: the type
/// weight = 1.0                # optional; default 1.0
/// on_error = 0.0              # optional; score given to a whole batch when the function fails
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RewardSpec {
    /// How logs and metrics call this function (default: its `type`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Weight in the total reward (default 1.0).
    pub weight: f64,
    /// Score every sample of a batch gets when the function fails or times out; such failures
    /// are counted. Without it, a failure stops training with the function's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_error: Option<f64>,
    /// Which function, with its settings.
    #[serde(flatten)]
    pub kind: RewardKind,
}

/// The built-in reward functions, chosen by `type = "..."`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RewardKind {
    /// The seed example's rule: `0.1 * format + 0.9 * accuracy`, parts `format`, `accuracy`.
    PythonExprRule(PythonExprRuleSpec),
    /// 1.0 when the normalised first `\boxed{}` equals the normalised ground truth.
    BoxedAccuracy(BoxedAccuracySpec),
    /// 1.0 when a regex matches the whole completion.
    StrictFormat(StrictFormatSpec),
    /// 1.0 when a regex matches anywhere in the completion.
    RegexFormat(RegexFormatSpec),
    /// Partial credit per tag present exactly once, minus a trailing-text penalty.
    IncrementalFormat(IncrementalFormatSpec),
    /// Penalty for a token count away from a target.
    Length(LengthSpec),
    /// DAPO's soft overlong punishment.
    Overlong(OverlongSpec),
    /// open-r1's repeated n-gram penalty.
    Repetition(RepetitionSpec),
    /// An external process speaking JSON lines on stdin/stdout.
    Command(CommandSpec),
    /// A Python function with TRL's reward signature, run by a worker process.
    Python(PythonSpec),
    /// An HTTP endpoint receiving `{"samples": [...]}`.
    Http(HttpSpec),
    /// A reward model (a `score` head) scoring prompt + completion; loaded by the trainers
    /// (crate `rlft`), since this crate holds no model.
    Model(ModelSpec),
    /// The `[environment]`'s reward of an episode: the sum of the rewards its steps gave.
    Environment(EnvironmentRewardSpec),
}

impl RewardKind {
    /// Every valid `type`, in declaration order.
    pub const TYPES: [&'static str; 13] = [
        "python_expr_rule",
        "boxed_accuracy",
        "strict_format",
        "regex_format",
        "incremental_format",
        "length",
        "overlong",
        "repetition",
        "command",
        "python",
        "http",
        "model",
        "environment",
    ];

    /// The `type` string of this kind.
    pub fn type_name(&self) -> &'static str {
        let i = match self {
            RewardKind::PythonExprRule(_) => 0,
            RewardKind::BoxedAccuracy(_) => 1,
            RewardKind::StrictFormat(_) => 2,
            RewardKind::RegexFormat(_) => 3,
            RewardKind::IncrementalFormat(_) => 4,
            RewardKind::Length(_) => 5,
            RewardKind::Overlong(_) => 6,
            RewardKind::Repetition(_) => 7,
            RewardKind::Command(_) => 8,
            RewardKind::Python(_) => 9,
            RewardKind::Http(_) => 10,
            RewardKind::Model(_) => 11,
            RewardKind::Environment(_) => 12,
        };
        Self::TYPES[i]
    }
}

fn seed_answer_field() -> String {
    "reward_model.ground_truth".to_string()
}
fn answer() -> String {
    "answer".to_string()
}
fn guide_tags() -> Vec<String> {
    [
        "<reasoning>\n",
        "\n</reasoning>\n",
        "\n<answer>\n",
        "\n</answer>",
    ]
    .map(String::from)
    .to_vec()
}
fn eighth() -> f64 {
    0.125
}
fn milli() -> f64 {
    0.001
}
fn minus_one() -> f64 {
    -1.0
}
fn three() -> usize {
    3
}
fn thirty() -> f64 {
    30.0
}
fn eight() -> usize {
    8
}
fn python3() -> String {
    "python3".to_string()
}

/// `type = "python_expr_rule"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonExprRuleSpec {
    /// Dotted path of the ground truth in the dataset row (default `reward_model.ground_truth`).
    #[serde(default = "seed_answer_field")]
    pub answer_field: String,
}

/// `type = "boxed_accuracy"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxedAccuracySpec {
    /// Dotted path of the ground truth in the dataset row (default `answer`).
    #[serde(default = "answer")]
    pub answer_field: String,
}

/// `type = "strict_format"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrictFormatSpec {
    /// Regex that must match the whole completion (`.` matches newlines).
    pub pattern: String,
}

/// `type = "regex_format"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexFormatSpec {
    /// Regex searched anywhere in the completion (`.` matches newlines).
    pub pattern: String,
}

/// `type = "incremental_format"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncrementalFormatSpec {
    /// Literal tags, each worth `per_tag` when present exactly once; the text after the last one
    /// is penalised (default: the TRL guide's `<reasoning>\n`, `\n</reasoning>\n`, `\n<answer>\n`,
    /// `\n</answer>`).
    #[serde(default = "guide_tags")]
    pub tags: Vec<String>,
    /// Credit per tag present exactly once (default 0.125).
    #[serde(default = "eighth")]
    pub per_tag: f64,
    /// Subtracted per character after the last tag, surrounding whitespace not counted (default
    /// 0.001).
    #[serde(default = "milli")]
    pub trailing_penalty: f64,
}

/// `type = "length"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthSpec {
    /// Ideal completion length in tokens.
    pub target: usize,
    /// No penalty within `target +- tolerance` tokens (default 0).
    #[serde(default)]
    pub tolerance: usize,
    /// Score at `|len - target| >= tolerance + target`, reached linearly (default -1.0).
    #[serde(default = "minus_one")]
    pub max_penalty: f64,
}

/// `type = "overlong"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongSpec {
    /// The trainer's `max_completion_length` (L_max in DAPO).
    pub max_completion_length: usize,
    /// Soft punishment zone before it (L_cache in DAPO): 0 up to `max - buffer`, then linear to -1.
    pub buffer: usize,
}

/// `type = "repetition"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepetitionSpec {
    /// Size of the word n-grams (default 3).
    #[serde(default = "three")]
    pub ngram: usize,
    /// Score when every n-gram repeats; must be <= 0 (default -1.0).
    #[serde(default = "minus_one")]
    pub max_penalty: f64,
}

/// `type = "command"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    /// Program and arguments, e.g. `["python3", "reward.py"]` (no shell; started once).
    pub command: Vec<String>,
    /// Seconds one batch may take before the process is killed (default 30; restarted next call).
    #[serde(default = "thirty")]
    pub timeout_s: f64,
    /// false (default): one JSON line per sample each way; true: one `{"samples": [...]}` line
    /// per batch, answered by one `{"scores": [...]}` line.
    #[serde(default)]
    pub batch: bool,
}

/// `type = "python"`: a function `def f(completions, **kwargs) -> list[float | None]` called
/// with TRL's keyword arguments (see `docs/rewards.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonSpec {
    /// The `.py` file defining the function; a relative path is read from the working
    /// directory (as `command`'s arguments are).
    pub path: String,
    /// Name of the function in that file, e.g. `accuracy_reward`.
    pub function: String,
    /// Seconds one batch may take before the worker is killed (default 30; a fresh one starts
    /// on the next batch).
    #[serde(default = "thirty")]
    pub timeout_s: f64,
    /// Interpreter that runs the worker, with the packages the file imports (default `python3`;
    /// e.g. `.venv/bin/python`).
    #[serde(default = "python3")]
    pub python: String,
}

/// `type = "http"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    /// `http://host:port/path` to POST `{"samples": [...]}` to (https is not supported).
    pub url: String,
    /// Seconds one request may take, connecting included (default 30).
    #[serde(default = "thirty")]
    pub timeout_s: f64,
}

/// `type = "environment"`: no keys of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentRewardSpec {}

/// `type = "model"`: a reward model's score of prompt + completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The reward model: an HF `*ForSequenceClassification` directory with one label (what
    /// `rlft reward-model` writes to `OUTPUT/final`), or a PEFT `SEQ_CLS` adapter directory
    /// (`OUTPUT/adapter`) over `base`.
    pub path: String,
    /// Base model of an adapter `path` (an HF directory, a `.gguf` or a built-in name such as
    /// `default`; the trainer's `model` string means the policy's base). Default: the
    /// adapter's `base_model_name_or_path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Sequences per forward pass of the reward model (default 8).
    #[serde(default = "eight")]
    pub batch_size: usize,
    /// Longest sequence in the reward model's tokens; a longer one keeps its last `max_length`
    /// tokens (the score is read at the end). 0 = no limit (default, as TRL's GRPO).
    #[serde(default)]
    pub max_length: usize,
}

impl RewardSpec {
    /// A spec with default name, weight 1.0 and no `on_error`.
    pub fn new(kind: RewardKind) -> Self {
        RewardSpec {
            name: None,
            weight: 1.0,
            on_error: None,
            kind,
        }
    }

    /// The name the function gets: `name`, or the `type` when unnamed.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(self.kind.type_name())
    }

    /// Parses a spec from JSON (the same keys as TOML), with the same errors as deserialisation.
    pub fn from_value(value: Value) -> Result<Self, RewardError> {
        let label = value
            .get("name")
            .or(value.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("?");
        let label = label.to_string();
        match value {
            Value::Object(map) => from_map(map),
            other => Err(format!("a reward spec is a table/object, not {other}")),
        }
        .map_err(|message| RewardError::config(&label, message))
    }
}

impl<'de> Deserialize<'de> for RewardSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(deserializer)?;
        from_map(map).map_err(serde::de::Error::custom)
    }
}

fn from_map(mut map: Map<String, Value>) -> Result<RewardSpec, String> {
    let types = RewardKind::TYPES.map(|t| format!("`{t}`")).join(", ");
    let ty = match map.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(other) => {
            return Err(format!(
                "`type` must be a string, one of {types}; got {other}"
            ))
        }
        None => {
            return Err(format!(
                "a reward spec needs `type = \"...\"`, one of {types}"
            ))
        }
    };
    if !RewardKind::TYPES.contains(&ty.as_str()) {
        let hint = rlft_suggest::closest(&ty, &RewardKind::TYPES)
            .map(|t| format!(" (did you mean `{t}`?)"))
            .unwrap_or_default();
        return Err(format!(
            "unknown reward type `{ty}`{hint}; valid types: {types}"
        ));
    }
    if ty == "model" && !map.contains_key("path") {
        return Err(
            "reward `model`: `path` is missing; give the reward model's directory: \
             `rlft reward-model`'s OUTPUT/final (or OUTPUT/adapter with `base`), or an HF \
             *ForSequenceClassification directory"
                .into(),
        );
    }
    let name = match map.remove("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s),
        Some(other) => return Err(format!("`name` must be a non-empty string; got {other}")),
    };
    let label = name.clone().unwrap_or_else(|| ty.clone());
    if ty == "python" {
        for (key, what) in [
            ("path", "the .py file, e.g. path = \"rewards.py\""),
            (
                "function",
                "the function's name, e.g. function = \"accuracy_reward\"",
            ),
        ] {
            if !map.contains_key(key) {
                return Err(format!(
                    "reward `{label}`: `{key}` is missing; give {what} (a TRL reward function \
                     `def f(completions, **kwargs)`)"
                ));
            }
        }
    }
    let number = |key: &str, v: Value| -> Result<f64, String> {
        v.as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("reward `{label}`: `{key}` must be a finite number; got {v}"))
    };
    let weight = match map.remove("weight") {
        None => 1.0,
        Some(v) => number("weight", v)?,
    };
    let on_error = match map.remove("on_error") {
        None | Some(Value::Null) => None,
        Some(v) => Some(number("on_error", v)?),
    };
    let kind: RewardKind = serde_json::from_value(Value::Object(map)).map_err(|e| {
        let of_type = if label == ty {
            String::new()
        } else {
            format!(" (type `{ty}`)")
        };
        format!(
            "reward `{label}`{of_type}: {e}; every reward also takes `name`, `weight` and \
             `on_error`"
        )
    })?;
    Ok(RewardSpec {
        name,
        weight,
        on_error,
        kind,
    })
}

/// Validates `spec` and builds its reward function. External processes start lazily, on the
/// first batch.
pub fn build_reward(spec: &RewardSpec) -> Result<Box<dyn Reward>, RewardError> {
    let name = spec.display_name().to_string();
    let bad = |message: String| Err(RewardError::config(&name, message));
    Ok(match &spec.kind {
        RewardKind::PythonExprRule(k) => {
            let answer_field = non_empty_field(&name, &k.answer_field)?;
            Box::new(PythonExprRule { name, answer_field })
        }
        RewardKind::BoxedAccuracy(k) => {
            let answer_field = non_empty_field(&name, &k.answer_field)?;
            Box::new(BoxedAccuracy { name, answer_field })
        }
        RewardKind::StrictFormat(k) => {
            let regex = compile(&name, &k.pattern, true)?;
            Box::new(StrictFormat { name, regex })
        }
        RewardKind::RegexFormat(k) => {
            let regex = compile(&name, &k.pattern, false)?;
            Box::new(RegexFormat { name, regex })
        }
        RewardKind::IncrementalFormat(k) => {
            if k.tags.is_empty() || k.tags.iter().any(String::is_empty) {
                return bad("`tags` must be a non-empty list of non-empty strings".into());
            }
            if !k.per_tag.is_finite() || !k.trailing_penalty.is_finite() {
                return bad("`per_tag` and `trailing_penalty` must be finite numbers".into());
            }
            Box::new(IncrementalFormat {
                name,
                tags: k.tags.clone(),
                per_tag: k.per_tag,
                trailing_penalty: k.trailing_penalty,
            })
        }
        RewardKind::Length(k) => {
            if k.target == 0 {
                return bad("`target` must be at least 1 token".into());
            }
            if !k.max_penalty.is_finite() {
                return bad("`max_penalty` must be a finite number".into());
            }
            Box::new(Length {
                name,
                target: k.target,
                tolerance: k.tolerance,
                max_penalty: k.max_penalty,
            })
        }
        RewardKind::Overlong(k) => {
            if k.buffer == 0 || k.buffer > k.max_completion_length {
                return bad(format!(
                    "`buffer` must be between 1 and `max_completion_length` ({}); got {} (DAPO uses \
                     e.g. max_completion_length = 20480, buffer = 4096)",
                    k.max_completion_length, k.buffer
                ));
            }
            Box::new(Overlong {
                name,
                max_completion_length: k.max_completion_length,
                buffer: k.buffer,
            })
        }
        RewardKind::Repetition(k) => {
            if k.ngram == 0 {
                return bad("`ngram` must be at least 1".into());
            }
            if k.max_penalty.is_nan() || k.max_penalty > 0.0 {
                return bad(format!(
                    "`max_penalty` must be <= 0 (it is a penalty; -1.0 is usual); got {}",
                    k.max_penalty
                ));
            }
            Box::new(Repetition {
                name,
                ngram: k.ngram,
                max_penalty: k.max_penalty,
            })
        }
        RewardKind::Command(k) => Box::new(CommandReward::new(name, k)?),
        RewardKind::Python(k) => Box::new(PythonReward::new(name, k)?),
        RewardKind::Http(k) => Box::new(HttpReward::new(name, k)?),
        RewardKind::Environment(_) => Box::new(EnvironmentReward { name }),
        RewardKind::Model(_) => {
            return bad(
                "a `model` reward loads a model, which this crate does not: build the reward \
                 set with the trainers' builder (`rlft grpo`, `rloo`, `ppo`, `eval` and \
                 `reward test` do; in Rust `rlft::online::setup::reward_set`)"
                    .into(),
            )
        }
    })
}

fn non_empty_field(reward: &str, field: &str) -> Result<String, RewardError> {
    if field.trim().is_empty() {
        return Err(RewardError::config(
            reward,
            "`answer_field` is empty; give the dotted path of the ground truth, e.g. \"answer\"",
        ));
    }
    Ok(field.to_string())
}

/// Checks a `timeout_s` value: positive and finite.
pub(crate) fn timeout(reward: &str, seconds: f64) -> Result<std::time::Duration, RewardError> {
    if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 {
        Ok(std::time::Duration::from_secs_f64(seconds))
    } else {
        Err(RewardError::config(
            reward,
            format!("`timeout_s` must be a positive number of seconds; got {seconds}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<RewardSpec, String> {
        serde_json::from_value::<RewardSpec>(v).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_common_keys() {
        let s = parse(json!({"type": "python_expr_rule"})).unwrap();
        assert_eq!(s.weight, 1.0);
        assert_eq!(s.on_error, None);
        assert_eq!(s.display_name(), "python_expr_rule");
        assert_eq!(
            s.kind,
            RewardKind::PythonExprRule(PythonExprRuleSpec {
                answer_field: "reward_model.ground_truth".into()
            })
        );
        let s = parse(json!({"type": "repetition", "name": "rep", "weight": 2, "on_error": 0}))
            .unwrap();
        assert_eq!(
            (s.display_name(), s.weight, s.on_error),
            ("rep", 2.0, Some(0.0))
        );
        assert_eq!(
            s.kind,
            RewardKind::Repetition(RepetitionSpec {
                ngram: 3,
                max_penalty: -1.0
            })
        );
        // Serialises back to the same keys.
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back["type"], "repetition");
        assert_eq!(parse(back).unwrap(), s);
    }

    #[test]
    fn errors_say_what_and_how() {
        let e = parse(json!({"type": "strict_fromat", "pattern": "x"})).unwrap_err();
        assert!(
            e.contains("unknown reward type `strict_fromat` (did you mean `strict_format`?)"),
            "{e}"
        );
        assert!(
            e.contains("`python_expr_rule`") && e.contains("`http`"),
            "{e}"
        );
        let e = parse(json!({"pattern": "x"})).unwrap_err();
        assert!(e.contains("needs `type"), "{e}");
        let e = parse(json!({"type": "strict_format", "patern": "x"})).unwrap_err();
        assert!(
            e.contains("unknown field `patern`, expected `pattern`") && e.contains("`weight`"),
            "{e}"
        );
        let e = parse(json!({"type": "strict_format"})).unwrap_err();
        assert!(e.contains("missing field `pattern`"), "{e}");
        let e = parse(json!({"type": "length", "target": 10, "weight": "high"})).unwrap_err();
        assert!(e.contains("`weight` must be a finite number"), "{e}");
        let e = parse(json!({"type": "overlong", "max_completion_length": -3, "buffer": 1}))
            .unwrap_err();
        assert!(
            e.contains("max_completion_length") || e.contains("invalid value"),
            "{e}"
        );
    }

    #[test]
    fn build_validates() {
        let build = |v: Value| {
            build_reward(&parse(v).unwrap())
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            build(json!({"type": "overlong", "max_completion_length": 128, "buffer": 32})),
            None
        );
        let e =
            build(json!({"type": "overlong", "max_completion_length": 16, "buffer": 32})).unwrap();
        assert!(
            e.contains("`buffer` must be between 1 and `max_completion_length` (16)"),
            "{e}"
        );
        let e = build(json!({"type": "repetition", "max_penalty": 0.5, "name": "rep"})).unwrap();
        assert!(
            e.starts_with("reward `rep`: `max_penalty` must be <= 0"),
            "{e}"
        );
        let e = build(json!({"type": "regex_format", "pattern": "[a-"})).unwrap();
        assert!(e.contains("not a valid regex"), "{e}");
        let e = build(json!({"type": "length", "target": 0})).unwrap();
        assert!(e.contains("`target` must be at least 1"), "{e}");
        let e = build(json!({"type": "incremental_format", "tags": []})).unwrap();
        assert!(e.contains("`tags`"), "{e}");
        let e = build(json!({"type": "command", "command": []})).unwrap();
        assert!(e.contains("`command`"), "{e}");
        let e = build(json!({"type": "http", "url": "https://example.com/score"})).unwrap();
        assert!(e.contains("https"), "{e}");
        let e = build(json!({"type": "http", "url": "http://x/", "timeout_s": 0})).unwrap();
        assert!(e.contains("`timeout_s` must be a positive"), "{e}");
    }

    #[test]
    fn model_spec_parses_and_is_built_by_the_trainers() {
        let s = parse(json!({"type": "model", "path": "rm/final", "weight": 0.5})).unwrap();
        assert_eq!(
            s.kind,
            RewardKind::Model(ModelSpec {
                path: "rm/final".into(),
                base: None,
                batch_size: 8,
                max_length: 0,
            })
        );
        assert_eq!((s.display_name(), s.weight), ("model", 0.5));
        let e = parse(json!({"type": "model", "weight": 2})).unwrap_err();
        assert!(
            e.contains("`path` is missing") && e.contains("OUTPUT/final"),
            "{e}"
        );
        let e = parse(json!({"type": "model", "path": "x", "bach_size": 2})).unwrap_err();
        assert!(e.contains("unknown field `bach_size`"), "{e}");
        let e = build_reward(&s).err().unwrap().to_string();
        assert!(e.contains("reward_set"), "{e}");
    }

    #[test]
    fn python_spec_defaults_and_errors() {
        let s = parse(json!({"type": "python", "path": "r.py", "function": "acc"})).unwrap();
        assert_eq!(
            s.kind,
            RewardKind::Python(PythonSpec {
                path: "r.py".into(),
                function: "acc".into(),
                timeout_s: 30.0,
                python: "python3".into(),
            })
        );
        assert_eq!(s.display_name(), "python");
        let e = parse(json!({"type": "python", "name": "acc", "path": "r.py"})).unwrap_err();
        assert!(
            e.contains("reward `acc`: `function` is missing")
                && e.contains("function = \"accuracy_reward\""),
            "{e}"
        );
        let e = parse(json!({"type": "python", "function": "f"})).unwrap_err();
        assert!(e.contains("`path` is missing"), "{e}");
        let e =
            parse(json!({"type": "python", "path": "r.py", "function": "f", "fn": 1})).unwrap_err();
        assert!(e.contains("unknown field `fn`"), "{e}");
        let e = build_reward(&s).err().unwrap().to_string();
        assert!(
            e.contains("`path` r.py is not a file") && e.contains("working directory"),
            "{e}"
        );
    }

    #[test]
    fn types_match_serde_names() {
        for t in RewardKind::TYPES {
            let err = parse(json!({"type": t})).err().unwrap_or_default();
            assert!(!err.contains("unknown"), "{t}: {err}");
        }
    }
}
