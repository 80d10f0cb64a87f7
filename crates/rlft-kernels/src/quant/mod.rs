//! Frozen weights kept in their GGUF block format, for decoding.
//!
//! A decode step of batch 8 reads every weight once and does 16 FLOPs with it: at f32 it is
//! bound by memory (538 MB per step for a 135M model). A model loaded from a GGUF file holds
//! its weights as f32 for training, but as long as a weight is frozen and untouched it still
//! equals the dequantised blocks it came from, which are 5 (Q4_1) or 8.5 (Q8_0) bits per
//! weight. [`QuantWeight`] keeps those blocks beside the f32 tensor and remembers which tensor
//! it mirrors ([`QuantWeight::mirrors`]): the model's fused decode path uses it only while the
//! layer still holds that very tensor and it is not a trainable `Var` (training, merging
//! adapters or loading a checkpoint replace the tensor, and the blocks are then ignored).
//!
//! With AVX2 + FMA the blocks are unpacked in registers and multiplied there (`avx2`, and
//! its AVX-512 twin `avx512`); other CPUs dequantise a small tile of weight rows at a time
//! into a scratch and run the f32 streaming kernel ([`crate::stream`]) on it. Both use the
//! loader's formulas (same f32 operations, so the weights are bit-identical to the f32 tensor):
//! results differ from the f32 path only in summation order.

use candle_core::{Tensor, TensorId};
use rayon::prelude::*;
use rlft_gguf::GgmlType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dense;
mod groups;

pub use dense::CHUNK_ELEMENTS;

pub use groups::BLOCK;

use crate::stream::tiles::TILE_COLS;
use crate::stream::{by_column_blocks, dot_block_into, SendPtr};

/// The blocks of a `[rows, cols]` matrix, row-major, `cols / 32` blocks per row; scales and
/// mins are stored as f32 (exact conversions of the file's f16 values).
#[derive(Debug, Clone)]
enum Blocks {
    /// `x = q * d + m` with `q` a nibble: byte `j` of a block holds elements `j` (low nibble)
    /// and `j + 16` (high nibble).
    Q4_1 {
        d: Vec<f32>,
        m: Vec<f32>,
        qs: Vec<u8>,
    },
    /// `x = q * d` with `q` a signed byte.
    Q8_0 { d: Vec<f32>, qs: Vec<i8> },
    /// Any other type [`rlft_gguf::dequantize`] reads (the k-quants, Q5_0, F16, ...): the
    /// file's bytes, `row_bytes` per row, dequantised a tile of rows at a time.
    Raw {
        ty: GgmlType,
        row_bytes: usize,
        data: Vec<u8>,
    },
}

/// A frozen weight `[rows, cols]` in a GGUF block format, bound to the f32 tensor it mirrors.
#[derive(Debug, Clone)]
pub struct QuantWeight {
    rows: usize,
    cols: usize,
    blocks: Blocks,
    source: Option<TensorId>,
}

