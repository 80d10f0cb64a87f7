//! Crate tests that need a GGUF writer: candle compatibility, metadata round trips,
//! error messages and robustness against corrupt input.

#[path = "../../../../tests/fixtures.rs"]
mod fixtures;

mod candle_compat;
mod metadata;
mod robustness;

use crate::{Array, GgmlType, Value};

/// A tensor to write: name, dims in GGUF order, type, raw data.
pub(crate) struct RawTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

/// A minimal GGUF writer for tests (the crate itself only reads).
pub(crate) fn write_gguf(
    version: u32,
    alignment: u64,
    kvs: &[(&str, Value)],
    tensors: &[RawTensor],
) -> Vec<u8> {
    let mut w = Vec::new();
    w.extend_from_slice(b"GGUF");
    w.extend_from_slice(&version.to_le_bytes());
    w.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    w.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        write_str(&mut w, key);
        w.extend_from_slice(&value.value_type().id().to_le_bytes());
        write_value(&mut w, value);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in tensors {
        write_str(&mut w, &t.name);
        w.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            w.extend_from_slice(&d.to_le_bytes());
        }
        w.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        w.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
    }
    let start = (w.len() as u64).next_multiple_of(alignment) as usize;
    w.resize(start, 0);
    for (t, off) in tensors.iter().zip(offsets) {
        w.resize(start + off as usize, 0);
        w.extend_from_slice(&t.data);
    }
    w
}

fn write_str(w: &mut Vec<u8>, s: &str) {
    w.extend_from_slice(&(s.len() as u64).to_le_bytes());
    w.extend_from_slice(s.as_bytes());
}

fn write_value(w: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => w.push(*x),
        Value::I8(x) => w.push(*x as u8),
        Value::U16(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => w.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => w.push(u8::from(*x)),
        Value::String(s) => write_str(w, s),
        Value::Array(a) => write_array(w, a),
    }
}

fn write_array(w: &mut Vec<u8>, a: &Array) {
    w.extend_from_slice(&a.element_type().id().to_le_bytes());
    w.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy>(w: &mut Vec<u8>, xs: &[T], f: fn(T) -> Value) {
        for &x in xs {
            write_value(w, &f(x));
        }
    }
    match a {
        Array::U8(v) => each(w, v, Value::U8),
        Array::I8(v) => each(w, v, Value::I8),
        Array::U16(v) => each(w, v, Value::U16),
        Array::I16(v) => each(w, v, Value::I16),
        Array::U32(v) => each(w, v, Value::U32),
        Array::I32(v) => each(w, v, Value::I32),
        Array::U64(v) => each(w, v, Value::U64),
        Array::I64(v) => each(w, v, Value::I64),
        Array::F32(v) => each(w, v, Value::F32),
        Array::F64(v) => each(w, v, Value::F64),
        Array::Bool(v) => each(w, v, Value::Bool),
        Array::String(v) => v.iter().for_each(|s| write_str(w, s)),
        Array::Array(v) => v.iter().for_each(|inner| write_array(w, inner)),
    }
}

/// SplitMix64: a tiny deterministic generator for test data.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[-1, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}
