//! The file source: a landing directory of JSON, CSV, Parquet or text files (spec §10).
//!
//! New files are discovered at every trigger by listing the directory, oldest modification
//! time first (ties broken by path). Which files were taken, and in which batch, is kept in
//! the query's checkpoint ([`log`], `sources/<i>/<k>`), so every file is read exactly once
//! per query. The offset is the newest log entry, `{"logOffset": k}`. Decoding is
//! [`crate::format`]'s. A folder written by a file sink is read through its manifest: only
//! committed files.

pub mod ahead;
pub mod log;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::{BatchStream, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::format::{FileDecoder, FilesTable, manifest};
use ahead::ReadAhead;
use log::FileSourceLog;

use crate::sql::options::{OptionSpec, OptionTable, OptionType};

/// The options of a file stream (Spark's file source).
pub const OPTIONS: OptionTable = OptionTable {
    object: "stream",
    connector: "file",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&["file"]),
            Some("file"),
            "The connector; 'file' when path or format is given",
        ),
        OptionSpec::new(
            "format",
            OptionType::OneOf(&["json", "csv", "parquet", "text"]),
            None,
            "How the files are decoded",
        )
        .required(),
        OptionSpec::new(
            "path",
            OptionType::Path,
            None,
            "The directory files land in (it must exist)",
        )
        .required(),
        OptionSpec::new(
            "max_files_per_trigger",
            OptionType::PositiveInt,
            None,
            "At most this many new files per micro-batch (unlimited when unset)",
        ),
        OptionSpec::new(
            "read_ahead",
            OptionType::Boolean,
            Some("true"),
            "Decode the next batch's likely files while the current batch runs (with max_files_per_trigger)",
        ),
        OptionSpec::new(
            "header",
            OptionType::Boolean,
            Some("false"),
            "csv: the first line of each file names the columns",
        ),
        OptionSpec::new(
            "delimiter",
            OptionType::Char,
            Some(","),
            "csv: the field separator",
        ),
        OptionSpec::new(
            "mode",
            OptionType::OneOf(&["PERMISSIVE", "DROPMALFORMED", "FAILFAST"]),
            Some("PERMISSIVE"),
            "json and csv: what a malformed record does (NULLs and _corrupt_record, dropped, or the query fails)",
        ),
    ],
};

/// Everything needed to list and read a stream's files.
#[derive(Debug, Clone)]
pub struct FileSourceConfig {
    pub path: PathBuf,
    pub decoder: FileDecoder,
    /// At most this many new files per micro-batch.
    pub max_files_per_trigger: Option<u64>,
    /// Decode the next batch's likely files while the current batch runs ([`ahead`]).
    pub read_ahead: bool,
}

/// A file found in the landing directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedFile {
    /// `file:///...` URL, as Spark writes it in the source log.
    pub path: String,
    /// Modification time, ms since the epoch.
    pub timestamp: i64,
    /// Its size in bytes when listed (for the backlog; not in the log).
    #[serde(skip)]
    pub size: u64,
}

impl ListedFile {
    pub fn local_path(&self) -> PathBuf {
        local_path(&self.path)
    }
}

fn local_path(url: &str) -> PathBuf {
    PathBuf::from(url.strip_prefix("file://").unwrap_or(url))
}

impl FileSourceConfig {
    pub fn schema(&self) -> SchemaRef {
        self.decoder.schema.clone()
    }

    /// Lists the files under the path, oldest first. Hidden files (`.x`, `_x`) and
    /// directories are skipped, as Spark does; subdirectories are walked.
    pub fn list(&self) -> Result<Vec<ListedFile>> {
        let mut out = Vec::new();
        if manifest::is_sink_folder(&self.path) {
            // The folder of a file sink: only the files its manifest committed (spec §10.3).
            for path in manifest::committed_files(&self.path)? {
                if let Ok(meta) = std::fs::metadata(&path) {
                    out.push(listed(&path, &meta));
                }
            }
        } else {
            walk(&self.path, &mut out)?;
        }
        out.sort_by(|a, b| {
            a.timestamp
                .cmp(&b.timestamp)
                .then_with(|| a.path.cmp(&b.path))
        });
        Ok(out)
    }

    /// The stream as a table: every file listed now.
    pub fn table(self: &Arc<Self>) -> FilesTable {
        let config = self.clone();
        FilesTable::new(
            self.decoder.clone(),
            Box::new(move || Ok(config.list()?.into_iter().map(|f| f.local_path()).collect())),
        )
    }

    /// `file:<path> (<format>)`, as a checkpoint's definition records the source.
    pub fn identity(&self) -> String {
        format!(
            "file:{} ({})",
            self.path.display(),
            self.decoder.format.name()
        )
    }
}

