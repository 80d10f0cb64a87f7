//! The slice kernels of a fused decoder forward pass (generation's prefill and decode steps):
//! products that stream or call gemm by size ([`matmul`]), RMSNorm over rows, RoPE over heads,
//! and one token's attention over its sequence's cache ([`attend`]).
//!
//! A decode step is hundreds of small pieces of work between its matrix products; the pieces
//! below a size ([`serial`]) run on the calling thread, since handing them to the thread pool
//! costs more than the work. The model's decoder (`rlft_model::decode_fast`) calls these over
//! its weights and caches; inference only, no gradients.

use rayon::prelude::*;

use crate::math::{dot, exp_f32, sum};
use crate::stream::{dot_block, dot_block_into, matmul_wt};

/// Rows up to which every product of the fused forward streams its weights ([`matmul`]).
const STREAM_ROWS: usize = 192;
/// Rows up to which products whose output is no wider than their input stream.
const STREAM_NARROW_ROWS: usize = 256;

/// Whether [`matmul`] streams an `[m, k] @ [n, k]^T` product rather than calling gemm.
pub fn streams(m: usize, n: usize, k: usize) -> bool {
    m <= STREAM_ROWS || (m <= STREAM_NARROW_ROWS && n <= k)
}

/// `out [m, n] = x [m, k] @ w [n, k]^T`: the streaming kernel where it beats gemm ([`streams`]),
/// gemm otherwise. gemm packs both operands on every call, which a prefill's few dozen rows do
/// not amortise; the streaming kernel keeps a row group of `x` in L1 and writes its output row
/// by row, so it wins up to a couple of hundred rows (`matmul_bench prefill`,
/// docs/kernels.md).
pub fn matmul(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    if streams(m, n, k) {
        matmul_wt(x, m, k, w, n, None, out);
        return;
    }
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    let threads = rayon::current_num_threads();
    let par = if threads > 1 {
        ::gemm::Parallelism::Rayon(threads)
    } else {
        ::gemm::Parallelism::None
    };
    // SAFETY: the slices hold m*k, n*k and m*n elements (asserted) with the strides given
    // (row-major x and out; w read transposed: element (kk, j) is w[j * k + kk]).
    unsafe {
        ::gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// [`matmul`] for the small products of a LoRA update: on the calling thread when the
/// product is small (a decode step has 2 per linear layer; dispatching each to the pool costs
/// more than computing it).
pub fn low_rank_matmul(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    if m * n * k >= 1 << 20 {
        return matmul(x, m, k, w, n, out);
    }
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    // SAFETY: `out` holds `[m, n]` row-major (asserted), written by this thread alone.
    unsafe { dot_block_into(x, m, k, &w[..n * k], (out.as_mut_ptr(), n, 1)) }
}

/// RMSNorm of each `width`-sized row: `out = w * x / sqrt(mean(x^2) + eps)`.
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f64, width: usize, out: &mut [f32]) {
    let norm = |(xr, or): (&[f32], &mut [f32])| {
        let ms = dot(xr, xr) / width as f32;
        let inv = 1.0 / (ms + eps as f32).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = g * (v * inv);
        }
    };
    if serial(x.len()) {
        x.chunks(width).zip(out.chunks_mut(width)).for_each(norm);
    } else {
        x.par_chunks(width)
            .zip(out.par_chunks_mut(width))
            .for_each(norm);
    }
}

/// Whether work of about `elements` multiply-adds is done on the calling thread: below this
/// size handing it to the thread pool (a wake-up, a hand-over, a sleep) costs more than the
/// work. A decoding step has hundreds of such small steps (norms, activations, attention over
/// short caches) between its matmuls.
pub fn serial(elements: usize) -> bool {
    elements < 1 << 16
}

/// Rotates each `d`-wide head of `x` (HF "rotate half" convention).
pub fn rope_heads(x: &mut [f32], d: usize, cos: &[f32], sin: &[f32]) {
    let h = d / 2;
    for head in x.chunks_exact_mut(d) {
        for i in 0..h {
            let (a, b) = (head[i], head[i + h]);
            head[i] = a * cos[i] - b * sin[i];
            head[i + h] = b * cos[i] + a * sin[i];
        }
    }
}

