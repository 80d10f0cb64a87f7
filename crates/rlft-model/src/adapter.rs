//! The LoRA adapter of one linear layer ([`LoraAdapter`]): its factors, scaling and dropout
//! masks, and the update it adds. The layers ([`crate::ops::Linear`]) hold one each; attaching,
//! merging and the PEFT format are [`crate::lora`]'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::Result;

/// The adapter of one linear layer.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// `lora_A.weight [r, in]` (a `Var`'s tensor while training).
    pub a: Tensor,
    /// `lora_B.weight [out, r]`.
    pub b: Tensor,
    /// Factor on `B @ A` (`lora::scaling`).
    pub scaling: f64,
    /// Dropout probability on the adapter input.
    pub dropout: f64,
    /// Whether the layer adds the adapter's update (see `CausalLm::disable_adapters`).
    pub enabled: bool,
    /// Seed of the dropout masks of training forwards (`grad = true`); `None` turns dropout
    /// off. Set for the whole model with `lora::set_dropout_seed`.
    pub dropout_seed: Option<u64>,
    /// Per-module salt of the dropout masks (hash of the module path).
    pub key: u64,
    /// Training forwards drawn since the seed was set: each draws a fresh mask. Shared by
    /// clones (a detached view or a reference copy never draws: they run without graph or
    /// with adapters off).
    pub draws: Arc<AtomicU64>,
}

impl LoraAdapter {
    /// An enabled adapter of module `module` (its path, which salts the dropout masks) from
    /// `a [r, in]` and `b [out, r]`, with dropout masks drawn from `seed`.
    pub fn new(a: Tensor, b: Tensor, scaling: f64, dropout: f64, module: &str, seed: u64) -> Self {
        LoraAdapter {
            a,
            b,
            scaling,
            dropout,
            enabled: true,
            dropout_seed: Some(seed),
            key: fnv1a(module),
            draws: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Rank `r`.
    pub fn rank(&self) -> usize {
        self.a.dim(0).unwrap_or(0)
    }

    /// `scaling * dropout(x) @ A^T @ B^T` for `x [rows, in]` -> `[rows, out]` in the adapter's
    /// dtype. `grad = true` (training) drops out with a fresh mask per call when the adapter has
    /// a dropout seed and `dropout > 0`; `grad = false` uses `A`, `B` detached and never drops
    /// out, as PEFT in `eval()` mode.
    pub fn delta(&self, x: &Tensor, grad: bool) -> Result<Tensor> {
        let mut x = x.to_dtype(self.a.dtype())?;
        if let Some(mask) = self.dropout_mask(x.dims(), grad, x.device())? {
            x = (x * mask)?;
        }
        let (a, b) = if grad {
            (self.a.clone(), self.b.clone())
        } else {
            (self.a.detach(), self.b.detach())
        };
        let h = x.matmul(&a.t()?)?;
        Ok((h.matmul(&b.t()?)? * self.scaling)?)
    }

    /// The next dropout mask for an input of `dims` (in the adapter's dtype): `None` unless
    /// training (`grad`) with a dropout seed and `dropout > 0`. Each call draws a fresh mask.
    pub fn dropout_mask(
        &self,
        dims: &[usize],
        grad: bool,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let (true, Some(seed), true) = (grad, self.dropout_seed, self.dropout > 0.0) else {
            return Ok(None);
        };
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        let seed = seed ^ self.key ^ splitmix64(draw.wrapping_add(0x5EED));
        let mask = dropout_mask(dims, self.dropout, seed, device)?;
        Ok(Some(mask.to_dtype(self.a.dtype())?))
    }

    /// `y + delta(x)`, added in the adapter's dtype and cast back to `y`'s.
    pub(crate) fn add_delta(&self, y: &Tensor, x: &Tensor, grad: bool) -> Result<Tensor> {
        let d = self.delta(x, grad)?;
        if y.dtype() == d.dtype() {
            Ok((y + d)?)
        } else {
            Ok((y.to_dtype(d.dtype())? + d)?.to_dtype(y.dtype())?)
        }
    }

    /// The dense update `scaling * B @ A` `[out, in]` in the adapter's dtype (no graph).
    pub fn delta_weight(&self) -> Result<Tensor> {
        Ok((self.b.detach().matmul(&self.a.detach())? * self.scaling)?)
    }

    /// `w + scaling * B @ A`, added in the adapter's dtype and returned in `w`'s: the one
    /// merge formula (`merge_lora`, and the export's streamed merge).
    pub fn merged_into(&self, w: &Tensor) -> Result<Tensor> {
        let d = self.delta_weight()?;
        let w = w.detach();
        Ok((w.to_dtype(d.dtype())? + d)?.to_dtype(w.dtype())?)
    }
}

/// SplitMix64: a full-period 64-bit mixer, enough for init and dropout streams.
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` from a 64-bit value.
pub(crate) fn unit(u: u64) -> f64 {
    (u >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// FNV-1a of a string: a stable per-module salt.
pub(crate) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Inverted-dropout mask of `dims`: `1 / (1 - p)` kept, `0` dropped, element `i` decided by
/// `hash(seed, i)` (so a mask depends only on the seed and the shape, on every device).
pub(crate) fn dropout_mask(dims: &[usize], p: f64, seed: u64, device: &Device) -> Result<Tensor> {
    let n: usize = dims.iter().product();
    let keep = (1.0 / (1.0 - p)) as f32;
    let base = splitmix64(seed);
    let data: Vec<f32> = (0..n as u64)
        .map(|i| {
            if unit(splitmix64(base ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03))) < p {
                0.0
            } else {
                keep
            }
        })
        .collect();
    Ok(Tensor::from_vec(data, dims, device)?)
}
