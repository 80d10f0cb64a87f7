//! The decoder-only transformer shared by Llama, Qwen2 and Qwen3, with HF weight names.
//!
//! What differs per family lives in `models/`: which weights exist (q/k/v biases for Qwen2,
//! q/k norms for Qwen3) and how GGUF metadata maps to the config. The forward pass reads like
//! transformers' `modeling_llama.py`.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::ops::{self, Linear};
use crate::weight::{LazyWeight, Weight};
use rlft_kernels::quant::QuantWeight;

/// One attention block.
#[derive(Debug, Clone)]
pub struct Attention {
    /// `self_attn.q_proj`.
    pub q_proj: Linear,
    /// `self_attn.k_proj`.
    pub k_proj: Linear,
    /// `self_attn.v_proj`.
    pub v_proj: Linear,
    /// `self_attn.o_proj`.
    pub o_proj: Linear,
    /// `self_attn.q_norm.weight` (Qwen3).
    pub q_norm: Option<Tensor>,
    /// `self_attn.k_norm.weight` (Qwen3).
    pub k_norm: Option<Tensor>,
}

/// The SwiGLU MLP.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `mlp.gate_proj`.
    pub gate_proj: Linear,
    /// `mlp.up_proj`.
    pub up_proj: Linear,
    /// `mlp.down_proj`.
    pub down_proj: Linear,
}

/// One decoder layer.
#[derive(Debug, Clone)]
pub struct Layer {
    /// `input_layernorm.weight`.
    pub input_layernorm: Tensor,
    /// `self_attn.*`.
    pub self_attn: Attention,
    /// `post_attention_layernorm.weight`.
    pub post_attention_layernorm: Tensor,
    /// `mlp.*`.
    pub mlp: Mlp,
}

/// A causal language model: embeddings, layers, final norm, LM head.
#[derive(Debug, Clone)]
pub struct CausalLm {
    /// Shape and family.
    pub config: ModelConfig,
    /// `model.embed_tokens.weight [vocab, hidden]`.
    pub embed_tokens: Weight,
    /// `model.layers.*`.
    pub layers: Vec<Layer>,
    /// `model.norm.weight`.
    pub norm: Tensor,
    /// `lm_head.weight [vocab, hidden]`; `None` when tied to the embeddings.
    pub lm_head: Option<Weight>,
    /// The GGUF blocks of the LM head matrix ([`Self::lm_head_weight`]), for decoding.
    pub head_quant: Option<Arc<QuantWeight>>,
    inv_freq: Tensor,
    /// No LM head at all: the backbone of a `*ForSequenceClassification` checkpoint with
    /// untied embeddings ([`Self::from_backbone_weights`]); logits and generation are errors.
    headless: bool,
}

/// One forward call's inputs.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Token ids `[b, t]` (u32).
    pub ids: Tensor,
    /// Rotary positions `[b, t]` (u32): for left-padded rows, counted from the first real token.
    pub positions: Tensor,
    /// Additive attention bias `[b, 1, t, past + t]` (0 or -inf).
    pub bias: Tensor,
}

impl Batch {
    /// Builds a left-padded batch from rows of token ids continuing a cache with `past`
    /// positions, where `pad[r]` leading positions of row `r` (in the cache and in these ids)
    /// are padding. Returns the batch; padding ids are `pad_id`.
    pub fn left_padded(
        rows: &[Vec<u32>],
        pad: &[usize],
        past: usize,
        pad_id: u32,
        device: &Device,
    ) -> Result<Batch> {
        let t = rows.iter().map(Vec::len).max().unwrap_or(0);
        let b = rows.len();
        let mut ids = Vec::with_capacity(b * t);
        let mut pos = Vec::with_capacity(b * t);
        for (row, &p) in rows.iter().zip(pad) {
            let extra = t - row.len();
            for i in 0..t {
                let abs = past + i;
                ids.push(if i < extra { pad_id } else { row[i - extra] });
                pos.push(abs.saturating_sub(p) as u32);
            }
        }
        Ok(Batch {
            ids: Tensor::from_vec(ids, (b, t), device)?,
            positions: Tensor::from_vec(pos, (b, t), device)?,
            bias: ops::causal_bias(pad, past, t, device)?,
        })
    }
}

