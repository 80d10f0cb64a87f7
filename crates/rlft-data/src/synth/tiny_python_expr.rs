//! `tiny_python_expr`: small integer arithmetic expressions (`((8 * 20) - (0 * 3))`) with
//! their values, the prompt set of rlft's seed GRPO example.
//!
//! A port of the Python reference (`scripts/reference/tiny_python_expr_reference.py`) that
//! draws from [`PyRandom`] in exactly the same order, so with the same options it produces
//! the same rows, byte for byte, for any seed and sizes. The default options are the original
//! generator; see the [`crate::synth`] docs for the rules.

use serde_json::{json, Value};

use std::path::{Path, PathBuf};

use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::pyrandom::PyRandom;
use crate::synth::{python_json_dumps, save_splits, SaveFormats};

/// The `data_source` column of every row.
pub const DATA_SOURCE: &str = "tiny_python_expr";

/// The `extra_info.label` of every row.
pub const LABEL: &str = "python_expr_rule";

/// The system prompt the seed example trains with (not part of the rows).
pub const SYSTEM_PROMPT: &str = "You are a careful arithmetic assistant. Solve the expression \
    and respond briefly. Return the final result in the format \\boxed{answer}. Do not add \
    unnecessary explanation.";

/// Chance that a node above depth 0 becomes a leaf (`rng.random() < 0.35`).
pub const LEAF_PROBABILITY: f64 = 0.35;

/// Operator draws per node before it falls back to a leaf.
pub const MAX_TRIES: usize = 64;

/// The largest exponent `**` accepts; larger (or negative) exponents reject the draw.
pub const MAX_POW_EXPONENT: i64 = 4;

/// Consecutive duplicate expressions after which a split gives up with
/// [`DataError::SynthExhausted`] instead of looping forever.
pub const MAX_CONSECUTIVE_DUPLICATES: usize = 100_000;

/// Expression nodes built since the last new row after which a split gives up with
/// [`DataError::SynthExhausted`]: options that reject almost every draw (say leaves 0..=2 but
/// values 14..) make each row cost up to `(2 * MAX_TRIES)^depth` nodes. About a second of work
/// here and a minute in Python.
pub const MAX_NODES_PER_ROW: u64 = 50_000_000;

const GENERATOR: &str = "tiny_python_expr";

/// A binary operator, with Python's integer semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `+`
    Add,
    /// `-` (operands are swapped when the left one is smaller, so results are not negative)
    Sub,
    /// `*`
    Mul,
    /// `//`: floor division (rounds towards negative infinity); a zero divisor rejects the draw.
    FloorDiv,
    /// `%`: modulo with the divisor's sign; a zero divisor rejects the draw.
    Mod,
    /// `**`: exponents in `0..=MAX_POW_EXPONENT` only; others reject the draw.
    Pow,
}

impl Op {
    /// Every operator, in the order `+ - * // % **`.
    pub const ALL: [Op; 6] = [Op::Add, Op::Sub, Op::Mul, Op::FloorDiv, Op::Mod, Op::Pow];

    /// The original generator's operators, in its order.
    pub const DEFAULT: [Op; 3] = [Op::Add, Op::Sub, Op::Mul];

    /// The Python symbol (`"//"`).
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "*",
            Op::FloorDiv => "//",
            Op::Mod => "%",
            Op::Pow => "**",
        }
    }

    /// Parses a comma-separated list (`"+,-,*"`, spaces allowed); the order matters, since
    /// operators are drawn by index.
    pub fn parse_list(s: &str) -> Result<Vec<Op>> {
        s.split(',').map(|p| p.trim().parse()).collect()
    }

    /// `left op right` as Python computes it on integers, or `None` when the draw is rejected
    /// (zero divisor, exponent outside `0..=MAX_POW_EXPONENT`, or no exact 128-bit result).
    pub fn apply(self, left: i64, right: i64) -> Option<i128> {
        let (l, r) = (i128::from(left), i128::from(right));
        match self {
            Op::Add => Some(l + r),
            Op::Sub => Some(l - r),
            Op::Mul => Some(l * r),
            Op::FloorDiv if r == 0 => None,
            Op::FloorDiv => {
                let q = l / r;
                Some(if l % r != 0 && ((l < 0) != (r < 0)) {
                    q - 1
                } else {
                    q
                })
            }
            Op::Mod if r == 0 => None,
            Op::Mod => {
                let m = l % r;
                Some(if m != 0 && ((m < 0) != (r < 0)) {
                    m + r
                } else {
                    m
                })
            }
            Op::Pow if !(0..=MAX_POW_EXPONENT).contains(&right) => None,
            Op::Pow => l.checked_pow(right as u32),
        }
    }
}