/// What reading a batch's files counted.
#[derive(Debug, Default)]
struct ReadCounters {
    malformed: u64,
    /// The malformed records themselves, in file order.
    rejected: Vec<super::MalformedRecord>,
    missing: u64,
    /// Files whose rows came from the read-ahead.
    read_ahead: u64,
    /// Each file's modification time and rows.
    arrivals: Vec<super::Arrival>,
    /// Files read.
    files: u64,
}

/// A query's file source: the configuration and the query's log of files taken.
pub struct FileSource {
    config: Arc<FileSourceConfig>,
    log: FileSourceLog,
    /// Every file some log entry holds.
    seen: HashSet<String>,
    last_log: Option<u64>,
    /// `available_now`: the listing fixed when the run started (spec §6.3).
    fixed: Option<Vec<ListedFile>>,
    counters: Arc<Mutex<ReadCounters>>,
    ahead: Arc<ReadAhead>,
    /// Files listed but not taken by the last `latest_offset`: how many, how many bytes.
    outstanding: (u64, u64),
}

fn log_offset(o: &Offset) -> Result<u64> {
    o.get("logOffset")
        .and_then(|k| k.as_u64())
        .ok_or_else(|| Error::Internal(format!("unexpected file source offset {o}")))
}

impl FileSource {
    /// Opens the source with its log in `dir` (the checkpoint's `sources/<i>`).
    pub fn open(config: Arc<FileSourceConfig>, dir: PathBuf) -> Result<FileSource> {
        let log = FileSourceLog::open(dir)?;
        let last_log = log.latest()?;
        let mut seen = HashSet::new();
        if let Some(latest) = last_log {
            for k in 0..=latest {
                seen.extend(log.entry(k)?.into_iter().map(|e| e.path));
            }
        }
        Ok(FileSource {
            config,
            log,
            seen,
            last_log,
            fixed: None,
            counters: Default::default(),
            ahead: Default::default(),
            outstanding: (0, 0),
        })
    }
}

#[async_trait]
impl Source for FileSource {
    fn schema(&self) -> SchemaRef {
        self.config.schema()
    }

    fn describe(&self) -> String {
        format!("FileStreamSource[file:{}]", self.config.path.display())
    }

    async fn prepare_available_now(&mut self) -> Result<()> {
        self.fixed = Some(self.config.list()?);
        Ok(())
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        let start = start.map(log_offset).transpose()?;
        // A new batch: the last one's counters no longer apply (it may not read this source).
        *self.counters.lock().unwrap_or_else(|e| e.into_inner()) = ReadCounters::default();
        // A log entry that no batch covers yet (written just before a crash that came
        // before its offsets entry) is the next batch by itself, so a restart plans the
        // same batches as an uninterrupted run.
        let unplanned = self.last_log.is_some() && self.last_log > start;
        if !unplanned {
            let listed = match &self.fixed {
                Some(f) => f.clone(),
                None => self.config.list()?,
            };
            let limit = match limit {
                ReadLimit::AllAvailable => usize::MAX,
                ReadLimit::Default => self
                    .config
                    .max_files_per_trigger
                    .map_or(usize::MAX, |n| n as usize),
            };
            let mut unseen = listed.into_iter().filter(|f| !self.seen.contains(&f.path));
            let new: Vec<ListedFile> = unseen.by_ref().take(limit).collect();
            let rest: Vec<ListedFile> = unseen.collect();
            self.outstanding = (rest.len() as u64, rest.iter().map(|f| f.size).sum());
            // The batch after this one takes the next files, unless others land before them.
            self.ahead
                .guess(if limit == usize::MAX || !self.config.read_ahead {
                    Vec::new()
                } else {
                    within_budget(rest.iter().take(limit).map(|f| f.local_path()))
                });
            if !new.is_empty() {
                let k = self.last_log.map_or(0, |k| k + 1);
                self.log.write(k, &new)?;
                crate::testing::crash_point("after_source_log_write");
                self.seen.extend(new.into_iter().map(|f| f.path));
                self.last_log = Some(k);
            }
        }
        Ok(self.last_log.map(|k| serde_json::json!({ "logOffset": k })))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let start = start.map(log_offset).transpose()?;
        let end = log_offset(end)?;
        let mut paths = Vec::new();
        if start != Some(end) {
            for k in start.map_or(0, |s| s + 1)..=end {
                paths.extend(
                    self.log
                        .entry(k)?
                        .into_iter()
                        .map(|e| (local_path(&e.path), e.timestamp)),
                );
            }
        }
        *self.counters.lock().unwrap_or_else(|e| e.into_inner()) = ReadCounters::default();
        let counters = self.counters.clone();
        let decoder = Arc::new(self.config.decoder.clone());
        let files: Vec<_> = paths
            .into_iter()
            .map(|(p, landed)| {
                let ahead = self.ahead.take(&p);
                (p, landed, ahead)
            })
            .collect();
        self.ahead.forget();
        let reads_decoder = decoder.clone();
        // Files are decoded in parallel, their batches kept in file order; with fewer files
        // than cores, a large file is decoded in pieces on the spare ones.
        let threads = (crate::config::parallelism() / files.len().max(1)).max(1);
        let reads = futures::stream::iter(files.into_iter().map(move |(p, landed, ahead)| {
            let decoder = reads_decoder.clone();
            async move {
                let path = p.display().to_string();
                if let Some(ahead) = ahead
                    && let Some(read) = ahead.get().await
                {
                    return Ok((path, landed, read, true));
                }
                tokio::task::spawn_blocking(move || decoder.read_on(&p, threads))
                    .await
                    .map_err(|e| Error::Internal(format!("file reader panicked: {e}")))?
                    .map(|read| (path, landed, read, false))
            }
        }))
        .buffered(crate::config::parallelism())
        .map(move |r| {
            let (path, landed, read, was_ahead) = r?;
            let mut c = counters.lock().unwrap_or_else(|e| e.into_inner());
            c.files += 1;
            c.arrivals.push(super::Arrival {
                at_ms: landed,
                rows: read.batches.iter().map(|b| b.num_rows() as u64).sum(),
            });
            c.malformed += read.malformed;
            c.rejected.extend(
                read.rejected
                    .into_iter()
                    .map(|record| super::MalformedRecord {
                        path: path.clone(),
                        record,
                    }),
            );
            c.missing += u64::from(read.missing);
            c.read_ahead += u64::from(was_ahead);
            Ok(read.batches)
        });
        // Once this batch's files are read, the next batch's are decoded while it runs.
        let ahead = self.ahead.clone();
        let then_read_ahead = futures::stream::once(async move { ahead.start(decoder) })
            .filter_map(|()| futures::future::ready(None));
        Ok(super::flatten_reads(reads.chain(then_read_ahead)))
    }

