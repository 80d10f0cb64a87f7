//! Parquet files, through the `parquet` crate's Arrow bridge.

use std::fs::File;
use std::path::Path;

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::atomic;
use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::to_arrow::dataset_batches;
use crate::to_json::append_batch;

/// Reads every row group of a Parquet file (Snappy, Zstd or uncompressed).
pub fn read_parquet(path: &Path) -> Result<Dataset> {
    let decode = |e: parquet::errors::ParquetError| DataError::Decode {
        path: path.to_path_buf(),
        message: format!("cannot read Parquet: {e}"),
    };
    let file = File::open(path).map_err(|e| DataError::io("cannot open", path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(decode)?;
    let columns = builder
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let reader = builder.with_batch_size(8192).build().map_err(decode)?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| DataError::Decode {
            path: path.to_path_buf(),
            message: format!("cannot read Parquet: {e}"),
        })?;
        append_batch(path, &batch, &mut rows)?;
    }
    Ok(Dataset {
        columns,
        rows,
        source: Some(path.to_path_buf()),
    })
}

/// Writes `dataset` as one Parquet file (Snappy, as pyarrow writes by default), atomically.
/// The Arrow schema is inferred from the rows (see the crate docs).
pub fn write_parquet(path: impl AsRef<Path>, dataset: &Dataset) -> Result<()> {
    let path = path.as_ref();
    let (schema, batches) = dataset_batches(dataset, path)?;
    let encode = |e: parquet::errors::ParquetError| DataError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    atomic::write_file(path, |w| {
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build();
        let mut writer = ArrowWriter::try_new(w, schema.clone(), Some(props)).map_err(encode)?;
        for batch in &batches {
            writer.write(batch).map_err(encode)?;
        }
        writer.close().map_err(encode)?;
        Ok(())
    })
}
