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

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};

use super::delta::SinkCommit;
use crate::checkpoint::BatchId;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, numbered, sync_dir, write_new};
use crate::source::file::{FileFormat, FileSourceConfig, ParseMode};

/// The manifest directory, named as Spark names it.
pub const MANIFEST_DIR: &str = "_spark_metadata";
/// Every this many batches the manifest is compacted (Spark's
/// `spark.sql.streaming.fileSink.log.compactInterval` default).
pub const COMPACT_INTERVAL: u64 = 10;
const COMPACT_SUFFIX: &str = ".compact";

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

    /// Manifest files: batch id and whether the file is a compaction, ascending.
    fn manifests(dir: &Path) -> Result<Vec<(u64, bool)>> {
        let m = Self::manifest_dir(dir);
        let mut ids: Vec<(u64, bool)> = numbered(&m, "")?
            .into_iter()
            .map(|id| (id, false))
            .chain(
                numbered(&m, COMPACT_SUFFIX)?
                    .into_iter()
                    .map(|id| (id, true)),
            )
            .collect();
        ids.sort();
        Ok(ids)
    }

    fn manifest_file(dir: &Path, id: u64, compact: bool) -> PathBuf {
        let suffix = if compact { COMPACT_SUFFIX } else { "" };
        Self::manifest_dir(dir).join(format!("{id}{suffix}"))
    }

    /// The entries (JSON lines) of the newest compaction and of the batches after it.
    fn live_entries(dir: &Path) -> Result<Vec<String>> {
        let manifests = Self::manifests(dir)?;
        let compacted = manifests.iter().filter(|m| m.1).map(|m| m.0).max();
        let mut out = Vec::new();
        for (id, compact) in manifests {
            let live = match compacted {
                Some(c) => id > c || (id == c && compact),
                None => true,
            };
            if !live {
                continue;
            }
            let file = Self::manifest_file(dir, id, compact);
            let text = std::fs::read_to_string(&file)
                .map_err(io(format!("reading {}", file.display())))?;
            out.extend(
                text.lines()
                    .skip(1)
                    .filter(|l| !l.trim().is_empty())
                    .map(str::to_string),
            );
        }
        Ok(out)
    }

    /// The files committed to the sink folder at `dir`, in batch order.
    pub fn committed_files(dir: &Path) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for line in Self::live_entries(dir)? {
            let status: SinkFileStatus = serde_json::from_str(&line).map_err(|e| {
                Error::Internal(format!(
                    "corrupt manifest entry in {}: {e}",
                    Self::manifest_dir(dir).display()
                ))
            })?;
            let path = PathBuf::from(status.path.strip_prefix("file://").unwrap_or(&status.path));
            match status.action.as_str() {
                "add" => out.push(path),
                "delete" => out.retain(|p| *p != path),
                _ => {}
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

    /// After compaction `compacted`: removes the manifest files before the previous
    /// compaction (what readers of the last two compactions do not need).
    fn remove_old_manifests(&self, compacted: u64) -> Result<()> {
        let keep_from = compacted.saturating_sub(COMPACT_INTERVAL);
        for (id, compact) in Self::manifests(&self.dir)? {
            if id < keep_from {
                let file = Self::manifest_file(&self.dir, id, compact);
                if let Err(e) = std::fs::remove_file(&file)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(file = %file.display(), error = %e, "removing an old manifest");
                }
            }
        }
        Ok(())
    }

    /// Writes batch `batch_id`'s rows as one file and commits it in the manifest, unless the
    /// manifest already has the batch.
    pub fn add_batch(
        &self,
        batch_id: BatchId,
        batches: Vec<RecordBatch>,
        schema: &SchemaRef,
    ) -> Result<SinkCommit> {
        if Self::manifests(&self.dir)?
            .last()
            .is_some_and(|&(last, _)| batch_id <= last)
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
        let compact = (batch_id + 1).is_multiple_of(COMPACT_INTERVAL);
        let mut entries = if compact {
            Self::live_entries(&self.dir)?
        } else {
            Vec::new()
        };
        for s in &statuses {
            entries.push(
                serde_json::to_string(s)
                    .map_err(|e| Error::Internal(format!("encoding a manifest entry: {e}")))?,
            );
        }
        let mut text = String::from("v1");
        for e in &entries {
            text.push('\n');
            text.push_str(e);
        }
        let manifest = Self::manifest_file(&self.dir, batch_id, compact);
        if !write_new(&manifest, text.as_bytes())? {
            return Ok(SinkCommit::AlreadyCommitted);
        }
        if compact {
            self.remove_old_manifests(batch_id)?;
        }
        Ok(SinkCommit::Committed {
            version: batch_id as i64,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(schema: &SchemaRef, v: i64) -> RecordBatch {
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()
    }

    #[test]
    fn the_manifest_is_compacted_every_ten_batches_and_replays_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let schema: SchemaRef =
            Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let sink = FileSink::new(dir.path(), SinkFormat::Parquet).unwrap();
        for id in 0..25u64 {
            // Batch 3 is empty: a manifest without files.
            let rows = if id == 3 {
                vec![]
            } else {
                vec![batch(&schema, id as i64)]
            };
            let c = sink.add_batch(id, rows, &schema).unwrap();
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

        let files = FileSink::committed_files(dir.path()).unwrap();
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
                .add_batch(id, vec![batch(&schema, 99)], &schema)
                .unwrap();
            assert!(matches!(c, SinkCommit::AlreadyCommitted), "batch {id}");
        }
        // A reader lists exactly the committed files (the orphan-free folder has 24).
        let listed = SinkFormat::Parquet
            .reader(dir.path(), schema.clone())
            .list()
            .unwrap();
        assert_eq!(listed.len(), 24);
    }
}
