//! An external key/value cache: it lives outside the model so the same weights serve rollout,
//! reference scoring and training.

use candle_core::{Tensor, D};

use crate::error::{ModelError, Result};

/// Per-layer keys and values, preallocated to a capacity and filled in place.
///
/// Layout per layer: `k, v [b, kv_heads, capacity, head_dim]`; the first `len` positions are
/// valid. Appending writes into the buffer (no reallocation), so decoding costs no copies of the
/// past.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// An empty cache for `num_layers` layers that can hold `capacity` positions.
    pub fn new(num_layers: usize, capacity: usize) -> Self {
        KvCache {
            layers: vec![None; num_layers],
            len: 0,
            capacity,
        }
    }

    /// Positions stored so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Layers the cache was made for.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Maximum positions.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows in the batch (0 when empty).
    pub fn batch_size(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .next()
            .and_then(|(k, _)| k.dim(0).ok())
            .unwrap_or(0)
    }

    /// Appends `k, v [b, kvh, t, d]` for `layer` and returns views of all positions so far
    /// (`[b, kvh, len + t, d]`). The cache length advances when the last layer is written.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        if self.len + t > self.capacity {
            return Err(ModelError::Invalid(format!(
                "KV cache full: {} + {t} positions exceed its capacity {}; create the cache with \
                 a larger capacity (prompt length + max_new_tokens)",
                self.len, self.capacity
            )));
        }
        let slot = &mut self.layers[layer];
        if slot.is_none() {
            let (b, kvh, _, d) = k.dims4()?;
            let kb = Tensor::zeros((b, kvh, self.capacity, d), k.dtype(), k.device())?;
            let vb = Tensor::zeros((b, kvh, self.capacity, d), v.dtype(), v.device())?;
            *slot = Some((kb, vb));
        }
        let (kb, vb) = slot.as_ref().expect("allocated above");
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        let total = self.len + t;
        let out = (kb.narrow(2, 0, total)?, vb.narrow(2, 0, total)?);
        if layer + 1 == self.layers.len() {
            self.len = total;
        }
        Ok(out)
    }

    /// Keeps batch rows `rows` (in that order, repeats allowed): used to share one prompt prefill
    /// across `n` samples and to drop finished rows during decoding.
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        let Some(device) = self
            .layers
            .iter()
            .flatten()
            .next()
            .map(|(k, _)| k.device().clone())
        else {
            return Ok(());
        };
        let idx = Tensor::new(rows, &device)?;
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(&idx, 0)?;
            *v = v.index_select(&idx, 0)?;
        }
        Ok(())
    }

    /// Forgets the last `n` positions (e.g. a rejected draft).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Keys of `layer` so far, `[b, kvh, len, d]` (for tests and inspection).
    pub fn keys(&self, layer: usize) -> Option<Tensor> {
        self.layers[layer]
            .as_ref()
            .and_then(|(k, _)| k.narrow(D::Minus2, 0, self.len).ok())
    }
}
