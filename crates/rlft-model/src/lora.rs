//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"), as
//! PEFT implements them, so adapters move between rlft and PEFT unchanged ([`crate::peft`]).
//!
//! An adapter on a linear layer `W [out, in]` adds `scaling * dropout(x) @ A^T @ B^T` to its
//! output, with `A [r, in]`, `B [out, r]` and `scaling = lora_alpha / r` (`lora_alpha / sqrt(r)`
//! with rsLoRA, Kalajdzievski 2023). `A` starts kaiming-uniform and `B` at zero, so a fresh
//! adapter leaves the model unchanged. Only `A` and `B` are trained: the base weights stay plain
//! tensors and their products go through [`crate::ops::frozen_linear`], whose backward computes
//! no weight gradient.
//!
//! ```
//! # fn main() -> rlft_model::Result<()> {
//! # let cfg = rlft_model::tiny::tiny_config(rlft_model::Family::Llama);
//! # let dev = candle_core::Device::Cpu;
//! # let mut model = rlft_model::tiny::random_model(cfg, 0, candle_core::DType::F32, &dev)?;
//! use rlft_model::lora::{attach_lora, LoraConfig};
//! let cfg = LoraConfig { r: 4, lora_alpha: 8.0, ..LoraConfig::default() };
//! let params = attach_lora(&mut model, &cfg)?; // (PEFT name, Var) for the optimizer
//! let reference = model.adapters_disabled(); // the base model, sharing its weights
//! # assert_eq!(params.len(), 2 * 2 * 2);
//! # Ok(()) }
//! ```
//!
//! Adapters are kept in f32 when the base is bf16/f16 (f64 for f64 models), as PEFT's
//! `autocast_adapter_dtype` does: the input is cast up, the update added in that dtype, and the
//! sum cast back to the layer's dtype.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use candle_core::{DType, Tensor, Var};
use serde::{Deserialize, Serialize};

pub use crate::adapter::LoraAdapter;
use crate::adapter::{fnv1a, splitmix64, unit};
use crate::decoder::CausalLm;
use crate::error::{ModelError, Result};
use crate::ops;

/// The linear modules an adapter can target (module path suffixes inside a decoder layer).
pub const LORA_MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// `target_modules` value meaning every linear layer of the decoder layers (not `lm_head`), as
/// PEFT's `"all-linear"`.
pub const ALL_LINEAR: &str = "all-linear";

/// Prefix PEFT puts before module paths in adapter tensor names.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// What to adapt and how, with PEFT's `LoraConfig` field names and meanings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank of the update `B @ A` (PEFT `r`).
    pub r: usize,
    /// Numerator of the scaling `lora_alpha / r` (or `lora_alpha / sqrt(r)` with rsLoRA).
    pub lora_alpha: f64,
    /// Dropout probability on the adapter's input, applied in training forwards only (see
    /// [`set_dropout_seed`]).
    pub lora_dropout: f64,
    /// Modules to adapt: names such as `q_proj`, `v_proj`, `down_proj` (or suffixes such as
    /// `self_attn.q_proj`), or the single value `all-linear` (q, k, v, o, gate, up, down; never
    /// `lm_head`).
    pub target_modules: Vec<String>,
    /// rsLoRA: scaling `lora_alpha / sqrt(r)` instead of `lora_alpha / r`, so larger ranks
    /// keep learning (Kalajdzievski 2023).
    pub use_rslora: bool,
    /// `true` (PEFT's default): `B = 0`, so the adapted model starts as the base. `false`: `B`
    /// random too (PEFT's `init_lora_weights=False`, for tests).
    pub init_lora_weights: bool,
    /// Seed of the initial `A` (and `B` when random) and of the dropout masks; each module
    /// draws its own stream.
    pub seed: u64,
}

impl Default for LoraConfig {
    /// PEFT's defaults for Llama/Qwen: r 8, alpha 8, no dropout, `q_proj` and `v_proj`.
    fn default() -> Self {
        LoraConfig {
            r: 8,
            lora_alpha: 8.0,
            lora_dropout: 0.0,
            target_modules: vec!["q_proj".into(), "v_proj".into()],
            use_rslora: false,
            init_lora_weights: true,
            seed: 0,
        }
    }
}

