//! LoRA adapters in PEFT's directory format, so `PeftModel.from_pretrained(base, dir)` loads
//! what rlft trains and rlft loads what PEFT trains:
//!
//! - `adapter_config.json`: `peft_type "LORA"`, `r`, `lora_alpha`, `lora_dropout`,
//!   `target_modules`, `use_rslora`, `bias "none"`, `task_type "CAUSAL_LM"`, ...
//! - `adapter_model.safetensors`: `base_model.model.{module}.lora_A.weight [r, in]` and
//!   `.lora_B.weight [out, r]` per adapted module (`module` = `model.layers.{i}.self_attn.q_proj`).
//!
//! Each file is written to a temporary name and renamed, so a reader never sees a partial file.
//! Simplification: per-module ranks and alphas (`rank_pattern`, `alpha_pattern`), DoRA, LoRA
//! biases, `modules_to_save` (except a reward model's `score` head, [`crate::score`]) and
//! `fan_in_fan_out` are rejected on load with a clear error.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use serde_json::{json, Value};

use crate::decoder::CausalLm;
use crate::error::{ModelError, Result};
use crate::lora::{
    adapter_dtype, peft_tensor_name, resolve_targets, scaling, LoraAdapter, LoraConfig,
    LORA_MODULES, PEFT_PREFIX,
};
use crate::util::write_json_atomic;

/// Name of the adapter config file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// Name of the adapter weights file.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// The short names (`q_proj`, ...) of the modules that carry an adapter in `model`, in
/// [`LORA_MODULES`] order.
fn adapted_modules(model: &CausalLm) -> Vec<&'static str> {
    LORA_MODULES
        .iter()
        .filter(|m| {
            model
                .linears()
                .iter()
                .any(|(n, l)| n.ends_with(*m) && l.lora.is_some())
        })
        .map(|m| m.rsplit('.').next().expect("non-empty"))
        .collect()
}

/// `adapter_config.json` for adapters made with `cfg` on `modules` (short names such as
/// `q_proj`, or suffixes such as `self_attn.q_proj` from [`LoraConfig::resolve_targets`], which
/// are written as short names, as PEFT writes them).
pub fn adapter_config_json(
    cfg: &LoraConfig,
    modules: &[&str],
    base_model_name_or_path: Option<&str>,
) -> Value {
    let modules: Vec<&str> = modules
        .iter()
        .map(|m| m.rsplit('.').next().unwrap_or(m))
        .collect();
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "revision": null,
        "inference_mode": true,
        "r": cfg.r,
        "lora_alpha": cfg.lora_alpha,
        "lora_dropout": cfg.lora_dropout,
        "target_modules": modules,
        "use_rslora": cfg.use_rslora,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": cfg.init_lora_weights,
        "modules_to_save": null,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": false,
        "lora_bias": false,
    })
}

/// Writes the adapters of `model` (made with `cfg`) as a PEFT adapter directory `dir` (created
/// if needed; existing adapter files are replaced atomically). `base_model_name_or_path` is
/// recorded for PEFT (`None` writes `null`; PEFT then needs the base passed explicitly).
/// Errors when the model has no adapter or an adapter's rank or scaling disagrees with `cfg`.
pub fn save_adapter(
    model: &CausalLm,
    cfg: &LoraConfig,
    dir: &Path,
    base_model_name_or_path: Option<&str>,
) -> Result<()> {
    let tensors = adapter_tensors(model, cfg)?;
    let modules = adapted_modules(model);
    write_adapter(
        dir,
        &tensors,
        &adapter_config_json(cfg, &modules, base_model_name_or_path),
    )
}

/// The adapters of `model` as `(PEFT tensor name, tensor on the CPU)`, checked against `cfg`.
pub(crate) fn adapter_tensors(model: &CausalLm, cfg: &LoraConfig) -> Result<Vec<(String, Tensor)>> {
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (name, lin) in model.linears() {
        let Some(l) = &lin.lora else { continue };
        if l.rank() != cfg.r || (l.scaling - cfg.scaling()).abs() > 1e-12 * cfg.scaling().abs() {
            return Err(ModelError::Invalid(format!(
                "{name}: adapter rank {} and scaling {} do not match the LoRA config (r {}, \
                 scaling {}); save with the config the adapters were made with",
                l.rank(),
                l.scaling,
                cfg.r,
                cfg.scaling()
            )));
        }
        let cpu = |t: &Tensor| -> Result<Tensor> { Ok(t.detach().to_device(&Device::Cpu)?) };
        tensors.push((peft_tensor_name(&name, 'A'), cpu(&l.a)?));
        tensors.push((peft_tensor_name(&name, 'B'), cpu(&l.b)?));
    }
    if tensors.is_empty() {
        return Err(ModelError::Invalid(
            "the model has no LoRA adapter to save".into(),
        ));
    }
    Ok(tensors)
}

