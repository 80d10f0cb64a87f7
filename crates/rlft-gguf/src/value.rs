//! GGUF metadata values: scalars, strings and (nested) typed arrays.

/// The type tag of a GGUF metadata value (`gguf_metadata_value_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// id 0
    U8,
    /// id 1
    I8,
    /// id 2
    U16,
    /// id 3
    I16,
    /// id 4
    U32,
    /// id 5
    I32,
    /// id 6
    F32,
    /// id 7
    Bool,
    /// id 8
    String,
    /// id 9
    Array,
    /// id 10
    U64,
    /// id 11
    I64,
    /// id 12
    F64,
}

impl ValueType {
    /// The type with this id, or `None` if it is outside the specification.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The id stored in GGUF files.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies on disk (GGUF v2/v3); used to reject
    /// counts that cannot fit in the remaining input before allocating anything.
    pub fn min_disk_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            String => 8,
            Array => 12,
        }
    }

    /// Lower-case name, as used in error messages (`"u32"`, `"string"`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value.
///
/// Strings are decoded as UTF-8; invalid sequences are replaced by U+FFFD (some converters
/// write non-UTF-8 token strings, and rejecting the whole file for that would be unhelpful).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`
    U8(u8),
    /// `i8`
    I8(i8),
    /// `u16`
    U16(u16),
    /// `i16`
    I16(i16),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f32`
    F32(f32),
    /// `f64`
    F64(f64),
    /// `bool`
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Homogeneous array (possibly of arrays).
    Array(Array),
}

/// A homogeneous GGUF array, stored as a typed vector (compact for large vocabularies).
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `u8[]`
    U8(Vec<u8>),
    /// `i8[]`
    I8(Vec<i8>),
    /// `u16[]`
    U16(Vec<u16>),
    /// `i16[]`
    I16(Vec<i16>),
    /// `u32[]`
    U32(Vec<u32>),
    /// `i32[]`
    I32(Vec<i32>),
    /// `u64[]`
    U64(Vec<u64>),
    /// `i64[]`
    I64(Vec<i64>),
    /// `f32[]`
    F32(Vec<f32>),
    /// `f64[]`
    F64(Vec<f64>),
    /// `bool[]`
    Bool(Vec<bool>),
    /// `string[]`
    String(Vec<String>),
    /// Array of arrays; each inner array has its own element type.
    Array(Vec<Array>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F32(_) => ValueType::F32,
            Array::F64(_) => ValueType::F64,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
        }
    }

    /// The elements as `i128` if this is an integer array (every integer type fits).
    fn integers(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }

    /// The elements converted to `T` if this is an integer array whose every element fits.
    pub fn to_ints<T: TryFrom<i128>>(&self) -> Option<Vec<T>> {
        self.integers()?
            .into_iter()
            .map(|x| T::try_from(x).ok())
            .collect()
    }

    /// The elements as `f32` if this is an `f32` or `f64` array (`f64` is rounded).
    pub fn to_f32s(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// The strings if this is a string array.
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }
}

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// The value as `i128` if it is any integer type.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer value that fits in `u32`.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }

    /// Any integer value that fits in `i32`.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }

    /// Any integer value that fits in `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }

    /// Any integer value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }

    /// Any integer value that fits in `usize`.
    pub fn as_usize(&self) -> Option<usize> {
        self.as_i128().and_then(|v| v.try_into().ok())
    }

    /// An `f32` value, or an `f64` value rounded to `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `f64` or `f32` value.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) => Some(v),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }

    /// A short description for error messages, e.g. `i64 -1` or `array of 3 string`.
    pub fn describe(&self) -> String {
        match self {
            Value::String(s) if s.chars().count() > 40 => {
                let head: String = s.chars().take(40).collect();
                format!("string {head:?}...")
            }
            Value::String(s) => format!("string {s:?}"),
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type().name()),
            Value::U8(v) => format!("u8 {v}"),
            Value::I8(v) => format!("i8 {v}"),
            Value::U16(v) => format!("u16 {v}"),
            Value::I16(v) => format!("i16 {v}"),
            Value::U32(v) => format!("u32 {v}"),
            Value::I32(v) => format!("i32 {v}"),
            Value::U64(v) => format!("u64 {v}"),
            Value::I64(v) => format!("i64 {v}"),
            Value::F32(v) => format!("f32 {v}"),
            Value::F64(v) => format!("f64 {v}"),
            Value::Bool(v) => format!("bool {v}"),
        }
    }
}