fn f16(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

impl QuantWeight {
    /// Reads a GGUF tensor's raw `data` as a `[rows, cols]` matrix. `None` when the type has
    /// no decode kernel (supported: Q4_1, Q8_0), `cols` is not a multiple of 32, or the size
    /// does not match.
    pub fn from_gguf(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Option<Self> {
        if !cols.is_multiple_of(BLOCK) || cols == 0 {
            return None;
        }
        let nb = rows * cols / BLOCK;
        let blocks = match ty {
            GgmlType::Q4_1 => {
                if data.len() != nb * 20 {
                    return None;
                }
                let mut d = Vec::with_capacity(nb);
                let mut m = Vec::with_capacity(nb);
                let mut qs = Vec::with_capacity(nb * 16);
                for b in data.chunks_exact(20) {
                    d.push(f16(&b[0..2]));
                    m.push(f16(&b[2..4]));
                    qs.extend_from_slice(&b[4..20]);
                }
                Blocks::Q4_1 { d, m, qs }
            }
            GgmlType::Q8_0 => {
                if data.len() != nb * 34 {
                    return None;
                }
                let mut d = Vec::with_capacity(nb);
                let mut qs = Vec::with_capacity(nb * BLOCK);
                for b in data.chunks_exact(34) {
                    d.push(f16(&b[0..2]));
                    qs.extend(b[2..34].iter().map(|&v| v as i8));
                }
                Blocks::Q8_0 { d, qs }
            }
            _ => return None,
        };
        Some(QuantWeight {
            rows,
            cols,
            blocks,
            source: None,
        })
    }

    /// [`Self::from_gguf`] for every quantised or 16-bit type the loader dequantises (Q4_K,
    /// Q5_0, Q6_K, ... kept as the file's bytes); `None` for f32/f64 and integer tensors (no
    /// smaller than their f32 copy), rows that are not whole blocks, or a size mismatch.
    pub fn from_gguf_any(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Option<Self> {
        if let Some(q) = Self::from_gguf(ty, rows, cols, data) {
            return Some(q);
        }
        let row_bytes = Self::raw_row_bytes(ty, cols)?;
        (data.len() == rows * row_bytes).then(|| QuantWeight {
            rows,
            cols,
            blocks: Blocks::Raw {
                ty,
                row_bytes,
                data: data.to_vec(),
            },
            source: None,
        })
    }

    /// Bytes per row of a [`Blocks::Raw`] matrix of `cols` columns of `ty`, when kept.
    fn raw_row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
        use GgmlType::*;
        if matches!(ty, F32 | F64 | I8 | I16 | I32 | I64) || !ty.can_dequantize() || cols == 0 {
            return None;
        }
        if !cols.is_multiple_of(ty.block_size()) {
            return None;
        }
        Some(cols / ty.block_size() * ty.type_size())
    }

    /// Bytes [`Self::from_gguf_any`] would hold for a `[rows, cols]` tensor of type `ty`.
    pub fn bytes_for_any(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
        Self::bytes_for(ty, rows, cols).or_else(|| Some(rows * Self::raw_row_bytes(ty, cols)?))
    }

    /// Bytes [`Self::from_gguf`] would hold for a `[rows, cols]` tensor of type `ty` (`None`
    /// when it would not keep it).
    pub fn bytes_for(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
        if !cols.is_multiple_of(BLOCK) || cols == 0 {
            return None;
        }
        let nb = rows * cols / BLOCK;
        match ty {
            GgmlType::Q4_1 => Some(nb * (4 + 4 + 16)),
            GgmlType::Q8_0 => Some(nb * (4 + BLOCK)),
            _ => None,
        }
    }

    /// `[rows, cols]`.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes held.
    pub fn size_in_bytes(&self) -> usize {
        match &self.blocks {
            Blocks::Q4_1 { d, m, qs } => 4 * (d.len() + m.len()) + qs.len(),
            Blocks::Q8_0 { d, qs } => 4 * d.len() + qs.len(),
            Blocks::Raw { data, .. } => data.len(),
        }
    }

    /// Whether the blocks have in-register decode kernels (Q4_1, Q8_0); other types are
    /// dequantised a tile at a time.
    fn in_register(&self) -> bool {
        !matches!(self.blocks, Blocks::Raw { .. })
    }

    /// Row `i` of the result is row `perm[i]` of `self` (the loader's q/k un-permutation).
    pub fn permute_rows(&self, perm: &[usize]) -> Self {
        let nb = self.cols / BLOCK;
        let pick = |v: &[f32]| -> Vec<f32> {
            perm.iter()
                .flat_map(|&r| v[r * nb..(r + 1) * nb].iter().copied())
                .collect()
        };
        let blocks = match &self.blocks {
            Blocks::Q4_1 { d, m, qs } => Blocks::Q4_1 {
                d: pick(d),
                m: pick(m),
                qs: perm
                    .iter()
                    .flat_map(|&r| qs[r * nb * 16..(r + 1) * nb * 16].iter().copied())
                    .collect(),
            },
            Blocks::Q8_0 { d, qs } => Blocks::Q8_0 {
                d: pick(d),
                qs: perm
                    .iter()
                    .flat_map(|&r| qs[r * self.cols..(r + 1) * self.cols].iter().copied())
                    .collect(),
            },
            Blocks::Raw {
                ty,
                row_bytes,
                data,
            } => Blocks::Raw {
                ty: *ty,
                row_bytes: *row_bytes,
                data: perm
                    .iter()
                    .flat_map(|&r| data[r * row_bytes..(r + 1) * row_bytes].iter().copied())
                    .collect(),
            },
        };
        QuantWeight {
            rows: perm.len(),
            cols: self.cols,
            blocks,
            source: self.source,
        }
    }

    /// Binds the blocks to the f32 tensor `w` they were dequantised into.
    pub fn bind(mut self, w: &Tensor) -> Self {
        self.source = Some(w.id());
        self
    }

    /// Whether these blocks still describe `w`: `w` is the tensor they were bound to and not a
    /// trainable `Var` (an optimizer may update a `Var` in place).
    pub fn mirrors(&self, w: &Tensor) -> bool {
        self.source == Some(w.id()) && !w.is_variable() && w.dims() == [self.rows, self.cols]
    }

    /// Dequantises rows `r0..r0 + n` into `out [n, cols]`, with the loader's formulas.
    pub fn dequant_rows(&self, r0: usize, n: usize, out: &mut [f32]) {
        if let Blocks::Raw {
            ty,
            row_bytes,
            data,
        } = &self.blocks
        {
            let bytes = &data[r0 * row_bytes..(r0 + n) * row_bytes];
            rlft_gguf::dequantize(*ty, bytes, &mut out[..n * self.cols])
                .expect("sizes checked when the blocks were read");
            return;
        }
        let nb = self.cols / BLOCK;
        let (b0, b1) = (r0 * nb, (r0 + n) * nb);
        let out = &mut out[..n * self.cols];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked above); slices are sized by the loops.
                unsafe { self.dequant_avx2(b0, b1, out) };
                return;
            }
        }
        self.dequant_portable(b0, b1, out);
    }

    fn dequant_portable(&self, b0: usize, b1: usize, out: &mut [f32]) {
        let blocks = out.chunks_exact_mut(BLOCK).zip(b0..b1);
        match &self.blocks {
            Blocks::Q4_1 { d, m, qs } => {
                for (y, b) in blocks {
                    for j in 0..16 {
                        let q = qs[b * 16 + j];
                        y[j] = (q & 0xF) as f32 * d[b] + m[b];
                        y[j + 16] = (q >> 4) as f32 * d[b] + m[b];
                    }
                }
            }
            Blocks::Q8_0 { d, qs } => {
                for (y, b) in blocks {
                    for (j, v) in y.iter_mut().enumerate() {
                        *v = qs[b * BLOCK + j] as f32 * d[b];
                    }
                }
            }
            Blocks::Raw { .. } => unreachable!("dequant_rows reads raw blocks itself"),
        }
    }

    /// [`Self::dequant_portable`] with AVX2: 8 weights a vector.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn dequant_avx2(&self, b0: usize, b1: usize, out: &mut [f32]) {
        use std::arch::x86_64::*;
        let blocks = out.chunks_exact_mut(BLOCK).zip(b0..b1);
        match &self.blocks {
            Blocks::Q4_1 { d, m, qs } => {
                let low = _mm_set1_epi8(0x0F);
                for (y, b) in blocks {
                    let (dv, mv) = (_mm256_set1_ps(d[b]), _mm256_set1_ps(m[b]));
                    // SAFETY: `d[b]` was bounds-checked just above and `qs` holds 16 bytes for
                    // every block of `d`.
                    let raw = unsafe { _mm_loadu_si128(qs.as_ptr().add(b * 16) as *const __m128i) };
                    let lo = _mm_and_si128(raw, low);
                    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
                    // Multiply then add, as the loader does (no FMA): bit-identical weights.
                    macro_rules! put {
                        ($bytes:expr, $at:expr) => {{
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32($bytes));
                            let v = _mm256_add_ps(_mm256_mul_ps(q, dv), mv);
                            // SAFETY: `y` is a block of 32 values and `$at + 8 <= 32`.
                            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add($at), v) };
                        }};
                    }
                    put!(lo, 0);
                    put!(_mm_srli_si128(lo, 8), 8);
                    put!(hi, 16);
                    put!(_mm_srli_si128(hi, 8), 24);
                }
            }
            Blocks::Q8_0 { d, qs } => {
                for (y, b) in blocks {
                    let dv = _mm256_set1_ps(d[b]);
                    let q8 = &qs[b * BLOCK..(b + 1) * BLOCK];
                    for at in (0..BLOCK).step_by(8) {
                        // SAFETY: 8 bytes at `at + 8 <= 32` of the block's 32, and 8 f32 of
                        // the output block's 32.
                        unsafe {
                            let bytes = _mm_loadl_epi64(q8.as_ptr().add(at) as *const __m128i);
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                            _mm256_storeu_ps(y.as_mut_ptr().add(at), _mm256_mul_ps(q, dv));
                        }
                    }
                }
            }
            Blocks::Raw { .. } => unreachable!("dequant_rows reads raw blocks itself"),
        }
    }

    /// `out [m, rows] = x [m, cols] @ W^T` for few rows of `x` (decoding), parallel over
    /// output columns. With AVX2 + FMA the blocks are unpacked in registers and multiplied
    /// there; otherwise each tile of weight rows is dequantised into an L1-sized scratch and
    /// multiplied by the streaming kernel ([`crate::stream`]).
    pub fn matmul_wt(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.rows, self.cols);
        debug_assert!(x.len() >= m * k && out.len() >= m * n);
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::avx2_fma() && self.in_register() {
                // Tasks write their columns of `out` directly (no transposed copy to undo on
                // the calling thread: 393K values per decode step for a 49K-token head).
                return Self::matmul_wt_many(&[self], x, m, &mut [out]);
            }
        }
        self.matmul_wt_tiles(x, m, out);
    }

    /// [`Self::matmul_wt`] for several weights with the same number of columns over the same
    /// `x` (a layer's q/k/v, or gate/up): `outs[i] [m, rows_i] = x @ W_i^T`, all their rows in
    /// one parallel loop (a decode step runs one loop instead of three, and the tasks of the
    /// small k/v products balance against q's).
    pub fn matmul_wt_many(ws: &[&QuantWeight], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), outs.len());
        assert!(
            ws.iter()
                .zip(outs.iter())
                .all(|(w, o)| o.len() >= m * w.rows),
            "matmul_wt_many: an output holds fewer than m * rows values"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let k = ws.first().map_or(0, |w| w.cols);
            if crate::simd::avx2_fma() && ws.iter().all(|w| w.cols == k && w.in_register()) {
                let nb = k / BLOCK;
                let threads = rayon::current_num_threads().max(1);
                let total: usize = ws.iter().map(|w| w.rows).sum();
                // About 8 tasks per thread over all rows, in multiples of 16 columns so no two
                // tasks share a cache line of an output row (as `stream::cols_per_task`).
                let per = total.div_ceil(threads * 8).div_ceil(16).clamp(1, 16) * 16;
                let mut tasks = Vec::new();
                for (wi, w) in ws.iter().enumerate() {
                    for j0 in (0..w.rows).step_by(per) {
                        tasks.push((wi, j0, per.min(w.rows - j0)));
                    }
                }
                let dst: Vec<SendPtr> = outs.iter_mut().map(|o| SendPtr(o.as_mut_ptr())).collect();
                let xp = groups::pack_rows(x, m, k);
                tasks.par_iter().for_each(|&(wi, j0, cols)| {
                    let w = ws[wi];
                    let (b0, b1) = (j0 * nb, (j0 + cols) * nb);
                    let layout = match &w.blocks {
                        Blocks::Q4_1 { d, m, qs } => groups::Layout::Q4_1 {
                            d: &d[b0..b1],
                            m: &m[b0..b1],
                            qs: &qs[b0 * 16..b1 * 16],
                        },
                        Blocks::Q8_0 { d, qs } => groups::Layout::Q8_0 {
                            d: &d[b0..b1],
                            qs: &qs[b0 * BLOCK..b1 * BLOCK],
                        },
                        Blocks::Raw { .. } => unreachable!("checked by in_register above"),
                    };
                    // SAFETY: the CPU has AVX2 and FMA (checked above); the slices hold the
                    // blocks of `cols` whole rows; `outs[wi]` holds `m * rows` values (asserted
                    // above) and tasks own disjoint columns `j0..j0 + cols` of it.
                    unsafe {
                        matmul_blocks(xp.as_slice(), m, k, layout, dst[wi].0.add(j0), w.rows)
                    };
                });
                return;
            }
        }
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            w.matmul_wt(x, m, o);
        }
    }

    /// [`Self::matmul_wt`] through an f32 scratch tile and the streaming kernel (any CPU).
    fn matmul_wt_tiles(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.rows, self.cols);
        by_column_blocks(m, n, None, out, |j0, cols, o| {
            let mut w = vec![0f32; DEQUANT_ROWS * k];
            let mut j = 0;
            while j < cols {
                let nc = (cols - j).min(DEQUANT_ROWS);
                self.dequant_rows(j0 + j, nc, &mut w);
                // SAFETY: `o` is this task's columns of `out` (row stride `n`); these are
                // its columns `j..j + nc`.
                unsafe { dot_block_into(x, m, k, &w[..nc * k], (o.add(j), n, 1)) };
                j += nc;
            }
        });
    }
}