impl std::str::FromStr for Op {
    type Err = DataError;
    fn from_str(s: &str) -> Result<Op> {
        Op::ALL
            .into_iter()
            .find(|op| op.symbol() == s)
            .ok_or_else(|| invalid(format!("unknown operator {s:?}; use some of + - * // % **")))
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.symbol())
    }
}

/// What to generate. [`Default`] is the original generator: seed 42, 128 train and 32 test
/// rows, `+ - *`, depth 1..=3, leaves 0..=20, values 0..=200.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyPythonExprOptions {
    /// `random.Random(seed)`.
    pub seed: u64,
    /// Rows in the train split (distinct expressions).
    pub train_size: usize,
    /// Rows in the test split (distinct among themselves; may repeat train expressions, as in
    /// the original).
    pub test_size: usize,
    /// Operators, drawn with `rng.choice` in this order (no repeats).
    pub operators: Vec<Op>,
    /// Each row's depth is `randint(1, max_depth)`.
    pub max_depth: u32,
    /// Leaves are `randint(0, leaf_max)`.
    pub leaf_max: u32,
    /// Smallest value an operator node may take (leaves are not checked).
    pub value_min: i64,
    /// Largest value an operator node may take.
    pub value_max: i64,
}

impl Default for TinyPythonExprOptions {
    fn default() -> Self {
        TinyPythonExprOptions {
            seed: 42,
            train_size: 128,
            test_size: 32,
            operators: Op::DEFAULT.to_vec(),
            max_depth: 3,
            leaf_max: 20,
            value_min: 0,
            value_max: 200,
        }
    }
}

impl TinyPythonExprOptions {
    /// Checks the options; errors say which one and the fix.
    pub fn validate(&self) -> Result<()> {
        if self.operators.is_empty() {
            return Err(invalid(
                "operators is empty; give at least one of + - * // % **",
            ));
        }
        for (i, op) in self.operators.iter().enumerate() {
            if self.operators[..i].contains(op) {
                return Err(invalid(format!("operator {op} is listed twice")));
            }
        }
        if self.max_depth == 0 {
            return Err(invalid("max_depth must be at least 1"));
        }
        if self.value_min > self.value_max {
            return Err(invalid(format!(
                "value_min {} is above value_max {}",
                self.value_min, self.value_max
            )));
        }
        Ok(())
    }
}

/// Which split a row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// `"train"`, built first.
    Train,
    /// `"test"`, continuing the train split's random stream.
    Test,
}

impl Split {
    /// `"train"` or `"test"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "test",
        }
    }
}

/// One generated row before it becomes JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExprRecord {
    /// Fully parenthesised expression text (`(5 + ((2 + 15) - 7))`), or a bare integer.
    pub expression: String,
    /// Its value as Python computes it.
    pub answer: i64,
    /// Its split.
    pub split: Split,
    /// 0-based position within the split.
    pub index: usize,
}

impl ExprRecord {
    /// The user prompt of the row.
    pub fn prompt(&self) -> String {
        prompt_for(&self.expression)
    }