/// The short names of the adapted modules of `model` (for `target_modules`).
pub(crate) fn adapted_module_names(model: &CausalLm) -> Vec<&'static str> {
    adapted_modules(model)
}

/// Writes `tensors` as `adapter_model.safetensors` and `config` as `adapter_config.json` in
/// `dir` (created if needed), each through a temporary file and a rename.
pub(crate) fn write_adapter(
    dir: &Path,
    tensors: &[(String, Tensor)],
    config: &Value,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    crate::safetensors_io::write_file(&dir.join(ADAPTER_WEIGHTS), tensors)?;
    write_json_atomic(&dir.join(ADAPTER_CONFIG), config)
}

/// The LoRA hyper-parameters of a PEFT `adapter_config.json`, checked for what rlft supports.
pub fn read_adapter_config(path: &Path) -> Result<LoraConfig> {
    read_adapter_config_saving(path, &[])
}

/// [`read_adapter_config`] accepting `modules_to_save` entries in `saved` (PEFT's full copies
/// of small modules beside the adapters, such as a reward model's `score` head).
pub(crate) fn read_adapter_config_saving(path: &Path, saved: &[&str]) -> Result<LoraConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::bad_file(path, format!("not valid JSON ({e})")))?;
    let bad = |msg: String| ModelError::bad_file(path, msg);
    let peft_type = v.get("peft_type").and_then(Value::as_str).unwrap_or("");
    if peft_type != "LORA" {
        return Err(bad(format!(
            "peft_type is `{peft_type}`; rlft loads LoRA adapters only (peft_type \"LORA\")"
        )));
    }
    let r = v
        .get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("has no integer `r`".into()))? as usize;
    let lora_alpha = v
        .get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("has no number `lora_alpha`".into()))?;
    let lora_dropout = v.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let use_rslora = v
        .get("use_rslora")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let target_modules = match v.get("target_modules") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("target_modules holds a non-string".into()))
            })
            .collect::<Result<_>>()?,
        _ => return Err(bad("has no `target_modules` list".into())),
    };
    let is_set = |k: &str| match v.get(k) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => k == "bias" && s != "none",
        Some(_) => true,
    };
    let saves_only_allowed = match v.get("modules_to_save") {
        Some(Value::Array(a)) => a
            .iter()
            .all(|m| m.as_str().is_some_and(|m| saved.contains(&m))),
        _ => false,
    };
    for key in [
        "rank_pattern",
        "alpha_pattern",
        "use_dora",
        "lora_bias",
        "modules_to_save",
        "fan_in_fan_out",
        "bias",
        "layer_replication",
    ] {
        if is_set(key) && !(key == "modules_to_save" && saves_only_allowed) {
            return Err(bad(format!(
                "sets `{key}` ({}), which rlft does not support; merge the adapter with PEFT \
                 (merge_and_unload) and load the merged model instead",
                v[key]
            )));
        }
    }
    // Regex target_modules (a string other than a module name) cannot be matched here; the
    // tensors decide which modules are adapted, so only names are checked.
    let targets = if target_modules.len() == 1 && resolve_targets(&target_modules).is_err() {
        Vec::new()
    } else {
        target_modules
    };
    let cfg = LoraConfig {
        r,
        lora_alpha,
        lora_dropout,
        target_modules: targets,
        use_rslora,
        ..LoraConfig::default()
    };
    if r == 0 || !(0.0..1.0).contains(&lora_dropout) || !lora_alpha.is_finite() {
        return Err(bad(format!(
            "r {r}, lora_alpha {lora_alpha}, lora_dropout {lora_dropout}: out of range"
        )));
    }
    Ok(cfg)
}

/// Loads a PEFT LoRA adapter directory onto `model` (enabled, as plain tensors in
/// [`adapter_dtype`], dropout seed 0; [`crate::lora::lora_parameters`] makes them trainable). The tensors
/// decide which modules are adapted; `target_modules` of the returned config lists them.
/// Errors name the file and the problem: unknown or missing tensors, wrong shapes, a module
/// that already has an adapter.
pub fn load_adapter(model: &mut CausalLm, dir: &Path) -> Result<LoraConfig> {
    Ok(load_adapter_saving(model, dir, &[])?.0)
}

