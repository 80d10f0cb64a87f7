//! Arrow -> JSON: record batches to rows of `serde_json::Value`.
//!
//! Conversion is column-wise: each column becomes a `Vec<Value>` (recursively for lists,
//! structs, maps and dictionaries), then the columns are zipped into row objects.

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use serde_json::{Map, Number, Value};

use crate::error::{DataError, Result};

/// Appends the rows of `batch` to `rows`, one JSON object per row with the batch's columns in
/// schema order. `path` and column names go into errors.
pub(crate) fn append_batch(path: &Path, batch: &RecordBatch, rows: &mut Vec<Value>) -> Result<()> {
    let schema = batch.schema();
    let mut columns: Vec<std::vec::IntoIter<Value>> = Vec::with_capacity(batch.num_columns());
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        columns.push(array_to_json(path, field.name(), array.as_ref())?.into_iter());
    }
    rows.reserve(batch.num_rows());
    for _ in 0..batch.num_rows() {
        let mut obj = Map::with_capacity(columns.len());
        for (field, col) in schema.fields().iter().zip(columns.iter_mut()) {
            obj.insert(field.name().clone(), col.next().unwrap_or(Value::Null));
        }
        rows.push(Value::Object(obj));
    }
    Ok(())
}

/// The JSON values of every slot of `array` (`null` where the slot is null). `column` is the
/// dotted path of the array, for errors.
pub(crate) fn array_to_json(path: &Path, column: &str, array: &dyn Array) -> Result<Vec<Value>> {
    let n = array.len();
    let unsupported = || DataError::UnsupportedType {
        path: path.to_path_buf(),
        column: column.to_string(),
        data_type: array.data_type().to_string(),
    };
    let mut out: Vec<Value> = match array.data_type() {
        DataType::Null => vec![Value::Null; n],
        DataType::Boolean => array
            .as_boolean()
            .iter()
            .map(|v| v.map_or(Value::Null, Value::Bool))
            .collect(),
        DataType::Int8 => ints::<Int8Type>(array),
        DataType::Int16 => ints::<Int16Type>(array),
        DataType::Int32 => ints::<Int32Type>(array),
        DataType::Int64 => ints::<Int64Type>(array),
        DataType::UInt8 => ints::<UInt8Type>(array),
        DataType::UInt16 => ints::<UInt16Type>(array),
        DataType::UInt32 => ints::<UInt32Type>(array),
        DataType::UInt64 => ints::<UInt64Type>(array),
        DataType::Float16 => floats(
            array
                .as_primitive::<Float16Type>()
                .iter()
                .map(|v| v.map(|x| x.to_f64())),
        ),
        DataType::Float32 => floats(
            array
                .as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from)),
        ),
        DataType::Float64 => floats(array.as_primitive::<Float64Type>().iter()),
        DataType::Utf8 => strings(array.as_string::<i32>().iter()),
        DataType::LargeUtf8 => strings(array.as_string::<i64>().iter()),
        DataType::Utf8View => strings(array.as_string_view().iter()),
        DataType::Binary => bytes(array.as_binary::<i32>().iter()),
        DataType::LargeBinary => bytes(array.as_binary::<i64>().iter()),
        DataType::BinaryView => bytes(array.as_binary_view().iter()),
        DataType::FixedSizeBinary(_) => bytes(array.as_fixed_size_binary().iter()),
        DataType::List(_) => list::<i32>(path, column, array)?,
        DataType::LargeList(_) => list::<i64>(path, column, array)?,
        DataType::FixedSizeList(_, size) => {
            let list = array.as_fixed_size_list();
            let size = usize::try_from(*size).map_err(|_| unsupported())?;
            let values = array_to_json(path, &format!("{column}[]"), list.values().as_ref())?;
            (0..n)
                .map(|i| {
                    let start = i * size; // values are sliced with the array, so offsets start at 0
                    Value::Array(values[start..start + size].to_vec())
                })
                .collect()
        }
        DataType::Struct(fields) => {
            let s = array.as_struct();
            let mut children: Vec<std::vec::IntoIter<Value>> = Vec::with_capacity(fields.len());
            for (field, child) in fields.iter().zip(s.columns()) {
                let name = format!("{column}.{}", field.name());
                children.push(array_to_json(path, &name, child.as_ref())?.into_iter());
            }
            (0..n)
                .map(|_| {
                    let mut obj = Map::with_capacity(fields.len());
                    for (field, child) in fields.iter().zip(children.iter_mut()) {
                        obj.insert(field.name().clone(), child.next().unwrap_or(Value::Null));
                    }
                    Value::Object(obj)
                })
                .collect()
        }
        DataType::Map(_, _) => map(path, column, array)?,
        DataType::Dictionary(_, _) => {
            let dict = array.as_any_dictionary();
            let values = array_to_json(path, column, dict.values().as_ref())?;
            dict.normalized_keys()
                .into_iter()
                .map(|k| values.get(k).cloned().unwrap_or(Value::Null))
                .collect()
        }
        DataType::Date32 => {
            temporal::<Date32Type>(array, |a, i| a.value_as_date(i).map(|d| d.to_string()))
        }
        DataType::Date64 => {
            temporal::<Date64Type>(array, |a, i| a.value_as_date(i).map(|d| d.to_string()))
        }
        DataType::Timestamp(unit, tz) => {
            // A zoned timestamp is stored as UTC: print it with a `Z`.
            let z = tz.is_some();
            match unit {
                TimeUnit::Second => timestamps::<TimestampSecondType>(array, z),
                TimeUnit::Millisecond => timestamps::<TimestampMillisecondType>(array, z),
                TimeUnit::Microsecond => timestamps::<TimestampMicrosecondType>(array, z),
                TimeUnit::Nanosecond => timestamps::<TimestampNanosecondType>(array, z),
            }
        }
        DataType::Decimal128(_, _) => {
            let a = array.as_primitive::<Decimal128Type>();
            (0..n)
                .map(|i| Value::String(a.value_as_string(i)))
                .collect()
        }
        _ => return Err(unsupported()),
    };
    // Parent nulls (a null struct or list slot) override whatever the children held.
    if array.null_count() > 0 && !matches!(array.data_type(), DataType::Null) {
        for (i, v) in out.iter_mut().enumerate() {
            if array.is_null(i) {
                *v = Value::Null;
            }
        }
    }
    Ok(out)
}