/// Weight rows dequantised at a time: two register tiles (27 KB of f32 at 576 columns).
const DEQUANT_ROWS: usize = 2 * TILE_COLS;

/// One task's block product: `out[r * ld + c] = dot(x_r, w_c)` for the weight rows in `w`,
/// by the AVX-512 kernel where [`crate::simd::avx512`] says so, else the AVX2 one.
///
/// # Safety
/// The CPU has AVX2 and FMA ([`crate::simd::avx2_fma`]); the operands as
/// [`avx2::matmul_blocks`] takes them.
#[cfg(target_arch = "x86_64")]
unsafe fn matmul_blocks(
    x: &[f32],
    m: usize,
    k: usize,
    w: groups::Layout,
    out: *mut f32,
    ld: usize,
) {
    if crate::simd::avx512() {
        // SAFETY: the CPU has AVX-512F, AVX2 and FMA (checked by `avx512`); the operands are
        // this function's contract.
        unsafe { avx512::matmul_blocks(x, m, k, w, out, ld) }
    } else {
        // SAFETY: the CPU has AVX2 and FMA and the operands are as asked (this function's
        // contract).
        unsafe { avx2::matmul_blocks(x, m, k, w, out, ld) }
    }
}

/// GGUF test data for the kernels that read [`QuantWeight`] (here and in [`crate::fused`]).
#[cfg(test)]
pub(crate) mod test_blocks {
    use super::BLOCK;
    use rand::{Rng, SeedableRng};
    use rlft_gguf::GgmlType;

