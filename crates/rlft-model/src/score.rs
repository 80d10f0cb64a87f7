//! Sequence classification with one label: the decoder plus a scalar `score` head, as
//! transformers' `LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` /
//! `Qwen3ForSequenceClassification` with `num_labels = 1` (a reward model, or PPO's critic).
//!
//! The head is `score.weight [1, hidden]` (no bias) on the final-normed hidden states
//! ([`CausalLm::forward`]): [`token_scores`] gives a score per position `[b, t]` (what a PPO
//! critic uses as values), [`sequence_scores`] the score of each row at its last non-pad token,
//! read as transformers 5.24 does (`transformers/modeling_layers.py`,
//! `GenericForSequenceClassification.forward`, lines 174-190: the rightmost position whose id is
//! not `pad_token_id`, position 0 when every id is the pad id; see [`last_non_pad`]).
//!
//! On disk a reward model is an HF directory whose `config.json` names a
//! `*ForSequenceClassification` architecture with one label: backbone weights `model.*`, the
//! head `score.weight`, no `lm_head` ([`load_score_model`], [`save_score_model`]); or a PEFT
//! adapter (`task_type = "SEQ_CLS"`) whose `modules_to_save` holds the head
//! (`base_model.model.score.weight`, [`save_score_adapter`]).
//!
//! ```
//! # fn main() -> rlft_model::Result<()> {
//! # let dev = candle_core::Device::Cpu;
//! # let cfg = rlft_model::tiny::tiny_config(rlft_model::Family::Llama);
//! # let model = rlft_model::tiny::random_model(cfg, 0, candle_core::DType::F32, &dev)?;
//! use rlft_model::score::{sequence_scores, ScoreBatch, ScoreHead};
//! let head = ScoreHead::normal(64, 0.02, 7, candle_core::DType::F32, &dev)?;
//! let rows = vec![vec![1, 72, 105, 2], vec![1, 33]];
//! let sb = ScoreBatch::new(&rows, 2, &dev)?; // pad id 2: row 0 is read at position 2
//! let scores = sequence_scores(&model, &head, &sb, false)?; // [2]
//! # assert_eq!(scores.dims(), &[2]);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use rlft_text::TextBundle;
use serde_json::{json, Value};

use crate::adapter::{fnv1a, splitmix64, unit};
use crate::config::Family;
use crate::decoder::{Batch, CausalLm};
use crate::error::{ModelError, Result};
use crate::export::{dtype_name, filled_config, save_dir, ExportOptions};
use crate::generation_config::GenerationConfig;
use crate::load::{LoadOptions, LoadedModel};
use crate::lora::{LoraConfig, PEFT_PREFIX};

/// HF name of the head's weight.
pub const SCORE_WEIGHT: &str = "score.weight";

/// transformers' default `initializer_range` of Llama / Qwen configs: the standard deviation
/// of a fresh head (`_init_weights` draws `nn.Linear` weights from `normal(0, range)`).
pub const DEFAULT_INITIALIZER_RANGE: f64 = 0.02;

/// The scalar head `score.weight [1, hidden]`.
#[derive(Debug, Clone)]
pub struct ScoreHead {
    /// `[1, hidden]`, in the model's dtype (a `Var`'s tensor while training).
    pub weight: Tensor,
}

/// How a fresh head starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HeadInit {
    /// `normal(0, std)` drawn from `seed`, as transformers' `_init_weights` (with
    /// `std = initializer_range`, [`DEFAULT_INITIALIZER_RANGE`]).
    Normal {
        /// Standard deviation.
        std: f64,
        /// Seed of the draw.
        seed: u64,
    },
    /// All zeros: every sequence scores 0 before training.
    Zeros,
}

impl ScoreHead {
    /// A head from its weight, which must be `[1, hidden]`.
    pub fn new(weight: Tensor) -> Result<Self> {
        match weight.dims() {
            [1, _] => Ok(ScoreHead { weight }),
            [n, _] => Err(ModelError::Invalid(format!(
                "score.weight has {n} labels; a reward model has exactly one (num_labels = 1)"
            ))),
            d => Err(ModelError::Invalid(format!(
                "score.weight has shape {d:?}; expected [1, hidden]"
            ))),
        }
    }

    /// A fresh head for `hidden` features as `init` says.
    pub fn init(hidden: usize, init: HeadInit, dtype: DType, device: &Device) -> Result<ScoreHead> {
        match init {
            HeadInit::Normal { std, seed } => Self::normal(hidden, std, seed, dtype, device),
            HeadInit::Zeros => Self::new(Tensor::zeros((1, hidden), dtype, device)?),
        }
    }