fn ints<T: ArrowPrimitiveType>(array: &dyn Array) -> Vec<Value>
where
    T::Native: Into<Number>,
{
    array
        .as_primitive::<T>()
        .iter()
        .map(|v| v.map_or(Value::Null, |x| Value::Number(x.into())))
        .collect()
}

/// Non-finite floats (NaN, +-inf) have no JSON form and become `null`.
fn floats(values: impl Iterator<Item = Option<f64>>) -> Vec<Value> {
    values
        .map(|v| {
            v.and_then(Number::from_f64)
                .map_or(Value::Null, Value::Number)
        })
        .collect()
}

fn strings<'a>(values: impl Iterator<Item = Option<&'a str>>) -> Vec<Value> {
    values
        .map(|v| v.map_or(Value::Null, |s| Value::String(s.to_string())))
        .collect()
}

/// Binary becomes an array of byte values (0-255).
fn bytes<'a>(values: impl Iterator<Item = Option<&'a [u8]>>) -> Vec<Value> {
    values
        .map(|v| {
            v.map_or(Value::Null, |b| {
                Value::Array(b.iter().map(|&x| Value::from(x)).collect())
            })
        })
        .collect()
}

fn temporal<T: ArrowPrimitiveType>(
    array: &dyn Array,
    f: impl Fn(&arrow_array::PrimitiveArray<T>, usize) -> Option<String>,
) -> Vec<Value> {
    let a = array.as_primitive::<T>();
    (0..a.len())
        .map(|i| {
            if a.is_null(i) {
                Value::Null
            } else {
                f(a, i).map_or(Value::Null, Value::String)
            }
        })
        .collect()
}

/// ISO 8601 (`2024-01-31T12:00:00.5`), with a `Z` when the column has a time zone.
fn timestamps<T: ArrowTimestampType>(array: &dyn Array, zulu: bool) -> Vec<Value> {
    let z = if zulu { "Z" } else { "" };
    temporal::<T>(array, |a, i| {
        a.value_as_datetime(i)
            .map(|d| format!("{}{z}", d.format("%Y-%m-%dT%H:%M:%S%.f")))
    })
}

