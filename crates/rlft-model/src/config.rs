//! Model configuration mirroring Hugging Face `config.json` for the supported families.
//!
//! Reads both the transformers-5 layout (`rope_parameters`) and the older one (`rope_theta` and
//! `rope_scaling` at the top level), and writes both so every loader finds the right theta.

use serde_json::{json, Map, Value};

use crate::error::{ModelError, Result};

/// The model families rlft implements (one file each under `models/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama 2/3, SmolLM, SmolLM2 (`LlamaForCausalLM`).
    Llama,
    /// Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): bias on q/k/v projections.
    Qwen2,
    /// Qwen3 (`Qwen3ForCausalLM`): per-head RMSNorm on q and k.
    Qwen3,
}

impl Family {
    /// The HF `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The HF `architectures[0]` class name.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// Parses a `model_type` (HF) or `general.architecture` (GGUF) name.
    pub fn from_name(name: &str) -> Option<Family> {
        match name.to_ascii_lowercase().as_str() {
            "llama" | "llamaforcausallm" | "mistral" => Some(Family::Llama),
            "qwen2" | "qwen2forcausallm" => Some(Family::Qwen2),
            "qwen3" | "qwen3forcausallm" => Some(Family::Qwen3),
            _ => None,
        }
    }

    /// Whether q/k/v projections carry a bias by default in this family.
    pub fn default_qkv_bias(self) -> bool {
        matches!(self, Family::Qwen2)
    }

    /// Whether attention has per-head q/k RMSNorm.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Family::Qwen3)
    }
}

/// Rotary position embedding frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor` (`rope_type = "linear"`).
    Linear {
        /// Divisor of every frequency.
        factor: f64,
    },
    /// Llama 3.x frequency-dependent scaling (`rope_type = "llama3"`).
    Llama3 {
        /// Scale applied to low frequencies.
        factor: f64,
        /// Wavelength threshold factor for low frequencies.
        low_freq_factor: f64,
        /// Wavelength threshold factor for high frequencies.
        high_freq_factor: f64,
        /// Context length the base model was trained with.
        original_max_position_embeddings: usize,
    },
    /// Per-frequency divisors as stored by llama.cpp (`rope_freqs.weight` in GGUF files of
    /// Llama 3 models); exported to HF as the `llama3` parameters that reproduce them.
    Factors(Vec<f32>),
}

/// Rotary embedding settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Base of the geometric frequency series (`rope_theta`).
    pub theta: f64,
    /// Frequency scaling variant.
    pub scaling: RopeScaling,
}

/// Everything the decoder needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub family: Family,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention when smaller than the query heads).
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary embedding settings.
    pub rope: RopeConfig,
    /// Longest supported context.
    pub max_position_embeddings: usize,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v/o projections have biases (`attention_bias`; q/k/v only for Qwen2).
    pub attention_bias: bool,
    /// MLP projections have biases (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Beginning-of-sequence token id.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token ids (generation stops on any).
    pub eos_token_ids: Vec<u32>,
    /// Padding token id.
    pub pad_token_id: Option<u32>,
}

fn get_usize(obj: &Map<String, Value>, key: &str) -> Option<usize> {
    obj.get(key).and_then(Value::as_u64).map(|v| v as usize)
}

fn get_f64(obj: &Map<String, Value>, key: &str) -> Option<f64> {
    obj.get(key).and_then(Value::as_f64)
}

