//! A fused forward pass for f32 models on the CPU, used by generation for prefill and decoding.
//!
//! Every sequence ("row") owns its KV cache, and a call appends any number of tokens to each
//! row: the tokens of all rows are packed into one `[N, hidden]` matrix (no padding), the
//! linear layers run as one gemm over it (or as the streaming kernel when `N` is small, as in
//! decoding), and attention runs per token over its own row's cache. All work is on raw slices
//! with buffers reused across layers, so a decode step costs about what reading the weights
//! costs. It computes what [`CausalLm::forward`] computes (same formulas, same f32 rotary angles;
//! only summation order differs, ~1e-6), which the tests check. Inference only: no gradients.

use candle_core::{DType, Device, Storage, Tensor};
use rayon::prelude::*;

use rlft_kernels::decode::{
    attend, low_rank_matmul, matmul, rms_norm_rows, rope_heads, serial, streams, AttentionShape,
};
use rlft_kernels::quant::QuantWeight;
use rlft_kernels::stream::{matmul_wt, SMALL_M};

use crate::decoder::CausalLm;
use crate::error::{ModelError, Result};
use crate::weight::Weight;

/// Keys and values of one sequence: per layer `[kv_heads, capacity, head_dim]`.
#[derive(Debug, Clone)]
pub struct RowCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
    capacity: usize,
}

impl RowCache {
    /// An empty cache for `model` holding up to `capacity` positions.
    pub fn new(model: &CausalLm, capacity: usize) -> Self {
        let c = &model.config;
        let size = c.num_key_value_heads * capacity * c.head_dim;
        RowCache {
            k: (0..c.num_hidden_layers).map(|_| vec![0f32; size]).collect(),
            v: (0..c.num_hidden_layers).map(|_| vec![0f32; size]).collect(),
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

    /// Positions it has room for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Grows the room to at least `capacity` positions for `model` (the model it was made
    /// for), keeping what is stored: a grown cache continues bit for bit as one made that large.
    /// A server starts each sequence small and grows it as it decodes, instead of reserving its
    /// whole token budget up front.
    pub fn reserve(&mut self, model: &CausalLm, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        let (heads, hd) = (model.config.num_key_value_heads, model.config.head_dim);
        let (old_cap, len) = (self.capacity, self.len);
        let grow = |old: &mut Vec<f32>| {
            let mut new = vec![0f32; heads * capacity * hd];
            for g in 0..heads {
                let src = g * old_cap * hd;
                let dst = g * capacity * hd;
                new[dst..dst + len * hd].copy_from_slice(&old[src..src + len * hd]);
            }
            *old = new;
        };
        self.k.iter_mut().for_each(grow);
        self.v.iter_mut().for_each(grow);
        self.capacity = capacity;
    }
}

/// Whether the fused path applies to this model: f32 weights (and LoRA adapters) on the CPU.
pub fn supported(model: &CausalLm) -> bool {
    let f32_cpu = |t: &Tensor| matches!(t.device(), Device::Cpu) && t.dtype() == DType::F32;
    let f32_weight = |w: &Weight| w.dense().is_none_or(f32_cpu);
    f32_cpu(&model.norm)
        && f32_weight(&model.embed_tokens)
        && model.lm_head.as_ref().is_none_or(f32_weight)
        && model.linears().iter().all(|(_, l)| {
            f32_weight(&l.weight)
                && l.active_lora()
                    .is_none_or(|a| f32_cpu(&a.a) && f32_cpu(&a.b))
        })
}

/// Runs `f` on the f32 contents of a contiguous CPU tensor.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*st else {
        return Err(ModelError::Invalid(
            "fused forward needs CPU tensors".into(),
        ));
    };
    if !l.is_contiguous() {
        return Err(ModelError::Invalid(
            "fused forward needs contiguous weights".into(),
        ));
    }
    let s = cpu.as_slice::<f32>()?;
    Ok(f(
        &s[l.start_offset()..l.start_offset() + l.shape().elem_count()]
    ))
}

