//! JSON -> Arrow: infer one Arrow schema from rows of JSON objects, then build record batches.
//!
//! Inference rules (the same choices pyarrow's `Table.from_pylist` makes):
//! - `null` fits any type; a column that is `null` everywhere has Arrow type `null`.
//! - integers -> `int64`, floats -> `float64`, and a column mixing the two -> `float64`;
//!   integers beyond the int64 range are an error.
//! - strings -> `utf8` (HF `string`), booleans -> `bool`.
//! - arrays -> `list<item>` with the element types merged the same way (across all rows).
//! - objects -> `struct`, fields in order of first appearance, the union over all rows
//!   (a key absent from one row reads back as `null` there).
//! - anything else (a string in one row and a number in another, ...) is an error naming the
//!   dotted column path and the row.

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, ListArray, NullArray, RecordBatch, RecordBatchOptions, StructArray};
use arrow_buffer::{NullBuffer, OffsetBuffer};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use serde_json::Value;

use crate::dataset::json_kind;
use crate::error::{DataError, Result};

/// The type of a JSON value as far as Arrow is concerned.
#[derive(Debug, Clone, PartialEq)]
enum JsonType {
    Null,
    Bool,
    Int,
    Float,
    Str,
    List(Box<JsonType>),
    Struct(Vec<(String, JsonType)>),
}

impl JsonType {
    fn describe(&self) -> String {
        match self {
            JsonType::Null => "null".into(),
            JsonType::Bool => "a boolean".into(),
            JsonType::Int => "an integer".into(),
            JsonType::Float => "a float".into(),
            JsonType::Str => "a string".into(),
            JsonType::List(_) => "an array".into(),
            JsonType::Struct(_) => "an object".into(),
        }
    }

    fn to_arrow(&self) -> DataType {
        match self {
            JsonType::Null => DataType::Null,
            JsonType::Bool => DataType::Boolean,
            JsonType::Int => DataType::Int64,
            JsonType::Float => DataType::Float64,
            JsonType::Str => DataType::Utf8,
            JsonType::List(item) => {
                DataType::List(Arc::new(Field::new("item", item.to_arrow(), true)))
            }
            JsonType::Struct(fields) => DataType::Struct(
                fields
                    .iter()
                    .map(|(name, t)| Field::new(name, t.to_arrow(), true))
                    .collect::<Fields>(),
            ),
        }
    }
}

/// Infers the Arrow schema of `rows` for the given top-level `columns` (in that order).
pub(crate) fn infer_schema(columns: &[String], rows: &[Value]) -> Result<SchemaRef> {
    let mut types = vec![JsonType::Null; columns.len()];
    for (row_idx, row) in rows.iter().enumerate() {
        let obj = row.as_object().ok_or_else(|| DataError::NotAnObject {
            location: format!("row {row_idx}"),
            found: json_kind(row),
        })?;
        for (column, acc) in columns.iter().zip(types.iter_mut()) {
            if let Some(v) = obj.get(column) {
                let t = type_of(v, column, row_idx)?;
                merge(acc, t, column, row_idx)?;
            }
        }
    }
    let fields: Vec<Field> = columns
        .iter()
        .zip(&types)
        .map(|(c, t)| Field::new(c, t.to_arrow(), true))
        .collect();
    Ok(Arc::new(Schema::new(fields)))
}

fn type_of(v: &Value, path: &str, row: usize) -> Result<JsonType> {
    Ok(match v {
        Value::Null => JsonType::Null,
        Value::Bool(_) => JsonType::Bool,
        Value::Number(n) if n.is_i64() => JsonType::Int,
        Value::Number(n) if n.is_u64() => {
            return Err(DataError::BadNumber {
                column: path.to_string(),
                row,
                value: n.to_string(),
                reason: "is beyond the int64 range Arrow/HF columns use; store it as a string",
            })
        }
        Value::Number(_) => JsonType::Float,
        Value::String(_) => JsonType::Str,
        Value::Array(items) => {
            let item_path = format!("{path}[]");
            let mut acc = JsonType::Null;
            for item in items {
                merge(&mut acc, type_of(item, &item_path, row)?, &item_path, row)?;
            }
            JsonType::List(Box::new(acc))
        }
        Value::Object(obj) => {
            let mut fields = Vec::with_capacity(obj.len());
            for (k, v) in obj {
                fields.push((k.clone(), type_of(v, &format!("{path}.{k}"), row)?));
            }
            JsonType::Struct(fields)
        }
    })
}