impl LoraConfig {
    /// The factor on `B @ A`: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        scaling(self.lora_alpha, self.r, self.use_rslora)
    }

    /// Checks ranges and target names; errors say which field and what to use.
    pub fn validate(&self) -> Result<()> {
        if self.r == 0 {
            return Err(ModelError::Invalid(
                "LoRA r must be at least 1 (typical: 8, 16, 32)".into(),
            ));
        }
        if !self.lora_alpha.is_finite() {
            return Err(ModelError::Invalid(format!(
                "LoRA lora_alpha must be finite, got {}",
                self.lora_alpha
            )));
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return Err(ModelError::Invalid(format!(
                "LoRA lora_dropout must be in [0, 1), got {}",
                self.lora_dropout
            )));
        }
        self.resolve_targets().map(|_| ())
    }

    /// The targeted modules as entries of [`LORA_MODULES`], in that order.
    pub fn resolve_targets(&self) -> Result<Vec<&'static str>> {
        resolve_targets(&self.target_modules)
    }
}

/// `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
pub fn scaling(alpha: f64, r: usize, use_rslora: bool) -> f64 {
    if use_rslora {
        alpha / (r as f64).sqrt()
    } else {
        alpha / r as f64
    }
}

/// Maps `target_modules` to entries of [`LORA_MODULES`] (sorted in that order). A name matches a
/// module whose path ends with it at a `.` boundary (PEFT's rule); `all-linear` alone means all.
pub fn resolve_targets(targets: &[String]) -> Result<Vec<&'static str>> {
    let valid = || {
        let short: Vec<&str> = LORA_MODULES
            .iter()
            .map(|m| m.rsplit('.').next().expect("non-empty"))
            .collect();
        format!("{} or `{ALL_LINEAR}`", short.join(", "))
    };
    if targets.is_empty() {
        return Err(ModelError::Invalid(format!(
            "LoRA target_modules is empty; list modules to adapt: {}",
            valid()
        )));
    }
    if targets.iter().any(|t| t == ALL_LINEAR) {
        if targets.len() > 1 {
            return Err(ModelError::Invalid(format!(
                "LoRA target_modules: `{ALL_LINEAR}` already covers every linear layer; \
                 use it alone or list names instead"
            )));
        }
        return Ok(LORA_MODULES.to_vec());
    }
    let mut hit = [false; LORA_MODULES.len()];
    for t in targets {
        let mut any = false;
        for (i, m) in LORA_MODULES.iter().enumerate() {
            if *m == t || m.ends_with(&format!(".{t}")) {
                hit[i] = true;
                any = true;
            }
        }
        if !any {
            return Err(ModelError::Invalid(format!(
                "LoRA target module `{t}` is not a linear layer of the decoder; valid names: {}",
                valid()
            )));
        }
    }
    Ok(LORA_MODULES
        .iter()
        .zip(hit)
        .filter(|(_, h)| *h)
        .map(|(m, _)| *m)
        .collect())
}

/// `U(-bound, bound)` of `shape` from the stream `(seed, name)`.
fn uniform(shape: (usize, usize), bound: f64, seed: u64, name: &str) -> Vec<f64> {
    let base = splitmix64(seed ^ fnv1a(name));
    (0..(shape.0 * shape.1) as u64)
        .map(|i| bound * (2.0 * unit(splitmix64(base.wrapping_add(i))) - 1.0))
        .collect()
}

/// The dtype adapters are kept in for a model of `dtype`: f64 for f64 models, else f32.
pub fn adapter_dtype(dtype: DType) -> DType {
    ops::compute_dtype(dtype)
}

/// PEFT tensor name of a module's `lora_A` / `lora_B` weight.
pub fn peft_tensor_name(module: &str, which: char) -> String {
    format!("{PEFT_PREFIX}{module}.lora_{which}.weight")
}