    /// The row: `data_source`, `prompt`, `ability`, `reward_model`, `extra_info`, in that key
    /// order (as the original writes them).
    pub fn to_json(&self) -> Value {
        let answer = self.answer.to_string();
        json!({
            "data_source": DATA_SOURCE,
            "prompt": self.prompt(),
            "ability": "math",
            "reward_model": {"ground_truth": answer},
            "extra_info": {
                "label": LABEL,
                "reference": answer,
                "answer": answer,
                "expression": self.expression,
                "split": self.split.as_str(),
                "index": self.index,
            },
        })
    }
}

/// The user prompt for an expression.
pub fn prompt_for(expression: &str) -> String {
    format!(
        "Compute this Python-style arithmetic expression.\nExpression: {expression}\n\
         Return only the final result in the format \\boxed{{answer}}."
    )
}

/// Both splits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyPythonExprDataset {
    /// Train rows, `index` 0..train_size.
    pub train: Vec<ExprRecord>,
    /// Test rows, `index` 0..test_size.
    pub test: Vec<ExprRecord>,
}

impl TinyPythonExprDataset {
    /// The records of one split.
    pub fn records(&self, split: Split) -> &[ExprRecord] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// One split as a [`Dataset`] (columns `data_source, prompt, ability, reward_model,
    /// extra_info`).
    pub fn to_dataset(&self, split: Split) -> Dataset {
        let columns = [
            "data_source",
            "prompt",
            "ability",
            "reward_model",
            "extra_info",
        ];
        Dataset::new(
            columns.iter().map(|c| c.to_string()).collect(),
            self.records(split)
                .iter()
                .map(ExprRecord::to_json)
                .collect(),
        )
    }

    /// Train rows then test rows as JSON Lines, each line `json.dumps(row)`: the bytes the
    /// Python reference writes (`tests/fixtures/tiny_python_expr/dataset_seed42_128_32.jsonl` of
    /// the repository for the defaults).
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for record in self.train.iter().chain(&self.test) {
            out.push_str(&python_json_dumps(&record.to_json(), true));
            out.push('\n');
        }
        out
    }

    /// Saves both splits as a `DatasetDict` directory (`train`, `test`) plus the extra
    /// `formats`; see [`save_splits`].
    pub fn save(&self, dir: impl AsRef<Path>, formats: SaveFormats) -> Result<Vec<PathBuf>> {
        let train = self.to_dataset(Split::Train);
        let test = self.to_dataset(Split::Test);
        save_splits(dir.as_ref(), &[("train", &train), ("test", &test)], formats)
    }
}

/// Generates both splits (train first, then test from the same random stream).
///
/// Errors: [`DataError::InvalidSynthOptions`] for options that cannot work,
/// [`DataError::SynthExhausted`] when a split asks for more distinct expressions than the
/// options can (practically) produce.
pub fn generate(opts: &TinyPythonExprOptions) -> Result<TinyPythonExprDataset> {
    opts.validate()?;
    let mut gen = Generator {
        rng: PyRandom::new(opts.seed),
        opts,
        nodes: 0,
    };
    let train = gen.split(Split::Train, opts.train_size)?;
    let test = gen.split(Split::Test, opts.test_size)?;
    Ok(TinyPythonExprDataset { train, test })
}

struct Generator<'a> {
    rng: PyRandom,
    opts: &'a TinyPythonExprOptions,
    /// Nodes built since the last new row (the work guard).
    nodes: u64,
}