    /// `normal(0, std)` weights drawn from `seed` (Box-Muller over a splitmix64 stream: the
    /// same head on every machine, not torch's draw).
    pub fn normal(
        hidden: usize,
        std: f64,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<ScoreHead> {
        let salt = seed ^ fnv1a(SCORE_WEIGHT);
        let draw = |i: u64| unit(splitmix64(salt.wrapping_add(i)));
        let data: Vec<f64> = (0..hidden as u64)
            .map(|i| {
                let u1 = 1.0 - draw(2 * i); // (0, 1]: the log is finite
                let u2 = draw(2 * i + 1);
                std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
            })
            .collect();
        let w = Tensor::from_vec(data, (1, hidden), device)?.to_dtype(dtype)?;
        Self::new(w)
    }

    /// Hidden size the head reads.
    pub fn hidden_size(&self) -> usize {
        self.weight.dim(1).unwrap_or(0)
    }

    /// Makes the weight trainable: a [`Var`] whose tensor replaces the weight (the optimizer's
    /// in-place updates are seen by the head). Calling it again returns the same `Var`.
    pub fn make_trainable(&mut self) -> Result<Var> {
        let var = Var::from_tensor(&self.weight)?;
        self.weight = var.as_tensor().clone();
        Ok(var)
    }

    /// A copy sharing the storage but without graph (no-grad passes of a model in training).
    pub fn detached(&self) -> ScoreHead {
        ScoreHead {
            weight: self.weight.detach(),
        }
    }

    /// Scores of hidden rows: `hidden [.., hidden]` -> `[..]` (f32; f64 for f64 models).
    /// Differentiable through `hidden` and the weight.
    pub fn scores(&self, hidden: &Tensor) -> Result<Tensor> {
        let dims = hidden.dims().to_vec();
        let h = *dims.last().unwrap_or(&0);
        if h != self.hidden_size() {
            return Err(ModelError::Invalid(format!(
                "score head reads {} features but the hidden states have {h}; the head belongs \
                 to another model",
                self.hidden_size()
            )));
        }
        let n: usize = dims[..dims.len() - 1].iter().product();
        let w = self.weight.to_dtype(hidden.dtype())?;
        let y = hidden.reshape((n, h))?.matmul(&w.t()?)?;
        let y = y.to_dtype(crate::ops::compute_dtype(y.dtype()))?;
        Ok(y.reshape(&dims[..dims.len() - 1])?)
    }
}

/// Where transformers reads a row's sequence score: the rightmost position whose id is not
/// `pad_id`, or 0 when every id is `pad_id` (`(arange(t) * (ids != pad)).argmax()`, which
/// finds the last real token of left- and right-padded rows alike). Note that a row ending
/// in the pad id (the EOS, when pad = EOS) is read at the token before it, as transformers does.
pub fn last_non_pad(row: &[u32], pad_id: u32) -> usize {
    row.iter().rposition(|&t| t != pad_id).unwrap_or(0)
}

/// Rows of token ids as one left-padded batch, with each row's score position.
#[derive(Debug, Clone)]
pub struct ScoreBatch {
    /// The rows, left-padded to `[b, t]` (positions counted from each row's first token).
    pub batch: Batch,
    /// Per row, the batch position its sequence score is read at ([`last_non_pad`] of the row,
    /// shifted by its padding).
    pub score_pos: Vec<usize>,
    /// Real (unpadded) tokens in the batch.
    pub num_tokens: usize,
}

impl ScoreBatch {
    /// Batches `rows` (each non-empty) with `pad_id` as padding and as transformers'
    /// `pad_token_id` for the score position.
    pub fn new(rows: &[Vec<u32>], pad_id: u32, device: &Device) -> Result<ScoreBatch> {
        if let Some(r) = rows.iter().position(Vec::is_empty) {
            return Err(ModelError::Invalid(format!(
                "ScoreBatch: row {r} is empty; a sequence needs at least one token"
            )));
        }
        let t = rows.iter().map(Vec::len).max().unwrap_or(0);
        let pad: Vec<usize> = rows.iter().map(|r| t - r.len()).collect();
        let score_pos = rows
            .iter()
            .zip(&pad)
            .map(|(r, p)| p + last_non_pad(r, pad_id))
            .collect();
        Ok(ScoreBatch {
            batch: Batch::left_padded(rows, &pad, 0, pad_id, device)?,
            score_pos,
            num_tokens: rows.iter().map(Vec::len).sum(),
        })
    }
}

/// Scores of every position: `batch [b, t]` -> `[b, t]` (f32; f64 for f64 models): the head on
/// each final hidden state, as TRL's PPO reads values (`get_reward` on every position). Scores
/// of padding positions are meaningless. `grad = true` builds the graph through the trainable
/// weights (backbone, adapters, head).
pub fn token_scores(
    model: &CausalLm,
    head: &ScoreHead,
    batch: &Batch,
    grad: bool,
) -> Result<Tensor> {
    let hidden = model.forward(batch, None, grad)?;
    head.scores(&hidden)
}

/// Sequence scores `[b]` (f32; f64 for f64 models): the head on the hidden state at each row's
/// [`ScoreBatch::score_pos`], what `AutoModelForSequenceClassification(...).logits[:, 0]` gives.
pub fn sequence_scores(
    model: &CausalLm,
    head: &ScoreHead,
    sb: &ScoreBatch,
    grad: bool,
) -> Result<Tensor> {
    let hidden = model.forward(&sb.batch, None, grad)?;
    let (b, t, h) = hidden.dims3()?;
    let idx: Vec<u32> = sb
        .score_pos
        .iter()
        .enumerate()
        .map(|(r, &p)| (r * t + p) as u32)
        .collect();
    let idx = Tensor::from_vec(idx, b, hidden.device())?;
    let rows = hidden.reshape((b * t, h))?.index_select(&idx, 0)?;
    head.scores(&rows)
}

/// A reward model ready to score: the backbone, its head, tokenizer and pad id.
#[derive(Debug, Clone)]
pub struct ScoreModel {
    /// The decoder (may lack an LM head).
    pub model: CausalLm,
    /// The `score` head.
    pub head: ScoreHead,
    /// Tokenizer and chat template.
    pub text: TextBundle,
    /// Generation defaults of the checkpoint (eos / pad ids).
    pub generation: GenerationConfig,
    /// transformers' `pad_token_id`: padding, and the id skipped when finding the score position.
    pub pad_id: u32,
    /// Where it came from.
    pub source: PathBuf,
}

impl ScoreModel {
    /// Sequence scores of `rows` of token ids, `batch_size` rows per forward pass, no graph.
    pub fn score_rows(&self, rows: &[Vec<u32>], batch_size: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(batch_size.max(1)) {
            let sb = ScoreBatch::new(chunk, self.pad_id, self.model.device())?;
            let s = sequence_scores(&self.model, &self.head, &sb, false)?;
            out.extend(s.to_dtype(DType::F32)?.to_vec1::<f32>()?);
        }
        Ok(out)
    }
}

/// The pad id a loaded model uses: its pad id, else its first eos id (as TRL's `RewardTrainer`
/// falls back to the eos token), else 0.
pub fn pad_id_of(generation: &GenerationConfig) -> u32 {
    generation
        .pad_token_id
        .or_else(|| generation.eos_token_ids.first().copied())
        .unwrap_or(0)
}

/// A reward model made from a loaded causal LM and a fresh head (TRL's `RewardTrainer`
/// loading a causal LM with `AutoModelForSequenceClassification(num_labels=1)`: the backbone
/// is kept, the LM head unused, the score head new).
pub fn from_causal_lm(loaded: LoadedModel, init: HeadInit) -> Result<ScoreModel> {
    let m = &loaded.model;
    let head = ScoreHead::init(m.config.hidden_size, init, m.dtype(), m.device())?;
    Ok(ScoreModel {
        pad_id: pad_id_of(&loaded.generation),
        model: loaded.model,
        head,
        text: loaded.text,
        generation: loaded.generation,
        source: loaded.source,
    })
}

/// The `*ForSequenceClassification` class `dir/config.json` names, if it names one (None when
/// the file is missing, unreadable or names another class: the causal-LM loader reports those).
pub fn sequence_classification_arch(dir: &Path) -> Result<Option<String>> {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return Ok(None);
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return Ok(None);
    };
    Ok(v.get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .filter(|a| a.ends_with("ForSequenceClassification"))
        .map(str::to_string))
}