/// Attaches fresh adapters to the modules `cfg` targets in every decoder layer, as `Var`s,
/// and returns them as `(PEFT tensor name, Var)` for the optimizer (`A` then `B` per module, in
/// layer order).
///
/// Init as PEFT's default: `A ~ U(-1/sqrt(in), 1/sqrt(in))` (kaiming-uniform with `a = sqrt(5)`,
/// what `nn.Linear` uses), `B = 0`; with `init_lora_weights = false`, `B ~ U(-1/sqrt(r),
/// 1/sqrt(r))`. Errors if a targeted layer already has an adapter.
pub fn attach_lora(model: &mut CausalLm, cfg: &LoraConfig) -> Result<Vec<(String, Var)>> {
    cfg.validate()?;
    let targets = cfg.resolve_targets()?;
    let dtype = adapter_dtype(model.dtype());
    let device = model.device().clone();
    let r = cfg.r;
    let mut out = Vec::new();
    for (name, lin) in model.linears_mut() {
        if !targets.iter().any(|t| name.ends_with(t)) {
            continue;
        }
        if lin.lora.is_some() {
            return Err(ModelError::Invalid(format!(
                "{name} already has a LoRA adapter; merge it (merge_lora) or remove it \
                 (remove_lora) before attaching another"
            )));
        }
        let (n_out, n_in) = lin.weight.dims2()?;
        let a = uniform(
            (r, n_in),
            1.0 / (n_in as f64).sqrt(),
            cfg.seed,
            &format!("{name}.A"),
        );
        let b = if cfg.init_lora_weights {
            vec![0.0; n_out * r]
        } else {
            uniform(
                (n_out, r),
                1.0 / (r as f64).sqrt(),
                cfg.seed,
                &format!("{name}.B"),
            )
        };
        let a = Var::from_tensor(&Tensor::from_vec(a, (r, n_in), &device)?.to_dtype(dtype)?)?;
        let b = Var::from_tensor(&Tensor::from_vec(b, (n_out, r), &device)?.to_dtype(dtype)?)?;
        lin.lora = Some(LoraAdapter::new(
            a.as_tensor().clone(),
            b.as_tensor().clone(),
            cfg.scaling(),
            cfg.lora_dropout,
            &name,
            cfg.seed,
        ));
        out.push((peft_tensor_name(&name, 'A'), a));
        out.push((peft_tensor_name(&name, 'B'), b));
    }
    Ok(out)
}

/// The adapters' tensors as `(PEFT tensor name, Var)`, `A` then `B` per module in layer order:
/// what the optimizer updates. Adapters held as plain tensors (loaded with
/// [`crate::peft::load_adapter`], or after [`crate::trainable::detached`]) are first turned
/// into `Var`s in place, so calling this again returns the same `Var`s. Errors when the model
/// has no adapter.
pub fn lora_parameters(model: &mut CausalLm) -> Result<Vec<(String, Var)>> {
    let mut out = Vec::new();
    for (name, lin) in model.linears_mut() {
        let Some(l) = &mut lin.lora else { continue };
        let a = Var::from_tensor(&l.a)?;
        let b = Var::from_tensor(&l.b)?;
        l.a = a.as_tensor().clone();
        l.b = b.as_tensor().clone();
        out.push((peft_tensor_name(&name, 'A'), a));
        out.push((peft_tensor_name(&name, 'B'), b));
    }
    if out.is_empty() {
        return Err(ModelError::Invalid(
            "the model has no LoRA adapter; attach one (attach_lora) or load one \
             (peft::load_adapter) first"
                .into(),
        ));
    }
    Ok(out)
}

/// Folds every attached adapter into its base weight, `W += scaling * B @ A` (computed in the
/// adapter dtype, stored in the weight's), and removes the adapters: the model then computes
/// what the adapted model computed, with no adapter cost. Disabled adapters are merged too.
/// Merged weights are plain tensors. Returns the number of merged modules.
pub fn merge_lora(model: &mut CausalLm) -> Result<usize> {
    let mut n = 0;
    for (_, lin) in model.linears_mut() {
        let Some(l) = lin.lora.take() else { continue };
        lin.weight = l.merged_into(&lin.weight.to_tensor()?)?.into();
        n += 1;
    }
    Ok(n)
}

/// Removes every adapter without merging; returns how many were attached.
pub fn remove_lora(model: &mut CausalLm) -> usize {
    model
        .linears_mut()
        .into_iter()
        .filter_map(|(_, lin)| lin.lora.take())
        .count()
}