fn take(w: &mut HashMap<String, Tensor>, name: &str, shape: &[usize]) -> Result<Tensor> {
    let t = w.remove(name).ok_or_else(|| ModelError::MissingWeight {
        name: name.to_string(),
        source_desc: "the weights".into(),
    })?;
    if t.dims() != shape {
        return Err(ModelError::ShapeMismatch {
            name: name.to_string(),
            got: t.dims().to_vec(),
            expected: shape.to_vec(),
        });
    }
    Ok(t)
}

/// The weights a model is built from: tensors, and matrices kept in GGUF blocks.
struct Parts {
    dense: HashMap<String, Tensor>,
    blocks: HashMap<String, QuantWeight>,
}

impl Parts {
    /// Matrix `name` of `shape`: its blocks when kept, else its tensor.
    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Weight> {
        match self.blocks.remove(name) {
            Some(q) if q.dims() == (shape[0], shape[1]) => Ok(Weight::Quant(Arc::new(q))),
            Some(q) => Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                got: vec![q.dims().0, q.dims().1],
                expected: shape.to_vec(),
            }),
            None => Ok(Weight::Dense(take(&mut self.dense, name, &shape)?)),
        }
    }
}

fn linear(w: &mut Parts, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
    let weight = w.matrix(&format!("{prefix}.weight"), [out, inp])?;
    let w = &mut w.dense;
    let bias = if bias {
        Some(take(w, &format!("{prefix}.bias"), &[out])?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

impl CausalLm {
    /// Assembles a model from HF-named tensors (already in the target dtype and device).
    /// Unused tensors are an error: they mean the config does not describe the checkpoint.
    pub fn from_weights(config: ModelConfig, w: HashMap<String, Tensor>) -> Result<Self> {
        Self::build(config, w, HashMap::new(), true)
    }

    /// [`Self::from_weights`] with some matrices (linear layers, embedding, LM head; HF names)
    /// kept in GGUF blocks instead of tensors: a frozen base for LoRA ([`Weight::Quant`]).
    pub fn from_weights_and_blocks(
        config: ModelConfig,
        w: HashMap<String, Tensor>,
        blocks: HashMap<String, QuantWeight>,
    ) -> Result<Self> {
        Self::build(config, w, blocks, true)
    }

    /// [`Self::from_weights`] for a decoder whose checkpoint may lack `lm_head.weight` although
    /// its embeddings are untied: the backbone of a transformers `*ForSequenceClassification`
    /// model (which has a `score` head instead, [`crate::score`]). Such a model computes hidden
    /// states but no logits ([`Self::has_lm_head`]).
    pub fn from_backbone_weights(config: ModelConfig, w: HashMap<String, Tensor>) -> Result<Self> {
        Self::build(config, w, HashMap::new(), false)
    }

    fn build(
        config: ModelConfig,
        dense: HashMap<String, Tensor>,
        blocks: HashMap<String, QuantWeight>,
        need_head: bool,
    ) -> Result<Self> {
        config.validate()?;
        let c = &config;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let mut parts = Parts { dense, blocks };
        let embed_tokens = parts.matrix("model.embed_tokens.weight", [c.vocab_size, h])?;
        let w = &mut parts;
        let qkv_bias = c.attention_bias;
        let o_bias = c.attention_bias && c.family != crate::config::Family::Qwen2;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let norm = |w: &mut Parts, n: &str| {
                if c.family.has_qk_norm() {
                    take(&mut w.dense, &format!("{p}.self_attn.{n}.weight"), &[hd]).map(Some)
                } else {
                    Ok(None)
                }
            };
            let self_attn = Attention {
                q_proj: linear(w, &format!("{p}.self_attn.q_proj"), q, h, qkv_bias)?,
                k_proj: linear(w, &format!("{p}.self_attn.k_proj"), kv, h, qkv_bias)?,
                v_proj: linear(w, &format!("{p}.self_attn.v_proj"), kv, h, qkv_bias)?,
                o_proj: linear(w, &format!("{p}.self_attn.o_proj"), h, q, o_bias)?,
                q_norm: norm(w, "q_norm")?,
                k_norm: norm(w, "k_norm")?,
            };
            let i_sz = c.intermediate_size;
            let mlp = Mlp {
                gate_proj: linear(w, &format!("{p}.mlp.gate_proj"), i_sz, h, c.mlp_bias)?,
                up_proj: linear(w, &format!("{p}.mlp.up_proj"), i_sz, h, c.mlp_bias)?,
                down_proj: linear(w, &format!("{p}.mlp.down_proj"), h, i_sz, c.mlp_bias)?,
            };
            layers.push(Layer {
                input_layernorm: take(&mut w.dense, &format!("{p}.input_layernorm.weight"), &[h])?,
                self_attn,
                post_attention_layernorm: take(
                    &mut w.dense,
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[h],
                )?,
                mlp,
            });
        }
        let norm = take(&mut w.dense, "model.norm.weight", &[h])?;
        let device = norm.device().clone();
        let has_head =
            w.dense.contains_key("lm_head.weight") || w.blocks.contains_key("lm_head.weight");
        let headless = !c.tie_word_embeddings && !need_head && !has_head;
        let lm_head = if c.tie_word_embeddings || headless {
            w.dense.remove("lm_head.weight");
            w.blocks.remove("lm_head.weight");
            None
        } else {
            Some(w.matrix("lm_head.weight", [c.vocab_size, h])?)
        };
        if let Some(extra) = w.blocks.keys().min() {
            return Err(ModelError::config(format!(
                "GGUF blocks for `{extra}`, which is not a matrix of this model"
            )));
        }
        let w = &mut w.dense;
        // Rotary buffers some exporters keep are derived data, not weights.
        w.retain(|k, _| !k.ends_with("rotary_emb.inv_freq"));
        if let Some(extra) = w.keys().min() {
            return Err(ModelError::config(format!(
                "unexpected weight `{extra}` ({} unused in all): the checkpoint has weights its \
                 config.json does not describe (wrong architecture or layer count?)",
                w.len()
            )));
        }
        let inv_freq = Tensor::new(ops::inv_freq(&c.rope, hd), &device)?;
        Ok(CausalLm {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            head_quant: None,
            inv_freq,
            headless,
        })
    }

    /// Whether the model has an LM head (tied or its own): false only for a backbone loaded
    /// without one ([`Self::from_backbone_weights`]).
    pub fn has_lm_head(&self) -> bool {
        !self.headless
    }

    /// Frees an untied LM head (and its GGUF blocks): a reward model or critic reads hidden
    /// states only. Afterwards the model computes no logits ([`Self::has_lm_head`]); a tied
    /// head is the embedding matrix, which stays.
    pub fn drop_lm_head(&mut self) {
        if self.lm_head.take().is_some() {
            self.headless = true;
        }
        self.head_quant = None;
    }

    /// An error unless the model has an LM head (logits, log-probs and generation need one).
    pub fn require_lm_head(&self) -> Result<()> {
        if self.headless {
            return Err(ModelError::Invalid(
                "this model has no LM head (it is the backbone of a sequence-classification \
                 checkpoint, a reward model): it scores text but cannot compute token logits or \
                 generate; load the causal LM it was trained from instead"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Device of the weights.
    pub fn device(&self) -> &Device {
        self.norm.device()
    }

    /// Dtype of the weights.
    pub fn dtype(&self) -> DType {
        self.norm.dtype()
    }

    /// The LM head matrix `[vocab, hidden]` (the embedding when tied; also the embedding for a
    /// model without LM head, which [`Self::logits`] and generation refuse).
    pub fn lm_head_weight(&self) -> &Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// All weights with their HF names (tied `lm_head` omitted), in a stable order. Weights
    /// kept in GGUF blocks are dequantised ([`Weight::to_tensor`]: f32, a new tensor each call).
    pub fn named_weights(&self) -> Vec<(String, Tensor)> {
        self.try_named_weights()
            .expect("dequantising GGUF blocks of checked sizes cannot fail")
    }

    fn try_named_weights(&self) -> Result<Vec<(String, Tensor)>> {
        self.lazy_weights(false)?
            .into_iter()
            .map(|w| Ok((w.name.clone(), w.tensor()?)))
            .collect()
    }

    /// [`Self::named_weights`] made one at a time ([`LazyWeight::tensor`]), with each linear
    /// layer's attached LoRA adapter merged in when `merge_adapters` (enabled or not, as
    /// [`crate::lora::merge_lora`]): what an export streams.
    pub fn lazy_weights(&self, merge_adapters: bool) -> Result<Vec<LazyWeight>> {
        let mut out = vec![LazyWeight::matrix(
            "model.embed_tokens.weight".into(),
            &self.embed_tokens,
            None,
        )?];
        let lin = |out: &mut Vec<LazyWeight>, n: String, l: &Linear| -> Result<()> {
            let lora = l.lora.as_ref().filter(|_| merge_adapters);
            out.push(LazyWeight::matrix(format!("{n}.weight"), &l.weight, lora)?);
            if let Some(b) = &l.bias {
                out.push(LazyWeight::from_tensor(format!("{n}.bias"), b.clone()));
            }
            Ok(())
        };
        let t = |n: String, t: &Tensor| LazyWeight::from_tensor(n, t.clone());
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.push(t(format!("{p}.input_layernorm.weight"), &l.input_layernorm));
            let a = &l.self_attn;
            lin(&mut out, format!("{p}.self_attn.q_proj"), &a.q_proj)?;
            lin(&mut out, format!("{p}.self_attn.k_proj"), &a.k_proj)?;
            lin(&mut out, format!("{p}.self_attn.v_proj"), &a.v_proj)?;
            lin(&mut out, format!("{p}.self_attn.o_proj"), &a.o_proj)?;
            if let Some(n) = &a.q_norm {
                out.push(t(format!("{p}.self_attn.q_norm.weight"), n));
            }
            if let Some(n) = &a.k_norm {
                out.push(t(format!("{p}.self_attn.k_norm.weight"), n));
            }
            out.push(t(
                format!("{p}.post_attention_layernorm.weight"),
                &l.post_attention_layernorm,
            ));
            lin(&mut out, format!("{p}.mlp.gate_proj"), &l.mlp.gate_proj)?;
            lin(&mut out, format!("{p}.mlp.up_proj"), &l.mlp.up_proj)?;
            lin(&mut out, format!("{p}.mlp.down_proj"), &l.mlp.down_proj)?;
        }
        out.push(t("model.norm.weight".into(), &self.norm));
        if let Some(h) = &self.lm_head {
            out.push(LazyWeight::matrix("lm_head.weight".into(), h, None)?);
        }
        Ok(out)
    }

    /// Mutable access to every dense weight by HF name, in the order of
    /// [`Self::named_weights`] (tied `lm_head` omitted; weights kept in GGUF blocks are not
    /// tensors: [`Self::dequantize_weight`] makes one so first). Used to swap weights for
    /// trainable `Var`s ([`crate::trainable::make_trainable`]) or updated values.
    pub fn weights_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        fn lin<'a>(out: &mut Vec<(String, &'a mut Tensor)>, n: String, l: &'a mut Linear) {
            if let Weight::Dense(w) = &mut l.weight {
                out.push((format!("{n}.weight"), w));
            }
            if let Some(b) = &mut l.bias {
                out.push((format!("{n}.bias"), b));
            }
        }
        let mut out = Vec::new();
        if let Weight::Dense(e) = &mut self.embed_tokens {
            out.push(("model.embed_tokens.weight".to_string(), e));
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            let p = format!("model.layers.{i}");
            out.push((
                format!("{p}.input_layernorm.weight"),
                &mut l.input_layernorm,
            ));
            let a = &mut l.self_attn;
            lin(&mut out, format!("{p}.self_attn.q_proj"), &mut a.q_proj);
            lin(&mut out, format!("{p}.self_attn.k_proj"), &mut a.k_proj);
            lin(&mut out, format!("{p}.self_attn.v_proj"), &mut a.v_proj);
            lin(&mut out, format!("{p}.self_attn.o_proj"), &mut a.o_proj);
            if let Some(n) = &mut a.q_norm {
                out.push((format!("{p}.self_attn.q_norm.weight"), n));
            }
            if let Some(n) = &mut a.k_norm {
                out.push((format!("{p}.self_attn.k_norm.weight"), n));
            }
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                &mut l.post_attention_layernorm,
            ));
            lin(&mut out, format!("{p}.mlp.gate_proj"), &mut l.mlp.gate_proj);
            lin(&mut out, format!("{p}.mlp.up_proj"), &mut l.mlp.up_proj);
            lin(&mut out, format!("{p}.mlp.down_proj"), &mut l.mlp.down_proj);
        }
        out.push(("model.norm.weight".to_string(), &mut self.norm));
        if let Some(Weight::Dense(h)) = &mut self.lm_head {
            out.push(("lm_head.weight".to_string(), h));
        }
        out
    }

    /// Whether any weight is kept in GGUF blocks ([`Weight::Quant`]).
    pub fn has_quantized_base(&self) -> bool {
        matches!(self.embed_tokens, Weight::Quant(_))
            || matches!(self.lm_head, Some(Weight::Quant(_)))
            || self
                .linears()
                .iter()
                .any(|(_, l)| l.weight.quant().is_some())
    }

    /// Replaces every weight kept in GGUF blocks whose HF name `pick` selects by its
    /// dequantised f32 tensor (before making it trainable, merging into it, or converting).
    /// Returns how many were replaced.
    pub fn dequantize_weights(&mut self, pick: impl Fn(&str) -> bool) -> Result<usize> {
        let mut n = 0;
        let mut fix = |name: &str, w: &mut Weight| -> Result<()> {
            if w.quant().is_some() && pick(name) {
                *w = Weight::Dense(w.to_tensor()?);
                n += 1;
            }
            Ok(())
        };
        fix("model.embed_tokens.weight", &mut self.embed_tokens)?;
        if let Some(h) = &mut self.lm_head {
            fix("lm_head.weight", h)?;
        }
        for (name, l) in self.linears_mut() {
            fix(&format!("{name}.weight"), &mut l.weight)?;
        }
        Ok(n)
    }

    /// Every linear layer of the decoder layers with its module path
    /// (`model.layers.{i}.self_attn.q_proj`, ..., `model.layers.{i}.mlp.down_proj`), in
    /// [`Self::named_weights`] order. The LM head is not included (it is a plain tensor).
    pub fn linears(&self) -> Vec<(String, &Linear)> {
        let mut out = Vec::with_capacity(7 * self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let (a, m) = (&l.self_attn, &l.mlp);
            for (n, lin) in [
                ("self_attn.q_proj", &a.q_proj),
                ("self_attn.k_proj", &a.k_proj),
                ("self_attn.v_proj", &a.v_proj),
                ("self_attn.o_proj", &a.o_proj),
                ("mlp.gate_proj", &m.gate_proj),
                ("mlp.up_proj", &m.up_proj),
                ("mlp.down_proj", &m.down_proj),
            ] {
                out.push((format!("model.layers.{i}.{n}"), lin));
            }
        }
        out
    }

    /// Mutable [`Self::linears`] (attaching and merging LoRA adapters).
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = Vec::with_capacity(7 * self.layers.len());
        for (i, l) in self.layers.iter_mut().enumerate() {
            let (a, m) = (&mut l.self_attn, &mut l.mlp);
            for (n, lin) in [
                ("self_attn.q_proj", &mut a.q_proj),
                ("self_attn.k_proj", &mut a.k_proj),
                ("self_attn.v_proj", &mut a.v_proj),
                ("self_attn.o_proj", &mut a.o_proj),
                ("mlp.gate_proj", &mut m.gate_proj),
                ("mlp.up_proj", &mut m.up_proj),
                ("mlp.down_proj", &mut m.down_proj),
            ] {
                out.push((format!("model.layers.{i}.{n}"), lin));
            }
        }
        out
    }

    /// Runs the decoder: `batch.ids [b, t]` -> final-normed hidden states `[b, t, hidden]`.
    ///
    /// With a cache, keys/values of this call are appended and attention covers the cached
    /// positions (`batch.bias` must then be `[b, 1, t, past + t]`). `grad` selects the
    /// differentiable op composites instead of the fused no-backward kernels.
    pub fn forward(
        &self,
        batch: &Batch,
        mut cache: Option<&mut KvCache>,
        grad: bool,
    ) -> Result<Tensor> {
        if let Some(cache) = cache.as_deref() {
            if cache.num_layers() != self.layers.len() {
                return Err(ModelError::Invalid(
                    "KV cache was created for a model with another layer count".into(),
                ));
            }
        }
        let (mut x, cos, sin) = self.embed(batch)?;
        if grad && cache.is_none() && crate::checkpoint::active(self) {
            let m = self.clone();
            let bias = batch.bias.clone();
            let step: crate::checkpoint::LayerFn = std::rc::Rc::new(move |li, x| {
                let layer = &m.layers[li];
                let (q, k, v) = m.layer_qkv(layer, x, &cos, &sin, true)?;
                let attn = ops::attention_rows(&q, &k, &v, &bias, true)?;
                m.layer_out(layer, x.clone(), &attn, true)
            });
            let n = self.layers.len();
            let x = crate::checkpoint::run_layers(self, x, n, self.dropout_counters(), step)?;
            return self.final_norm(&x, grad);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = self.layer_qkv(layer, &x, &cos, &sin, grad)?;
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => cache.append(li, &k, &v)?,
                None => (k, v),
            };
            let attn = ops::attention_rows(&q, &k, &v, &batch.bias, grad)?;
            x = self.layer_out(layer, x, &attn, grad)?;
        }
        self.final_norm(&x, grad)
    }

    /// Input norm, q/k/v projections, q/k norms and rotary embedding of one layer:
    /// `x [b, t, hidden]` -> `q [b, heads, t, d]`, `k, v [b, kv_heads, t, d]`.
    pub(crate) fn layer_qkv(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        grad: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let p = self.layer_proj(layer, x, grad)?;
        self.layer_heads(layer, &p, cos, sin, grad)
    }

    /// Input norm and q/k/v projections of one layer over `x [b, t, hidden]`: the first half
    /// of [`Self::layer_qkv`]. Rows are independent here, so callers may project rows of
    /// several batches in one call and split the result ([`QkvProj::rows`]).
    pub(crate) fn layer_proj(&self, layer: &Layer, x: &Tensor, grad: bool) -> Result<QkvProj> {
        let c = &self.config;
        let hs = ops::rms_norm(x, &layer.input_layernorm, c.rms_norm_eps, grad)?;
        let a = &layer.self_attn;
        Ok(QkvProj {
            fused: a.q_norm.is_none() && ops::use_fused(&hs, grad),
            q: a.q_proj.forward_t(&hs, grad)?,
            k: a.k_proj.forward_t(&hs, grad)?,
            v: a.v_proj.forward_t(&hs, grad)?,
        })
    }

    /// The second half of [`Self::layer_qkv`]: heads, q/k norms and rotation of projections
    /// `[b, t, n * d]` with rotary tables `cos, sin [b, t, d / 2]`.
    pub(crate) fn layer_heads(
        &self,
        layer: &Layer,
        p: &QkvProj,
        cos: &Tensor,
        sin: &Tensor,
        grad: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.config;
        let (b, t, _) = p.q.dims3()?;
        let hd = c.head_dim;
        let a = &layer.self_attn;
        let (nh, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        if p.fused {
            // Rotation straight from the projections' rows: no reshape/transpose nodes.
            let (cos, sin) = (cos.to_dtype(p.q.dtype())?, sin.to_dtype(p.q.dtype())?);
            let q = rlft_kernels::fused::rope::rope_rows(&p.q, nh, &cos, &sin)?;
            let k = rlft_kernels::fused::rope::rope_rows(&p.k, nkv, &cos, &sin)?;
            let v = p.v.reshape((b, t, nkv, hd))?.transpose(1, 2)?;
            return Ok((q, k, v));
        }
        let heads = |x: &Tensor, n: usize| x.reshape((b, t, n, hd))?.transpose(1, 2);
        let mut q = heads(&p.q, nh)?;
        let mut k = heads(&p.k, nkv)?;
        let v = heads(&p.v, nkv)?;
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            q = ops::rms_norm(&q, qn, c.rms_norm_eps, grad)?;
            k = ops::rms_norm(&k, kn, c.rms_norm_eps, grad)?;
        }
        let q = ops::apply_rope(&q, cos, sin, grad)?;
        let k = ops::apply_rope(&k, cos, sin, grad)?;
        Ok((q, k, v))
    }

    /// The rest of a layer after attention: output projection and residual, then the MLP
    /// block. `x` is the layer's input, `attn [b, t, heads * d]` ([`ops::attention_rows`]).
    pub(crate) fn layer_out(
        &self,
        layer: &Layer,
        x: Tensor,
        attn: &Tensor,
        grad: bool,
    ) -> Result<Tensor> {
        let c = &self.config;
        let x = (x + layer.self_attn.o_proj.forward_t(attn, grad)?)?;
        let hs = ops::rms_norm(&x, &layer.post_attention_layernorm, c.rms_norm_eps, grad)?;
        let m = &layer.mlp;
        let (gate, up) = (
            m.gate_proj.forward_t(&hs, grad)?,
            m.up_proj.forward_t(&hs, grad)?,
        );
        let act = if ops::use_fused(&gate, grad) {
            rlft_kernels::fused::act::swiglu(&gate, &up)?
        } else {
            (gate.silu()? * up)?
        };
        Ok((x + m.down_proj.forward_t(&act, grad)?)?)
    }

    /// Token embeddings and rotary tables of a batch: `(x [b, t, hidden], cos, sin)`.
    pub(crate) fn embed(&self, batch: &Batch) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t) = batch.ids.dims2()?;
        let (cos, sin) = self.rope_tables(batch)?;
        let x =
            self.embed_ids(&batch.ids.flatten_all()?)?
                .reshape((b, t, self.config.hidden_size))?;
        Ok((x, cos, sin))
    }

    /// Token embeddings of flat ids `[n]` (u32) -> `[n, hidden]`.
    pub(crate) fn embed_ids(&self, ids: &Tensor) -> Result<Tensor> {
        self.embed_tokens.rows(ids)
    }

    /// Rotary tables `cos, sin [b, t, d / 2]` at a batch's positions.
    pub(crate) fn rope_tables(&self, batch: &Batch) -> Result<(Tensor, Tensor)> {
        ops::rope_tables(&self.inv_freq, &batch.positions)
    }

    /// The final norm.
    pub(crate) fn final_norm(&self, x: &Tensor, grad: bool) -> Result<Tensor> {
        ops::rms_norm(x, &self.norm, self.config.rms_norm_eps, grad)
    }

    /// Logits of chosen hidden rows: `hidden [n, hidden] -> [n, vocab]` in f32 (f64 for f64
    /// models, see [`ops::compute_dtype`]).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.require_lm_head()?;
        let w = match self.lm_head_weight() {
            Weight::Dense(w) => w,
            Weight::Quant(q) => return Self::quant_logits(hidden, q),
        };
        if let Some(y) = ops::inference_small_matmul(hidden, w, None)? {
            return Ok(y);
        }
        // A frozen head under a graph: backward computes d(hidden) only, not the [vocab, hidden]
        // gradient of the head.
        let y = if hidden.track_op() && !w.track_op() && ops::frozen_ops_enabled() {
            ops::frozen_linear(&hidden.contiguous()?, w, None)?
        } else {
            hidden.matmul(&w.t()?)?
        };
        Ok(y.to_dtype(ops::compute_dtype(y.dtype()))?)
    }

    /// [`Self::logits`] from a head kept in GGUF blocks: the decode kernel for a few rows
    /// without a graph, else the chunked product (gradient to `hidden`).
    fn quant_logits(hidden: &Tensor, q: &Arc<QuantWeight>) -> Result<Tensor> {
        let (m, _) = hidden.dims2()?;
        if !hidden.track_op() && m <= rlft_kernels::stream::SMALL_M {
            let x: Vec<f32> = hidden.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            let mut y = vec![0f32; m * q.dims().0];
            q.matmul_wt(&x, m, &mut y);
            return Ok(Tensor::from_vec(y, (m, q.dims().0), hidden.device())?);
        }
        Ok(rlft_kernels::fused::quant_linear::quant_linear(
            &hidden.to_dtype(DType::F32)?,
            q,
            None,
        )?)
    }

    /// Logits at one position per row: `hidden [b, t, h]`, `pos[r]` -> `[b, vocab]` f32.
    pub fn logits_at(&self, hidden: &Tensor, pos: &[usize]) -> Result<Tensor> {
        let (b, t, h) = hidden.dims3()?;
        let idx: Vec<u32> = pos
            .iter()
            .enumerate()
            .map(|(r, &p)| (r * t + p.min(t - 1)) as u32)
            .collect();
        let idx = Tensor::from_vec(idx, b, hidden.device())?;
        let rows = hidden.reshape((b * t, h))?.index_select(&idx, 0)?;
        self.logits(&rows)
    }

    /// Log-probabilities of `targets` under the model: `hidden [n, h]`, `targets [n]` (u32)
    /// -> `[n]` f32 (f64 for f64 models), computed `chunk` rows at a time so `[n, vocab]` is
    /// never whole in memory. Differentiable when `hidden` is.
    pub fn target_logprobs(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        chunk: usize,
    ) -> Result<Tensor> {
        Ok(self
            .target_logprobs_entropy(hidden, targets, chunk, false)?
            .0)
    }

    /// [`Self::target_logprobs`] plus, when `entropy`, the entropy of each row's next-token
    /// distribution `[n]` (detached: a metric, no graph), from the same logits chunks.
    ///
    /// f32/f64 models on the CPU (with [`rlft_kernels::fused`] on) take the fused head
    /// ([`rlft_kernels::fused::head::lm_head_logprobs`]), which blocks rows and vocabulary itself and
    /// ignores `chunk`; its backward also gives the head's gradient when the head is trainable.
    pub fn target_logprobs_entropy(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        chunk: usize,
        entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.require_lm_head()?;
        let fused = rlft_kernels::fused::enabled_for(hidden);
        let w = match self.lm_head_weight() {
            Weight::Quant(q) if fused && hidden.dtype() == DType::F32 => {
                return Ok(rlft_kernels::fused::quant_head::quant_lm_head_logprobs(
                    hidden, q, targets, entropy,
                )?);
            }
            Weight::Quant(_) => None,
            Weight::Dense(w) => Some(w),
        };
        if let Some(w) =
            w.filter(|w| fused && w.dtype() == hidden.dtype() && matches!(w.device(), Device::Cpu))
        {
            return Ok(rlft_kernels::fused::head::lm_head_logprobs(
                hidden, w, targets, entropy,
            )?);
        }
        let n = hidden.dim(0)?;
        let chunk = chunk.max(1);
        let mut parts = Vec::with_capacity(n.div_ceil(chunk));
        let mut ents = Vec::new();
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let logits = self.logits(&hidden.narrow(0, start, len)?)?;
            let lse = logits.log_sum_exp(D::Minus1)?;
            if entropy {
                // H = lse - sum(p * logits), p = exp(logits - lse).
                let (l, m) = (logits.detach(), lse.detach());
                let p = l.broadcast_sub(&m.unsqueeze(1)?)?.exp()?;
                ents.push((m - (p * &l)?.sum(D::Minus1)?)?);
            }
            let tgt = targets.narrow(0, start, len)?.unsqueeze(1)?;
            let picked = logits.gather(&tgt, 1)?.squeeze(1)?;
            parts.push((picked - lse)?);
            start += len;
        }
        let ent = if entropy {
            Some(Tensor::cat(&ents, 0)?)
        } else {
            None
        };
        Ok((Tensor::cat(&parts, 0)?, ent))
    }
}

