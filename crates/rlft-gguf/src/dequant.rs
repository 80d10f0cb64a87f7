//! Dequantisation of ggml tensor data to f32: plain types and the 32-element block quants.
//!
//! Block layouts and arithmetic follow ggml's `dequantize_row_*` (ggml-quants.c) operation for
//! operation, so results are bit-identical to ggml and to candle's CPU dequantisation (the
//! tests check the latter). The super-block "k-quants" live in [`crate::kquants`].

use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::{GgufError, Result};
use crate::kquants;
use crate::reader::le;
use crate::GgmlType;

/// Tensors with fewer elements than this are dequantised on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;
/// Elements per rayon task (a multiple of every block size).
const TASK_ELEMENTS: usize = 1 << 15;

/// Dequantises `data` (raw ggml data of type `ggml_type`) into `out`.
///
/// `out.len()` is the element count; it must be a multiple of the type's block size and `data`
/// must hold exactly the bytes of that many elements, else [`GgufError::SizeMismatch`].
/// Types without a dequantiser give [`GgufError::UnsupportedType`].
pub fn dequantize(ggml_type: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    let expected = ggml_type.bytes_for(out.len() as u64);
    if expected != Some(data.len() as u64) {
        return Err(GgufError::SizeMismatch {
            ggml_type,
            elements: out.len(),
            expected: expected.unwrap_or(0) as usize,
            bytes: data.len(),
        });
    }
    use GgmlType::*;
    match ggml_type {
        F32 => for_blocks(data, out, |b: &[u8; 4], y: &mut [f32; 1]| {
            y[0] = f32::from_le_bytes(*b)
        }),
        F16 => for_blocks(data, out, |b: &[u8; 2], y: &mut [f32; 1]| y[0] = f16_le(*b)),
        BF16 => for_blocks(data, out, |b: &[u8; 2], y: &mut [f32; 1]| {
            y[0] = bf16::from_bits(u16::from_le_bytes(*b)).to_f32()
        }),
        F64 => for_blocks(data, out, |b: &[u8; 8], y: &mut [f32; 1]| {
            y[0] = f64::from_le_bytes(*b) as f32
        }),
        I8 => for_blocks(data, out, |b: &[u8; 1], y: &mut [f32; 1]| {
            y[0] = f32::from(b[0] as i8)
        }),
        I16 => for_blocks(data, out, |b: &[u8; 2], y: &mut [f32; 1]| {
            y[0] = f32::from(i16::from_le_bytes(*b))
        }),
        I32 => for_blocks(data, out, |b: &[u8; 4], y: &mut [f32; 1]| {
            y[0] = i32::from_le_bytes(*b) as f32
        }),
        I64 => for_blocks(data, out, |b: &[u8; 8], y: &mut [f32; 1]| {
            y[0] = i64::from_le_bytes(*b) as f32
        }),
        Q4_0 => for_blocks(data, out, q4_0),
        Q4_1 => for_blocks(data, out, q4_1),
        Q5_0 => for_blocks(data, out, q5_0),
        Q5_1 => for_blocks(data, out, q5_1),
        Q8_0 => for_blocks(data, out, q8_0),
        Q8_1 => for_blocks(data, out, q8_1),
        Q2_K => for_blocks(data, out, kquants::q2_k),
        Q3_K => for_blocks(data, out, kquants::q3_k),
        Q4_K => for_blocks(data, out, kquants::q4_k),
        Q5_K => for_blocks(data, out, kquants::q5_k),
        Q6_K => for_blocks(data, out, kquants::q6_k),
        Q8_K => for_blocks(data, out, kquants::q8_k),
        other => {
            return Err(GgufError::UnsupportedType {
                tensor: String::new(),
                ggml_type: other,
            })
        }
    }
    Ok(())
}

