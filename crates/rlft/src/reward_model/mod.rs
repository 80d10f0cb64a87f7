//! The reward-model trainer: `rlft reward-model --config rm.toml`, on the run core
//! ([`crate::run`]), as TRL's `RewardTrainer`.
//!
//! A decoder with a scalar `score` head ([`rlft_model::score`]) learns from preference pairs
//! with the Bradley-Terry loss ([`crate::algo::reward`]): each micro-batch scores its chosen and
//! rejected sequences in one left-padded forward pass (chosen rows first, as TRL's
//! `DataCollatorForPreference`), reads each at its last non-pad token, and adds
//! `-log sigmoid(r_c - r_r - margin)` (plus the centring term) per pair; the sum over a
//! micro-batch is divided by the pairs of the whole optimiser step, so batch 8 x accumulation 1
//! equals 4 x 2 (TRL's mean per micro-batch over equal micro-batches). The head trains beside
//! the LoRA adapters (PEFT's `modules_to_save`) or with every weight.
//!
//! Metrics (TRL's names): `loss`, `accuracy` (share of pairs whose chosen scores higher),
//! `margin` (mean `r_c - r_r`), `min_reward` / `mean_reward` / `max_reward`, and the same with
//! `eval_` on the eval pairs. Where TRL averages per-micro-batch values over the logging
//! window (its min and max are means of per-batch minima and maxima), rlft logs each step's
//! values over all of its pairs, and the eval values over all eval pairs.
//!
//! [`score`] scores dataset rows with a trained reward model (`rlft score`); [`reward`] makes
//! one a reward of the online trainers (`[[rewards]] type = "model"`).
//!
//! The final export is an HF `*ForSequenceClassification` directory (`final/`) that
//! `AutoModelForSequenceClassification` loads, and with LoRA also the PEFT adapter with the head
//! (`adapter/`).

pub mod reward;
pub mod score;
mod setup;

use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use rlft_model::score::{
    save_score_adapter, save_score_model, sequence_scores, ScoreBatch, ScoreHead,
};

use crate::algo::reward::{pair_losses, PairStats};
use crate::config::reward::RewardConfig;
use crate::data::preferences::RewardPair;
use crate::error::Result;
use crate::run::offline::{self, OfflineAlgorithm, OfflineStep};
use crate::run::{
    Console, Metrics, MicroContext, Policy, RunOptions, RunSummary, Shown, StepStats, GRAD_NORM,
    LEARNING_RATE, LOSS,
};
pub use setup::{prepare, Prepared};

/// The scores of pairs: chosen and rejected of each, from one forward pass.
struct PairScores {
    /// `[2n]`: the chosen rows' scores, then the rejected rows'.
    scores: Tensor,
    /// Real tokens of the batch.
    tokens: usize,
}

/// Scores `pairs` (chosen rows first, then rejected) with `head` on `model`.
fn score_pairs(
    model: &rlft_model::CausalLm,
    head: &ScoreHead,
    pairs: &[&RewardPair],
    pad_id: u32,
    grad: bool,
) -> Result<PairScores> {
    let rows: Vec<Vec<u32>> = pairs
        .iter()
        .map(|p| p.chosen_ids.clone())
        .chain(pairs.iter().map(|p| p.rejected_ids.clone()))
        .collect();
    let sb = ScoreBatch::new(&rows, pad_id, model.device())?;
    Ok(PairScores {
        scores: sequence_scores(model, head, &sb, grad)?,
        tokens: sb.num_tokens,
    })
}

/// The per-pair losses `[n]` and the chosen / rejected scores of `s` for `pairs`.
fn losses(
    cfg: &RewardConfig,
    s: &PairScores,
    pairs: &[&RewardPair],
    has_margin: bool,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    let n = pairs.len();
    let chosen = s.scores.narrow(0, 0, n)?;
    let rejected = s.scores.narrow(0, n, n)?;
    let margin = if has_margin {
        let m: Vec<f64> = pairs.iter().map(|p| p.margin).collect();
        Some(Tensor::new(m, s.scores.device())?.to_dtype(s.scores.dtype())?)
    } else {
        None
    };
    let l = pair_losses(
        &chosen,
        &rejected,
        margin.as_ref(),
        cfg.center_rewards_coefficient,
    )?;
    let v = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.to_vec1()?) };
    Ok((l, v(&chosen)?, v(&rejected)?))
}

/// A reward model as an [`OfflineAlgorithm`]: a step is micro-batches of pairs.
struct RewardModel<'a> {
    cfg: &'a RewardConfig,
    head: &'a ScoreHead,
    train: &'a [RewardPair],
    eval: &'a [RewardPair],
    has_margin: bool,
}