/// The q/k/v projections of one layer, `[b, t, n * d]` each ([`CausalLm::layer_proj`]).
#[derive(Debug, Clone)]
pub(crate) struct QkvProj {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    /// Whether the fused rotation kernel applies (no q/k norms, fused kernels enabled).
    pub(crate) fused: bool,
}

impl QkvProj {
    /// Rows `start..start + b * t` of projections over `[1, rows, _]`, as `[b, t, _]`.
    pub(crate) fn rows(&self, start: usize, b: usize, t: usize) -> Result<QkvProj> {
        let part = |x: &Tensor| -> Result<Tensor> {
            let f = x.dim(2)?;
            Ok(x.narrow(1, start, b * t)?.reshape((b, t, f))?)
        };
        Ok(QkvProj {
            q: part(&self.q)?,
            k: part(&self.k)?,
            v: part(&self.v)?,
            fused: self.fused,
        })
    }
}

impl crate::checkpoint::Checkpointed for CausalLm {}

impl CausalLm {
    /// Per layer, the LoRA dropout draw counters of its adapters (for
    /// [`crate::checkpoint`]'s replay).
    pub(crate) fn dropout_counters(
        &self,
    ) -> Vec<Vec<std::sync::Arc<std::sync::atomic::AtomicU64>>> {
        self.layers
            .iter()
            .map(|l| {
                let a = &l.self_attn;
                let m = &l.mlp;
                [
                    &a.q_proj,
                    &a.k_proj,
                    &a.v_proj,
                    &a.o_proj,
                    &m.gate_proj,
                    &m.up_proj,
                    &m.down_proj,
                ]
                .iter()
                .filter_map(|lin| lin.lora.as_ref().map(|l| l.draws.clone()))
                .collect()
            })
            .collect()
    }
}