/// Labels of a sequence-classification `config.json`: `id2label`'s size, else `num_labels`,
/// else transformers' default of 2.
fn num_labels(v: &Value) -> usize {
    v.get("id2label")
        .and_then(Value::as_object)
        .map(|m| m.len())
        .or_else(|| {
            v.get("num_labels")
                .and_then(Value::as_u64)
                .map(|n| n as usize)
        })
        .unwrap_or(2)
}

/// Loads a reward model: an HF directory of a `*ForSequenceClassification` checkpoint with one
/// label, or a PEFT adapter directory (`task_type = "SEQ_CLS"`, the head in `modules_to_save`)
/// over `base` (a causal LM; default: the adapter's `base_model_name_or_path`), merged.
/// A causal LM without a score head is an error that says how to get a reward model.
pub fn load_score_model(
    path: &Path,
    base: Option<&Path>,
    opts: &LoadOptions,
) -> Result<ScoreModel> {
    if path.join(crate::peft::ADAPTER_CONFIG).is_file() {
        return load_score_adapter(path, base, opts);
    }
    let Some(arch) = path
        .is_dir()
        .then(|| sequence_classification_arch(path))
        .transpose()?
        .flatten()
    else {
        return Err(ModelError::bad_file(
            path,
            "is not a reward model: it has no `score` head (config.json must name a \
             `*ForSequenceClassification` architecture, or the directory must be a PEFT \
             SEQ_CLS adapter); train one with `rlft reward-model`, or score with a rule reward",
        ));
    };
    let cfg_path = path.join("config.json");
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?,
    )
    .map_err(|e| ModelError::bad_file(&cfg_path, format!("not valid JSON ({e})")))?;
    let labels = num_labels(&v);
    if labels != 1 {
        return Err(ModelError::bad_file(
            &cfg_path,
            format!(
                "`{arch}` with {labels} labels; a reward model has one (num_labels = 1, \
                 id2label {{\"0\": \"LABEL_0\"}})"
            ),
        ));
    }
    let (config, mut weights, dtypes) = crate::load::read_hf_weights(path, opts)?;
    let w = weights.remove(SCORE_WEIGHT).ok_or_else(|| {
        ModelError::bad_file(
            path,
            format!("`{arch}` checkpoint without `{SCORE_WEIGHT}`; re-export the reward model"),
        )
    })?;
    let head = ScoreHead::new(w)?;
    if head.hidden_size() != config.hidden_size {
        return Err(ModelError::ShapeMismatch {
            name: SCORE_WEIGHT.into(),
            got: head.weight.dims().to_vec(),
            expected: vec![1, config.hidden_size],
        });
    }
    let model = CausalLm::from_backbone_weights(config, weights)?;
    let loaded = crate::load::finish_hf_load(path, model, dtypes)?;
    let pad_id = v
        .get("pad_token_id")
        .and_then(Value::as_u64)
        .map(|p| p as u32)
        .unwrap_or_else(|| pad_id_of(&loaded.generation));
    Ok(ScoreModel {
        model: loaded.model,
        head,
        text: loaded.text,
        generation: loaded.generation,
        pad_id,
        source: path.to_path_buf(),
    })
}

