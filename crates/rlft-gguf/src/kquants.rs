//! Dequantisation of the "k-quant" super-blocks (256 elements each): Q2_K ... Q8_K.
//!
//! Each function decodes one block as laid out by ggml (`block_q2_K` ... `block_q8_K` in
//! ggml-common.h) with the arithmetic of ggml's `dequantize_row_q*_K`, in the same order, so
//! the f32 results are bit-identical.

use crate::dequant::f16_le;
use crate::reader::le;

/// Elements per super-block.
pub const QK_K: usize = 256;

/// The (scale, min) pair `j` (0..8) of a Q4_K/Q5_K block: eight 6-bit scales and eight 6-bit
/// mins packed into 12 bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `block_q2_K` (84 bytes): `scales[16]` (low nibble scale, high nibble min), `qs[64]` (2-bit
/// quants), f16 `d`, f16 `dmin`. Sixteen groups of 16: `x = d*sc * q - dmin*m`.
pub(crate) fn q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let d = f16_le([b[80], b[81]]);
    let dmin = f16_le([b[82], b[83]]);
    for half in 0..2 {
        let qs = 16 + 32 * half;
        for shift_idx in 0..4 {
            let shift = 2 * shift_idx;
            for k in 0..2 {
                let sc = b[8 * half + 2 * shift_idx + k];
                let dl = d * (sc & 0xF) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let base = 128 * half + 32 * shift_idx + 16 * k;
                for i in 0..16 {
                    let q = (b[qs + 16 * k + i] >> shift) & 3;
                    y[base + i] = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// `block_q3_K` (110 bytes): `hmask[32]` (high bits), `qs[64]` (low 2 bits), `scales[12]`
/// (sixteen 6-bit scales), f16 `d`. `x = d*(sc-32) * (q - 4*(1-h))`.
pub(crate) fn q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let d = f16_le([b[108], b[109]]);
    let s: [u8; 12] = le(&b[96..108]);
    // Unpack: scale j has its low nibble in s[j] (j < 8) or the high nibble of s[j-8], and its
    // top two bits in bits 2*(j/4).. of s[8 + j%4].
    let mut scales = [0i32; 16];
    for (j, sc) in scales.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + (j & 3)] >> (2 * (j / 4))) & 3;
        *sc = i32::from(low | (high << 4));
    }
    for half in 0..2 {
        let qs = 32 + 32 * half;
        for shift_idx in 0..4 {
            let shift = 2 * shift_idx;
            let mask = 1u8 << (4 * half + shift_idx);
            for k in 0..2 {
                let dl = d * (scales[8 * half + 2 * shift_idx + k] as f32 - 32.0);
                let base = 128 * half + 32 * shift_idx + 16 * k;
                for i in 0..16 {
                    let l = 16 * k + i;
                    let low = ((b[qs + l] >> shift) & 3) as i8;
                    let sub = if b[l] & mask == 0 { 4 } else { 0 };
                    y[base + i] = dl * (low - sub) as f32;
                }
            }
        }
    }
}

/// `block_q4_K` (144 bytes): f16 `d`, f16 `dmin`, `scales[12]`, `qs[128]` (nibbles). Eight
/// groups of 32: `x = d*sc * q - dmin*m`; each 32 bytes of `qs` hold two groups (low nibbles,
/// then high nibbles).
pub(crate) fn q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = f16_le([b[0], b[1]]);
    let dmin = f16_le([b[2], b[3]]);
    let s: [u8; 12] = le(&b[4..16]);
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, &s);
        let (sc2, m2) = scale_min_k4(2 * j + 1, &s);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for i in 0..32 {
            let q = b[16 + 32 * j + i];
            y[64 * j + i] = d1 * (q & 0xF) as f32 - m1;
            y[64 * j + 32 + i] = d2 * (q >> 4) as f32 - m2;
        }
    }
}

/// `block_q5_K` (176 bytes): f16 `d`, f16 `dmin`, `scales[12]`, `qh[32]` (fifth bits),
/// `qs[128]` (nibbles). Like Q4_K with `q += 16` where the group's bit in `qh` is set.
pub(crate) fn q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = f16_le([b[0], b[1]]);
    let dmin = f16_le([b[2], b[3]]);
    let s: [u8; 12] = le(&b[4..16]);
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, &s);
        let (sc2, m2) = scale_min_k4(2 * j + 1, &s);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let u1 = 1u8 << (2 * j);
        let u2 = 2u8 << (2 * j);
        for i in 0..32 {
            let q = b[48 + 32 * j + i];
            let h = b[16 + i];
            let h1 = if h & u1 != 0 { 16.0 } else { 0.0 };
            let h2 = if h & u2 != 0 { 16.0 } else { 0.0 };
            y[64 * j + i] = d1 * ((q & 0xF) as f32 + h1) - m1;
            y[64 * j + 32 + i] = d2 * ((q >> 4) as f32 + h2) - m2;
        }
    }
}

/// `block_q6_K` (210 bytes): `ql[128]` (low nibbles), `qh[64]` (top two bits), `scales[16]`
/// (i8), f16 `d`. Sixteen groups of 16: `x = d * sc * (q - 32)`.
pub(crate) fn q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let d = f16_le([b[208], b[209]]);
    for half in 0..2 {
        let ql = 64 * half;
        let qh = 128 + 32 * half;
        let sc = 192 + 8 * half;
        let out = 128 * half;
        for l in 0..32 {
            let is = l / 16;
            let h = b[qh + l];
            let lo0 = b[ql + l];
            let lo1 = b[ql + l + 32];
            let q1 = ((lo0 & 0xF) | ((h & 3) << 4)) as i8 - 32;
            let q2 = ((lo1 & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((lo0 >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((lo1 >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            y[out + l] = d * (b[sc + is] as i8) as f32 * q1 as f32;
            y[out + l + 32] = d * (b[sc + is + 2] as i8) as f32 * q2 as f32;
            y[out + l + 64] = d * (b[sc + is + 4] as i8) as f32 * q3 as f32;
            y[out + l + 96] = d * (b[sc + is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// `block_q8_K` (292 bytes): f32 `d`, `qs[256]` (i8), `bsums[16]` (i16, unused here).
/// `x = d * q`.
pub(crate) fn q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (i, y) in y.iter_mut().enumerate() {
        *y = d * (b[4 + i] as i8) as f32;
    }
}
