//! File sinks (`connector = 'parquet' | 'json' | 'csv'`) with Spark's commit manifest.
//!
//! Batch `N` writes one file `part-<N>-<uuid>.<ext>` into the sink folder (none for an
//! empty batch), then commits by writing `_spark_metadata/<N>`: `v1` and one JSON line per
//! file, in the format of Spark's `FileStreamSinkLog` (spec §11.1), so Spark's readers —
//! and Tidemark's, and a file stream over the folder — see only committed files. A batch
//! whose manifest exists is skipped (a replay after a crash), and a file written by a batch
//! that crashed before its manifest is an orphan no reader lists.

use std::fs::File;
use std::path::{Path, PathBuf};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};

use super::delta::SinkCommit;
use crate::checkpoint::BatchId;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, sync_dir, write_new};
use crate::source::file::{FileFormat, FileSourceConfig, ParseMode};

/// The manifest directory, named as Spark names it.
pub const MANIFEST_DIR: &str = "_spark_metadata";

/// The file format of a file sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkFormat {
    Parquet,
    Json,
    Csv,
}

impl SinkFormat {
    /// The format of a file-sink connector name, if it is one.
    pub fn from_connector(connector: &str) -> Option<SinkFormat> {
        match connector {
            "parquet" => Some(SinkFormat::Parquet),
            "json" => Some(SinkFormat::Json),
            "csv" => Some(SinkFormat::Csv),
            _ => None,
        }
    }

    fn ext(self) -> &'static str {
        match self {
            SinkFormat::Parquet => "parquet",
            SinkFormat::Json => "json",
            SinkFormat::Csv => "csv",
        }
    }

    /// How to read a sink folder of this format back: through its manifest (see
    /// [`FileSourceConfig::list`]), failing on anything malformed.
    pub fn reader(self, dir: &Path, schema: SchemaRef) -> FileSourceConfig {
        FileSourceConfig {
            path: dir.to_path_buf(),
            format: self.source_format(),
            mode: ParseMode::FailFast,
            max_files_per_trigger: None,
            schema,
        }
    }

    /// How a file stream reads these files back.
    fn source_format(self) -> FileFormat {
        match self {
            SinkFormat::Parquet => FileFormat::Parquet,
            SinkFormat::Json => FileFormat::Json,
            SinkFormat::Csv => FileFormat::Csv {
                header: true,
                delimiter: b',',
            },
        }
    }
}

/// One line of a manifest (Spark's `SinkFileStatus`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SinkFileStatus {
    path: String,
    size: u64,
    is_dir: bool,
    modification_time: i64,
    block_replication: u32,
    block_size: u64,
    action: String,
}

/// A folder of files committed batch by batch through a manifest.
pub struct FileSink {
    dir: PathBuf,
    format: SinkFormat,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl FileSink {
    /// Opens the sink folder, creating it and its manifest directory.
    pub fn new(dir: &Path, format: SinkFormat) -> Result<FileSink> {
        create_dir_all(&dir.join(MANIFEST_DIR))?;
        Ok(FileSink {
            dir: dir.to_path_buf(),
            format,
        })
    }

    fn manifest_dir(dir: &Path) -> PathBuf {
        dir.join(MANIFEST_DIR)
    }

    /// Batch ids with a manifest, ascending.
    fn committed(dir: &Path) -> Result<Vec<u64>> {
        let m = Self::manifest_dir(dir);
        let entries = match std::fs::read_dir(&m) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io(format!("listing {}", m.display()), e)),
        };
        let mut ids: Vec<u64> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// The files committed to the sink folder at `dir`, in batch order.
    pub fn committed_files(dir: &Path) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for id in Self::committed(dir)? {
            let file = Self::manifest_dir(dir).join(id.to_string());
            let text = std::fs::read_to_string(&file)
                .map_err(io(format!("reading {}", file.display())))?;
            for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
                let status: SinkFileStatus = serde_json::from_str(line).map_err(|e| {
                    Error::Internal(format!("corrupt manifest {}: {e}", file.display()))
                })?;
                if status.action == "add" {
                    let path = status.path.strip_prefix("file://").unwrap_or(&status.path);
                    out.push(PathBuf::from(path));
                }
            }
        }
        Ok(out)
    }

    fn write_file(&self, path: &Path, batches: &[RecordBatch], schema: &SchemaRef) -> Result<()> {
        let f = File::create(path).map_err(io(format!("creating {}", path.display())))?;
        let werr = |e: &dyn std::fmt::Display| {
            Error::io(
                format!("writing {}", path.display()),
                std::io::Error::other(e.to_string()),
            )
        };
        let f = match self.format {
            SinkFormat::Parquet => {
                let mut w = ArrowWriter::try_new(f, schema.clone(), None).map_err(|e| werr(&e))?;
                for b in batches {
                    w.write(b).map_err(|e| werr(&e))?;
                }
                w.into_inner().map_err(|e| werr(&e))?
            }
            SinkFormat::Json => {
                let mut w = datafusion::arrow::json::LineDelimitedWriter::new(f);
                for b in batches {
                    w.write(b).map_err(|e| werr(&e))?;
                }
                w.finish().map_err(|e| werr(&e))?;
                w.into_inner()
            }
            SinkFormat::Csv => {
                let mut w = datafusion::arrow::csv::WriterBuilder::new()
                    .with_header(true)
                    .build(f);
                for b in batches {
                    w.write(b).map_err(|e| werr(&e))?;
                }
                w.into_inner()
            }
        };
        f.sync_all()
            .map_err(io(format!("syncing {}", path.display())))
    }

    /// Writes batch `batch_id`'s rows as one file and commits it in the manifest, unless the
    /// manifest already has the batch.
    pub fn add_batch(
        &self,
        batch_id: BatchId,
        batches: Vec<RecordBatch>,
        schema: &SchemaRef,
    ) -> Result<SinkCommit> {
        if Self::committed(&self.dir)?
            .last()
            .is_some_and(|&last| batch_id <= last)
        {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        let mut statuses = Vec::new();
        if batches.iter().any(|b| b.num_rows() > 0) {
            let name = format!(
                "part-{batch_id:05}-{}.{}",
                uuid::Uuid::new_v4(),
                self.format.ext()
            );
            let path = self.dir.join(name);
            self.write_file(&path, &batches, schema)?;
            sync_dir(&self.dir)?;
            let meta =
                std::fs::metadata(&path).map_err(io(format!("reading {}", path.display())))?;
            statuses.push(SinkFileStatus {
                path: format!("file://{}", path.display()),
                size: meta.len(),
                is_dir: false,
                modification_time: meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_millis() as i64),
                block_replication: 1,
                block_size: 32 << 20,
                action: "add".into(),
            });
        }
        crate::testing::crash_point("sink_files_written");
        let mut text = String::from("v1");
        for s in &statuses {
            text.push('\n');
            text.push_str(
                &serde_json::to_string(s)
                    .map_err(|e| Error::Internal(format!("encoding a manifest entry: {e}")))?,
            );
        }
        let manifest = Self::manifest_dir(&self.dir).join(batch_id.to_string());
        if !write_new(&manifest, text.as_bytes())? {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        Ok(SinkCommit::Committed {
            version: batch_id as i64,
        })
    }
}
