//! The logs every online trainer keeps (GRPO's family and Online DPO): reward names,
//! `samples.jsonl` with train and eval completions, and an online step's metrics.

use rlft_rewards::{RewardSet, Scores};

use super::eval::evaluate;
use super::samples::{pick, LoggedSample, SampleLog};
use super::{Sample, Turns};
use crate::config::online::OnlineConfig;
use crate::data::prompts::PromptItem;
use crate::error::{Result, TrainerError};
use crate::online::eval_settings;
use crate::run::{Metrics, Policy, Position, StepOutcome};

/// The logs every online trainer keeps: reward names, `samples.jsonl`, and the eval pass that
/// writes its completions there too.
pub(crate) struct OnlineLogs {
    /// Reward function names, in config order.
    pub names: Vec<String>,
    samples: Option<SampleLog>,
    /// Completions logged per step (an eval pass logs twice as many).
    num_completions_to_log: usize,
}

impl OnlineLogs {
    pub fn new(names: Vec<String>, num_completions_to_log: usize) -> Self {
        OnlineLogs {
            names,
            samples: None,
            num_completions_to_log,
        }
    }

    /// Opens `samples.jsonl` in `out_dir` (cut back to `resumed_at` on resume).
    pub fn open(&mut self, out_dir: &std::path::Path, resumed_at: Option<u64>) -> Result<()> {
        self.samples =
            Some(SampleLog::open(out_dir, resumed_at).map_err(TrainerError::io(out_dir))?);
        Ok(())
    }

    fn write(&mut self, step: u64, logged: &[LoggedSample<'_>]) -> Result<()> {
        if let Some(log) = &mut self.samples {
            log.write(step, logged)
                .map_err(|e| TrainerError::Other(format!("samples.jsonl: {e}")))?;
        }
        Ok(())
    }

    /// Logs the `picks` of a rollout's samples at `step`.
    pub fn log_train(
        &mut self,
        step: u64,
        items: &[PromptItem],
        samples: &[Sample],
        scores: &Scores,
        advantages: Option<&[f64]>,
        picks: impl IntoIterator<Item = usize>,
    ) -> Result<()> {
        let scored = (&self.names[..], scores);
        let logged = pick("train", items, samples, scored, advantages, picks);
        self.write(step, &logged)
    }

    /// An eval pass of `policy` on `eval` with `cfg`'s eval settings and the run's tools (None
    /// without prompts).
    pub fn evaluate(
        &mut self,
        cfg: &OnlineConfig,
        policy: &Policy,
        eval: &[PromptItem],
        rewards: &mut RewardSet,
        turns: Option<&Turns>,
        at: Position,
    ) -> Result<Option<Metrics>> {
        if eval.is_empty() {
            return Ok(None);
        }
        let settings = eval_settings(cfg, &policy.generation.eos_token_ids, policy.pad_id);
        rewards.set_trainer_state(at.into());
        let r = evaluate(&policy.model, &policy.text, eval, rewards, &settings, turns)?;
        let keep = self.num_completions_to_log.max(1) * 2;
        let scored = (&self.names[..], &r.scores);
        let logged = pick("eval", eval, &r.samples, scored, None, 0..keep);
        self.write(at.global_step, &logged)?;
        Ok(Some(r.metrics))
    }
}

/// An online step's metrics: the rollout's, the optimiser's, the step's accumulated stats and,
/// on a rollout's first step, its phase times.
pub(crate) fn online_step_metrics(
    rollout: &Metrics,
    out: &StepOutcome,
    first: bool,
    times: &Metrics,
) -> Metrics {
    let mut m = rollout.clone();
    m.push(("loss".into(), out.loss));
    m.push(("grad_norm".into(), out.grad_norm));
    m.push(("learning_rate".into(), out.lr));
    m.extend(out.stats.means().map(|(k, v)| (k.to_string(), v)));
    m.extend(out.stats.counts().map(|(k, v)| (k.to_string(), v)));
    m.push((
        "tokens_per_s".into(),
        out.tokens as f64 / out.seconds.max(1e-9),
    ));
    if first {
        m.extend(times.iter().cloned());
    }
    m.push(("time/update".into(), out.seconds));
    m
}
