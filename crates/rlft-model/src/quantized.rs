//! The GGUF blocks a model keeps beside its f32 weights for decoding
//! ([`rlft_kernels::quant::QuantWeight`]): attached at load, dropped once they no longer mirror
//! their weight, counted for memory reports. The fused decoder ([`crate::decode_fast`]) reads
//! them while they still mirror the layer's tensor.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use rlft_kernels::quant::QuantWeight;

use crate::decoder::CausalLm;
use crate::weight::Weight;

impl CausalLm {
    /// Keeps the GGUF blocks of weights (HF names, `<module>.weight`) beside their f32 tensors
    /// for the decode path, bound to the tensors the layers hold now ([`QuantWeight::bind`]).
    /// Blocks whose shape does not match their weight, or that name no linear layer or the LM
    /// head, are ignored. Returns how many were attached.
    pub fn attach_quantized(&mut self, mut blocks: HashMap<String, QuantWeight>) -> usize {
        let mut n = 0;
        let mut fits = |q: QuantWeight, w: &Tensor| {
            (w.dims() == [q.dims().0, q.dims().1]).then(|| {
                n += 1;
                Arc::new(q.bind(w))
            })
        };
        let head = if self.lm_head.is_some() {
            "lm_head.weight"
        } else {
            "model.embed_tokens.weight"
        };
        if let (Some(q), Some(w)) = (blocks.remove(head), self.lm_head_weight().dense()) {
            let w = w.clone();
            self.head_quant = fits(q, &w);
        }
        for (name, lin) in self.linears_mut() {
            if let (Some(q), Weight::Dense(w)) =
                (blocks.remove(&format!("{name}.weight")), &lin.weight)
            {
                lin.quant = fits(q, w);
            }
        }
        n
    }

    /// Drops the GGUF blocks that no longer mirror their weight (made trainable, merged,
    /// replaced), freeing their memory.
    pub fn drop_stale_quantized(&mut self) {
        let stale = |q: &Option<Arc<QuantWeight>>, w: &Weight| {
            q.as_ref()
                .is_some_and(|q| w.dense().is_none_or(|w| !q.mirrors(w)))
        };
        if stale(&self.head_quant, self.lm_head_weight()) {
            self.head_quant = None;
        }
        for (_, lin) in self.linears_mut() {
            if stale(&lin.quant, &lin.weight) {
                lin.quant = None;
            }
        }
    }

    /// Drops every GGUF block kept for decoding (for models that never decode: a trainer's
    /// reference copy, SFT).
    pub fn drop_quantized(&mut self) {
        self.head_quant = None;
        for (_, lin) in self.linears_mut() {
            lin.quant = None;
        }
    }

    /// Bytes held by GGUF blocks kept for decoding ([`Self::attach_quantized`]).
    pub fn quantized_bytes(&self) -> usize {
        let lin: usize = self
            .linears()
            .iter()
            .filter_map(|(_, l)| l.quant.as_ref().map(|q| q.size_in_bytes()))
            .sum();
        lin + self.head_quant.as_ref().map_or(0, |q| q.size_in_bytes())
    }
}
