//! [`RewardSet`]: the trainer's reward functions with their weights, scored together.

use crate::spec::build_reward;
use crate::{Reward, RewardError, RewardOutput, RewardSpec, Sample, TrainerState};

/// The reward functions of a trainer, with weights and `on_error` defaults.
pub struct RewardSet {
    functions: Vec<Box<dyn Reward>>,
    weights: Vec<f64>,
    on_error: Vec<Option<f64>>,
}

/// What [`RewardSet::score`] returns for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    /// One output per function, in the order of the specs.
    pub per_function: Vec<RewardOutput>,
    /// Per sample: the weighted sum over functions, `None` counted as 0 (TRL's `nansum`). A
    /// sample no function scored (every one answered `None`) has 0 here; [`Scores::totals`]
    /// tells it apart.
    pub total: Vec<f64>,
    /// Per function: how many samples of this batch got its `on_error` default.
    pub failures: Vec<usize>,
    /// Per function: the error that made it fall back to `on_error` in this batch, if any, for
    /// the trainer to log.
    pub errors: Vec<Option<String>>,
}

impl Scores {
    /// Per sample: its weighted total, or `None` when every function answered `None` (an
    /// unscorable sample, TRL's all-NaN row: trainers give it advantage 0 and leave it out of
    /// the reward statistics). A function that fell back to `on_error` scored the sample.
    pub fn totals(&self) -> Vec<Option<f64>> {
        (0..self.total.len())
            .map(|i| self.is_scored(i).then_some(self.total[i]))
            .collect()
    }

    /// Whether at least one function scored sample `i`.
    pub fn is_scored(&self, i: usize) -> bool {
        self.per_function.iter().any(|f| f.scores[i].is_some())
    }
}

impl RewardSet {
    /// Builds every spec. `weights_override` (TRL's `reward_weights`) replaces the specs' weights
    /// and must have one entry per spec.
    pub fn new(
        specs: &[RewardSpec],
        weights_override: Option<&[f64]>,
    ) -> Result<Self, RewardError> {
        Self::with_builder(specs, weights_override, build_reward)
    }

    /// [`RewardSet::new`] with `build` making each function from its spec: a caller that can
    /// build kinds this crate cannot (a `model` reward needs a loaded model) handles those and
    /// passes the rest to [`build_reward`]. Functions keep the order of `specs`.
    pub fn with_builder(
        specs: &[RewardSpec],
        weights_override: Option<&[f64]>,
        mut build: impl FnMut(&RewardSpec) -> Result<Box<dyn Reward>, RewardError>,
    ) -> Result<Self, RewardError> {
        if specs.is_empty() {
            return Err(RewardError::Set(
                "no reward functions: add at least one, e.g. a `[[rewards]]` table with \
                 `type = \"python_expr_rule\"`"
                    .into(),
            ));
        }
        let names: Vec<&str> = specs.iter().map(RewardSpec::display_name).collect();
        let weights: Vec<f64> = match weights_override {
            Some(w) if w.len() != specs.len() => {
                return Err(RewardError::Set(format!(
                    "`reward_weights` has {} entries but there are {} reward functions ({}); give \
                     one weight per function, in the same order, or drop `reward_weights` to use \
                     each function's `weight`",
                    w.len(),
                    specs.len(),
                    names.join(", ")
                )))
            }
            Some(w) => w.to_vec(),
            None => specs.iter().map(|s| s.weight).collect(),
        };
        let mut set = RewardSet {
            functions: Vec::new(),
            weights: Vec::new(),
            on_error: Vec::new(),
        };
        for (spec, weight) in specs.iter().zip(weights) {
            set.check(spec.display_name(), weight, spec.on_error)?;
            set.functions.push(build(spec)?);
            set.weights.push(weight);
            set.on_error.push(spec.on_error);
        }
        Ok(set)
    }

    /// Adds a reward function written in Rust.
    pub fn push(
        &mut self,
        reward: Box<dyn Reward>,
        weight: f64,
        on_error: Option<f64>,
    ) -> Result<(), RewardError> {
        self.check(reward.name(), weight, on_error)?;
        self.functions.push(reward);
        self.weights.push(weight);
        self.on_error.push(on_error);
        Ok(())
    }