/// Token ids from an HF JSON value that is one id or a list of ids (`eos_token_id` is either).
pub(crate) fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn parse_rope(obj: &Map<String, Value>, family: Family) -> Result<RopeConfig> {
    // transformers 5: `rope_parameters` holds theta and scaling; older: top-level keys.
    let params = obj.get("rope_parameters").and_then(Value::as_object);
    let legacy_scaling = obj.get("rope_scaling").and_then(Value::as_object);
    let theta = params
        .and_then(|p| get_f64(p, "rope_theta"))
        .or_else(|| get_f64(obj, "rope_theta"))
        .unwrap_or(match family {
            Family::Llama => 10_000.0,
            Family::Qwen2 | Family::Qwen3 => 1_000_000.0,
        });
    let scaling_obj = params.or(legacy_scaling);
    let scaling = match scaling_obj {
        None => RopeScaling::Default,
        Some(s) => {
            let kind = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            let factor = get_f64(s, "factor");
            match kind {
                "default" => RopeScaling::Default,
                "linear" => RopeScaling::Linear {
                    factor: factor.ok_or_else(|| {
                        ModelError::config("rope scaling `linear` needs a `factor`")
                    })?,
                },
                "llama3" => RopeScaling::Llama3 {
                    factor: factor.ok_or_else(|| {
                        ModelError::config("rope scaling `llama3` needs a `factor`")
                    })?,
                    low_freq_factor: get_f64(s, "low_freq_factor").unwrap_or(1.0),
                    high_freq_factor: get_f64(s, "high_freq_factor").unwrap_or(4.0),
                    original_max_position_embeddings: get_usize(
                        s,
                        "original_max_position_embeddings",
                    )
                    .unwrap_or(8192),
                },
                other => {
                    return Err(ModelError::config(format!(
                        "rope scaling type `{other}` is not supported (supported: default, linear, \
                         llama3); remove `rope_scaling` from config.json to use plain RoPE"
                    )))
                }
            }
        }
    };
    Ok(RopeConfig { theta, scaling })
}