/// The base that adapter `dir`'s `base_model_name_or_path` names, when it is on this machine:
/// a path that exists, or a built-in name (`default`: fetched once).
fn named_base(dir: &Path) -> Result<Option<PathBuf>> {
    let Some(name) = crate::load::adapter_base_name(dir)? else {
        return Ok(None);
    };
    match rlft_fetch::classify(&name) {
        Ok(rlft_fetch::ModelRef::Builtin(m)) => Ok(Some(rlft_fetch::ensure(m)?)),
        Ok(rlft_fetch::ModelRef::Path(p)) if p.exists() => Ok(Some(p)),
        _ => Ok(None),
    }
}

/// A PEFT SEQ_CLS adapter with its `score` head over a causal-LM base, merged.
fn load_score_adapter(dir: &Path, base: Option<&Path>, opts: &LoadOptions) -> Result<ScoreModel> {
    let cfg_path = dir.join(crate::peft::ADAPTER_CONFIG);
    let base = match base {
        Some(b) => b.to_path_buf(),
        None => named_base(dir)?.ok_or_else(|| {
            ModelError::bad_file(
                &cfg_path,
                "names no base model on this machine (base_model_name_or_path); pass the \
                 base explicitly",
            )
        })?,
    };
    let mut loaded = crate::load::load_model(&base, opts)?;
    loaded.model.drop_quantized();
    let (_, mut saved) =
        crate::peft::load_adapter_saving(&mut loaded.model, dir, &["score", "classifier"])?;
    let w = saved.remove("score").ok_or_else(|| {
        ModelError::bad_file(
            dir,
            "is a LoRA adapter without a `score` head (modules_to_save); it adapts a causal LM, \
             not a reward model: train one with `rlft reward-model`",
        )
    })?;
    crate::lora::merge_lora(&mut loaded.model)?;
    let head = ScoreHead::new(w.to_dtype(loaded.model.dtype())?)?;
    let mut sm = from_causal_lm(loaded, HeadInit::Zeros)?;
    sm.head = head;
    sm.source = dir.to_path_buf();
    Ok(sm)
}