impl OfflineAlgorithm for RewardModel<'_> {
    type Extra = ();

    const CONSOLE: Console = Console {
        step: &[
            LOSS,
            Shown::new("accuracy", "acc"),
            Shown::new("margin", "margin"),
            GRAD_NORM,
            LEARNING_RATE,
        ],
        progress: &[LOSS, Shown::new("accuracy", "acc")],
        eval: &[
            Shown::new("eval_loss", "loss"),
            Shown::new("eval_accuracy", "accuracy"),
            Shown::new("eval_margin", "margin"),
        ],
    };

    fn micro_loss(&self, cx: MicroContext<'_, OfflineStep<()>>) -> Result<Tensor> {
        let (policy, step, micro, stats) = (cx.policy, cx.unit, cx.micro, cx.stats);
        let step_pairs = step.rows();
        let pairs: Vec<&RewardPair> = micro.iter().map(|&i| &self.train[i]).collect();
        let s = score_pairs(&policy.model, self.head, &pairs, policy.pad_id, true)?;
        let (l, chosen, rejected) = losses(self.cfg, &s, &pairs, self.has_margin)?;
        stats.tokens += s.tokens;
        let st = PairStats::of(&chosen, &rejected);
        let n = pairs.len() as f64;
        stats.add("accuracy", st.accuracy, n);
        stats.add("margin", st.margin, n);
        stats.add("mean_reward", st.mean_reward, 2.0 * n);
        stats.min("min_reward", st.min_reward);
        stats.max("max_reward", st.max_reward);
        Ok((l.sum_all()? / step_pairs.max(1) as f64)?)
    }

    fn own_metrics(&self, stats: &StepStats) -> Metrics {
        let mut m: Metrics = stats.means().map(|(k, v)| (k.to_string(), v)).collect();
        for key in ["min_reward", "max_reward"] {
            m.push((key.into(), stats.extreme(key).unwrap_or(f64::NAN)));
        }
        m
    }

    fn evaluate(&mut self, policy: &Policy) -> Result<Option<Metrics>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let plain = rlft_model::trainable::detached(&policy.model);
        let head = self.head.detached();
        let (mut total, mut chosen, mut rejected) = (0f64, Vec::new(), Vec::new());
        let batch = self.cfg.args.per_device_train_batch_size.max(1);
        for chunk in self.eval.chunks(batch) {
            let pairs: Vec<&RewardPair> = chunk.iter().collect();
            let s = score_pairs(&plain, &head, &pairs, policy.pad_id, false)?;
            let (l, c, r) = losses(self.cfg, &s, &pairs, self.has_margin)?;
            total += l.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
            chosen.extend(c);
            rejected.extend(r);
        }
        let st = PairStats::of(&chosen, &rejected);
        Ok(Some(vec![
            ("eval_loss".into(), total / self.eval.len() as f64),
            ("eval_accuracy".into(), st.accuracy),
            ("eval_margin".into(), st.margin),
            ("eval_min_reward".into(), st.min_reward),
            ("eval_mean_reward".into(), st.mean_reward),
            ("eval_max_reward".into(), st.max_reward),
        ]))
    }

    fn export(&self, out_dir: &Path, model_name: &str, policy: &Policy) -> Result<PathBuf> {
        export(out_dir, model_name, policy, self.head)
    }
}

/// Writes the reward model: `final/` (an HF `*ForSequenceClassification` directory, the
/// adapters merged) and, with LoRA, `adapter/` (PEFT, the head in `modules_to_save`).
pub fn export(
    out_dir: &Path,
    model_name: &str,
    policy: &Policy,
    head: &ScoreHead,
) -> Result<PathBuf> {
    let opts = rlft_model::export::ExportOptions {
        overwrite: true,
        ..Default::default()
    };
    let mut plain = rlft_model::trainable::detached(&policy.model);
    let head = head.detached();
    let out = out_dir.join("final");
    if let Some(l) = &policy.lora {
        let adapter = out_dir.join("adapter");
        save_score_adapter(&plain, &head, l, &adapter, Some(model_name))?;
        rlft_model::lora::merge_lora(&mut plain)?;
        eprintln!("wrote adapter {} (score head included)", adapter.display());
    }
    let (text, generation) = (&policy.text, &policy.generation);
    save_score_model(&plain, &head, text, generation, policy.pad_id, &out, &opts)?;
    eprintln!("wrote reward model {}", out.display());
    Ok(out)
}

/// Trains the reward model as configured. Prints progress when asked; writes metrics,
/// checkpoints and the final model under `output_dir`.
pub fn train(cfg: &RewardConfig, p: &mut Prepared, opts: &RunOptions) -> Result<RunSummary> {
    let algo = RewardModel {
        cfg,
        head: &p.head,
        train: &p.train,
        eval: &p.eval,
        has_margin: p.has_margin,
    };
    let steps = (p.train.len(), p.total_steps);
    offline::run(cfg, algo, steps, &mut p.policy, opts)
}