impl ModelConfig {
    /// Parses an HF `config.json` value.
    pub fn from_hf_json(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| ModelError::config("config.json is not a JSON object"))?;
        let model_type = obj
            .get("model_type")
            .and_then(Value::as_str)
            .or_else(|| {
                obj.get("architectures")
                    .and_then(Value::as_array)
                    .and_then(|a| a.first())
                    .and_then(Value::as_str)
            })
            .ok_or_else(|| {
                ModelError::config("config.json has neither `model_type` nor `architectures`")
            })?;
        let family = Family::from_name(model_type).ok_or_else(|| {
            ModelError::UnknownArchitecture(format!(
                "`{model_type}` (supported: llama, qwen2, qwen3)"
            ))
        })?;
        if obj.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
            return Err(ModelError::config(
                "`use_sliding_window = true` is not supported; set it to false in config.json",
            ));
        }
        if let Some(act) = obj.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(ModelError::config(format!(
                    "hidden_act `{act}` is not supported (only silu)"
                )));
            }
        }
        let need = |key: &str| {
            get_usize(obj, key)
                .ok_or_else(|| ModelError::config(format!("config.json lacks `{key}`")))
        };
        let hidden_size = need("hidden_size")?;
        let num_attention_heads = need("num_attention_heads")?;
        let num_key_value_heads =
            get_usize(obj, "num_key_value_heads").unwrap_or(num_attention_heads);
        let head_dim = match obj.get("head_dim") {
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0) as usize,
            // Qwen3Config defaults head_dim to 128, not hidden / heads.
            _ if family == Family::Qwen3 => 128,
            _ => hidden_size / num_attention_heads.max(1),
        };
        let cfg = ModelConfig {
            family,
            vocab_size: need("vocab_size")?,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            num_hidden_layers: need("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: get_f64(obj, "rms_norm_eps").unwrap_or(1e-6),
            rope: parse_rope(obj, family)?,
            max_position_embeddings: get_usize(obj, "max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: obj
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            attention_bias: obj
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(family.default_qkv_bias()),
            mlp_bias: obj
                .get("mlp_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            bos_token_id: token_ids(obj.get("bos_token_id")).first().copied(),
            eos_token_ids: token_ids(obj.get("eos_token_id")),
            pad_token_id: token_ids(obj.get("pad_token_id")).first().copied(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the shape arithmetic; errors name the field to fix.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(ModelError::config(format!("`{name}` must be positive")));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ModelError::config(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ModelError::config(format!(
                "head_dim ({}) must be even for rotary embeddings",
                self.head_dim
            )));
        }
        Ok(())
    }

    /// Number of query heads sharing one key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Writes an HF `config.json` value (transformers-5 `rope_parameters` plus the legacy
    /// top-level `rope_theta`/`rope_scaling`, so older loaders get the right theta too).
    pub fn to_hf_json(&self, dtype: &str) -> Result<Value> {
        let mut rope = Map::new();
        rope.insert("rope_theta".into(), json!(self.rope.theta));
        let scaling = match &self.rope.scaling {
            RopeScaling::Factors(f) => fit_llama3(f, &self.rope, self.head_dim)?,
            other => other.clone(),
        };
        let legacy_scaling = match &scaling {
            RopeScaling::Factors(_) => unreachable!("fitted above"),
            RopeScaling::Default => {
                rope.insert("rope_type".into(), json!("default"));
                Value::Null
            }
            RopeScaling::Linear { factor } => {
                rope.insert("rope_type".into(), json!("linear"));
                rope.insert("factor".into(), json!(factor));
                json!({"rope_type": "linear", "factor": factor})
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let s = json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low_freq_factor,
                    "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": original_max_position_embeddings,
                });
                for (k, v) in s.as_object().into_iter().flatten() {
                    rope.insert(k.clone(), v.clone());
                }
                s
            }
        };
        let eos = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let mut out = json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_parameters": Value::Object(rope),
            "rope_theta": self.rope.theta,
            "rope_scaling": legacy_scaling,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "dtype": dtype,
            "torch_dtype": dtype,
            "use_cache": true,
        });
        let o = out.as_object_mut().expect("object literal");
        match self.family {
            Family::Llama => {
                o.insert("attention_bias".into(), json!(self.attention_bias));
                o.insert("mlp_bias".into(), json!(self.mlp_bias));
            }
            Family::Qwen2 => {
                o.insert("use_sliding_window".into(), json!(false));
            }
            Family::Qwen3 => {
                o.insert("attention_bias".into(), json!(self.attention_bias));
                o.insert("use_sliding_window".into(), json!(false));
            }
        }
        Ok(out)
    }

    /// Total parameter count implied by the config.
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let i = self.intermediate_size;
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.attention_bias {
            attn += q + 2 * kv;
            if self.family != Family::Qwen2 {
                attn += h;
            }
        }
        if self.family.has_qk_norm() {
            attn += 2 * self.head_dim;
        }
        let mut mlp = 3 * h * i;
        if self.mlp_bias {
            mlp += 2 * i + h;
        }
        let layer = attn + mlp + 2 * h;
        let emb = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { emb };
        emb + head + self.num_hidden_layers * layer + h
    }
}

/// Finds the `llama3` rope parameters that reproduce llama.cpp's per-frequency divisors
/// (`rope_freqs.weight`, by which the plain frequencies are divided): first among the values
/// Llama 3.x models use, else solved from the divisors themselves.
fn fit_llama3(divisors: &[f32], rope: &RopeConfig, head_dim: usize) -> Result<RopeScaling> {
    let base = RopeConfig {
        theta: rope.theta,
        scaling: RopeScaling::Default,
    };
    let plain = inv_freq(&base, head_dim);
    if divisors.len() != plain.len() {
        return Err(ModelError::config(format!(
            "the GGUF's rope_freqs has {} factors; head_dim {head_dim} needs {}",
            divisors.len(),
            plain.len()
        )));
    }
    if divisors.iter().all(|&d| d == 1.0) {
        return Ok(RopeScaling::Default);
    }
    let fits = |cand: &RopeScaling| {
        let scaled = inv_freq(
            &RopeConfig {
                theta: rope.theta,
                scaling: cand.clone(),
            },
            head_dim,
        );
        plain
            .iter()
            .zip(&scaled)
            .zip(divisors)
            .all(|((p, s), d)| ((p / s) - d).abs() <= 1e-3 * d.abs().max(1.0))
    };
    for factor in [8.0, 32.0, 16.0, 4.0, 2.0] {
        for orig in [8192usize, 4096, 2048, 16384, 32768] {
            for (low, high) in [(1.0, 4.0), (1.0, 2.0), (2.0, 4.0)] {
                let cand = RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: orig,
                };
                if fits(&cand) {
                    return Ok(cand);
                }
            }
        }
    }
    match solve_llama3(divisors, &plain) {
        Some(cand) if fits(&cand) => Ok(cand),
        _ => Err(ModelError::config(
            "the GGUF's rope_freqs factors match no llama3 rope scaling; this model cannot be \
             exported as an HF config.json",
        )),
    }
}