impl Generator<'_> {
    /// `size` distinct rows: `depth = randint(1, max_depth)`, build, skip seen expressions.
    fn split(&mut self, split: Split, size: usize) -> Result<Vec<ExprRecord>> {
        let capacity = size.min(1 << 16); // an absurd size fails with an error, not an abort
        let mut seen = std::collections::HashSet::with_capacity(capacity);
        let mut rows = Vec::with_capacity(capacity);
        let mut duplicates_in_a_row = 0usize;
        self.nodes = 0;
        while rows.len() < size {
            let give_up = |reason: String, found: usize| DataError::SynthExhausted {
                generator: GENERATOR,
                split: split.as_str(),
                wanted: size,
                found,
                reason,
                hint: "max_depth, leaf_max, operators, value_min..value_max",
            };
            let depth = self.rng.randint(1, i64::from(self.opts.max_depth));
            let Some((expression, answer)) = self.expression(depth) else {
                let reason = format!(
                    "then {MAX_NODES_PER_ROW} expression nodes were built without a new row: \
                     the options reject almost every expression"
                );
                return Err(give_up(reason, rows.len()));
            };
            if !seen.insert(expression.clone()) {
                duplicates_in_a_row += 1;
                if duplicates_in_a_row >= MAX_CONSECUTIVE_DUPLICATES {
                    let reason =
                        format!("then {duplicates_in_a_row} draws in a row were duplicates");
                    return Err(give_up(reason, rows.len()));
                }
                continue;
            }
            duplicates_in_a_row = 0;
            self.nodes = 0;
            let index = rows.len();
            rows.push(ExprRecord {
                expression,
                answer,
                split,
                index,
            });
        }
        Ok(rows)
    }

    /// `build_expression(rng, depth)`: (text, value), or `None` once the work guard
    /// ([`MAX_NODES_PER_ROW`]) trips.
    fn expression(&mut self, depth: i64) -> Option<(String, i64)> {
        self.nodes += 1;
        if self.nodes > MAX_NODES_PER_ROW {
            return None;
        }
        if depth <= 0 || self.rng.random() < LEAF_PROBABILITY {
            return Some(self.leaf());
        }
        let ops = &self.opts.operators;
        for _ in 0..MAX_TRIES {
            let op = *self.rng.choose(ops);
            let (mut left, mut lv) = self.expression(depth - 1)?;
            let (mut right, mut rv) = self.expression(depth - 1)?;
            if op == Op::Sub && lv < rv {
                std::mem::swap(&mut left, &mut right);
                std::mem::swap(&mut lv, &mut rv);
            }
            let in_range = |v: i128| {
                (i128::from(self.opts.value_min)..=i128::from(self.opts.value_max)).contains(&v)
            };
            if let Some(value) = op.apply(lv, rv).filter(|v| in_range(*v)) {
                return Some((format!("({left} {op} {right})"), value as i64));
            }
        }
        Some(self.leaf())
    }

    fn leaf(&mut self) -> (String, i64) {
        let v = self.rng.randint(0, i64::from(self.opts.leaf_max));
        (v.to_string(), v)
    }
}

fn invalid(message: impl Into<String>) -> DataError {
    DataError::InvalidSynthOptions {
        generator: GENERATOR,
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_integer_semantics() {
        assert_eq!(Op::FloorDiv.apply(7, 2), Some(3));
        assert_eq!(Op::FloorDiv.apply(-7, 2), Some(-4));
        assert_eq!(Op::FloorDiv.apply(7, -2), Some(-4));
        assert_eq!(Op::Mod.apply(-7, 2), Some(1));
        assert_eq!(Op::Mod.apply(7, -2), Some(-1));
        assert_eq!(Op::Mod.apply(7, 0), None);
        assert_eq!(Op::FloorDiv.apply(7, 0), None);
        assert_eq!(Op::Pow.apply(3, 4), Some(81));
        assert_eq!(Op::Pow.apply(0, 0), Some(1));
        assert_eq!(Op::Pow.apply(2, 5), None);
        assert_eq!(Op::Pow.apply(2, -1), None);
        assert_eq!(Op::Pow.apply(i64::MAX, 4), None);
    }

    #[test]
    fn operators_parse_and_validate() {
        assert_eq!(Op::parse_list("+, - ,*,//,%,**").unwrap(), Op::ALL.to_vec());
        let err = Op::parse_list("+,/").unwrap_err().to_string();
        assert!(err.contains("unknown operator \"/\""), "{err}");
        let twice = TinyPythonExprOptions {
            operators: vec![Op::Add, Op::Add],
            ..Default::default()
        };
        assert!(twice.validate().unwrap_err().to_string().contains("twice"));
    }
}