    fn check(&self, name: &str, weight: f64, on_error: Option<f64>) -> Result<(), RewardError> {
        if self.functions.iter().any(|f| f.name() == name) {
            return Err(RewardError::Set(format!(
                "two reward functions are named `{name}` (an unnamed reward is named after its \
                 `type`); give each a distinct `name = \"...\"`"
            )));
        }
        if !weight.is_finite() {
            return Err(RewardError::config(
                name,
                format!("weight must be a finite number; got {weight}"),
            ));
        }
        if on_error.is_some_and(|d| !d.is_finite()) {
            return Err(RewardError::config(
                name,
                "`on_error` must be a finite number",
            ));
        }
        Ok(())
    }

    /// The functions' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.functions
            .iter()
            .map(|f| f.name().to_string())
            .collect()
    }

    /// The functions' weights, in order.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// True when the set holds no function.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// Tells every function where training stands (TRL's `trainer_state`): call it before
    /// scoring a step's rollout or an eval pass. Until then functions see the default (step 0).
    pub fn set_trainer_state(&mut self, state: TrainerState) {
        for function in &mut self.functions {
            function.set_trainer_state(state);
        }
    }

    /// Scores `batch` with every function (one after the other) and sums the weighted scores.
    ///
    /// A function that fails falls back to its `on_error` score for the whole batch (counted in
    /// `failures`); without `on_error` its error is returned.
    pub fn score(&mut self, batch: &[Sample<'_>]) -> Result<Scores, RewardError> {
        let n = batch.len();
        let mut scores = Scores {
            per_function: Vec::with_capacity(self.functions.len()),
            total: vec![0.0; n],
            failures: vec![0; self.functions.len()],
            errors: vec![None; self.functions.len()],
        };
        for (i, function) in self.functions.iter_mut().enumerate() {
            let result = function
                .score(batch)
                .and_then(|out| check_output(function.name(), out, n));
            let output = match (result, self.on_error[i]) {
                (Ok(out), _) => out,
                (Err(e), Some(default)) => {
                    scores.failures[i] = n;
                    scores.errors[i] = Some(e.to_string());
                    RewardOutput {
                        scores: vec![Some(default); n],
                        parts: Vec::new(),
                    }
                }
                (Err(e), None) => return Err(e),
            };
            for (total, score) in scores.total.iter_mut().zip(&output.scores) {
                *total += self.weights[i] * score.unwrap_or(0.0);
            }
            scores.per_function.push(output);
        }
        Ok(scores)
    }
}