/// Solves for `llama3` parameters giving `plain[i] / divisors[i]`. With `x = 1 / wavelength`,
/// llama3 scaling is `f / d` where `1 / d = (1 - s) / factor + s` and
/// `s = clamp((old * x - low) / (high - low), 0, 1)`: the factor is the largest divisor, and
/// only the slope `a = old / (high - low)` and offset `b = low / (high - low)` of `s` matter,
/// so `old` is rounded to an integer and `low`, `high` follow from `a` and `b`.
fn solve_llama3(divisors: &[f32], plain: &[f32]) -> Option<RopeScaling> {
    const EPS: f64 = 1e-4;
    let factor = divisors.iter().fold(1f64, |m, &d| m.max(d as f64));
    if factor <= 1.0 {
        return None;
    }
    let points: Vec<(f64, f64)> = plain
        .iter()
        .zip(divisors)
        .map(|(&f, &d)| {
            let x = f as f64 / (2.0 * std::f64::consts::PI);
            let s = (1.0 / d as f64 - 1.0 / factor) / (1.0 - 1.0 / factor);
            (x, s)
        })
        .collect();
    // Largest x still fully scaled (s = 0), smallest x left alone (s = 1).
    let x_low = points
        .iter()
        .filter(|p| p.1 <= EPS)
        .map(|p| p.0)
        .reduce(f64::max)?;
    let x_high = points
        .iter()
        .filter(|p| p.1 >= 1.0 - EPS)
        .map(|p| p.0)
        .reduce(f64::min);
    let mut medium: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|p| p.1 > EPS && p.1 < 1.0 - EPS)
        .collect();
    medium.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (a, b) = match medium.as_slice() {
        [] => {
            // Any ramp between the two bands: put it in their middle third.
            let hi = x_high.unwrap_or(2.0 * x_low);
            let a = 3.0 / (hi - x_low);
            (a, a * (x_low + (hi - x_low) / 3.0))
        }
        [(xm, sm)] => {
            // The steeper of the lines through the point and each band's edge.
            let mut a = sm / (xm - x_low);
            if let Some(hi) = x_high {
                a = a.max((1.0 - sm) / (hi - xm));
            }
            (a, a * xm - sm)
        }
        [(x1, s1), .., (x2, s2)] => {
            let a = (s2 - s1) / (x2 - x1);
            (a, a * x1 - s1)
        }
    };
    if !(a.is_finite() && b.is_finite() && a > 0.0 && b > 0.0) {
        return None;
    }
    let old = (a / b).round().max(1.0);
    let span = old / a;
    let low = b * span;
    Some(RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: low + span,
        original_max_position_embeddings: old as usize,
    })
}