/// `out = x @ W^T (+ b) (+ s * x @ A^T @ B^T)` for a [`crate::ops::Linear`] over `m` packed
/// rows: the base product from the GGUF blocks while they mirror the weight and `m` is small,
/// from the f32 weight otherwise; the enabled LoRA adapter's update without dropout.
fn linear(l: &crate::ops::Linear, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
    let (n, k) = l.weight.dims2()?;
    let _t = rlft_kernels::op_time::span(if m <= SMALL_M {
        "decode linear"
    } else if streams(m, n, k) {
        "prefill linear (streamed)"
    } else {
        "prefill linear (gemm)"
    });
    let out = &mut out[..m * n];
    match (block_weight(l, m), &l.weight) {
        (Some(q), _) => q.matmul_wt(x, m, out),
        (None, Weight::Quant(q)) => q.xwt(x, m, out, false),
        (None, Weight::Dense(w)) => with_f32(w, |w| matmul(x, m, k, w, n, out))?,
    }
    bias_and_adapter(l, x, m, out)
}

/// The GGUF blocks a decode step (`m` small) reads instead of an f32 weight, if any: the
/// weight's own blocks, or those kept beside a dense weight while they mirror it.
fn block_weight(l: &crate::ops::Linear, m: usize) -> Option<&QuantWeight> {
    if m > SMALL_M {
        return None;
    }
    match &l.weight {
        Weight::Quant(q) => Some(q),
        Weight::Dense(w) => l.quant.as_deref().filter(|q| q.mirrors(w)),
    }
}

/// [`linear`] for layers reading the same `x` (q/k/v; gate/up): when all decode from GGUF
/// blocks, their products run as one parallel loop.
fn linears(ls: &[&crate::ops::Linear], x: &[f32], m: usize, outs: &mut [&mut [f32]]) -> Result<()> {
    let blocks: Option<Vec<&QuantWeight>> = ls.iter().map(|l| block_weight(l, m)).collect();
    let Some(blocks) = blocks else {
        // `linear` times each product.
        for (l, o) in ls.iter().zip(outs.iter_mut()) {
            linear(l, x, m, o)?;
        }
        return Ok(());
    };
    let _t = rlft_kernels::op_time::span("decode linear");
    let mut sized: Vec<&mut [f32]> = Vec::with_capacity(ls.len());
    // `block_weight` only returns blocks that mirror their layer's weight (same shape).
    for (o, q) in outs.iter_mut().zip(&blocks) {
        sized.push(&mut o[..m * q.dims().0]);
    }
    QuantWeight::matmul_wt_many(&blocks, x, m, &mut sized);
    for (l, o) in ls.iter().zip(sized.iter_mut()) {
        bias_and_adapter(l, x, m, o)?;
    }
    Ok(())
}

/// Adds `l`'s bias and its enabled adapter's update (no dropout) to `out [m, n] = x @ W^T`.
fn bias_and_adapter(l: &crate::ops::Linear, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
    let (n, k) = l.weight.dims2()?;
    if let Some(b) = &l.bias {
        with_f32(b, |b| {
            out.par_chunks_mut(n)
                .for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b))
        })?;
    }
    if let Some(lora) = l.active_lora() {
        let r = lora.a.dim(0)?;
        let mut xa = vec![0f32; m * r];
        with_f32(&lora.a, |a| low_rank_matmul(x, m, k, a, r, &mut xa))?;
        let s = lora.scaling as f32;
        xa.iter_mut().for_each(|v| *v *= s);
        let mut delta = vec![0f32; m * n];
        with_f32(&lora.b, |b| low_rank_matmul(&xa, m, r, b, n, &mut delta))?;
        out.iter_mut().zip(&delta).for_each(|(o, d)| *o += d);
    }
    Ok(())
}

/// Reusable activations for `n` packed tokens.
struct Buffers {
    x: Vec<f32>,
    hs: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

/// Tokens at the start of every prompt that a shared prefill computes once: the longest common
/// prefix, less at least one token of each prompt (its last position gives the prompt's logits).
/// Zero for a single prompt.
pub fn shared_prefix_len(prompts: &[Vec<u32>]) -> usize {
    let Some((first, rest)) = prompts.split_first() else {
        return 0;
    };
    if rest.is_empty() {
        return 0;
    }
    let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
    let common = rest.iter().fold(first.len(), |l, p| {
        first[..l].iter().zip(p).take_while(|(a, b)| a == b).count()
    });
    common.min(shortest.saturating_sub(1))
}

/// Prefills one cache per prompt (each with room for `extra` more positions after the longest
/// prompt) and returns them with each prompt's next-token logits `[vocab]`. The tokens all
/// prompts start with (chat template, system prompt, shared instructions: see
/// [`shared_prefix_len`]) are computed once and their keys/values copied into every row, so
/// only the differing tails run per prompt. Same result as prefilling each prompt alone, up to
/// summation order.
pub fn prefill(
    model: &CausalLm,
    prompts: &[Vec<u32>],
    extra: usize,
) -> Result<(Vec<RowCache>, Vec<Vec<f32>>)> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = longest + extra;
    let shared = shared_prefix_len(prompts);
    let mut caches = if shared > 0 {
        let mut prefix = vec![RowCache::new(model, capacity)];
        run(model, &mut prefix, &[prompts[0][..shared].to_vec()], false)?;
        vec![prefix.remove(0); prompts.len()]
    } else {
        (0..prompts.len())
            .map(|_| RowCache::new(model, capacity))
            .collect()
    };
    let tails: Vec<Vec<u32>> = prompts.iter().map(|p| p[shared..].to_vec()).collect();
    let logits = run(model, &mut caches, &tails, true)?;
    Ok((caches, logits))
}

