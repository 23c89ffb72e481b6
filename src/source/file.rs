//! The file source: a landing directory of JSON, CSV, Parquet or text files (spec §10).
//!
//! New files are discovered at every trigger by listing the directory, oldest modification
//! time first (ties broken by path). Which files were taken, and in which batch, is kept in
//! the query's checkpoint (`sources/0/<k>`, see [`crate::checkpoint`]), so every file is
//! read exactly once per query.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use datafusion::arrow::array::{ArrayRef, StringBuilder, new_null_array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sql::options::Options;

/// Rows per Arrow batch when decoding files.
const BATCH_SIZE: usize = 8192;

/// The format of the files in a landing directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileFormat {
    /// One JSON object per line.
    Json,
    Csv {
        header: bool,
        delimiter: u8,
    },
    Parquet,
    /// One row per line, in the single column `value`.
    Text,
}

impl FileFormat {
    /// Parses the `format` option (with `header` and `delimiter` for CSV).
    pub fn parse(name: &str, options: &Options) -> Result<FileFormat> {
        match name.to_ascii_lowercase().as_str() {
            "json" => Ok(FileFormat::Json),
            "csv" => {
                let header = options.bool("header")?.unwrap_or(false);
                let delimiter = match options.get("delimiter") {
                    None => b',',
                    Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
                    Some("\\t") => b'\t',
                    Some(d) => {
                        return Err(Error::invalid_option(format!(
                            "option \"delimiter\" must be one ASCII character, got \"{d}\""
                        )));
                    }
                };
                Ok(FileFormat::Csv { header, delimiter })
            }
            "parquet" => Ok(FileFormat::Parquet),
            "text" => Ok(FileFormat::Text),
            other => Err(Error::InvalidOption {
                message: format!("format \"{other}\" is not supported"),
                hint: Some("Use 'json', 'csv', 'parquet' or 'text'.".into()),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            FileFormat::Json => "json",
            FileFormat::Csv { .. } => "csv",
            FileFormat::Parquet => "parquet",
            FileFormat::Text => "text",
        }
    }
}

/// Everything needed to list and read a stream's files.
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    pub path: PathBuf,
    pub format: FileFormat,
    /// At most this many new files per micro-batch.
    pub max_files_per_trigger: Option<u64>,
    /// The declared schema; every field nullable.
    pub schema: SchemaRef,
}

/// A file found in the landing directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedFile {
    /// `file:///...` URL, as Spark writes it in the source log.
    pub path: String,
    /// Modification time, ms since the epoch.
    pub timestamp: i64,
}

impl ListedFile {
    pub fn local_path(&self) -> PathBuf {
        PathBuf::from(self.path.strip_prefix("file://").unwrap_or(&self.path))
    }
}

impl FileSourceConfig {
    /// Lists the files under the path, oldest first. Hidden files (`.x`, `_x`) and
    /// directories are skipped, as Spark does; subdirectories are walked.
    pub fn list(&self) -> Result<Vec<ListedFile>> {
        let mut out = Vec::new();
        walk(&self.path, &mut out)?;
        out.sort_by(|a, b| {
            a.timestamp
                .cmp(&b.timestamp)
                .then_with(|| a.path.cmp(&b.path))
        });
        Ok(out)
    }