/// [`load_adapter`] for an adapter that also saves the whole modules named in `saved`
/// (`modules_to_save`, tensors `base_model.model.{module}.weight`): returns them by module
/// name beside the config, for the caller to place.
pub(crate) fn load_adapter_saving(
    model: &mut CausalLm,
    dir: &Path,
    saved: &[&str],
) -> Result<(LoraConfig, HashMap<String, Tensor>)> {
    let cfg_path = dir.join(ADAPTER_CONFIG);
    if !cfg_path.exists() {
        return Err(ModelError::bad_file(
            dir,
            format!("no {ADAPTER_CONFIG}; pass a PEFT adapter directory"),
        ));
    }
    let mut cfg = read_adapter_config_saving(&cfg_path, saved)?;
    let path = dir.join(ADAPTER_WEIGHTS);
    if !path.exists() {
        return Err(ModelError::bad_file(
            dir,
            format!(
                "no {ADAPTER_WEIGHTS} (adapter_model.bin is not read; re-save the adapter \
                 with safe_serialization=True)"
            ),
        ));
    }
    let dtype = adapter_dtype(model.dtype());
    let device = model.device().clone();
    let tensors =
        crate::safetensors_io::load_tensors(std::slice::from_ref(&path), dtype, &device, |_| {})?;
    // module path -> (A, B)
    let mut pairs: BTreeMap<String, (Option<Tensor>, Option<Tensor>)> = BTreeMap::new();
    let mut saved_tensors = HashMap::new();
    for (name, t) in tensors {
        if let Some(m) = name
            .strip_prefix(PEFT_PREFIX)
            .and_then(|rest| rest.strip_suffix(".weight"))
            .filter(|m| saved.contains(m))
        {
            saved_tensors.insert(m.to_string(), t);
            continue;
        }
        let parsed = name.strip_prefix(PEFT_PREFIX).and_then(|rest| {
            rest.strip_suffix(".lora_A.weight")
                .map(|m| (m, 'A'))
                .or_else(|| rest.strip_suffix(".lora_B.weight").map(|m| (m, 'B')))
        });
        let Some((module, which)) = parsed else {
            return Err(ModelError::bad_file(
                &path,
                format!(
                    "unexpected tensor `{name}`; a LoRA adapter holds only \
                     `{PEFT_PREFIX}<module>.lora_A.weight` / `.lora_B.weight`"
                ),
            ));
        };
        let e = pairs.entry(module.to_string()).or_default();
        if which == 'A' {
            e.0 = Some(t);
        } else {
            e.1 = Some(t);
        }
    }
    if pairs.is_empty() {
        return Err(ModelError::bad_file(&path, "holds no LoRA tensors"));
    }
    // Check everything first, so a bad file leaves the model untouched.
    let shapes: HashMap<String, (Vec<usize>, bool)> = model
        .linears()
        .into_iter()
        .map(|(n, l)| {
            let (o, i) = l.weight.dims2().unwrap_or((0, 0));
            (n, (vec![o, i], l.lora.is_some()))
        })
        .collect();
    let mut ready = Vec::with_capacity(pairs.len());
    for (module, (a, b)) in pairs {
        let (Some(a), Some(b)) = (a, b) else {
            return Err(ModelError::bad_file(
                &path,
                format!("module `{module}` has only one of lora_A / lora_B"),
            ));
        };
        let Some((w, has_lora)) = shapes.get(&module) else {
            return Err(ModelError::bad_file(
                &path,
                format!(
                    "adapts `{module}`, which is not a linear layer of this model (wrong base \
                     model or layer count?)"
                ),
            ));
        };
        let (n_out, n_in) = (w[0], w[1]);
        if a.dims() != [cfg.r, n_in] || b.dims() != [n_out, cfg.r] {
            return Err(ModelError::bad_file(
                &path,
                format!(
                    "`{module}`: lora_A {:?} / lora_B {:?}, expected [{}, {n_in}] / \
                     [{n_out}, {}] (r from {ADAPTER_CONFIG}; wrong base model?)",
                    a.dims(),
                    b.dims(),
                    cfg.r,
                    cfg.r
                ),
            ));
        }
        if *has_lora {
            return Err(ModelError::Invalid(format!(
                "{module} already has a LoRA adapter; merge or remove it before loading another"
            )));
        }
        ready.push((module, a, b));
    }
    let sc = scaling(cfg.lora_alpha, cfg.r, cfg.use_rslora);
    let mut linears: HashMap<String, &mut crate::ops::Linear> =
        model.linears_mut().into_iter().collect();
    for (module, a, b) in ready {
        let lin = linears.get_mut(&module).expect("checked above");
        lin.lora = Some(LoraAdapter::new(a, b, sc, cfg.lora_dropout, &module, 0));
    }
    drop(linears);
    cfg.target_modules = adapted_modules(model)
        .into_iter()
        .map(str::to_string)
        .collect();
    Ok((cfg, saved_tensors))
}
