//! The f32 streaming kernel: `x @ W^T` for few rows of `x`, each weight row read once.
//!
//! `x @ W^T` for few rows (decoding: one row per sequence) is bound by reading `W` from memory.
//! candle's gemm packs `W` into panels on every call, which triples that traffic; this kernel
//! streams each weight row once, computing its dot products with all rows of `x` (kept in L1),
//! split over threads by output column. Register tiles for AVX2 + FMA (`avx2`) and AVX-512
//! (`avx512`) on one tile loop (`tiles`), chosen at run time ([`crate::simd`](mod@crate::simd)); a portable
//! loop otherwise. No backward: training uses gemm, except for the LoRA factors' narrow
//! products ([`matmul_wt_rows`], called inside `fused::linear`'s forward and backward).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod tiles;

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

/// Rows of `x` up to which [`matmul_wt_small`] is used instead of gemm.
pub const SMALL_M: usize = 16;

/// Output columns per parallel task: about 8 tasks per thread (so work stealing evens out a
/// busy core), a multiple of 16 (whole 64-byte lines of an output row), at most 256.
///
/// Tasks write their columns of the row-major output in place, so where two tasks' columns
/// met inside a cache line, the two threads wrote that line of every row in turn and it moved
/// between their cores each time. Multiples of 16 columns keep every task's part of a row on
/// lines of its own (`tile_probe 2` compares task widths).
pub(crate) fn cols_per_task(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let per = n.div_ceil(threads * 8);
    per.div_ceil(16).clamp(1, 16) * 16
}

/// `x [m, k] @ w[n, k]^T (+ bias[n]) -> [m, n]` for small `m`, f32 on CPU.
/// Returns `None` when the inputs are not CPU f32 contiguous (callers fall back to gemm).
pub fn matmul_wt_small(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    if !matches!(x.device(), Device::Cpu)
        || x.dtype() != DType::F32
        || w.dtype() != DType::F32
        || !x.is_contiguous()
        || !w.is_contiguous()
    {
        return Ok(None);
    }
    let (m, k) = x.dims2()?;
    let (n, k2) = w.dims2()?;
    if k != k2 || m == 0 || m > SMALL_M {
        return Ok(None);
    }
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (candle_core::Storage::Cpu(xs), candle_core::Storage::Cpu(ws)) = (&*xs, &*ws) else {
        return Ok(None);
    };
    let xv = &xs.as_slice::<f32>()?[xl.start_offset()..xl.start_offset() + m * k];
    let wv = &ws.as_slice::<f32>()?[wl.start_offset()..wl.start_offset() + n * k];
    let bias_v: Option<Vec<f32>> = match bias {
        Some(b) => Some(b.to_vec1::<f32>()?),
        None => None,
    };
    let mut out = vec![0f32; m * n];
    matmul_wt(xv, m, k, wv, n, bias_v.as_deref(), &mut out);
    Ok(Some(Tensor::from_vec(out, (m, n), x.device())?))
}

/// Slice version of [`matmul_wt_small`]: `out [m, n] = x [m, k] @ w [n, k]^T (+ bias [n])`,
/// any `m` (rows are processed 8 at a time), parallel over output columns.
pub fn matmul_wt(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    assert!(x.len() >= m * k && w.len() >= n * k);
    by_column_blocks(m, n, bias, out, |j0, cols, o| {
        // SAFETY: `by_column_blocks` hands this task columns `j0..j0 + cols` of `out`
        // (row stride `n`) at `o`.
        unsafe { dot_block_into(x, m, k, &w[j0 * k..(j0 + cols) * k], (o, n, 1)) }
    });
}

/// Rows of `x` per task of [`matmul_wt_rows`].
const ROWS_PER_TASK: usize = 32;

/// `out [m, n] = x [m, k] @ w [n, k]^T` for a narrow `w` (a LoRA factor: `n` = the rank), in
/// parallel over blocks of rows of `x`: each block is read once while `w` stays in cache, and
/// nothing is packed. gemm packs all of `x` for the few output columns, which makes these
/// products bound by copying `x` (`examples/matmul_bench.rs` compares both).
pub fn matmul_wt_rows(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    if n == 0 {
        return;
    }
    out[..m * n]
        .par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(t, o)| {
            let rows = o.len() / n;
            let xs = &x[t * ROWS_PER_TASK * k..(t * ROWS_PER_TASK + rows) * k];
            // SAFETY: `o` is this task's `[rows, n]` block of `out`, row-major.
            unsafe { dot_block_into(xs, rows, k, &w[..n * k], (o.as_mut_ptr(), n, 1)) };
        });
}

/// Fills `out [m, n]` (+ `bias [n]`) block of output columns by block, in parallel:
/// `block(j0, cols, o)` writes columns `j0..j0 + cols` of the row-major `out` in place, `o`
/// pointing at `out[0][j0]` (row stride `n`), and the task then adds their bias. No scratch to
/// allocate, zero and copy back, and no serial transpose of the whole `m x n` result (393K
/// values a decode step for a 49K-token head). Tasks cover [`cols_per_task`] columns.
pub(crate) fn by_column_blocks(
    m: usize,
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    block: impl Fn(usize, usize, *mut f32) + Sync,
) {
    assert!(out.len() >= m * n && bias.is_none_or(|b| b.len() >= n));
    let per_task = cols_per_task(n);
    let dst = SendPtr(out.as_mut_ptr());
    (0..n.div_ceil(per_task)).into_par_iter().for_each(|blk| {
        let j0 = blk * per_task;
        let cols = per_task.min(n - j0);
        // SAFETY: `out` holds `m * n` values (asserted) and tasks own disjoint columns.
        let o = unsafe { dst.get().add(j0) };
        block(j0, cols, o);
        if let Some(b) = bias {
            for i in 0..m {
                for (c, b) in b[j0..j0 + cols].iter().enumerate() {
                    // SAFETY: as above; row `i`, column `j0 + c` of this task.
                    unsafe { *o.add(i * n + c) += b };
                }
            }
        }
    });
}