/// The shapes of one layer's attention over a sequence's cache.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query heads per key/value head.
    pub groups: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Positions the cache holds per head (its row stride is `capacity * head_dim`).
    pub capacity: usize,
    /// The scores' scale, `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// Causal attention of one token over keys `0..len` of its sequence's cache: `q` holds the
/// token's query heads (`kv_heads * groups` of `head_dim`), `k` and `v` the cache,
/// `[kv_heads, capacity, head_dim]`; writes the heads' outputs to `out` (as `q`). The inner
/// loops run compiled for AVX2 + FMA where the CPU has them.
pub fn attend(q: &[f32], k: &[f32], v: &[f32], len: usize, s: AttentionShape, out: &mut [f32]) {
    let AttentionShape {
        kv_heads: nkv,
        groups,
        head_dim: hd,
        capacity: cap,
        scale,
    } = s;
    crate::simd!({
        // Per key group: the scores of its `groups` query heads against every key in one
        // register-tiled product (keys are the "weight rows": `t[j * groups + h]`), then each
        // head's softmax, then the values, each read once for the group.
        let mut t = vec![0f32; len * groups];
        let mut w = vec![0f32; groups * len];
        for g in 0..nkv {
            let base = g * cap * hd;
            let qg = &q[g * groups * hd..(g + 1) * groups * hd];
            dot_block(qg, groups, hd, &k[base..base + len * hd], &mut t);
            for (hh, wh) in w.chunks_exact_mut(len).enumerate() {
                let mut max = f32::NEG_INFINITY;
                for (j, s) in wh.iter_mut().enumerate() {
                    *s = t[j * groups + hh] * scale;
                    max = max.max(*s);
                }
                // Separate loops: the exponentials vectorise, the sum has 8 lanes.
                for s in wh.iter_mut() {
                    *s = exp_f32(*s - max);
                }
                let sum = sum(wh);
                wh.iter_mut().for_each(|s| *s /= sum);
            }
            let o = &mut out[g * groups * hd..(g + 1) * groups * hd];
            o.fill(0.0);
            for j in 0..len {
                let vv = &v[base + j * hd..base + (j + 1) * hd];
                for (hh, oh) in o.chunks_exact_mut(hd).enumerate() {
                    let wj = w[hh * len + j];
                    oh.iter_mut().zip(vv).for_each(|(o, &x)| *o += wj * x);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token's attention against a plain softmax over the same scores, two key groups of
    /// two query heads, a cache with room to spare.
    #[test]
    fn attend_matches_a_plain_softmax() {
        let s = AttentionShape {
            kv_heads: 2,
            groups: 2,
            head_dim: 8,
            capacity: 7,
            scale: 1.0 / 8f32.sqrt(),
        };
        let len = 5;
        let val = |i: usize, m: usize| ((i * m) % 17) as f32 / 8.0 - 1.0;
        let q: Vec<f32> = (0..4 * 8).map(|i| val(i, 5)).collect();
        let k: Vec<f32> = (0..2 * 7 * 8).map(|i| val(i, 3)).collect();
        let v: Vec<f32> = (0..2 * 7 * 8).map(|i| val(i, 7)).collect();
        let mut out = vec![f32::NAN; 4 * 8];
        attend(&q, &k, &v, len, s, &mut out);
        for h in 0..4 {
            let g = h / 2;
            let scores: Vec<f64> = (0..len)
                .map(|j| {
                    (0..8)
                        .map(|d| q[h * 8 + d] as f64 * k[(g * 7 + j) * 8 + d] as f64)
                        .sum::<f64>()
                        * s.scale as f64
                })
                .collect();
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
            let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..8 {
                let want: f64 = (0..len)
                    .map(|j| e[j] / z * v[(g * 7 + j) * 8 + d] as f64)
                    .sum();
                let got = out[h * 8 + d] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "head {h} dim {d}: {got} vs {want}"
                );
            }
        }
    }
}
