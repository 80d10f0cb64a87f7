//! A weight matrix as the model holds it: a tensor, or a frozen base kept in its GGUF blocks.
//!
//! Under LoRA over a GGUF file the base never changes, so its matrices (the linear layers, the
//! embedding and the LM head) can stay in the file's block format ([`QuantWeight`]: 0.5 GB for
//! Qwen2.5-0.5B's Q4_K_M mix instead of 2.5 GB of f32) and serve the forward pass, the backward
//! pass to the inputs and decoding directly ([`rlft_kernels::fused::quant_linear`],
//! [`rlft_kernels::fused::quant_head`], the decode kernels). Anything that needs the values as
//! a tensor (merging an adapter, full fine-tuning, exporting) dequantises with
//! [`Weight::to_tensor`], the loader's formulas, so it gets the very tensor a dense load gives.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rlft_kernels::quant::QuantWeight;

use crate::error::Result;

/// A `[rows, cols]` weight matrix.
#[derive(Debug, Clone)]
pub enum Weight {
    /// A tensor (trainable or not).
    Dense(Tensor),
    /// A frozen matrix in GGUF blocks, f32 when dequantised.
    Quant(Arc<QuantWeight>),
}

impl Weight {
    /// `(rows, cols)`.
    pub fn dims2(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Weight::Dense(t) => t.dims2()?,
            Weight::Quant(q) => q.dims(),
        })
    }

    /// The tensor of a dense weight.
    pub fn dense(&self) -> Option<&Tensor> {
        match self {
            Weight::Dense(t) => Some(t),
            Weight::Quant(_) => None,
        }
    }

    /// The blocks of a quantised weight.
    pub fn quant(&self) -> Option<&Arc<QuantWeight>> {
        match self {
            Weight::Dense(_) => None,
            Weight::Quant(q) => Some(q),
        }
    }

    /// Whether the weight records a graph (a trainable `Var`); blocks never do.
    pub fn track_op(&self) -> bool {
        self.dense().is_some_and(Tensor::track_op)
    }

    /// The values as a tensor: the tensor itself, or the blocks dequantised to f32 on the CPU.
    pub fn to_tensor(&self) -> Result<Tensor> {
        Ok(match self {
            Weight::Dense(t) => t.clone(),
            Weight::Quant(q) => {
                let (r, c) = q.dims();
                let mut v = vec![0f32; r * c];
                q.dequant_rows_par(0, r, &mut v);
                Tensor::from_vec(v, (r, c), &Device::Cpu)?
            }
        })
    }

    /// Dtype of the values ([`Self::to_tensor`]'s).
    pub fn dtype(&self) -> DType {
        self.dense().map_or(DType::F32, Tensor::dtype)
    }

    /// Rows `ids [n]` (u32) -> `[n, cols]`: an embedding lookup (no gradient for blocks).
    pub fn rows(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Weight::Dense(t) => Ok(t.index_select(ids, 0)?),
            Weight::Quant(q) => {
                let ids: Vec<u32> = ids.to_dtype(DType::U32)?.to_vec1()?;
                let c = q.dims().1;
                let mut v = vec![0f32; ids.len() * c];
                q.gather_rows(&ids, &mut v);
                Ok(Tensor::from_vec(v, (ids.len(), c), &Device::Cpu)?)
            }
        }
    }

    /// Bytes held.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Weight::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Weight::Quant(q) => q.size_in_bytes(),
        }
    }
}

impl From<Tensor> for Weight {
    fn from(t: Tensor) -> Self {
        Weight::Dense(t)
    }
}

/// A weight to be written, made when it is read ([`LazyWeight::tensor`]): an export streams
/// a model one tensor at a time, so a base kept in blocks, or an adapter merged on the way, is
/// never whole in f32 memory.
#[derive(Debug, Clone)]
pub struct LazyWeight {
    /// HF name.
    pub name: String,
    /// Shape of the tensor [`Self::tensor`] makes.
    pub shape: Vec<usize>,
    source: LazySource,
}

#[derive(Debug, Clone)]
enum LazySource {
    Tensor(Tensor),
    /// A matrix, with the adapter to merge into it.
    Matrix(Weight, Option<crate::adapter::LoraAdapter>),
}

impl LazyWeight {
    /// A tensor as it is.
    pub fn from_tensor(name: impl Into<String>, t: Tensor) -> Self {
        LazyWeight {
            name: name.into(),
            shape: t.dims().to_vec(),
            source: LazySource::Tensor(t),
        }
    }

    /// A matrix, plus `scaling * B @ A` of `lora` when given (computed in the adapter's dtype
    /// and stored in the weight's: [`crate::adapter::LoraAdapter::merged_into`]).
    pub(crate) fn matrix(
        name: String,
        w: &Weight,
        lora: Option<&crate::adapter::LoraAdapter>,
    ) -> Result<Self> {
        let (r, c) = w.dims2()?;
        Ok(LazyWeight {
            name,
            shape: vec![r, c],
            source: LazySource::Matrix(w.clone(), lora.cloned()),
        })
    }

    /// The values: the tensor, the blocks dequantised, with the adapter merged.
    pub fn tensor(&self) -> Result<Tensor> {
        match &self.source {
            LazySource::Tensor(t) => Ok(t.clone()),
            LazySource::Matrix(w, None) => w.to_tensor(),
            LazySource::Matrix(w, Some(l)) => l.merged_into(&w.to_tensor()?),
        }
    }
}
