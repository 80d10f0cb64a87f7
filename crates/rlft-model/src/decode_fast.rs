//! A fused decode step for f32 models on the CPU: one new token per row, all of a layer's work
//! on raw slices with no tensor allocations, so a step costs about what reading the weights
//! costs.
//!
//! It computes exactly what [`CausalLm::forward`] computes for `t = 1` with a KV cache (same
//! formulas, same f32 rounding of rotary angles; only summation order differs, ~1e-6). The
//! cache lives per row, so finished rows leave the batch for free and the `n` samples of a
//! prompt start from copies of its prefill. Used by [`crate::generate`] when the model is f32 on
//! the CPU; other devices and dtypes take the tensor path.

use candle_core::{DType, Device, Storage, Tensor};
use rayon::prelude::*;

use crate::decoder::CausalLm;
use crate::error::{ModelError, Result};
use crate::kernels::matmul_wt;
use crate::kv_cache::KvCache;

/// Keys and values of one sequence: per layer `[kv_heads, capacity, head_dim]`.
#[derive(Debug, Clone)]
pub struct RowCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    /// Positions stored (including left padding at the front).
    len: usize,
    /// Leading padding positions (never attended to).
    pad: usize,
}

impl RowCache {
    /// Positions stored so far (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Whether the fused path applies to this model (f32 weights on the CPU).
pub fn supported(model: &CausalLm) -> bool {
    matches!(model.device(), Device::Cpu) && model.dtype() == DType::F32
}

/// Splits a batched candle cache `[b, kvh, cap, d]` (after prefill) into per-row caches.
pub fn rows_from_cache(cache: &KvCache, pads: &[usize]) -> Result<Vec<RowCache>> {
    let len = cache.len();
    let cap = cache.capacity();
    let mut rows: Vec<RowCache> = pads
        .iter()
        .map(|&pad| RowCache {
            k: Vec::new(),
            v: Vec::new(),
            len,
            pad,
        })
        .collect();
    for layer in 0..cache.num_layers() {
        let (k, v) = cache
            .layer_buffers(layer)
            .ok_or_else(|| ModelError::Invalid("KV cache layer is empty".into()))?;
        for (src, is_k) in [(k, true), (v, false)] {
            let (b, kvh, c, d) = src.dims4()?;
            debug_assert_eq!(c, cap);
            let data: Vec<f32> = src.flatten_all()?.to_vec1()?;
            let per_row = kvh * c * d;
            for (r, row) in rows.iter_mut().enumerate().take(b) {
                let slice = data[r * per_row..(r + 1) * per_row].to_vec();
                if is_k {
                    row.k.push(slice);
                } else {
                    row.v.push(slice);
                }
            }
        }
    }
    Ok(rows)
}

/// Runs `f` on the f32 contents of a contiguous CPU tensor.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*st else {
        return Err(ModelError::Invalid("fused decode needs CPU tensors".into()));
    };
    if !l.is_contiguous() {
        return Err(ModelError::Invalid(
            "fused decode needs contiguous weights".into(),
        ));
    }
    let s = cpu.as_slice::<f32>()?;
    Ok(f(
        &s[l.start_offset()..l.start_offset() + l.shape().elem_count()]
    ))
}

/// `out [m, n] = x [m, k] @ W^T (+ b)` for a [`crate::ops::Linear`].
fn linear(l: &crate::ops::Linear, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
    let (n, k) = l.weight.dims2()?;
    let bias: Option<Vec<f32>> = match &l.bias {
        Some(b) => Some(b.to_vec1()?),
        None => None,
    };
    with_f32(&l.weight, |w| {
        matmul_wt(x, m, k, w, n, bias.as_deref(), out)
    })
}

/// RMSNorm of each `width`-sized row of `x` in place-out: `out = w * x / sqrt(mean(x^2) + eps)`.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f64, width: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let inv = 1.0 / (ms + eps as f32).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = g * (v * inv);
        }
    }
}

/// Rotates `x [heads, d]` at one position (HF "rotate half" convention).
fn rope_heads(x: &mut [f32], d: usize, cos: &[f32], sin: &[f32]) {
    let h = d / 2;
    for head in x.chunks_exact_mut(d) {
        for i in 0..h {
            let (a, b) = (head[i], head[i + h]);
            head[i] = a * cos[i] - b * sin[i];
            head[i + h] = b * cos[i] + a * sin[i];
        }
    }
}