/// Merges `new` (seen at `row`) into `acc`, the type of everything seen before.
fn merge(acc: &mut JsonType, new: JsonType, path: &str, row: usize) -> Result<()> {
    match (&mut *acc, new) {
        (_, JsonType::Null) => {}
        (JsonType::Null, t) => *acc = t,
        (JsonType::Int, JsonType::Float) => *acc = JsonType::Float,
        (JsonType::Float, JsonType::Int) => {}
        (JsonType::List(a), JsonType::List(b)) => merge(a, *b, &format!("{path}[]"), row)?,
        (JsonType::Struct(a), JsonType::Struct(b)) => {
            for (name, t) in b {
                let field_path = format!("{path}.{name}");
                match a.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, existing)) => merge(existing, t, &field_path, row)?,
                    None => a.push((name, t)),
                }
            }
        }
        (a, b) if *a == b => {}
        (a, b) => {
            return Err(DataError::InconsistentType {
                column: path.to_string(),
                row,
                expected: a.describe(),
                found: b.describe(),
            })
        }
    }
    Ok(())
}

/// One record batch of `rows` (already checked by [`infer_schema`]) under `schema`.
pub(crate) fn rows_to_batch(
    schema: &SchemaRef,
    rows: &[Value],
) -> std::result::Result<RecordBatch, String> {
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let values: Vec<&Value> = rows
            .iter()
            .map(|r| r.get(field.name()).unwrap_or(&Value::Null))
            .collect();
        columns.push(build_array(field.data_type(), &values)?);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options).map_err(|e| e.to_string())
}

fn validity(values: &[&Value]) -> Option<NullBuffer> {
    let valid: Vec<bool> = values.iter().map(|v| !v.is_null()).collect();
    valid.contains(&false).then(|| NullBuffer::from(valid))
}

/// Builds an array of type `dt` (one [`JsonType::to_arrow`] produced) from `values`.
fn build_array(dt: &DataType, values: &[&Value]) -> std::result::Result<ArrayRef, String> {
    Ok(match dt {
        DataType::Null => Arc::new(NullArray::new(values.len())),
        DataType::Boolean => {
            let mut b = BooleanBuilder::with_capacity(values.len());
            values.iter().for_each(|v| b.append_option(v.as_bool()));
            Arc::new(b.finish())
        }
        DataType::Int64 => {
            let mut b = Int64Builder::with_capacity(values.len());
            values.iter().for_each(|v| b.append_option(v.as_i64()));
            Arc::new(b.finish())
        }
        DataType::Float64 => {
            let mut b = Float64Builder::with_capacity(values.len());
            values.iter().for_each(|v| b.append_option(v.as_f64()));
            Arc::new(b.finish())
        }
        DataType::Utf8 => {
            let mut b = StringBuilder::with_capacity(values.len(), 0);
            values.iter().for_each(|v| b.append_option(v.as_str()));
            Arc::new(b.finish())
        }
        DataType::List(item) => {
            let mut offsets = Vec::with_capacity(values.len() + 1);
            offsets.push(0i32);
            let mut children: Vec<&Value> = Vec::new();
            for v in values {
                if let Value::Array(items) = v {
                    children.extend(items.iter());
                }
                let end = i32::try_from(children.len())
                    .map_err(|_| "a list column holds over 2^31 items")?;
                offsets.push(end);
            }
            let child = build_array(item.data_type(), &children)?;
            let list = ListArray::try_new(
                item.clone(),
                OffsetBuffer::new(offsets.into()),
                child,
                validity(values),
            )
            .map_err(|e| e.to_string())?;
            Arc::new(list)
        }
        DataType::Struct(fields) => {
            let mut children = Vec::with_capacity(fields.len());
            for f in fields {
                let child: Vec<&Value> = values
                    .iter()
                    .map(|v| v.get(f.name()).unwrap_or(&Value::Null))
                    .collect();
                children.push(build_array(f.data_type(), &child)?);
            }
            let s = StructArray::try_new_with_length(
                fields.clone(),
                children,
                validity(values),
                values.len(),
            )
            .map_err(|e| e.to_string())?;
            Arc::new(s)
        }
        other => return Err(format!("internal: no JSON builder for Arrow type {other}")),
    })
}

/// Rows per record batch, as `datasets` writes them (`writer_batch_size`).
const BATCH_ROWS: usize = 1000;

/// The inferred schema of `dataset` (with the `huggingface` features metadata `datasets`
/// writes into Arrow and Parquet files) and its rows as record batches. `dest` names the
/// output in errors.
pub(crate) fn dataset_batches(
    dataset: &crate::Dataset,
    dest: &std::path::Path,
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let write_err = |message: String| DataError::Write {
        path: dest.to_path_buf(),
        message,
    };
    let schema = infer_schema(&dataset.columns, &dataset.rows)?;
    let features = crate::features::features_of(&schema).map_err(write_err)?;
    let meta = serde_json::json!({"info": {"features": features}}).to_string();
    let schema =
        Arc::new(Schema::clone(&schema).with_metadata([("huggingface".to_string(), meta)].into()));
    let mut batches = Vec::with_capacity(dataset.rows.len().div_ceil(BATCH_ROWS));
    for chunk in dataset.rows.chunks(BATCH_ROWS) {
        batches.push(rows_to_batch(&schema, chunk).map_err(write_err)?);
    }
    Ok((schema, batches))
}