/// Reseeds the dropout of every adapter (`lora_dropout > 0`): `Some(seed)` restarts the mask
/// stream, `None` turns dropout off (e.g. for gradient checks).
///
/// Dropout applies to training forwards (`grad = true`) only. Each adapter draws a fresh mask
/// per training forward from `(seed, module path, forwards since the seed was set)`, so a run
/// is reproducible out of the box (the seed starts as [`LoraConfig::seed`], or 0 for loaded
/// adapters). A trainer that resumes mid-run calls this at every step with e.g.
/// `hash(run seed, step)`, so the masks after a resume are those of the uninterrupted run.
pub fn set_dropout_seed(model: &mut CausalLm, seed: Option<u64>) {
    for (_, lin) in model.linears_mut() {
        if let Some(l) = &mut lin.lora {
            l.dropout_seed = seed;
            l.draws = Arc::new(AtomicU64::new(0));
        }
    }
}

impl CausalLm {
    /// Whether any linear layer has a LoRA adapter attached (enabled or not).
    pub fn has_adapters(&self) -> bool {
        self.linears().iter().any(|(_, l)| l.lora.is_some())
    }

    /// Whether any linear layer adds an adapter's update.
    pub fn has_active_adapters(&self) -> bool {
        self.linears()
            .iter()
            .any(|(_, l)| l.active_lora().is_some())
    }

    /// Switches every adapter off: the model computes exactly what the base model computes
    /// (same kernels, bit-identical), e.g. for GRPO's reference log-probs.
    pub fn disable_adapters(&mut self) {
        self.set_adapters_enabled(false);
    }

    /// Switches every adapter back on.
    pub fn enable_adapters(&mut self) {
        self.set_adapters_enabled(true);
    }

    fn set_adapters_enabled(&mut self, on: bool) {
        for (_, lin) in self.linears_mut() {
            if let Some(l) = &mut lin.lora {
                l.enabled = on;
            }
        }
    }

    /// A copy sharing every weight (no data copied) with its adapters switched off: the base
    /// model, e.g. as the frozen reference of GRPO, while `self` keeps training.
    pub fn adapters_disabled(&self) -> CausalLm {
        let mut m = self.clone();
        m.disable_adapters();
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapter::dropout_mask;
    use candle_core::Device;

    #[test]
    fn targets_resolve_like_peft() {
        let t = |v: &[&str]| resolve_targets(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            t(&["v_proj", "q_proj"]).unwrap(),
            ["self_attn.q_proj", "self_attn.v_proj"]
        );
        assert_eq!(t(&["mlp.down_proj"]).unwrap(), ["mlp.down_proj"]);
        assert_eq!(t(&["all-linear"]).unwrap(), LORA_MODULES);
        let e = t(&["qproj"]).unwrap_err().to_string();
        assert!(
            e.contains("`qproj`") && e.contains("q_proj, k_proj, v_proj"),
            "{e}"
        );
        assert!(t(&["lm_head"]).is_err());
        assert!(t(&[]).is_err());
        assert!(t(&["all-linear", "q_proj"]).is_err());
    }

    #[test]
    fn dropout_mask_is_seeded_and_scaled() {
        let m = dropout_mask(&[64, 64], 0.25, 7, &Device::Cpu).unwrap();
        let v: Vec<f32> = m.flatten_all().unwrap().to_vec1().unwrap();
        let dropped = v.iter().filter(|&&x| x == 0.0).count() as f64 / v.len() as f64;
        assert!((dropped - 0.25).abs() < 0.03, "{dropped}");
        assert!(v.iter().all(|&x| x == 0.0 || (x - 4.0 / 3.0).abs() < 1e-6));
        let again: Vec<f32> = dropout_mask(&[64, 64], 0.25, 7, &Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(v, again);
        let other: Vec<f32> = dropout_mask(&[64, 64], 0.25, 8, &Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_ne!(v, other);
    }

    #[test]
    fn kaiming_bound() {
        let v = uniform((16, 100), 0.1, 3, "x");
        assert!(v.iter().all(|x| x.abs() <= 0.1));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01);
        assert!(v.iter().any(|x| x.abs() > 0.09));
    }
}