fn list<O: OffsetSizeTrait>(path: &Path, column: &str, array: &dyn Array) -> Result<Vec<Value>> {
    let list = array.as_list::<O>();
    let mut values = array_to_json(path, &format!("{column}[]"), list.values().as_ref())?;
    let offsets = list.value_offsets();
    Ok(offsets
        .windows(2)
        .map(|w| {
            let (start, end) = (w[0].as_usize(), w[1].as_usize());
            // List offsets never overlap, so each child value is moved out exactly once.
            Value::Array(values[start..end].iter_mut().map(std::mem::take).collect())
        })
        .collect())
}

/// A map with string keys becomes an object; any other key type a list of `{key, value}`.
fn map(path: &Path, column: &str, array: &dyn Array) -> Result<Vec<Value>> {
    let m = array.as_map();
    let string_keys = matches!(
        m.key_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    let keys = array_to_json(path, &format!("{column}.key"), m.keys().as_ref())?;
    let mut values = array_to_json(path, &format!("{column}.value"), m.values().as_ref())?;
    Ok(m.value_offsets()
        .windows(2)
        .map(|w| {
            let range = w[0] as usize..w[1] as usize;
            if string_keys {
                let mut obj = Map::new();
                for j in range {
                    let key = keys[j].as_str().unwrap_or_default().to_string();
                    obj.insert(key, std::mem::take(&mut values[j]));
                }
                Value::Object(obj)
            } else {
                Value::Array(
                    range
                        .map(|j| {
                            let mut obj = Map::new();
                            obj.insert("key".into(), keys[j].clone());
                            obj.insert("value".into(), std::mem::take(&mut values[j]));
                            Value::Object(obj)
                        })
                        .collect(),
                )
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        ArrayRef, BinaryArray, Date32Array, Decimal128Array, Float16Array, StringViewArray,
        TimestampMillisecondArray, UnionArray,
    };
    use arrow_buffer::ScalarBuffer;
    use arrow_schema::{Field, UnionFields};
    use serde_json::json;

    use super::*;

    fn conv(a: ArrayRef) -> Vec<Value> {
        array_to_json(Path::new("t.arrow"), "c", a.as_ref()).unwrap()
    }

    #[test]
    fn temporal_decimal_binary_and_views() {
        assert_eq!(
            conv(Arc::new(Date32Array::from(vec![Some(19753), None]))),
            [json!("2024-01-31"), json!(null)]
        );
        let ts = TimestampMillisecondArray::from(vec![1_706_702_400_500]);
        assert_eq!(
            conv(Arc::new(ts.clone())),
            [json!("2024-01-31T12:00:00.500")]
        );
        assert_eq!(
            conv(Arc::new(ts.with_timezone("UTC"))),
            [json!("2024-01-31T12:00:00.500Z")]
        );
        let dec = Decimal128Array::from(vec![12345, -5])
            .with_precision_and_scale(10, 2)
            .unwrap();
        assert_eq!(conv(Arc::new(dec)), [json!("123.45"), json!("-0.05")]);
        assert_eq!(
            conv(Arc::new(BinaryArray::from(vec![&b"\x00\xff"[..]]))),
            [json!([0, 255])]
        );
        assert_eq!(
            conv(Arc::new(StringViewArray::from(vec![Some("v"), None]))),
            [json!("v"), json!(null)]
        );
        let halves = Float16Array::from(vec![half_of(0.5), half_of(f32::INFINITY)]);
        assert_eq!(conv(Arc::new(halves)), [json!(0.5), json!(null)]);
    }

    fn half_of(x: f32) -> <Float16Type as ArrowPrimitiveType>::Native {
        <Float16Type as ArrowPrimitiveType>::Native::from_f32(x)
    }

    #[test]
    fn unsupported_types_name_the_file_and_column() {
        let fields = UnionFields::try_new([0], [Field::new("a", DataType::Int32, false)]).unwrap();
        let children: Vec<ArrayRef> = vec![Arc::new(arrow_array::Int32Array::from(vec![1]))];
        let union =
            UnionArray::try_new(fields, ScalarBuffer::from(vec![0i8]), None, children).unwrap();
        let err = array_to_json(Path::new("t.arrow"), "col.sub", &union)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("t.arrow: column \"col.sub\" has Arrow type Union"),
            "{err}"
        );
    }
}