/// Inverse frequencies `[head_dim / 2]` in f32, following transformers' rope init functions.
pub fn inv_freq(rope: &RopeConfig, head_dim: usize) -> Vec<f32> {
    let base: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / (rope.theta as f32).powf((2 * i) as f32 / head_dim as f32))
        .collect();
    match &rope.scaling {
        RopeScaling::Default => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / *factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old = *original_max_position_embeddings as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let f = f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                    } else {
                        scaled as f32
                    }
                })
                .collect()
        }
        RopeScaling::Factors(div) => base.iter().zip(div).map(|(f, d)| f / d).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "rms_norm_eps": 1e-5})
    }

    #[test]
    fn reads_legacy_and_v5_rope() {
        let mut legacy = base();
        legacy["rope_theta"] = json!(100000.0);
        legacy["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let mut v5 = base();
        v5["rope_parameters"] = json!({"rope_theta": 100000.0, "rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let a = ModelConfig::from_hf_json(&legacy).unwrap();
        let b = ModelConfig::from_hf_json(&v5).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope.theta, 100000.0);
        assert!(matches!(a.rope.scaling, RopeScaling::Llama3 { .. }));
        assert_eq!(a.head_dim, 16);
    }

    #[test]
    fn round_trips_through_json() {
        let mut v = base();
        v["rope_parameters"] = json!({"rope_theta": 5e5, "rope_type": "default"});
        v["eos_token_id"] = json!([2, 7]);
        let a = ModelConfig::from_hf_json(&v).unwrap();
        let b = ModelConfig::from_hf_json(&a.to_hf_json("float32").unwrap()).unwrap();
        assert_eq!(a, b);
        assert_eq!(b.eos_token_ids, vec![2, 7]);
    }

    #[test]
    fn clear_errors() {
        let mut v = base();
        v["model_type"] = json!("gpt_neox");
        let e = ModelConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("gpt_neox") && e.contains("qwen3"), "{e}");
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        let e = ModelConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("multiple"), "{e}");
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = ModelConfig::from_hf_json(&v).unwrap_err().to_string();
        assert!(e.contains("yarn"), "{e}");
    }

    #[test]
    fn llama3_fit_reproduces_any_divisors() {
        // llama.cpp's rope_freqs for many llama3 settings (including contexts off the grid of
        // common values, and ramps covering 0, 1 or several frequencies) fit back exactly.
        for theta in [10_000.0, 500_000.0] {
            for head_dim in [16usize, 64, 128] {
                for factor in [8.0, 4.0, 32.0] {
                    for orig in [64usize, 100, 1000, 8192] {
                        for (low, high) in [(1.0, 4.0), (1.0, 2.0), (2.0, 4.0), (1.0, 1.5)] {
                            let want = RopeConfig {
                                theta,
                                scaling: RopeScaling::Llama3 {
                                    factor,
                                    low_freq_factor: low,
                                    high_freq_factor: high,
                                    original_max_position_embeddings: orig,
                                },
                            };
                            let plain = inv_freq(
                                &RopeConfig {
                                    theta,
                                    scaling: RopeScaling::Default,
                                },
                                head_dim,
                            );
                            let scaled = inv_freq(&want, head_dim);
                            let div: Vec<f32> =
                                plain.iter().zip(&scaled).map(|(p, s)| p / s).collect();
                            let got = fit_llama3(&div, &want, head_dim).unwrap_or_else(|e| {
                                panic!("{theta} {head_dim} {factor} {orig} {low} {high}: {e}")
                            });
                            let back = inv_freq(
                                &RopeConfig {
                                    theta,
                                    scaling: got.clone(),
                                },
                                head_dim,
                            );
                            for (a, b) in back.iter().zip(&scaled) {
                                assert!((a - b).abs() <= 1e-3 * b.abs(), "{got:?}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
        let rope = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        };
        assert_eq!(
            fit_llama3(&[1.0; 8], &rope, 16).unwrap(),
            RopeScaling::Default
        );
        assert!(fit_llama3(&[1.0; 4], &rope, 16).is_err());
        // Divisors shrinking with wavelength are no llama3 ramp.
        let odd = [8.0, 8.0, 8.0, 8.0, 1.0, 1.0, 1.0, 1.0];
        assert!(fit_llama3(&odd, &rope, 16).is_err());
    }

    #[test]
    fn smollm2_parameter_count() {
        let v = json!({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "tie_word_embeddings": true});
        let c = ModelConfig::from_hf_json(&v).unwrap();
        assert_eq!(c.num_parameters(), 134_515_008);
    }
}