/// Appends `tokens[r]` to row `r` for every row and returns the logits `[vocab]` after the last
/// appended token of each row. Rows with no tokens are not allowed.
pub fn forward(
    model: &CausalLm,
    rows: &mut [RowCache],
    tokens: &[Vec<u32>],
) -> Result<Vec<Vec<f32>>> {
    run(model, rows, tokens, true)
}

/// [`forward`]; without `logits` it only fills the caches (no final norm or LM head) and
/// returns no rows.
fn run(
    model: &CausalLm,
    rows: &mut [RowCache],
    tokens: &[Vec<u32>],
    logits: bool,
) -> Result<Vec<Vec<f32>>> {
    let c = &model.config;
    let (h, nh, nkv, hd) = (
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    );
    let groups = nh / nkv;
    let eps = c.rms_norm_eps;
    if tokens.len() != rows.len() || tokens.iter().any(Vec::is_empty) {
        return Err(ModelError::Invalid(
            "fused forward needs one non-empty token list per row".into(),
        ));
    }
    for (row, t) in rows.iter().zip(tokens) {
        if row.len + t.len() > row.capacity {
            return Err(ModelError::Invalid(format!(
                "KV cache full: {} + {} positions exceed its capacity {}; use a capacity of \
                 prompt length + max_new_tokens",
                row.len,
                t.len(),
                row.capacity
            )));
        }
    }
    // Packed token index -> (row, offset in the row's new tokens).
    let owner: Vec<(usize, usize)> = tokens
        .iter()
        .enumerate()
        .flat_map(|(r, t)| (0..t.len()).map(move |i| (r, i)))
        .collect();
    let n = owner.len();
    let i_sz = c.intermediate_size;
    let mut b = Buffers {
        x: vec![0f32; n * h],
        hs: vec![0f32; n * h],
        q: vec![0f32; n * nh * hd],
        k: vec![0f32; n * nkv * hd],
        v: vec![0f32; n * nkv * hd],
        attn: vec![0f32; n * nh * hd],
        o: vec![0f32; n * h],
        gate: vec![0f32; n * i_sz],
        up: vec![0f32; n * i_sz],
    };
    match &model.embed_tokens {
        Weight::Dense(e) => with_f32(e, |e| {
            for (p, &(r, i)) in owner.iter().enumerate() {
                let t = tokens[r][i] as usize;
                b.x[p * h..(p + 1) * h].copy_from_slice(&e[t * h..(t + 1) * h]);
            }
        })?,
        Weight::Quant(q) => {
            let ids: Vec<u32> = owner.iter().map(|&(r, i)| tokens[r][i]).collect();
            q.gather_rows(&ids, &mut b.x[..n * h]);
        }
    }
    // Rotary tables per token: angle = position * inv_freq in f32, as the tensor path.
    let inv = crate::config::inv_freq(&c.rope, hd);
    let half = hd / 2;
    let mut cos = vec![0f32; n * half];
    let mut sin = vec![0f32; n * half];
    for (p, &(r, i)) in owner.iter().enumerate() {
        let pos = (rows[r].len + i) as f32;
        for (j, f) in inv.iter().enumerate() {
            cos[p * half + j] = (pos * f).cos();
            sin[p * half + j] = (pos * f).sin();
        }
    }
    let scale = 1.0 / (hd as f32).sqrt();
    for (li, layer) in model.layers.iter().enumerate() {
        with_f32(&layer.input_layernorm, |w| {
            rms_norm_rows(&b.x, w, eps, h, &mut b.hs)
        })?;
        let a = &layer.self_attn;
        linears(
            &[&a.q_proj, &a.k_proj, &a.v_proj],
            &b.hs,
            n,
            &mut [&mut b.q, &mut b.k, &mut b.v],
        )?;
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            let qc = b.q.clone();
            with_f32(qn, |w| rms_norm_rows(&qc, w, eps, hd, &mut b.q))?;
            let kc = b.k.clone();
            with_f32(kn, |w| rms_norm_rows(&kc, w, eps, hd, &mut b.k))?;
        }
        for p in 0..n {
            let (cs, sn) = (
                &cos[p * half..(p + 1) * half],
                &sin[p * half..(p + 1) * half],
            );
            rope_heads(&mut b.q[p * nh * hd..(p + 1) * nh * hd], hd, cs, sn);
            rope_heads(&mut b.k[p * nkv * hd..(p + 1) * nkv * hd], hd, cs, sn);
        }
        // Write the new keys/values into each row's cache.
        for (p, &(r, i)) in owner.iter().enumerate() {
            let row = &mut rows[r];
            let (cap, pos) = (row.capacity, row.len + i);
            for g in 0..nkv {
                let dst = (g * cap + pos) * hd;
                let src = (p * nkv + g) * hd;
                row.k[li][dst..dst + hd].copy_from_slice(&b.k[src..src + hd]);
                row.v[li][dst..dst + hd].copy_from_slice(&b.v[src..src + hd]);
            }
        }
        // Causal attention of each token over its row's keys 0..=position.
        let rows_ref: &[RowCache] = rows;
        let q = &b.q;
        let shape = |cap| AttentionShape {
            kv_heads: nkv,
            groups,
            head_dim: hd,
            capacity: cap,
            scale,
        };
        let attend_token = |(p, out): (usize, &mut [f32])| {
            let (r, i) = owner[p];
            let row = &rows_ref[r];
            let (k, v) = (&row.k[li], &row.v[li]);
            let q = &q[p * nh * hd..(p + 1) * nh * hd];
            attend(q, k, v, row.len + i + 1, shape(row.capacity), out);
        };
        let _t = rlft_kernels::op_time::span(if n <= SMALL_M {
            "decode attention"
        } else {
            "prefill attention"
        });
        let scores: usize = owner.iter().map(|&(r, i)| rows_ref[r].len + i + 1).sum();
        // Multiply-adds: q.k and the weighted sum of values over every (token, head, key).
        if serial(scores * nh * hd * 2) {
            b.attn
                .chunks_mut(nh * hd)
                .enumerate()
                .for_each(attend_token);
        } else {
            b.attn
                .par_chunks_mut(nh * hd)
                .enumerate()
                .for_each(attend_token);
        }
        drop(_t);
        linear(&a.o_proj, &b.attn, n, &mut b.o)?;
        b.x.iter_mut().zip(&b.o).for_each(|(x, o)| *x += o);
        with_f32(&layer.post_attention_layernorm, |w| {
            rms_norm_rows(&b.x, w, eps, h, &mut b.hs)
        })?;
        linears(
            &[&layer.mlp.gate_proj, &layer.mlp.up_proj],
            &b.hs,
            n,
            &mut [&mut b.gate, &mut b.up],
        )?;
        let swiglu =
            |(g, u): (&mut [f32], &[f32])| rlft_kernels::fused::act::silu_mul_in_place(g, u);
        if serial(n * i_sz) {
            b.gate
                .chunks_mut(i_sz)
                .zip(b.up.chunks(i_sz))
                .for_each(swiglu);
        } else {
            b.gate
                .par_chunks_mut(i_sz)
                .zip(b.up.par_chunks(i_sz))
                .for_each(swiglu);
        }
        linear(&layer.mlp.down_proj, &b.gate, n, &mut b.o)?;
        b.x.iter_mut().zip(&b.o).for_each(|(x, o)| *x += o);
    }
    for (row, t) in rows.iter_mut().zip(tokens) {
        row.len += t.len();
    }
    if !logits {
        return Ok(Vec::new());
    }
    // Final norm and LM head only at each row's last new token.
    let mut last = Vec::with_capacity(rows.len() * h);
    let mut end = 0;
    for t in tokens {
        end += t.len();
        last.extend_from_slice(&b.x[(end - 1) * h..end * h]);
    }
    let _t = rlft_kernels::op_time::span("decode lm-head");
    let m = tokens.len();
    let mut normed = vec![0f32; m * h];
    with_f32(&model.norm, |w| {
        rms_norm_rows(&last, w, eps, h, &mut normed)
    })?;
    let vocab = c.vocab_size;
    let mut logits = vec![0f32; m * vocab];
    let head = match model.lm_head_weight() {
        Weight::Quant(q) => Some(q.as_ref()),
        Weight::Dense(w) => model.head_quant.as_deref().filter(|q| q.mirrors(w)),
    };
    match (head, model.lm_head_weight()) {
        // One row per sequence: the streaming kernels, whatever the batch.
        (Some(q), _) => q.matmul_wt(&normed, m, &mut logits),
        (None, w) => {
            let w = w.dense().expect("a head without blocks is dense");
            with_f32(w, |w| matmul_wt(&normed, m, h, w, vocab, None, &mut logits))?
        }
    }
    Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::tiny::{random_model, tiny_config};

    #[test]
    fn shared_prefix_keeps_a_token_of_each_prompt() {
        let p = |v: &[u32]| v.to_vec();
        assert_eq!(shared_prefix_len(&[]), 0);
        assert_eq!(shared_prefix_len(&[p(&[1, 2, 3])]), 0);
        assert_eq!(shared_prefix_len(&[p(&[1, 2, 3, 4]), p(&[1, 2, 3, 5])]), 3);
        assert_eq!(shared_prefix_len(&[p(&[1, 2, 3]), p(&[1, 2, 3, 4])]), 2);
        assert_eq!(shared_prefix_len(&[p(&[1, 2]), p(&[1, 2]), p(&[1, 2])]), 1);
        assert_eq!(shared_prefix_len(&[p(&[1, 2]), p(&[2, 2])]), 0);
        assert_eq!(
            shared_prefix_len(&[p(&[1, 2, 3]), p(&[1, 2, 4]), p(&[1, 9])]),
            1
        );
    }

    #[test]
    fn a_grown_cache_continues_as_a_large_one() {
        let model = random_model(tiny_config(Family::Qwen2), 4, DType::F32, &Device::Cpu).unwrap();
        let prompt = vec![vec![5u32, 6, 7, 8, 9]];
        let mut small = vec![RowCache::new(&model, 6)];
        let mut large = vec![RowCache::new(&model, 12)];
        forward(&model, &mut small, &prompt).unwrap();
        forward(&model, &mut large, &prompt).unwrap();
        small[0].reserve(&model, 4);
        assert_eq!(small[0].capacity(), 6, "reserve never shrinks");
        small[0].reserve(&model, 12);
        assert_eq!((small[0].capacity(), small[0].len()), (12, 5));
        for t in [3u32, 4, 11, 2] {
            let a = forward(&model, &mut small, &[vec![t]]).unwrap();
            let b = forward(&model, &mut large, &[vec![t]]).unwrap();
            assert_eq!(
                a, b,
                "token {t}: a grown cache decodes bit for bit as a large one"
            );
        }
    }

    #[test]
    fn shared_prefill_equals_separate_prefills() {
        let model = random_model(tiny_config(Family::Llama), 3, DType::F32, &Device::Cpu).unwrap();
        let prompts = vec![
            vec![5u32, 6, 7, 8, 9, 10, 11],
            vec![5u32, 6, 7, 8, 20],
            vec![5u32, 6, 7, 8, 9],
        ];
        let (mut shared, logits) = prefill(&model, &prompts, 3).unwrap();
        assert!(shared.iter().zip(&prompts).all(|(c, p)| c.len() == p.len()));
        for (i, p) in prompts.iter().enumerate() {
            let mut alone = vec![RowCache::new(&model, shared[i].capacity)];
            let want = forward(&model, &mut alone, std::slice::from_ref(p)).unwrap();
            let d = want[0]
                .iter()
                .zip(&logits[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d < 1e-4, "prompt {i}: logits differ by {d}");
            // The caches continue the same way.
            let next = vec![vec![3u32]];
            let a = forward(&model, &mut alone, &next).unwrap();
            let b = forward(&model, std::slice::from_mut(&mut shared[i]), &next).unwrap();
            let d = a[0]
                .iter()
                .zip(&b[0])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(d < 1e-4, "prompt {i}: next-token logits differ by {d}");
        }
    }
}
