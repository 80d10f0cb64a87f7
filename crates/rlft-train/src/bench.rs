//! The AdamW benchmark of `rlft bench adamw` and `examples/adamw_bench.rs`, one implementation
//! for both, in the shape of the reference's `bench/reference/bench.py` (`adamw` case):
//! lr 1e-6, weight decay 0 ([`bench_config`]), fixed gradients, untimed warm-up steps (the first
//! touches the zeroed moments), then timed steps ([`time_reps`]).
//!
//! The parameters are a model's own `Var`s (`rlft bench`) or [`synthetic_vars`] of SmolLM2-135M's
//! shapes ([`smollm2_shapes`], the example, which needs no model); the gradients are
//! deterministic values ([`synthetic_grads`]): an AdamW step's work does not depend on them.

use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use crate::adamw::AdamWConfig;
use crate::error::Result;

/// SmolLM2-135M's parameter shapes (134.5M params in 272 tensors): hidden 576, 30 layers, 9 query
/// / 3 key-value heads of 64, MLP 1536, vocab 49152, tied embeddings.
pub fn smollm2_shapes() -> Vec<Vec<usize>> {
    let (h, kv, mlp) = (576, 192, 1536);
    let mut s = vec![vec![49152, h]];
    for _ in 0..30 {
        s.extend([
            vec![h, h],
            vec![kv, h],
            vec![kv, h],
            vec![h, h],
            vec![mlp, h],
            vec![mlp, h],
            vec![h, mlp],
            vec![h],
            vec![h],
        ]);
    }
    s.push(vec![h]);
    s
}

/// `n` deterministic values in `[-scale, scale)` from `seed` (a cheap hash, not a formula the
/// compiler could fold).
pub fn fill(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let x = (i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// f32 `Var`s of `shapes` filled with [`fill`] (seed = index, scale 0.05).
pub fn synthetic_vars(shapes: &[Vec<usize>], device: &Device) -> Result<Vec<Var>> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = s.iter().product();
            let t = Tensor::from_vec(fill(n, i as u64, 0.05), s.as_slice(), device)?;
            Ok(Var::from_tensor(&t)?)
        })
        .collect()
}

/// A gradient for each of `vars`, in its shape, dtype and device, filled with [`fill`]
/// (seed = 1000 + index, scale 1e-3).
pub fn synthetic_grads(vars: &[Var]) -> Result<GradStore> {
    let mut grads = GradStore::default();
    for (i, v) in vars.iter().enumerate() {
        let g = Tensor::from_vec(
            fill(v.elem_count(), 1000 + i as u64, 1e-3),
            v.dims(),
            v.device(),
        )?;
        let g = if v.dtype() == DType::F32 {
            g
        } else {
            g.to_dtype(v.dtype())?
        };
        grads.insert(v.as_tensor(), g);
    }
    Ok(grads)
}

/// The hyperparameters bench.py times `torch.optim.AdamW` with: lr 1e-6, weight decay 0,
/// PyTorch's betas and epsilon.
pub fn bench_config() -> AdamWConfig {
    AdamWConfig {
        lr: 1e-6,
        weight_decay: 0.0,
        ..AdamWConfig::default()
    }
}

/// Runs `step` `warmup` times untimed, then `reps` times timed; returns the timed wall seconds.
pub fn time_reps<E>(
    warmup: usize,
    reps: usize,
    mut step: impl FnMut() -> std::result::Result<(), E>,
) -> std::result::Result<Vec<f64>, E> {
    for _ in 0..warmup {
        step()?;
    }
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            step()?;
            Ok(t.elapsed().as_secs_f64())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AdamW, AdamWKernel, ParamGroup};

    #[test]
    fn smollm2_has_134_5m_params_in_272_tensors() {
        let s = smollm2_shapes();
        assert_eq!(s.len(), 272);
        assert_eq!(
            s.iter().map(|d| d.iter().product::<usize>()).sum::<usize>(),
            134_515_008
        );
    }

    #[test]
    fn times_fused_steps_on_synthetic_params() {
        let vars = synthetic_vars(&[vec![4, 3], vec![5]], &Device::Cpu).unwrap();
        let grads = synthetic_grads(&vars).unwrap();
        let mut opt = AdamW::new(vec![ParamGroup::new(vars.clone())], bench_config())
            .unwrap()
            .with_kernel(AdamWKernel::Fused);
        let before = vars[0].as_tensor().to_vec2::<f32>().unwrap();
        let t = time_reps(1, 2, || opt.step(&grads)).unwrap();
        assert_eq!(t.len(), 2);
        assert_ne!(before, vars[0].as_tensor().to_vec2::<f32>().unwrap());
    }
}