    /// Random GGUF blocks of `ty` for a `[rows, cols]` matrix (finite scales).
    pub(crate) fn random_blocks(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut out = Vec::new();
        let f16b = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
        for _ in 0..rows * cols / BLOCK {
            out.extend_from_slice(&f16b(rng.random_range(-0.05f32..0.05)));
            match ty {
                GgmlType::Q4_1 => {
                    out.extend_from_slice(&f16b(rng.random_range(-0.5f32..0.5)));
                    out.extend((0..16).map(|_| rng.random::<u8>()));
                }
                _ => out.extend((0..32).map(|_| rng.random::<u8>())),
            }
        }
        out
    }

    /// The loader's f32 values of `data` (what [`super::QuantWeight`] must reproduce).
    pub(crate) fn reference(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Vec<f32> {
        let mut w = vec![0f32; rows * cols];
        rlft_gguf::dequantize(ty, data, &mut w).unwrap();
        w
    }
}

#[cfg(test)]
mod tests {
    use super::test_blocks::{random_blocks, reference};
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn dequantised_rows_are_bit_identical_to_the_loader() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (rows, cols) = (7, 96);
            let data = random_blocks(ty, rows, cols, 1);
            let q = QuantWeight::from_gguf(ty, rows, cols, &data).unwrap();
            let want = reference(ty, rows, cols, &data);
            let mut got = vec![0f32; 3 * cols];
            q.dequant_rows(2, 3, &mut got);
            let mut portable = vec![0f32; 3 * cols];
            let nb = cols / BLOCK;
            q.dequant_portable(2 * nb, 5 * nb, &mut portable);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want[2 * cols..5 * cols]), "{ty:?}");
            assert_eq!(bits(&portable), bits(&want[2 * cols..5 * cols]), "{ty:?}");
        }
    }

    #[test]
    fn quantised_matmul_matches_the_f32_kernel() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            // Every row-group width (1-8, 9 = 8 + 1, 16), one and several k chunks.
            for (m, rows, cols) in [
                (1, 50, 64),
                (2, 9, 96),
                (3, 11, 640),
                (4, 5, 1536),
                (5, 7, 1536),
                (6, 3, 32),
                (7, 20, 576),
                (8, 193, 576),
                (9, 17, 1024),
                (12, 33, 640),
                (16, 130, 32),
            ] {
                let data = random_blocks(ty, rows, cols, m as u64);
                let q = QuantWeight::from_gguf(ty, rows, cols, &data).unwrap();
                let w = reference(ty, rows, cols, &data);
                let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                let x: Vec<f32> = (0..m * cols)
                    .map(|_| rng.random_range(-1f32..1.0))
                    .collect();
                let mut want = vec![0f32; m * rows];
                crate::stream::matmul_wt(&x, m, cols, &w, rows, None, &mut want);
                let mut got = vec![0f32; m * rows];
                q.matmul_wt(&x, m, &mut got);
                let mut tiles = vec![0f32; m * rows];
                q.matmul_wt_tiles(&x, m, &mut tiles);
                // Summation order differs: allow a few ulps of the sum of |x * w|.
                for (idx, ((a, t), b)) in got.iter().zip(&tiles).zip(&want).enumerate() {
                    let (i, j) = (idx / rows, idx % rows);
                    let scale: f32 = (0..cols)
                        .map(|c| (x[i * cols + c] * w[j * cols + c]).abs())
                        .sum();
                    let tol = 1e-6 * scale + 1e-6;
                    assert!((a - b).abs() <= tol, "{ty:?} {m}x{rows}x{cols}: {a} vs {b}");
                    assert!(
                        (t - b).abs() <= tol,
                        "{ty:?} {m}x{rows}x{cols} (tiles): {t} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn many_weights_in_one_loop_equal_one_by_one() {
        for m in [1usize, 3, 8, 11] {
            let cols = 640;
            let ws: Vec<QuantWeight> = [
                (37usize, GgmlType::Q4_1),
                (5, GgmlType::Q4_1),
                (300, GgmlType::Q8_0),
            ]
            .iter()
            .enumerate()
            .map(|(i, &(rows, ty))| {
                let data = random_blocks(ty, rows, cols, 10 + i as u64);
                QuantWeight::from_gguf(ty, rows, cols, &data).unwrap()
            })
            .collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(m as u64);
            let x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-1f32..1.0))
                .collect();
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; m * w.rows]).collect();
            let refs: Vec<&QuantWeight> = ws.iter().collect();
            let mut views: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            QuantWeight::matmul_wt_many(&refs, &x, m, &mut views);
            for (w, got) in ws.iter().zip(&outs) {
                let mut want = vec![0f32; m * w.rows];
                w.matmul_wt(&x, m, &mut want);
                assert_eq!(got, &want, "m = {m}, {} rows", w.rows);
            }
        }
    }

    #[test]
    fn permuted_rows_and_binding() {
        let (rows, cols) = (4, 64);
        let data = random_blocks(GgmlType::Q4_1, rows, cols, 3);
        let q = QuantWeight::from_gguf(GgmlType::Q4_1, rows, cols, &data).unwrap();
        let perm = [2, 0, 3, 1];
        let p = q.permute_rows(&perm);
        let mut a = vec![0f32; rows * cols];
        let mut b = vec![0f32; rows * cols];
        q.dequant_rows(0, rows, &mut a);
        p.dequant_rows(0, rows, &mut b);
        for (i, &r) in perm.iter().enumerate() {
            assert_eq!(b[i * cols..(i + 1) * cols], a[r * cols..(r + 1) * cols]);
        }
        let t = Tensor::from_vec(a, (rows, cols), &candle_core::Device::Cpu).unwrap();
        let bound = q.bind(&t);
        assert!(bound.mirrors(&t));
        assert!(!bound.mirrors(&t.copy().unwrap()), "another tensor");
        let var = candle_core::Var::from_tensor(&t).unwrap();
        assert!(!bound.mirrors(var.as_tensor()), "a trainable copy");
        assert!(QuantWeight::from_gguf(GgmlType::Q4_0, rows, cols, &data).is_none());
        assert!(QuantWeight::from_gguf(GgmlType::Q4_1, rows, 48, &data).is_none());
    }
}
