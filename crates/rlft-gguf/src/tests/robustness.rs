//! Deterministic corruption of a valid file: truncation at every length, random byte flips and
//! huge values written over every header field. Errors are fine; panics are not.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{write_gguf, RawTensor, Rng};
use crate::{Array, GgmlType, GgufFile, Value};

fn fixture() -> Vec<u8> {
    let kvs = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(2)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("b", Value::Bool(true)),
        ("i", Value::I64(-1)),
        (
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["<s>".into(), "a".into(), "bc".into()])),
        ),
        (
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![3, 1, 1])),
        ),
        ("scores", Value::Array(Array::F32(vec![0.0, -1.0, -2.0]))),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::U16(vec![1, 2]),
                Array::Bool(vec![true]),
            ])),
        ),
    ];
    let mut rng = Rng(7);
    let mut tensor = |name: &str, ty: GgmlType, dims: Vec<u64>| {
        let n: u64 = dims.iter().product();
        let len = ty.bytes_for(n).unwrap() as usize;
        let data = (0..len).map(|_| rng.next_u64() as u8).collect();
        RawTensor {
            name: name.into(),
            dims,
            ggml_type: ty,
            data,
        }
    };
    let tensors = [
        tensor("f32", GgmlType::F32, vec![4, 2]),
        tensor("f16", GgmlType::F16, vec![8]),
        tensor("bf16", GgmlType::BF16, vec![8]),
        tensor("q4_1", GgmlType::Q4_1, vec![32, 2]),
        tensor("q8_0", GgmlType::Q8_0, vec![32]),
        tensor("q5_0", GgmlType::Q5_0, vec![32]),
        tensor("q4_k", GgmlType::Q4_K, vec![256]),
        tensor("q6_k", GgmlType::Q6_K, vec![256]),
        tensor("q3_k", GgmlType::Q3_K, vec![256]),
        tensor("iq4_nl", GgmlType::IQ4_NL, vec![32]),
    ];
    write_gguf(3, 32, &kvs, &tensors)
}

/// Parses `bytes` and exercises the whole read API; returns whether parsing succeeded.
/// Panics (the test fails) if the reader panics.
fn exercise(bytes: &[u8], case: &str) -> bool {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let Ok(file) = GgufFile::from_bytes(bytes) else {
            return false;
        };
        let m = file.metadata();
        for (key, _) in m.entries() {
            let _ = (
                m.get_str(key),
                m.get_u32(key),
                m.get_f32(key),
                m.get_i32_array(key),
            );
            let _ = m.get_string_array(key);
        }
        for info in file.tensors() {
            let _ = (info.shape(), info.n_elements(), info.data_range());
            if let Ok((shape, data)) = file.read_f32(&info.name) {
                let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                assert_eq!(n, Some(data.len()));
            }
        }
        true
    }));
    match result {
        Ok(parsed) => parsed,
        Err(_) => panic!("reader panicked on {case}"),
    }
}

#[test]
fn truncation_at_every_length_is_an_error() {
    let bytes = fixture();
    assert!(exercise(&bytes, "the valid fixture"));
    let file = GgufFile::from_bytes(&bytes).unwrap();
    assert_eq!(file.tensors().len(), 10);
    for len in 0..bytes.len() {
        // Every tensor's data reaches the end of the file, so every prefix is invalid.
        assert!(
            !exercise(&bytes[..len], &format!("prefix of {len} bytes")),
            "len {len}"
        );
    }
}

#[test]
fn random_byte_corruption_never_panics() {
    let bytes = fixture();
    let header_len = GgufFile::from_bytes(&bytes).unwrap().data_offset();
    let mut rng = Rng(2024);
    let mut parsed = 0;
    for case in 0..4000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.below(4) {
            // Mostly in the header, where the structure is.
            let limit = if rng.below(4) == 0 {
                b.len() as u64
            } else {
                header_len
            };
            let pos = rng.below(limit) as usize;
            b[pos] = if rng.below(2) == 0 {
                b[pos] ^ (1 << rng.below(8))
            } else {
                rng.next_u64() as u8
            };
        }
        parsed += exercise(&b, &format!("random corruption case {case}")) as usize;
    }
    // Some corruptions (e.g. of tensor data or string contents) are still valid files.
    assert!(parsed > 0);
}

#[test]
fn huge_values_over_every_header_field_never_panic() {
    let bytes = fixture();
    let header_len = GgufFile::from_bytes(&bytes).unwrap().data_offset() as usize;
    let len = bytes.len() as u64;
    let u64s = [u64::MAX, 1 << 63, 1 << 62, 1 << 32, len + 1, len / 2];
    let u32s = [u32::MAX, 1 << 31, 5];
    for pos in 0..header_len {
        for v in u64s {
            let mut b = bytes.clone();
            let end = (pos + 8).min(b.len());
            b[pos..end].copy_from_slice(&v.to_le_bytes()[..end - pos]);
            exercise(&b, &format!("u64 {v} at {pos}"));
        }
        for v in u32s {
            let mut b = bytes.clone();
            let end = (pos + 4).min(b.len());
            b[pos..end].copy_from_slice(&v.to_le_bytes()[..end - pos]);
            exercise(&b, &format!("u32 {v} at {pos}"));
        }
    }
}
