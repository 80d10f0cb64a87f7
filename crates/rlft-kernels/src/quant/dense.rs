//! Products with a frozen [`QuantWeight`] over many rows: the training passes, prefills and
//! scoring of a model whose frozen base stays in its GGUF blocks (LoRA over a GGUF file).
//!
//! The weight is dequantised a chunk of rows at a time into an f32 scratch of about
//! [`CHUNK_ELEMENTS`] values (8 MiB), and each chunk goes through the gemm the dense layer
//! uses ([`crate::gemm`]): the product reads every block once per call, never holds the whole
//! f32 matrix, and has the dense path's arithmetic on the dequantised values (the loader's
//! formulas, so the same weights bit for bit). Results differ from the dense path only where
//! the gemm splits its `k` sum differently, a few ulps of `sum |x * w|`; the order is fixed,
//! so a call is deterministic.

use rayon::prelude::*;

use super::QuantWeight;
use crate::gemm::{gemm, gemm_new};

/// f32 values of one dequantised chunk of weight rows.
pub const CHUNK_ELEMENTS: usize = 1 << 21;

/// Weight rows one dequantising task takes.
const TASK_ROWS: usize = 8;

impl QuantWeight {
    /// Weight rows per chunk: as many as fit [`CHUNK_ELEMENTS`], at least 16.
    fn chunk_rows(&self) -> usize {
        (CHUNK_ELEMENTS / self.cols.max(1))
            .max(16)
            .min(self.rows.max(1))
    }

    /// Rows `r0..r0 + n` dequantised into `out [n, cols]`, in parallel over groups of rows.
    pub fn dequant_rows_par(&self, r0: usize, n: usize, out: &mut [f32]) {
        let k = self.cols;
        out[..n * k]
            .par_chunks_mut(TASK_ROWS * k)
            .enumerate()
            .for_each(|(i, o)| self.dequant_rows(r0 + i * TASK_ROWS, o.len() / k, o));
    }

    /// `out [m, rows] = x [m, cols] @ W^T` (`accumulate`: `+=`), chunk by chunk of weight rows.
    pub fn xwt(&self, x: &[f32], m: usize, out: &mut [f32], accumulate: bool) {
        let (n, k) = (self.rows, self.cols);
        assert!(x.len() >= m * k && out.len() >= m * n, "xwt: operand sizes");
        let c = self.chunk_rows();
        let mut w = vec![0f32; c * k];
        for r0 in (0..n).step_by(c) {
            let nc = c.min(n - r0);
            self.dequant_rows_par(r0, nc, &mut w);
            if nc == n {
                gemm(
                    m,
                    n,
                    k,
                    out,
                    &x[..m * k],
                    false,
                    &w[..n * k],
                    true,
                    accumulate,
                );
                return;
            }
            let y = gemm_new(m, nc, k, &x[..m * k], false, &w[..nc * k], true);
            out[..m * n]
                .par_chunks_mut(n)
                .zip(y.par_chunks(nc))
                .for_each(|(o, y)| {
                    let o = &mut o[r0..r0 + nc];
                    if accumulate {
                        o.iter_mut().zip(y).for_each(|(o, y)| *o += y);
                    } else {
                        o.copy_from_slice(y);
                    }
                });
        }
    }

    /// `dx [m, cols] = g [m, rows] @ W` (`accumulate`: `+=`): the input gradient of
    /// [`Self::xwt`], chunk by chunk of weight rows.
    pub fn gw(&self, g: &[f32], m: usize, dx: &mut [f32], accumulate: bool) {
        let (n, k) = (self.rows, self.cols);
        assert!(g.len() >= m * n && dx.len() >= m * k, "gw: operand sizes");
        let c = self.chunk_rows();
        let mut w = vec![0f32; c * k];
        let mut gc = Vec::new();
        for r0 in (0..n).step_by(c) {
            let nc = c.min(n - r0);
            self.dequant_rows_par(r0, nc, &mut w);
            let acc = accumulate || r0 > 0;
            if nc == n {
                gemm(m, k, n, dx, &g[..m * n], false, &w[..n * k], false, acc);
                return;
            }
            gc.resize(m * nc, 0f32);
            gc.par_chunks_mut(nc)
                .zip(g[..m * n].par_chunks(n))
                .for_each(|(d, s)| d.copy_from_slice(&s[r0..r0 + nc]));
            gemm(m, k, nc, dx, &gc, false, &w[..nc * k], false, acc);
        }
    }

