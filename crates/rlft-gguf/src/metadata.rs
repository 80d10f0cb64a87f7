//! The ordered metadata table of a GGUF file, with typed getters.

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::value::{Array, Value};

/// The metadata table of a GGUF file: keys in file order, with lookup by key and typed
/// getters that return a [`GgufError`] naming the key when it is missing or mistyped.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds an entry; gives the key back (and changes nothing) if it is already present.
    pub(crate) fn insert_new(&mut self, key: String, value: Value) -> Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(key);
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// The entries in file order.
    pub fn entries(&self) -> &[(String, Value)] {
        &self.entries
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index
            .get(key)
            .and_then(|&i| self.entries.get(i))
            .map(|(_, v)| v)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T> {
        let value = self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })?;
        conv(value).ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: value.describe(),
        })
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "a string", Value::as_str)
    }

    /// Any integer value that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "an integer in u32 range", Value::as_u32)
    }

    /// Any integer value that fits in `i32`.
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.typed(key, "an integer in i32 range", Value::as_i32)
    }

    /// Any integer value that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "an integer in u64 range", Value::as_u64)
    }

    /// Any integer value that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.typed(key, "an integer in i64 range", Value::as_i64)
    }

    /// Any integer value that fits in `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.typed(key, "an integer in usize range", Value::as_usize)
    }

    /// An `f32` or `f64` value (as `f32`).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "an f32 or f64", Value::as_f32)
    }

    /// An `f32` or `f64` value (as `f64`).
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.typed(key, "an f32 or f64", Value::as_f64)
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.typed(key, "an array", Value::as_array)
    }

    /// A string array.
    pub fn get_string_array(&self, key: &str) -> Result<&[String]> {
        self.typed(key, "a string array", |v| v.as_array()?.as_strings())
    }

    /// An integer array (of any integer element type) whose elements all fit in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.typed(key, "an integer array in i32 range", |v| {
            v.as_array()?.to_ints()
        })
    }

    /// An integer array (of any integer element type) whose elements all fit in `u32`.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        self.typed(key, "an integer array in u32 range", |v| {
            v.as_array()?.to_ints()
        })
    }

    /// An `f32` or `f64` array (as `f32`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        self.typed(key, "an f32 or f64 array", |v| v.as_array()?.to_f32s())
    }

    /// `general.architecture` (e.g. `"llama"`), if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Metadata {
        let mut m = Metadata::default();
        m.insert_new("a.u8".into(), Value::U8(7)).unwrap();
        m.insert_new("a.neg".into(), Value::I64(-1)).unwrap();
        m.insert_new("a.big".into(), Value::U64(1 << 40)).unwrap();
        m.insert_new("a.f64".into(), Value::F64(0.5)).unwrap();
        m.insert_new("a.s".into(), Value::String("x".into()))
            .unwrap();
        m.insert_new(
            "a.toks".into(),
            Value::Array(Array::String(vec!["a".into(), "b".into()])),
        )
        .unwrap();
        m.insert_new("a.tt".into(), Value::Array(Array::U8(vec![1, 3])))
            .unwrap();
        assert!(m.insert_new("a.u8".into(), Value::U8(8)).is_err());
        m
    }

    #[test]
    fn typed_getters_convert_and_explain() {
        let m = table();
        assert_eq!(m.len(), 7);
        assert_eq!(m.entries()[0].0, "a.u8");
        assert_eq!(m.get_u32("a.u8").unwrap(), 7);
        assert_eq!(m.get_i32("a.neg").unwrap(), -1);
        assert_eq!(m.get_u64("a.big").unwrap(), 1 << 40);
        assert_eq!(m.get_f32("a.f64").unwrap(), 0.5);
        assert_eq!(m.get_str("a.s").unwrap(), "x");
        assert_eq!(m.get_string_array("a.toks").unwrap(), ["a", "b"]);
        assert_eq!(m.get_i32_array("a.tt").unwrap(), [1, 3]);
        let e = m.get_u32("a.neg").unwrap_err().to_string();
        assert!(e.contains("a.neg") && e.contains("i64 -1"), "{e}");
        let e = m.get_u32("a.big").unwrap_err().to_string();
        assert!(e.contains("u32 range"), "{e}");
        let e = m.get_str("nope").unwrap_err().to_string();
        assert!(e.contains("'nope' is missing"), "{e}");
        assert!(m.get_f32("a.u8").is_err());
        assert!(m.get_string_array("a.tt").is_err());
        assert_eq!(m.architecture(), None);
    }
}