/// A function's output must have one finite score (or `None`) and one part value per sample.
fn check_output(name: &str, out: RewardOutput, n: usize) -> Result<RewardOutput, RewardError> {
    let bad = |message: String| {
        Err(RewardError::Output {
            reward: name.to_string(),
            message,
        })
    };
    if out.scores.len() != n {
        return bad(format!(
            "returned {} scores for a batch of {n} samples",
            out.scores.len()
        ));
    }
    if let Some(i) = out
        .scores
        .iter()
        .position(|s| s.is_some_and(|x| !x.is_finite()))
    {
        return bad(format!(
            "returned a non-finite score ({:?}) for sample {i}",
            out.scores[i]
        ));
    }
    if let Some((part, v)) = out.parts.iter().find(|(_, v)| v.len() != n) {
        return bad(format!(
            "part `{part}` has {} values for a batch of {n} samples",
            v.len()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn spec(v: Value) -> RewardSpec {
        serde_json::from_value(v).unwrap()
    }

    struct Flaky;
    impl Reward for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
            if batch.len() > 1 {
                Err(RewardError::Output {
                    reward: "flaky".into(),
                    message: "boom".into(),
                })
            } else {
                Ok(RewardOutput {
                    scores: vec![None],
                    parts: Vec::new(),
                })
            }
        }
    }

    struct Nan;
    impl Reward for Nan {
        fn name(&self) -> &str {
            "nan"
        }
        fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
            Ok(RewardOutput::from_scores(vec![f64::NAN; batch.len()]))
        }
    }

    #[test]
    fn weighted_total_and_failures() {
        let specs = [
            spec(json!({"type": "python_expr_rule"})),
            spec(
                json!({"type": "overlong", "max_completion_length": 10, "buffer": 4, "weight": 0.5}),
            ),
        ];
        let mut set = RewardSet::new(&specs, None).unwrap();
        assert_eq!(set.names(), vec!["python_expr_rule", "overlong"]);
        assert_eq!(set.weights(), &[1.0, 0.5]);
        set.push(Box::new(Flaky), 2.0, Some(-1.0)).unwrap();
        let row = json!({"reward_model": {"ground_truth": "4"}});
        let s = |c, t| Sample {
            prompt: "2+2?",
            completion: c,
            row: &row,
            completion_ids: &[],
            completion_tokens: t,
            truncated: false,
            environment_reward: None,
        };
        let out = set.score(&[s("\\boxed{4}", 3), s("4", 8)]).unwrap();
        // 1.0 + 0.5 * 0 + 2 * -1 ; 0.9 + 0.5 * -0.5 + 2 * -1
        assert_eq!(out.total, vec![1.0 - 2.0, 0.9 - 0.25 - 2.0]);
        assert_eq!(out.failures, vec![0, 0, 2]);
        assert!(out.errors[2].as_deref().unwrap().contains("boom"));
        // None counts as 0.
        let out = set.score(&[s("\\boxed{4}", 3)]).unwrap();
        assert_eq!(out.total, vec![1.0]);
        assert_eq!(out.totals(), vec![Some(1.0)]);
        assert_eq!(out.per_function[2].scores, vec![None]);
        assert_eq!(out.failures, vec![0, 0, 0]);
    }

    /// Scores only completions that contain a digit; `None` for the others.
    struct DigitsOnly;
    impl Reward for DigitsOnly {
        fn name(&self) -> &str {
            "digits_only"
        }
        fn score(&mut self, batch: &[Sample<'_>]) -> Result<RewardOutput, RewardError> {
            let scores = batch
                .iter()
                .map(|s| {
                    s.completion
                        .chars()
                        .any(|c| c.is_ascii_digit())
                        .then_some(2.0)
                })
                .collect();
            Ok(RewardOutput {
                scores,
                parts: Vec::new(),
            })
        }
    }

    /// A sample every function answers `None` for is unscorable: no total, while a sample one
    /// function scored keeps the weighted sum of what was scored.
    #[test]
    fn unscorable_samples_have_no_total() {
        let mut set = RewardSet {
            functions: Vec::new(),
            weights: Vec::new(),
            on_error: Vec::new(),
        };
        set.push(Box::new(DigitsOnly), 0.5, None).unwrap();
        set.push(Box::new(Flaky), 1.0, None).unwrap();
        let row = serde_json::json!({});
        let s = |c| Sample {
            prompt: "",
            completion: c,
            row: &row,
            completion_ids: &[],
            completion_tokens: 1,
            truncated: false,
            environment_reward: None,
        };
        for (c, want) in [("7", Some(1.0)), ("x", None)] {
            let out = set.score(&[s(c)]).unwrap();
            assert_eq!(out.totals(), vec![want], "{c}");
            assert_eq!(out.is_scored(0), want.is_some());
            assert_eq!(out.total, vec![want.unwrap_or(0.0)]);
        }
    }

    #[test]
    fn errors_without_on_error_propagate() {
        let mut set = RewardSet::new(&[spec(json!({"type": "boxed_accuracy"}))], None).unwrap();
        set.push(Box::new(Nan), 1.0, None).unwrap();
        let row = json!({"answer": "1"});
        let batch = [Sample {
            prompt: "",
            completion: "",
            row: &row,
            completion_ids: &[],
            completion_tokens: 0,
            truncated: false,
            environment_reward: None,
        }];
        let e = set.score(&batch).unwrap_err().to_string();
        assert!(
            e.starts_with("reward `nan`: returned a non-finite score"),
            "{e}"
        );
        let mut set = RewardSet::new(
            &[spec(json!({"type": "boxed_accuracy", "answer_field": "x"}))],
            None,
        )
        .unwrap();
        let e = set.score(&batch).unwrap_err();
        assert_eq!(e.reward(), Some("boxed_accuracy"));
    }

    #[test]
    fn validation() {
        let two = [
            spec(json!({"type": "repetition"})),
            spec(json!({"type": "repetition", "ngram": 2})),
        ];
        let e = RewardSet::new(&two, None).err().unwrap().to_string();
        assert!(
            e.contains("two reward functions are named `repetition`") && e.contains("`name"),
            "{e}"
        );
        let one = [spec(json!({"type": "repetition"}))];
        let e = RewardSet::new(&one, Some(&[1.0, 2.0]))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(
                "`reward_weights` has 2 entries but there are 1 reward functions (repetition)"
            ),
            "{e}"
        );
        let set = RewardSet::new(&one, Some(&[3.0])).unwrap();
        assert_eq!(set.weights(), &[3.0]);
        assert!(RewardSet::new(&[], None)
            .err()
            .unwrap()
            .to_string()
            .contains("no reward functions"));
        let e = RewardSet::new(&one, Some(&[f64::NAN]))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("finite"), "{e}");
    }
}
