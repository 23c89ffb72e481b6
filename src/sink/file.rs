//! File sinks (`connector = 'parquet' | 'json' | 'csv'`) with Spark's commit manifest.
//!
//! Batch `N` writes one file `part-<N>-<uuid>.<ext>` into the sink folder (none for an
//! empty batch), then commits by writing `_spark_metadata/<N>`: `v1` and one JSON line per
//! file, in the format of Spark's `FileStreamSinkLog` (spec §11.1), so Spark's readers —
//! and Tidemark's, and a file stream over the folder — see only committed files. A batch
//! whose manifest exists is skipped (a replay after a crash), and a file written by a batch
//! that crashed before its manifest is an orphan no reader lists.
//!
//! Like Spark's, the manifest is compacted: batch `N` with `(N + 1) % 10 == 0` writes
//! `_spark_metadata/<N>.compact`, every committed file so far, instead of `<N>`; readers
//! take the newest compaction and the batch files after it. Manifest files older than the
//! previous compaction are then deleted (a reader that listed the folder before that
//! compaction existed may still read them, as Spark keeps them for a delay).

use std::fs::File;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;

use super::{BatchInfo, Sink, SinkCommit};
use crate::error::{Error, Result};
use crate::format::manifest::{self, SinkFileStatus};
use crate::format::{FileDecoder, FileFormat, FilesTable, ParseMode};
use crate::fsutil::{create_dir_all, sync_dir};

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

    pub fn name(self) -> &'static str {
        self.ext()
    }

    fn ext(self) -> &'static str {
        match self {
            SinkFormat::Parquet => "parquet",
            SinkFormat::Json => "json",
            SinkFormat::Csv => "csv",
        }
    }

    /// How to decode this sink's files: failing on anything malformed.
    pub fn decoder(self, schema: SchemaRef) -> FileDecoder {
        FileDecoder {
            format: self.source_format(),
            mode: ParseMode::FailFast,
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

/// A folder of files committed batch by batch through a manifest.
pub struct FileSink {
    dir: PathBuf,
    format: SinkFormat,
    schema: SchemaRef,
}

/// A file sink's folder as a table: its committed files (through the manifest), decoded.
pub fn read_table(dir: &Path, format: SinkFormat, schema: SchemaRef) -> FilesTable {
    let dir = dir.to_path_buf();
    FilesTable::new(
        format.decoder(schema),
        Box::new(move || manifest::committed_files(&dir)),
    )
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl FileSink {
    /// Opens the sink folder, creating it and its manifest directory.
    pub fn new(dir: &Path, format: SinkFormat, schema: SchemaRef) -> Result<FileSink> {
        create_dir_all(&manifest::manifest_dir(dir))?;
        Ok(FileSink {
            dir: dir.to_path_buf(),
            format,
            schema,
        })
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
}

#[async_trait]
impl Sink for FileSink {
    /// Writes batch `batch_id`'s rows as one file and commits it in the manifest, unless the
    /// manifest already has the batch.
    async fn add_batch(
        &self,
        batch: &BatchInfo<'_>,
        batches: Vec<RecordBatch>,
    ) -> Result<SinkCommit> {
        let batch_id = batch.id;
        let schema = &self.schema;
        if manifest::last_batch(&self.dir)?.is_some_and(|last| batch_id.get() <= last) {
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
        if !manifest::commit(&self.dir, batch_id.get(), &statuses)? {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        Ok(SinkCommit::Committed {
            version: batch_id.get() as i64,
        })
    }

    fn describe(&self) -> String {
        format!("FileSink[{}, {}]", self.format.name(), self.dir.display())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::format::manifest::{COMPACT_SUFFIX, MANIFEST_DIR};
    use crate::sink::WriteMode;
    use crate::types::BatchId;

    fn batch(schema: &SchemaRef, v: i64) -> RecordBatch {
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()
    }

    #[tokio::test]
    async fn the_manifest_is_compacted_every_ten_batches_and_replays_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let sink = FileSink::new(dir.path(), SinkFormat::Parquet, schema.clone()).unwrap();
        for id in 0..25u64 {
            // Batch 3 is empty: a manifest without files.
            let rows = if id == 3 {
                vec![]
            } else {
                vec![batch(&schema, id as i64)]
            };
            let c = sink
                .add_batch(&BatchInfo::new("q", BatchId(id), &WriteMode::Append), rows)
                .await
                .unwrap();
            assert!(matches!(c, SinkCommit::Committed { .. }), "batch {id}");
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join(MANIFEST_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_by_key(|n| n.trim_end_matches(COMPACT_SUFFIX).parse::<u64>().unwrap());
        let mut expected = vec!["9.compact".to_string()];
        expected.extend((10..19).map(|i| i.to_string()));
        expected.push("19.compact".into());
        expected.extend((20..25).map(|i| i.to_string()));
        assert_eq!(names, expected);

        let files = manifest::committed_files(dir.path()).unwrap();
        assert_eq!(files.len(), 24);
        let ids: Vec<u64> = files
            .iter()
            .map(|f| {
                let name = f.file_name().unwrap().to_string_lossy().into_owned();
                name[5..10].parse().unwrap()
            })
            .collect();
        let mut want: Vec<u64> = (0..25).filter(|&i| i != 3).collect();
        want.sort();
        assert_eq!(ids, want, "every committed file once, in batch order");

        // Replays of a compacted and of a plain batch are skipped.
        for id in [5, 19, 24] {
            let c = sink
                .add_batch(
                    &BatchInfo::new("q", BatchId(id), &WriteMode::Append),
                    vec![batch(&schema, 99)],
                )
                .await
                .unwrap();
            assert!(matches!(c, SinkCommit::AlreadyCommitted), "batch {id}");
        }
        // The sink's table reads exactly the committed files' rows (the orphan-free folder
        // has 24 batches of one row).
        let ctx = datafusion::prelude::SessionContext::new();
        let table = read_table(dir.path(), SinkFormat::Parquet, schema.clone());
        let rows: usize = ctx
            .read_table(Arc::new(table))
            .unwrap()
            .collect()
            .await
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(rows, 24);
    }
}