/// A pointer to an output buffer that parallel tasks write disjoint elements of.
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: only used for writes to disjoint elements from rayon tasks that end before the
// buffer does.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so a closure captures the whole `SendPtr`, not its field).
    pub(crate) fn get(&self) -> *mut f32 {
        self.0
    }
}

/// For each weight row `j` in `w [cols, k]`: `out[j * m + i] = dot(x_i, w_j)`.
pub(crate) fn dot_block(x: &[f32], m: usize, k: usize, w: &[f32], out: &mut [f32]) {
    assert!(out.len() >= (w.len() / k) * m);
    // SAFETY: `out` holds an element for every (row, weight row) at strides (1, m).
    unsafe { dot_block_into(x, m, k, w, (out.as_mut_ptr(), 1, m)) }
}

/// For each weight row `j` in `w [cols, k]` and row `i` of `x [m, k]`: `out[i * rs + j * cs] =
/// dot(x_i, w_j)`, given `(out, rs, cs)`.
///
/// # Safety
/// Those elements of `out` are writable and no other thread touches them meanwhile.
pub(crate) unsafe fn dot_block_into(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    out: (*mut f32, usize, usize),
) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::avx512() {
            // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (checked by `avx512`); `out`
            // is this function's contract.
            unsafe { avx512::dot_block(x, m, k, w, out) };
            return;
        }
        if crate::simd::avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above); `out` as above.
            unsafe { avx2::dot_block(x, m, k, w, out) };
            return;
        }
    }
    let (o, rs, cs) = out;
    for (j, wr) in w.chunks_exact(k).enumerate() {
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            // SAFETY: element (i, j) is writable (this function's contract).
            unsafe { *o.add(i * rs + j * cs) = xr.iter().zip(wr).map(|(a, b)| a * b).sum() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-block kernel against a plain loop: several row blocks and a partial one, a
    /// `k` with a tail, a narrow and a wider rank; and each row
    /// bit-identical to computing it alone.
    #[test]
    fn row_blocks_match_a_plain_product() {
        for &(m, k, n) in &[
            (1usize, 8usize, 1usize),
            (70, 37, 16),
            (33, 576, 4),
            (9, 20, 80),
            // k cut into spans in both kernels (AVX2's 4 rows of x over 24 KiB at k > 1536).
            (11, 2000, 7),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let mut out = vec![f32::NAN; m * n];
            super::matmul_wt_rows(&x, m, k, &w, n, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (mut s, mut mag) = (0f64, 0f64);
                    for p in 0..k {
                        let t = x[i * k + p] as f64 * w[j * k + p] as f64;
                        s += t;
                        mag += t.abs();
                    }
                    let err = (out[i * n + j] as f64 - s).abs();
                    assert!(err <= 1e-5 * mag + 1e-12, "{m}x{k}x{n} [{i},{j}]: {err}");
                }
                let mut alone = vec![0f32; n];
                super::matmul_wt_rows(&x[i * k..(i + 1) * k], 1, k, &w, n, &mut alone);
                assert_eq!(alone, out[i * n..(i + 1) * n]);
            }
        }
    }

    /// `matmul_wt` at prefill sizes (row groups outer, `x` kept in L1, when `8 * k` floats fit;
    /// weight tiles outer otherwise), with a bias, against gemm.
    #[test]
    fn prefill_sized_products_match_gemm() {
        // The last two cut `k` into spans (AVX-512 at 8 rows of 1536, AVX2 at 4 rows of 2000).
        for (m, k, n) in [
            (40usize, 576usize, 100usize),
            (177, 64, 31),
            (35, 1536, 20),
            (9, 2000, 13),
        ] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).unwrap();
            let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
            let b = Tensor::randn(0f32, 1.0, n, &Device::Cpu).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let mut got = vec![f32::NAN; m * n];
            matmul_wt(&flat(&x), m, k, &flat(&w), n, Some(&flat(&b)), &mut got);
            let want = x
                .matmul(&w.t().unwrap())
                .unwrap()
                .broadcast_add(&b)
                .unwrap();
            for (g, w) in got.iter().zip(flat(&want)) {
                assert!(
                    (g - w).abs() < 1e-3 * (1.0 + w.abs()),
                    "{m}x{k}x{n}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn small_matmul_matches_gemm() {
        for (m, k, n) in [
            (1, 576, 100),
            (8, 64, 130),
            (5, 67, 3),
            (16, 128, 257),
            (7, 1536, 193),
            (13, 35, 50),
            (2, 8, 1),
        ] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).unwrap();
            let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
            let b = Tensor::randn(0f32, 1.0, n, &Device::Cpu).unwrap();
            let got = matmul_wt_small(&x, &w, Some(&b)).unwrap().unwrap();
            let want = x
                .matmul(&w.t().unwrap())
                .unwrap()
                .broadcast_add(&b)
                .unwrap();
            let d: f32 = (got - want)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar()
                .unwrap();
            assert!(d < 1e-3, "{m}x{k}x{n}: {d}");
        }
        let big = Tensor::zeros((SMALL_M + 1, 8), DType::F32, &Device::Cpu).unwrap();
        let w = Tensor::zeros((4, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(matmul_wt_small(&big, &w, None).unwrap().is_none());
    }
}
