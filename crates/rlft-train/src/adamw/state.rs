//! Saving and restoring the optimizer state, with PyTorch's `state_dict()["state"]` naming.
//!
//! For parameter `i` (state order: groups in order, vars in group order), once it has taken a
//! step:
//!
//! | name                  | shape        | dtype                       |
//! |-----------------------|--------------|-----------------------------|
//! | `state.{i}.step`      | `[]`         | f64 (steps taken)           |
//! | `state.{i}.exp_avg`   | param shape  | f32 (f64 for f64 params); the param's with `ParamDtype` |
//! | `state.{i}.exp_avg_sq`| param shape  | like `exp_avg`              |
//! | `state.{i}.master`    | param shape  | f32; bf16/f16 params only, not with `SplitMaster` for bf16 or `ParamDtype` |
//! | `state.{i}.master_low`| param shape  | bf16 (16 bits each, `precision::split`); bf16 params with `SplitMaster` |
//!
//! Hyperparameters are not saved: they come from the run's config, and the lr from the schedule.
//! A state saved under one [`AdamWPrecision`] loads under another: the moments are converted,
//! a master is converted to the other form or dropped, and one that is missing is made from the
//! parameter.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::{
    host_join, host_split, moment_dtype, state_zeros, AdamW, AdamWPrecision, Master, MasterForm,
    ParamState,
};
use crate::error::{Result, TrainError};

const FIELDS: [&str; 5] = ["step", "exp_avg", "exp_avg_sq", "master", "master_low"];

impl AdamW {
    /// A snapshot of the state (copies, safe to keep while training continues), named as in the
    /// module docs; parameters that never took a step have no entries. Save it with
    /// `candle_core::safetensors::save` and restore it with [`AdamW::load_state_tensors`].
    ///
    /// The copies are in host memory whatever the parameters' device: a checkpoint writes them
    /// from there anyway, and a copy on a GPU would need as much free device memory again as the
    /// state itself (f32 moments and master weights: 12 bytes per parameter).
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let host = |t: &Tensor| -> Result<Tensor> {
            Ok(if t.device().is_cpu() {
                t.copy()?
            } else {
                t.to_device(&Device::Cpu)?
            })
        };
        let mut out = Vec::new();
        for (i, st) in self.params.iter().enumerate() {
            if st.step == 0 {
                continue;
            }
            let step = Tensor::new(st.step as f64, &Device::Cpu)?;
            out.push((format!("state.{i}.step"), step));
            out.push((format!("state.{i}.exp_avg"), host(&st.exp_avg)?));
            out.push((format!("state.{i}.exp_avg_sq"), host(&st.exp_avg_sq)?));
            match &st.master {
                Some(Master::F32(w)) => out.push((format!("state.{i}.master"), host(w)?)),
                Some(Master::Low(lo)) => out.push((format!("state.{i}.master_low"), host(lo)?)),
                None => {}
            }
        }
        Ok(out)
    }

    /// Restores a state written by [`AdamW::state_tensors`] (any device/dtype; converted to each
    /// var's device and the state dtype, copied). The optimizer must be built with the same vars
    /// in the same groups and order. Parameters without entries start fresh; a missing `master`
    /// is re-made from the var. Nothing changes if an error is returned.
    pub fn load_state_tensors(&mut self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        let n = self.params.len();
        for name in tensors.keys() {
            let parsed = parse_name(name);
            match parsed {
                Some((i, _)) if i < n => {}
                Some((i, _)) => {
                    return Err(TrainError::State(format!(
                        "`{name}` is for parameter {i} but this optimizer has {n} parameters; \
                         build the parameter groups with the same vars, in the same order, as the \
                         run that saved the state"
                    )))
                }
                None => {
                    return Err(TrainError::State(format!(
                        "unexpected tensor `{name}`; optimizer state tensors are named \
                         `state.<index>.<{}>`",
                        FIELDS.join("|")
                    )))
                }
            }
        }
        let mut restored = Vec::with_capacity(n);
        for (i, st) in self.params.iter().enumerate() {
            restored.push(restore_one(i, st, tensors, self.precision)?);
        }
        for (st, (step, m, v, master)) in self.params.iter_mut().zip(restored) {
            st.step = step;
            st.exp_avg = m;
            st.exp_avg_sq = v;
            st.master = match master {
                // An f32 master saved for a split-master parameter: the parameter becomes its
                // rounding (it was, but for the tie rule of another path) beside the low half.
                Some(Restored::Split { hi, lo }) => {
                    st.var.set(&hi)?;
                    Some(Master::Low(lo))
                }
                Some(Restored::Ready(m)) => Some(m),
                None => None,
            };
        }
        Ok(())
    }
}

