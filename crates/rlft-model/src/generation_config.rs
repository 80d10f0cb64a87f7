//! `generation_config.json`: end-of-sequence ids and sampling defaults shipped with a model.

use std::path::Path;

use serde_json::{json, Value};

use crate::config::token_ids;
use crate::error::{ModelError, Result};
use crate::sampling::SamplingParams;

/// Generation defaults of a model (HF `generation_config.json`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationConfig {
    /// Generation stops on any of these ids.
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence id.
    pub bos_token_id: Option<u32>,
    /// Padding id.
    pub pad_token_id: Option<u32>,
    /// Sample (true) or decode greedily (false) by default.
    pub do_sample: bool,
    /// Default sampling parameters.
    pub sampling: SamplingParams,
    /// Default `max_new_tokens`, when the model sets one.
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Parses a `generation_config.json` value.
    pub fn from_json(v: &Value) -> Self {
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        let d = SamplingParams::default();
        GenerationConfig {
            eos_token_ids: token_ids(v.get("eos_token_id")),
            bos_token_id: token_ids(v.get("bos_token_id")).first().copied(),
            pad_token_id: token_ids(v.get("pad_token_id")).first().copied(),
            do_sample: v.get("do_sample").and_then(Value::as_bool).unwrap_or(false),
            sampling: SamplingParams {
                temperature: f("temperature").map_or(d.temperature, |x| x as f32),
                top_k: v
                    .get("top_k")
                    .and_then(Value::as_u64)
                    .map_or(d.top_k, |x| x as usize),
                top_p: f("top_p").map_or(d.top_p, |x| x as f32),
                min_p: f("min_p").map_or(d.min_p, |x| x as f32),
                repetition_penalty: f("repetition_penalty")
                    .map_or(d.repetition_penalty, |x| x as f32),
            },
            max_new_tokens: v
                .get("max_new_tokens")
                .and_then(Value::as_u64)
                .map(|x| x as usize),
        }
    }

    /// Reads `dir/generation_config.json` if present.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ModelError::bad_file(
                &path,
                format!("not valid JSON ({e}); fix or delete the file"),
            )
        })?;
        Ok(Some(Self::from_json(&v)))
    }

    /// The `generation_config.json` value transformers reads.
    pub fn to_json(&self) -> Value {
        let eos = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let mut v = json!({
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "do_sample": self.do_sample,
        });
        if self.do_sample {
            let s = &self.sampling;
            let o = v.as_object_mut().expect("object literal");
            o.insert("temperature".into(), json!(s.temperature));
            o.insert("top_p".into(), json!(s.top_p));
            o.insert("top_k".into(), json!(s.top_k));
        }
        if let Some(m) = self.max_new_tokens {
            v["max_new_tokens"] = json!(m);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lists_and_defaults() {
        let g = GenerationConfig::from_json(&json!({"eos_token_id": [128001, 128009],
            "bos_token_id": 128000, "do_sample": true, "temperature": 0.6, "top_p": 0.9}));
        assert_eq!(g.eos_token_ids, vec![128001, 128009]);
        assert!(g.do_sample);
        assert!((g.sampling.temperature - 0.6).abs() < 1e-6);
        let back = GenerationConfig::from_json(&g.to_json());
        assert_eq!(back, g);
    }
}