    /// `out [ids.len(), cols]`: the weight rows `ids` (an embedding lookup).
    pub fn gather_rows(&self, ids: &[u32], out: &mut [f32]) {
        let k = self.cols;
        assert!(out.len() >= ids.len() * k, "gather_rows: output size");
        out[..ids.len() * k]
            .par_chunks_mut(k)
            .zip(ids.par_iter())
            .for_each(|(o, &id)| self.dequant_rows(id as usize, 1, o));
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_blocks::{random_blocks, reference};
    use super::*;
    use rand::{Rng, SeedableRng};
    use rlft_gguf::GgmlType;

    /// Random GGUF blocks of a raw-kept type: random bytes with small finite f16 scales.
    fn random_raw(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n = rows * cols / ty.block_size() * ty.type_size();
        let mut data: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        // The f16 scales sit first in Q5_0 and Q4_K/Q5_K (d, dmin) and last in Q6_K; clearing
        // the top exponent bits of those words keeps every scale small and finite.
        for b in data.chunks_exact_mut(ty.type_size()) {
            let len = b.len();
            for at in [1, 3, len - 1] {
                b[at] &= 0x23;
            }
        }
        data
    }

    fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (QuantWeight, Vec<f32>) {
        let in_register = matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0);
        let data = if !in_register {
            random_raw(ty, rows, cols, seed)
        } else {
            random_blocks(ty, rows, cols, seed)
        };
        let q = QuantWeight::from_gguf_any(ty, rows, cols, &data).unwrap();
        let mut w = vec![0f32; rows * cols];
        if !in_register {
            rlft_gguf::dequantize(ty, &data, &mut w).unwrap();
        } else {
            w = reference(ty, rows, cols, &data);
        }
        assert!(w.iter().all(|v| v.is_finite()));
        (q, w)
    }

    fn rand_vec(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..len).map(|_| rng.random_range(-1f32..1.0)).collect()
    }

    fn close(got: &[f32], want: &[f32], what: &str) {
        let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max).max(1.0);
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "{what} [{i}]: {a} vs {b}");
        }
    }

    #[test]
    fn chunked_products_match_the_dense_gemm() {
        // One chunk and several (rows > CHUNK_ELEMENTS / cols at 256 columns: 8192).
        for (ty, rows, cols) in [
            (GgmlType::Q8_0, 40, 96),
            (GgmlType::Q4_1, 9000, 256),
            (GgmlType::Q5_0, 33, 64),
            (GgmlType::Q4_K, 20, 512),
            (GgmlType::Q6_K, 8300, 256),
        ] {
            let (q, w) = weights(ty, rows, cols, rows as u64);
            let m = 7;
            let x = rand_vec(m * cols, 1);
            let want = gemm_new(m, rows, cols, &x, false, &w, true);
            let mut got = vec![0f32; m * rows];
            q.xwt(&x, m, &mut got, false);
            close(&got, &want, &format!("{ty:?} xwt"));
            let mut twice = got.clone();
            q.xwt(&x, m, &mut twice, true);
            let doubled: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
            close(&twice, &doubled, &format!("{ty:?} xwt accumulate"));
            let g = rand_vec(m * rows, 2);
            let want = gemm_new(m, cols, rows, &g, false, &w, false);
            let mut got = vec![0f32; m * cols];
            q.gw(&g, m, &mut got, false);
            close(&got, &want, &format!("{ty:?} gw"));
            let ids = [0u32, (rows - 1) as u32, 3];
            let mut rows_out = vec![0f32; 3 * cols];
            q.gather_rows(&ids, &mut rows_out);
            for (i, &id) in ids.iter().enumerate() {
                let id = id as usize;
                assert_eq!(
                    rows_out[i * cols..(i + 1) * cols],
                    w[id * cols..(id + 1) * cols]
                );
            }
        }
    }

    #[test]
    fn raw_types_keep_only_whole_blocks() {
        let data = vec![0u8; 4 * 210];
        assert!(QuantWeight::from_gguf_any(GgmlType::Q6_K, 4, 256, &data).is_some());
        assert!(QuantWeight::from_gguf_any(GgmlType::Q6_K, 4, 128, &data).is_none());
        assert!(QuantWeight::from_gguf_any(GgmlType::Q6_K, 3, 256, &data).is_none());
        assert!(QuantWeight::from_gguf_any(GgmlType::F32, 4, 256, &data).is_none());
        assert_eq!(
            QuantWeight::bytes_for_any(GgmlType::Q6_K, 4, 256),
            Some(4 * 210)
        );
    }
}
