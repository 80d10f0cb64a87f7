//! Arrow types -> Hugging Face `datasets` feature descriptions (the `features` of
//! `dataset_info.json` and of the `huggingface` schema metadata), as `datasets` 4/5 write them:
//!
//! - scalars: `{"dtype": "string", "_type": "Value"}` (`int64`, `float64`, `bool`, `null`,
//!   `large_string`, ...);
//! - structs: a plain object of sub-features, `{"ground_truth": {...}}`;
//! - lists: `{"feature": <item>, "_type": "List"}` (`"LargeList"` for large lists, plus
//!   `"length": n` for fixed-size lists).
//!
//! (datasets 2.x/3.x wrote `Sequence` for lists; `load_from_disk` in 4+ reads both, and the
//! writer here targets 4/5, checked against `datasets` 5.2.)

use arrow_schema::{DataType, Schema};
use serde_json::{json, Map, Value};

/// The `features` object for `schema`, or the first type with no HF counterpart.
pub(crate) fn features_of(schema: &Schema) -> Result<Value, String> {
    let mut out = Map::new();
    for field in schema.fields() {
        out.insert(field.name().clone(), feature_of(field.data_type())?);
    }
    Ok(Value::Object(out))
}

fn value(dtype: &str) -> Value {
    json!({"dtype": dtype, "_type": "Value"})
}

fn feature_of(dt: &DataType) -> Result<Value, String> {
    Ok(match dt {
        DataType::Null => value("null"),
        DataType::Boolean => value("bool"),
        DataType::Int8 => value("int8"),
        DataType::Int16 => value("int16"),
        DataType::Int32 => value("int32"),
        DataType::Int64 => value("int64"),
        DataType::UInt8 => value("uint8"),
        DataType::UInt16 => value("uint16"),
        DataType::UInt32 => value("uint32"),
        DataType::UInt64 => value("uint64"),
        DataType::Float16 => value("float16"),
        DataType::Float32 => value("float32"),
        DataType::Float64 => value("float64"),
        DataType::Utf8 => value("string"),
        DataType::LargeUtf8 => value("large_string"),
        DataType::Binary => value("binary"),
        DataType::LargeBinary => value("large_binary"),
        DataType::List(item) => json!({"feature": feature_of(item.data_type())?, "_type": "List"}),
        DataType::LargeList(item) => {
            json!({"feature": feature_of(item.data_type())?, "_type": "LargeList"})
        }
        DataType::FixedSizeList(item, n) => {
            json!({"feature": feature_of(item.data_type())?, "length": n, "_type": "List"})
        }
        DataType::Struct(fields) => {
            let mut out = Map::new();
            for f in fields {
                out.insert(f.name().clone(), feature_of(f.data_type())?);
            }
            Value::Object(out)
        }
        other => {
            return Err(format!(
                "Arrow type {other} has no `datasets` feature equivalent"
            ))
        }
    })
}