    fn metrics(&self) -> BTreeMap<String, String> {
        let c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        BTreeMap::from([
            ("numMalformedRows".to_string(), c.malformed.to_string()),
            ("numMissingFiles".to_string(), c.missing.to_string()),
            ("numFilesReadAhead".to_string(), c.read_ahead.to_string()),
            ("numFilesRead".to_string(), c.files.to_string()),
        ])
    }

    fn take_arrivals(&self) -> Vec<super::Arrival> {
        std::mem::take(
            &mut self
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .arrivals,
        )
    }

    fn held_back(&self) -> bool {
        self.outstanding.0 > 0
    }

    fn backlog(&self, _end: Option<&Offset>) -> super::Backlog {
        super::Backlog {
            files: Some(self.outstanding.0),
            bytes: Some(self.outstanding.1),
            rows: None,
        }
    }

    fn take_malformed(&self) -> Vec<super::MalformedRecord> {
        std::mem::take(
            &mut self
                .counters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .rejected,
        )
    }
}

/// The leading files whose sizes together stay within [`crate::config::READ_AHEAD_BYTES`].
fn within_budget(files: impl Iterator<Item = PathBuf>) -> Vec<PathBuf> {
    let mut left = crate::config::READ_AHEAD_BYTES;
    let mut out = Vec::new();
    for f in files {
        let Ok(meta) = std::fs::metadata(&f) else {
            break;
        };
        if meta.len() > left {
            break;
        }
        left -= meta.len();
        out.push(f);
    }
    out
}

fn listed(path: &Path, meta: &std::fs::Metadata) -> ListedFile {
    let timestamp = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    ListedFile {
        path: format!("file://{}", path.display()),
        timestamp,
        size: meta.len(),
    }
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
            out.push(listed(&path, &meta));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;
    use crate::format::{FileFormat, ParseMode};

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
            decoder: FileDecoder {
                format: FileFormat::Json,
                mode: ParseMode::Permissive,
                schema: schema(),
            },
            max_files_per_trigger: None,
            read_ahead: true,
        };
        let files = cfg.list().unwrap();
        assert_eq!(files.len(), 2);
        assert!(files[0].path.ends_with("b.json"));
        let batches = cfg.decoder.read(&files[1].local_path()).unwrap().batches;
        assert_eq!(batches[0].num_rows(), 1);
        assert_eq!(batches[0].column(2).null_count(), 1);
    }
}