    /// Reads one file into batches of the declared schema.
    pub fn read(&self, file: &Path) -> Result<Vec<RecordBatch>> {
        let open =
            || File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e));
        let with_file = |e: datafusion::arrow::error::ArrowError| Error::InvalidOption {
            message: format!("cannot read {}: {e}", file.display()),
            hint: None,
        };
        let schema = self.schema.clone();
        match &self.format {
            FileFormat::Json => {
                let reader = datafusion::arrow::json::ReaderBuilder::new(schema)
                    .with_batch_size(BATCH_SIZE)
                    .build(BufReader::with_capacity(1 << 20, open()?))
                    .map_err(with_file)?;
                reader.map(|b| b.map_err(with_file)).collect()
            }
            FileFormat::Csv { header, delimiter } => {
                let reader = datafusion::arrow::csv::ReaderBuilder::new(schema)
                    .with_header(*header)
                    .with_delimiter(*delimiter)
                    .with_batch_size(BATCH_SIZE)
                    .build(BufReader::with_capacity(1 << 20, open()?))
                    .map_err(with_file)?;
                reader.map(|b| b.map_err(with_file)).collect()
            }
            FileFormat::Parquet => {
                let builder = ParquetRecordBatchReaderBuilder::try_new(open()?).map_err(|e| {
                    Error::invalid_option(format!("cannot read {}: {e}", file.display()))
                })?;
                let reader = builder.with_batch_size(BATCH_SIZE).build().map_err(|e| {
                    Error::invalid_option(format!("cannot read {}: {e}", file.display()))
                })?;
                let mut out = Vec::new();
                for b in reader {
                    out.push(conform(&b.map_err(with_file)?, &schema).map_err(with_file)?);
                }
                Ok(out)
            }
            FileFormat::Text => {
                let mut out = Vec::new();
                let mut builder = StringBuilder::new();
                let mut n = 0;
                let mut reader = BufReader::with_capacity(1 << 20, open()?);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    let read = reader
                        .read_until(b'\n', &mut line)
                        .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
                    if read == 0 {
                        break;
                    }
                    while matches!(line.last(), Some(b'\n' | b'\r')) {
                        line.pop();
                    }
                    builder.append_value(String::from_utf8_lossy(&line));
                    n += 1;
                    if n == BATCH_SIZE {
                        out.push(RecordBatch::try_new(
                            schema.clone(),
                            vec![Arc::new(builder.finish())],
                        )?);
                        n = 0;
                    }
                }
                if n > 0 {
                    out.push(RecordBatch::try_new(
                        schema.clone(),
                        vec![Arc::new(builder.finish())],
                    )?);
                }
                Ok(out)
            }
        }
    }
}

/// Projects and casts a Parquet batch to the declared schema: columns by name
/// (case-insensitively as a fallback), missing columns as nulls.
fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let src = batch.schema();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let idx = src.index_of(field.name()).ok().or_else(|| {
            src.fields()
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(field.name()))
        });
        columns.push(match idx {
            Some(i) => cast(batch.column(i), field.data_type())?,
            None => new_null_array(field.data_type(), batch.num_rows()),
        });
    }
    RecordBatch::try_new(schema.clone(), columns)
}

fn walk(dir: &Path, out: &mut Vec<ListedFile>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let path = entry.path();
        // A file that vanishes between listing and stat is simply not listed.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, out)?;
        } else if meta.is_file() {
            let timestamp = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            out.push(ListedFile {
                path: format!("file://{}", path.display()),
                timestamp,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    #[test]
    fn lists_oldest_first_and_reads_json() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        let b = dir.path().join("b.json");
        std::fs::write(
            &b,
            "{\"page\":\"/x\",\"event_time\":\"2026-06-10T10:01:00Z\",\"n\":1}\n",
        )
        .unwrap();
        std::fs::write(
            &a,
            "{\"page\":\"/y\",\"event_time\":\"2026-06-10T10:02:00Z\",\"extra\":true}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join(".hidden"), "x").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&b)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let cfg = FileSourceConfig {
            path: dir.path().to_path_buf(),
            format: FileFormat::Json,
            max_files_per_trigger: None,
            schema: schema(),
        };
        let files = cfg.list().unwrap();
        assert_eq!(files.len(), 2);
        assert!(files[0].path.ends_with("b.json"));
        let batches = cfg.read(&files[1].local_path()).unwrap();
        assert_eq!(batches[0].num_rows(), 1);
        assert_eq!(batches[0].column(2).null_count(), 1);
    }
}