/// The `*ForSequenceClassification` class of a family.
pub fn architecture(family: Family) -> &'static str {
    match family {
        Family::Llama => "LlamaForSequenceClassification",
        Family::Qwen2 => "Qwen2ForSequenceClassification",
        Family::Qwen3 => "Qwen3ForSequenceClassification",
    }
}

/// Writes `model` (no adapters: merge them first) and `head` as an HF directory that
/// `AutoModelForSequenceClassification.from_pretrained` loads with the same scores:
/// `config.json` with the `*ForSequenceClassification` architecture, one label and
/// `pad_token_id = pad_id`; `model.safetensors` with the backbone and `score.weight` (no
/// `lm_head`); the tokenizer files and generation defaults as [`crate::export::save_hf_dir`].
pub fn save_score_model(
    model: &CausalLm,
    head: &ScoreHead,
    text: &TextBundle,
    generation: &GenerationConfig,
    pad_id: u32,
    dir: &Path,
    opts: &ExportOptions,
) -> Result<()> {
    let mut config = filled_config(model, generation).to_hf_json(dtype_name(opts.dtype)?)?;
    let o = config.as_object_mut().expect("config.json is an object");
    o.insert(
        "architectures".into(),
        json!([architecture(model.config.family)]),
    );
    o.insert("id2label".into(), json!({"0": "LABEL_0"}));
    o.insert("label2id".into(), json!({"LABEL_0": 0}));
    o.insert("pad_token_id".into(), json!(pad_id));
    let mut generation = generation.clone();
    generation.pad_token_id = Some(pad_id);
    let w = head.weight.detach().to_device(&Device::Cpu)?;
    save_dir(
        model,
        text,
        &generation,
        dir,
        opts,
        &config,
        &[(SCORE_WEIGHT.to_string(), w)],
    )
}

/// Writes the LoRA adapters of `model` (made with `cfg`) and `head` as a PEFT adapter directory
/// that `PeftModel.from_pretrained(AutoModelForSequenceClassification(base, num_labels=1), dir)`
/// loads: `task_type "SEQ_CLS"`, `modules_to_save ["score"]`, the head as
/// `base_model.model.score.weight` (names as `peft.get_peft_model_state_dict` gives them).
pub fn save_score_adapter(
    model: &CausalLm,
    head: &ScoreHead,
    cfg: &LoraConfig,
    dir: &Path,
    base_model_name_or_path: Option<&str>,
) -> Result<()> {
    let mut tensors = crate::peft::adapter_tensors(model, cfg)?;
    let w = head.weight.detach().to_device(&Device::Cpu)?;
    tensors.push((score_adapter_name(), w));
    let modules = crate::peft::adapted_module_names(model);
    let mut config = crate::peft::adapter_config_json(cfg, &modules, base_model_name_or_path);
    config["task_type"] = json!("SEQ_CLS");
    config["modules_to_save"] = json!(["score"]);
    crate::peft::write_adapter(dir, &tensors, &config)
}

/// The head's tensor name in a PEFT adapter (`base_model.model.score.weight`).
pub fn score_adapter_name() -> String {
    format!("{PEFT_PREFIX}{SCORE_WEIGHT}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_non_pad_is_transformers_rule() {
        assert_eq!(last_non_pad(&[5, 6, 7], 2), 2);
        assert_eq!(last_non_pad(&[5, 6, 2], 2), 1);
        assert_eq!(last_non_pad(&[2, 5, 2, 2], 2), 1);
        assert_eq!(last_non_pad(&[2, 2], 2), 0);
    }

    #[test]
    fn normal_head_is_seeded_and_scaled() {
        let a = ScoreHead::normal(4096, 0.02, 3, DType::F64, &Device::Cpu).unwrap();
        let b = ScoreHead::normal(4096, 0.02, 3, DType::F64, &Device::Cpu).unwrap();
        let c = ScoreHead::normal(4096, 0.02, 4, DType::F64, &Device::Cpu).unwrap();
        let va: Vec<f64> = a.weight.flatten_all().unwrap().to_vec1().unwrap();
        let vb: Vec<f64> = b.weight.flatten_all().unwrap().to_vec1().unwrap();
        let vc: Vec<f64> = c.weight.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        let mean = va.iter().sum::<f64>() / va.len() as f64;
        let sd = (va.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / va.len() as f64).sqrt();
        assert!(
            mean.abs() < 0.002 && (sd - 0.02).abs() < 0.002,
            "{mean} {sd}"
        );
    }

    #[test]
    fn head_shape_is_checked() {
        let w = Tensor::zeros((2, 8), DType::F32, &Device::Cpu).unwrap();
        let e = ScoreHead::new(w).unwrap_err().to_string();
        assert!(e.contains("num_labels = 1"), "{e}");
    }
}