/// Runs `decode` on every `B`-byte block of `data` and its `N`-element slot of `out`, in
/// parallel for large tensors. Lengths were checked by the caller; any excess is ignored.
fn for_blocks<const B: usize, const N: usize, F>(data: &[u8], out: &mut [f32], decode: F)
where
    F: Fn(&[u8; B], &mut [f32; N]) + Sync,
{
    let run = |data: &[u8], out: &mut [f32]| {
        for (b, y) in data.chunks_exact(B).zip(out.chunks_exact_mut(N)) {
            if let (Ok(b), Ok(y)) = (<&[u8; B]>::try_from(b), <&mut [f32; N]>::try_from(y)) {
                decode(b, y);
            }
        }
    };
    if out.len() < PARALLEL_MIN_ELEMENTS {
        run(data, out);
    } else {
        let blocks = (TASK_ELEMENTS / N).max(1);
        data.par_chunks(blocks * B)
            .zip(out.par_chunks_mut(blocks * N))
            .for_each(|(d, o)| run(d, o));
    }
}

/// Reads a little-endian IEEE half float.
#[inline(always)]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// `block_q4_0`: f16 scale `d`, 16 bytes of nibbles; `x = (q - 8) * d`; low nibbles fill the
/// first half of the block, high nibbles the second.
fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_le([b[0], b[1]]);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// `block_q4_1`: f16 scale `d` and min `m`, 16 bytes of nibbles; `x = q * d + m`.
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_le([b[0], b[1]]);
    let m = f16_le([b[2], b[3]]);
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = (q & 0xF) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// `block_q5_0`: f16 scale, 32 high bits (`qh`, little-endian u32), 16 bytes of low nibbles;
/// `x = (q - 16) * d` with `q = nibble | (bit << 4)`.
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_le([b[0], b[1]]);
    let qh = u32::from_le_bytes(le(&b[2..6]));
    for j in 0..16 {
        let q = b[6 + j];
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((q & 0xF) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

/// `block_q5_1`: f16 scale and min, 32 high bits, 16 bytes of low nibbles; `x = q * d + m`.
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_le([b[0], b[1]]);
    let m = f16_le([b[2], b[3]]);
    let qh = u32::from_le_bytes(le(&b[4..8]));
    for j in 0..16 {
        let q = b[8 + j];
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((q & 0xF) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
    }
}

/// `block_q8_0`: f16 scale, 32 signed bytes; `x = q * d`.
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_le([b[0], b[1]]);
    for j in 0..32 {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

/// `block_q8_1`: f16 scale, f16 sum (unused here), 32 signed bytes; `x = q * d`.
fn q8_1(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f16_le([b[0], b[1]]);
    for j in 0..32 {
        y[j] = (b[4 + j] as i8) as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_checks_and_unsupported_types() {
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(GgufError::SizeMismatch { expected: 18, .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q4_K, &[0u8; 144], &mut out),
            Err(GgufError::SizeMismatch { expected: 0, .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::IQ4_NL, &[0u8; 18], &mut out),
            Err(GgufError::UnsupportedType { .. })
        ));
        dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out).unwrap();
        let mut empty: [f32; 0] = [];
        dequantize(GgmlType::Q6_K, &[], &mut empty).unwrap();
    }

    #[test]
    fn integer_and_f64_types() {
        let mut out = [0f32; 2];
        let bytes: Vec<u8> = [-3i32, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
        dequantize(GgmlType::I32, &bytes, &mut out).unwrap();
        assert_eq!(out, [-3.0, 7.0]);
        let bytes: Vec<u8> = [0.25f64, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        dequantize(GgmlType::F64, &bytes, &mut out).unwrap();
        assert_eq!(out, [0.25, -2.0]);
        dequantize(GgmlType::I8, &[0xff, 5], &mut out).unwrap();
        assert_eq!(out, [-1.0, 5.0]);
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 2.0 (f16 0x4000); byte 0x9F: low nibble 15 -> (15-8)*2 = 14, high 9 -> 2.
        let mut block = [0x88u8; 18];
        block[0] = 0x00;
        block[1] = 0x40;
        block[2] = 0x9F;
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_0, &block, &mut out).unwrap();
        assert_eq!(out[0], 14.0);
        assert_eq!(out[16], 2.0);
        assert!(out[1..16].iter().all(|&x| x == 0.0));
    }
}