/// `state.{i}.{field}` -> `(i, field)`.
fn parse_name(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("state.")?;
    let (i, field) = rest.split_once('.')?;
    let i = i.parse().ok()?;
    FIELDS.contains(&field).then_some((i, field))
}

/// A master read back: as it will be kept, or an f32 master split into the parameter it
/// rounds to and the low halves.
enum Restored {
    Ready(Master),
    Split { hi: Tensor, lo: Tensor },
}

type RestoredState = (u64, Tensor, Tensor, Option<Restored>);

/// The state of parameter `i` from `tensors`, validated against the var.
fn restore_one(
    i: usize,
    st: &ParamState,
    tensors: &HashMap<String, Tensor>,
    precision: AdamWPrecision,
) -> Result<RestoredState> {
    let get = |field: &str| tensors.get(&format!("state.{i}.{field}"));
    let dtype = moment_dtype(st.var.dtype(), precision);
    let dev = st.var.device();
    let Some(step) = get("step") else {
        if let Some(field) = FIELDS[1..].iter().find(|f| get(f).is_some()) {
            return Err(TrainError::State(format!(
                "`state.{i}.{field}` is present without `state.{i}.step`; the state file is \
                 incomplete, save it again with AdamW::state_tensors"
            )));
        }
        let (m, v) = (
            state_zeros(st.var.shape(), dtype, dev)?,
            state_zeros(st.var.shape(), dtype, dev)?,
        );
        return Ok((0, m, v, None));
    };
    let step = step.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    if !(step.is_finite() && step >= 0.0 && step.fract() == 0.0) {
        return Err(TrainError::State(format!(
            "`state.{i}.step` = {step} is not a step count; the state file is corrupt"
        )));
    }
    let load = |field: &str, dtype: DType| -> Result<Tensor> {
        let t = get(field).ok_or_else(|| {
            TrainError::State(format!(
                "`state.{i}.{field}` is missing; the state file is incomplete, save it again \
                 with AdamW::state_tensors"
            ))
        })?;
        if t.dims() != st.var.dims() {
            return Err(TrainError::State(format!(
                "`state.{i}.{field}` has shape {:?} but parameter {i} has shape {:?}; build the \
                 parameter groups with the same vars, in the same order, as the run that saved it",
                t.dims(),
                st.var.dims()
            )));
        }
        // `copy` so that in-place updates never write into the caller's tensors.
        Ok(t.to_device(dev)?.to_dtype(dtype)?.copy()?)
    };
    let m = load("exp_avg", dtype)?;
    let v = load("exp_avg_sq", dtype)?;
    // The master as saved (f32), if any, whichever form it was saved in.
    let saved = match (get("master"), get("master_low")) {
        (Some(_), _) => Some(load("master", DType::F32)?),
        (None, Some(_)) if st.var.dtype() == DType::BF16 => {
            let lo = load("master_low", DType::BF16)?;
            Some(host_join(
                &st.var.as_tensor().to_device(&Device::Cpu)?,
                &lo.to_device(&Device::Cpu)?,
            )?)
        }
        _ => None,
    };
    let master = match (st.master_form(precision), saved) {
        (None, _) | (_, None) => None,
        (Some(MasterForm::F32), Some(w)) => Some(Restored::Ready(Master::F32(w.to_device(dev)?))),
        (Some(MasterForm::Low), Some(w)) => {
            let (hi, lo) = host_split(&w)?;
            Some(Restored::Split { hi, lo })
        }
    };
    Ok((step as u64, m, v, master))
}