/// One decode step: appends `tokens[r]` to every row and returns the logits `[rows, vocab]`.
pub fn step(model: &CausalLm, rows: &mut [RowCache], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let c = &model.config;
    let m = rows.len();
    let (h, nh, nkv, hd) = (
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    );
    let groups = nh / nkv;
    let eps = c.rms_norm_eps;
    let cap = rows
        .iter()
        .map(|r| r.k.first().map_or(0, |k| k.len() / (nkv * hd)))
        .min()
        .unwrap_or(0);
    if rows.iter().any(|r| r.len >= cap) {
        return Err(ModelError::Invalid(
            "KV cache full; create it with capacity prompt + max_new_tokens".into(),
        ));
    }
    // Embeddings.
    let mut x = vec![0f32; m * h];
    with_f32(&model.embed_tokens, |e| {
        for (r, &t) in tokens.iter().enumerate() {
            x[r * h..(r + 1) * h].copy_from_slice(&e[t as usize * h..(t as usize + 1) * h]);
        }
    })?;
    // Rotary tables per row: angle = position * inv_freq in f32, as the tensor path.
    let inv: Vec<f32> = crate::ops::inv_freq(&c.rope, hd);
    let (cos, sin): (Vec<Vec<f32>>, Vec<Vec<f32>>) = rows
        .iter()
        .map(|r| {
            let p = (r.len - r.pad) as f32;
            inv.iter().map(|f| ((p * f).cos(), (p * f).sin())).unzip()
        })
        .unzip();
    let mut hs = vec![0f32; m * h];
    let mut q = vec![0f32; m * nh * hd];
    let mut k = vec![0f32; m * nkv * hd];
    let mut v = vec![0f32; m * nkv * hd];
    let mut attn = vec![0f32; m * nh * hd];
    let mut o = vec![0f32; m * h];
    let i_sz = c.intermediate_size;
    let mut gate = vec![0f32; m * i_sz];
    let mut up = vec![0f32; m * i_sz];
    for (li, layer) in model.layers.iter().enumerate() {
        with_f32(&layer.input_layernorm, |w| {
            rms_norm_rows(&x, w, eps, h, &mut hs)
        })?;
        let a = &layer.self_attn;
        linear(&a.q_proj, &hs, m, &mut q)?;
        linear(&a.k_proj, &hs, m, &mut k)?;
        linear(&a.v_proj, &hs, m, &mut v)?;
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            let qc = q.clone();
            with_f32(qn, |w| rms_norm_rows(&qc, w, eps, hd, &mut q))?;
            let kc = k.clone();
            with_f32(kn, |w| rms_norm_rows(&kc, w, eps, hd, &mut k))?;
        }
        for r in 0..m {
            rope_heads(&mut q[r * nh * hd..(r + 1) * nh * hd], hd, &cos[r], &sin[r]);
            rope_heads(
                &mut k[r * nkv * hd..(r + 1) * nkv * hd],
                hd,
                &cos[r],
                &sin[r],
            );
            let row = &mut rows[r];
            let pos = row.len;
            for g in 0..nkv {
                let dst = (g * cap + pos) * hd;
                let src = (r * nkv + g) * hd;
                row.k[li][dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                row.v[li][dst..dst + hd].copy_from_slice(&v[src..src + hd]);
            }
        }
        // Attention: one task per (row, query head) over keys pad..=pos.
        let scale = 1.0 / (hd as f32).sqrt();
        let rows_ref: &[RowCache] = rows;
        attn.par_chunks_mut(hd).enumerate().for_each(|(idx, out)| {
            let (r, head) = (idx / nh, idx % nh);
            let g = head / groups;
            let row = &rows_ref[r];
            let qv = &q[idx * hd..(idx + 1) * hd];
            let (kc, vc) = (&row.k[li], &row.v[li]);
            let keys = row.pad..=row.len;
            let mut scores: Vec<f32> = keys
                .clone()
                .map(|j| {
                    let kv = &kc[(g * cap + j) * hd..(g * cap + j + 1) * hd];
                    qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            out.fill(0.0);
            for (j, p) in keys.zip(&scores) {
                let w = p / sum;
                let vv = &vc[(g * cap + j) * hd..(g * cap + j + 1) * hd];
                for (o, &x) in out.iter_mut().zip(vv) {
                    *o += w * x;
                }
            }
        });
        for row in rows.iter_mut() {
            if li + 1 == model.layers.len() {
                row.len += 1;
            }
        }
        linear(&a.o_proj, &attn, m, &mut o)?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        with_f32(&layer.post_attention_layernorm, |w| {
            rms_norm_rows(&x, w, eps, h, &mut hs)
        })?;
        linear(&layer.mlp.gate_proj, &hs, m, &mut gate)?;
        linear(&layer.mlp.up_proj, &hs, m, &mut up)?;
        gate.iter_mut().zip(&up).for_each(|(g, u)| {
            *g = *g / (1.0 + (-*g).exp()) * u;
        });
        linear(&layer.mlp.down_proj, &gate, m, &mut o)?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
    }
    with_f32(&model.norm, |w| rms_norm_rows(&x, w, eps, h, &mut hs))?;
    let vocab = c.vocab_size;
    let mut logits = vec![0f32; m * vocab];
    with_f32(model.lm_head_weight(), |w| {
        matmul_wt(&hs, m, h, w, vocab, None, &mut logits)
    })?;
    Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}
