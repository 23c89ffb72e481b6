//! The Delta source (`connector = 'delta'`), as Spark's Delta source reads a table: first
//! every file of the snapshot at the version current when the query first starts (or,
//! with `starting_version`, nothing before that version), then the files each new table
//! version adds, in commit order, at most `max_files_per_trigger` per batch.
//!
//! It reads the table's JSON commits (`_delta_log/<v>.json`) itself: `add`, `remove` and
//! `metaData` actions, and the data files through [`crate::format`]'s Parquet decoder. A
//! version that removes data (a complete-mode overwrite, a MERGE, a DELETE) fails the
//! query, as in Spark, unless `ignore_deletes` is set: then its removals are ignored (and
//! its added files, a rewrite of existing rows, are read). The offset is Spark's
//! `DeltaSourceOffset` JSON: `{"sourceVersion":1,"reservoirId":<table id>,
//! "reservoirVersion":v,"index":i,"isStartingVersion":b}`, the last file read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use futures::StreamExt;
use serde_json::Value;

use super::{BatchStream, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::format::{FileDecoder, FileFormat, ParseMode};
use crate::fsutil::read_optional;

/// Spark's default `maxFilesPerTrigger` for Delta.
pub const DEFAULT_MAX_FILES: u64 = 1000;

/// The options of a Delta stream (Spark's Delta source).
pub const OPTIONS: crate::sql::options::OptionTable = {
    use crate::sql::options::{OptionSpec, OptionTable, OptionType};
    OptionTable {
        object: "stream",
        connector: "delta",
        options: &[
            OptionSpec::new(
                "connector",
                OptionType::OneOf(&["delta"]),
                None,
                "The connector",
            )
            .required(),
            OptionSpec::new(
                "path",
                OptionType::Path,
                None,
                "The Delta table's directory",
            )
            .required(),
            OptionSpec::new(
                "starting_version",
                OptionType::NonNegativeInt,
                None,
                "Read the changes from this version on (default: the snapshot at start, then its changes)",
            ),
            OptionSpec::new(
                "max_files_per_trigger",
                OptionType::PositiveInt,
                Some("1000"),
                "At most this many added files per micro-batch",
            ),
            OptionSpec::new(
                "ignore_deletes",
                OptionType::Boolean,
                Some("false"),
                "Skip versions' removals instead of failing",
            ),
        ],
    }
};

/// How a Delta stream is configured.
#[derive(Debug, Clone)]
pub struct DeltaSourceConfig {
    pub path: PathBuf,
    /// The table's schema (every field nullable), learned when the stream was created.
    pub schema: SchemaRef,
    pub starting_version: Option<u64>,
    pub max_files_per_trigger: u64,
    pub ignore_deletes: bool,
}

/// One data file in read order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Position {
    version: u64,
    /// Index of the file within its version (the snapshot counts as one version).
    index: i64,
    starting: bool,
}

impl Position {
    fn key(&self) -> (u64, bool, i64) {
        // The snapshot of version v comes before the changes of version v + 1; within a
        // version, files in index order.
        (self.version, !self.starting, self.index)
    }
}

/// Where a query's reading begins.
#[derive(Debug, Clone, Default)]
struct Plan {
    snapshot_version: u64,
    snapshot: Vec<String>,
    changes_from: u64,
}

/// A table version's actions that matter here.
#[derive(Debug, Default, Clone)]
struct Commit {
    /// Files added and removed with `dataChange` (new rows, deleted rows).
    adds: Vec<String>,
    removes: Vec<String>,
    /// Files added and removed without changing the data (a compaction's rewrite): they
    /// count in a snapshot, and a stream's changes skip them.
    rearranged_adds: Vec<String>,
    rearranged_removes: Vec<String>,
    table_id: Option<String>,
}

fn log_dir(table: &Path) -> PathBuf {
    table.join("_delta_log")
}

fn read_commit(table: &Path, version: u64) -> Result<Option<Commit>> {
    let file = log_dir(table).join(format!("{version:020}.json"));
    let Some(text) = read_optional(&file)? else {
        return Ok(None);
    };
    let mut c = Commit::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).map_err(|e| {
            Error::BadInput(format!("corrupt Delta commit {}: {e}", file.display()))
        })?;
        let data_change = |a: &Value| a.get("dataChange").and_then(Value::as_bool) != Some(false);
        if let Some(add) = v.get("add") {
            if data_change(add) {
                c.adds.push(path_of(add)?);
            } else {
                c.rearranged_adds.push(path_of(add)?);
            }
        } else if let Some(rm) = v.get("remove") {
            if data_change(rm) {
                c.removes.push(path_of(rm)?);
            } else {
                c.rearranged_removes.push(path_of(rm)?);
            }
        } else if let Some(meta) = v.get("metaData") {
            c.table_id = meta.get("id").and_then(Value::as_str).map(str::to_string);
        }
    }
    Ok(Some(c))
}

/// The newest single-file checkpoint, `_delta_log/<v>.checkpoint.parquet`, as one commit
/// that adds every file live at `v` (Delta's snapshot there). `None` if there is none.
fn read_checkpoint(table: &Path) -> Result<Option<(u64, Commit)>> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::DataType;
    let dir = log_dir(table);
    let listing = std::fs::read_dir(&dir)
        .map_err(|e| Error::BadInput(format!("listing {}: {e}", dir.display())))?;
    let version = listing
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".checkpoint.parquet")?
                .parse::<u64>()
                .ok()
        })
        .max();
    let Some(version) = version else {
        return Ok(None);
    };
    let file = dir.join(format!("{version:020}.checkpoint.parquet"));
    let bad = |e: &dyn std::fmt::Display| {
        Error::BadInput(format!("reading Delta checkpoint {}: {e}", file.display()))
    };
    let f = std::fs::File::open(&file).map_err(|e| bad(&e))?;
    let reader =
        datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
            .and_then(|b| b.build())
            .map_err(|e| bad(&e))?;
    let mut c = Commit::default();
    let strings = |a: &datafusion::arrow::array::ArrayRef| {
        datafusion::arrow::compute::cast(a, &DataType::Utf8).map_err(|e| bad(&e))
    };
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        if let Some(add) = batch.column_by_name("add").and_then(|a| a.as_struct_opt())
            && let Some(path) = add.column_by_name("path")
        {
            let path = strings(path)?;
            let path = path.as_string::<i32>();
            for i in 0..add.len() {
                if add.is_valid(i) && path.is_valid(i) {
                    c.adds.push(percent_decode(path.value(i)));
                }
            }
        }
        if let Some(meta) = batch
            .column_by_name("metaData")
            .and_then(|a| a.as_struct_opt())
            && let Some(id) = meta.column_by_name("id")
        {
            let id = strings(id)?;
            let id = id.as_string::<i32>();
            if let Some(i) = (0..meta.len()).find(|&i| meta.is_valid(i) && id.is_valid(i)) {
                c.table_id = Some(id.value(i).to_string());
            }
        }
    }
    Ok(Some((version, c)))
}

fn path_of(action: &Value) -> Result<String> {
    let p = action
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::BadInput("a Delta action without a path".into()))?;
    Ok(percent_decode(p))
}

/// Delta stores file paths URI-encoded.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) =
                u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or(""), 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A query's Delta source.
pub struct DeltaSource {
    config: DeltaSourceConfig,
    decoder: Arc<FileDecoder>,
    /// Parsed commits, by version.
    commits: BTreeMap<u64, Commit>,
    /// Where reading begins, decided at the first call: the starting snapshot's version and
    /// files (none when reading starts from a version's changes), and the first version
    /// whose changes are read.
    plan: Option<Plan>,
    table_id: String,
    /// `available_now`: the end fixed when the run started.
    fixed: Option<Option<Position>>,
    /// The checkpoint the log starts from when its early commits were cleaned up: the
    /// commit at this version is that snapshot, not a version's changes.
    base: Option<u64>,
    /// Whether the last `latest_offset` left files for a later batch.
    held_back: bool,
}

impl DeltaSource {
    pub fn new(config: DeltaSourceConfig) -> DeltaSource {
        let decoder = Arc::new(FileDecoder {
            format: FileFormat::Parquet,
            mode: ParseMode::FailFast,
            schema: config.schema.clone(),
        });
        DeltaSource {
            config,
            decoder,
            commits: BTreeMap::new(),
            plan: None,
            table_id: String::new(),
            fixed: None,
            base: None,
            held_back: false,
        }
    }

    /// Reads the commits not read yet, up to the table's latest version.
    fn refresh(&mut self) -> Result<()> {
        if self.commits.is_empty()
            && !log_dir(&self.config.path)
                .join(format!("{:020}.json", 0))
                .exists()
        {
            if !log_dir(&self.config.path).is_dir() {
                return Err(Error::BadInput(format!(
                    "\"{}\" is not a Delta table (no _delta_log)",
                    self.config.path.display()
                )));
            }
            // The early commits were cleaned up: start from the newest checkpoint.
            let Some((version, c)) = read_checkpoint(&self.config.path)? else {
                return Err(Error::unsupported(format!(
                    "the Delta table at \"{}\" has no commit 0 and no single-file checkpoint \
                     to start from",
                    self.config.path.display()
                )));
            };
            if let Some(id) = &c.table_id {
                self.table_id = id.clone();
            }
            self.commits.insert(version, c);
            self.base = Some(version);
        }
        let mut v = match self.commits.keys().next_back() {
            Some(&last) => last + 1,
            None => 0,
        };
        while let Some(c) = read_commit(&self.config.path, v)? {
            if let Some(id) = &c.table_id {
                self.table_id = id.clone();
            }
            self.commits.insert(v, c);
            v += 1;
        }
        Ok(())
    }

    /// The starting snapshot: files live at `version` (adds minus removes since 0), in the
    /// order they were added. Linear in the actions (a file is keyed by its path, as in
    /// Delta's snapshot).
    fn snapshot_at(&self, version: u64) -> Vec<String> {
        let mut files: Vec<Option<&String>> = Vec::new();
        let mut at: std::collections::HashMap<&String, usize> = std::collections::HashMap::new();
        for (_, c) in self.commits.range(..=version) {
            for r in c.removes.iter().chain(&c.rearranged_removes) {
                if let Some(i) = at.remove(r) {
                    files[i] = None;
                }
            }
            for a in c.adds.iter().chain(&c.rearranged_adds) {
                if let Some(i) = at.insert(a, files.len()) {
                    files[i] = None;
                }
                files.push(Some(a));
            }
        }
        files.into_iter().flatten().cloned().collect()
    }

    /// Where reading begins for a query at `start`.
    fn plan(&self, start: Option<&Position>) -> Plan {
        let latest = self.commits.keys().next_back().copied().unwrap_or(0);
        match (start, self.config.starting_version) {
            (Some(p), _) if p.starting => Plan {
                snapshot_version: p.version,
                snapshot: self.snapshot_at(p.version),
                changes_from: p.version + 1,
            },
            (Some(p), _) => Plan {
                snapshot_version: p.version,
                snapshot: Vec::new(),
                changes_from: p.version,
            },
            (None, Some(v)) => Plan {
                snapshot_version: v,
                snapshot: Vec::new(),
                changes_from: v,
            },
            (None, None) => Plan {
                snapshot_version: latest,
                snapshot: self.snapshot_at(latest),
                changes_from: latest + 1,
            },
        }
    }

    /// Every file after `start`, in read order, with its position.
    fn files_after(&mut self, start: Option<&Position>) -> Result<Vec<(Position, String)>> {
        if self.plan.is_none() {
            self.plan = Some(self.plan(start));
        }
        let plan = self.plan.clone().unwrap_or_default();
        // Changes (or a snapshot) from before the checkpoint the log starts at are gone.
        if let Some(base) = self.base
            && plan.changes_from <= base
        {
            return Err(Error::Unsupported {
                message: format!(
                    "the Delta table at \"{}\" keeps its log from version {base} on (older \
                     commits were cleaned up); this stream needs the changes from version {}",
                    self.config.path.display(),
                    plan.changes_from
                ),
                hint: Some(
                    "Create the stream again without starting_version (it starts from the \
                     latest snapshot), or with a starting_version after the checkpoint."
                        .into(),
                ),
            });
        }
        let mut out: Vec<(Position, String)> = plan
            .snapshot
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                (
                    Position {
                        version: plan.snapshot_version,
                        index: i as i64,
                        starting: true,
                    },
                    f,
                )
            })
            .collect();
        let from_changes = plan.changes_from;
        for (&v, c) in self.commits.range(from_changes..) {
            if !c.removes.is_empty() && !self.config.ignore_deletes {
                return Err(Error::Unsupported {
                    message: format!(
                        "the Delta table at \"{}\" removed data in version {v} (an overwrite, \
                         MERGE or DELETE): a Delta stream reads appends only",
                        self.config.path.display()
                    ),
                    hint: Some(
                        "Set ignore_deletes = true to skip removals and read what the version \
                         adds, or read the table with a new stream from a later \
                         starting_version."
                            .into(),
                    ),
                });
            }
            out.extend(c.adds.iter().enumerate().map(|(i, f)| {
                (
                    Position {
                        version: v,
                        index: i as i64,
                        starting: false,
                    },
                    f.clone(),
                )
            }));
        }
        if let Some(s) = start {
            out.retain(|(p, _)| p.key() > s.key());
        }
        Ok(out)
    }

    fn offset(&self, p: &Position) -> Offset {
        serde_json::json!({
            "sourceVersion": 1,
            "reservoirId": self.table_id,
            "reservoirVersion": p.version,
            "index": p.index,
            "isStartingVersion": p.starting,
        })
    }
}

fn position(o: &Offset) -> Result<Position> {
    let bad = || Error::Internal(format!("unexpected Delta source offset {o}"));
    Ok(Position {
        version: o
            .get("reservoirVersion")
            .and_then(Value::as_u64)
            .ok_or_else(bad)?,
        index: o.get("index").and_then(Value::as_i64).ok_or_else(bad)?,
        starting: o
            .get("isStartingVersion")
            .and_then(Value::as_bool)
            .ok_or_else(bad)?,
    })
}

#[async_trait]
impl Source for DeltaSource {
    fn schema(&self) -> SchemaRef {
        self.config.schema.clone()
    }

    fn describe(&self) -> String {
        format!("DeltaSource[file:{}]", self.config.path.display())
    }

    async fn prepare_available_now(&mut self) -> Result<()> {
        self.fixed = Some(None);
        Ok(())
    }

    fn held_back(&self) -> bool {
        self.held_back
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        let start = start.map(position).transpose()?;
        if !matches!(self.fixed, Some(Some(_))) {
            self.refresh()?;
        }
        let mut files = self.files_after(start.as_ref())?;
        if let Some(Some(end)) = &self.fixed {
            files.retain(|(p, _)| p.key() <= end.key());
        }
        if self.fixed == Some(None) {
            self.fixed = Some(files.last().map(|(p, _)| p.clone()).or(start.clone()));
        }
        let take = match limit {
            ReadLimit::AllAvailable => files.len(),
            ReadLimit::Default => files.len().min(self.config.max_files_per_trigger as usize),
        };
        self.held_back = take < files.len();
        Ok(match files.get(take.wrapping_sub(1)) {
            Some((p, _)) if take > 0 => Some(self.offset(p)),
            _ => start.map(|p| self.offset(&p)),
        })
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let start = start.map(position).transpose()?;
        let end = position(end)?;
        // A replay after a restart reads the commits and snapshot again.
        let mut me = DeltaSource::new(self.config.clone());
        me.commits = self.commits.clone();
        if me
            .commits
            .keys()
            .next_back()
            .is_none_or(|&v| v < end.version)
        {
            me.refresh()?;
        }
        me.plan = match &self.plan {
            Some(p) => Some(p.clone()),
            // Batch 0 replayed after a restart: the snapshot its end names.
            None if start.is_none() && end.starting => Some(me.plan(Some(&end))),
            None => None,
        };
        let files: Vec<PathBuf> = me
            .files_after(start.as_ref())?
            .into_iter()
            .filter(|(p, _)| p.key() <= end.key())
            .map(|(_, f)| self.config.path.join(f))
            .collect();
        let decoder = self.decoder.clone();
        let reads = futures::stream::iter(files.into_iter().map(move |f| {
            let decoder = decoder.clone();
            tokio::task::spawn_blocking(move || decoder.read(&f))
        }))
        .buffered(crate::config::parallelism())
        .map(|r| {
            let read =
                r.map_err(|e| Error::Internal(format!("parquet reader panicked: {e}")))??;
            if read.missing {
                return Err(Error::BadInput(
                    "a data file of the Delta table is gone (vacuumed?)".into(),
                ));
            }
            Ok(read.batches)
        });
        Ok(super::flatten_reads(reads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_uri_decoded_and_positions_ordered() {
        assert_eq!(
            percent_decode("date%3D2026-06-10/part%2000.parquet"),
            "date=2026-06-10/part 00.parquet"
        );
        assert_eq!(percent_decode("100%"), "100%");
        let snap = Position {
            version: 3,
            index: 7,
            starting: true,
        };
        let next = Position {
            version: 4,
            index: 0,
            starting: false,
        };
        let same_version_change = Position {
            version: 3,
            index: 0,
            starting: false,
        };
        assert!(snap.key() < next.key());
        // The snapshot of version 3 is read before any change after it.
        assert!(snap.key() < same_version_change.key());
    }

    /// The snapshot against a direct model (files live after each version, removes taken
    /// out, adds appended), over random valid histories.
    #[test]
    fn snapshots_equal_a_direct_replay_of_the_log() {
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut source = DeltaSource::new(DeltaSourceConfig {
            path: PathBuf::from("/nowhere"),
            schema: Arc::new(datafusion::arrow::datatypes::Schema::empty()),
            starting_version: None,
            max_files_per_trigger: DEFAULT_MAX_FILES,
            ignore_deletes: false,
        });
        let mut live: Vec<String> = Vec::new();
        let mut model: Vec<Vec<String>> = Vec::new();
        let mut fresh = 0;
        for v in 0..200u64 {
            let mut removes = Vec::new();
            for _ in 0..next(4) {
                if !live.is_empty() {
                    removes.push(live.remove(next(live.len() as u64) as usize));
                }
            }
            let mut adds = Vec::new();
            for _ in 0..next(5) {
                fresh += 1;
                adds.push(format!("part-{fresh}.parquet"));
            }
            live.extend(adds.iter().cloned());
            source.commits.insert(
                v,
                Commit {
                    adds,
                    removes,
                    ..Commit::default()
                },
            );
            model.push(live.clone());
        }
        for (v, want) in model.iter().enumerate() {
            let mut got = source.snapshot_at(v as u64);
            let mut want = want.clone();
            got.sort();
            want.sort();
            assert_eq!(got, want, "version {v}");
        }
        // Order: the order files were added in.
        let last = source.snapshot_at(199);
        let mut by_add = last.clone();
        by_add.sort_by_key(|p| {
            p.trim_start_matches("part-")
                .trim_end_matches(".parquet")
                .parse::<u64>()
                .unwrap()
        });
        assert_eq!(last, by_add);
    }

    fn commit(dir: &Path, v: u64, lines: &[&str]) {
        std::fs::create_dir_all(log_dir(dir)).unwrap();
        std::fs::write(log_dir(dir).join(format!("{v:020}.json")), lines.join("\n")).unwrap();
    }

    #[tokio::test]
    async fn snapshot_then_changes_under_the_file_limit() {
        let dir = tempfile::tempdir().unwrap();
        let add = |p: &str| format!("{{\"add\":{{\"path\":\"{p}\",\"dataChange\":true}}}}");
        commit(
            dir.path(),
            0,
            &["{\"metaData\":{\"id\":\"t1\"}}", &add("a"), &add("b")],
        );
        commit(dir.path(), 1, &[&add("c")]);
        let mut src = DeltaSource::new(DeltaSourceConfig {
            path: dir.path().to_path_buf(),
            schema: Arc::new(datafusion::arrow::datatypes::Schema::empty()),
            starting_version: None,
            max_files_per_trigger: 2,
            ignore_deletes: false,
        });
        // The snapshot at version 1 holds a, b, c: two files, then one.
        let first = src
            .latest_offset(None, ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first["reservoirVersion"], 1);
        assert_eq!(first["index"], 1);
        assert_eq!(first["isStartingVersion"], true);
        assert_eq!(first["reservoirId"], "t1");
        let second = src
            .latest_offset(Some(&first), ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (second["index"].clone(), second["isStartingVersion"].clone()),
            (2.into(), true.into())
        );
        assert_eq!(
            src.latest_offset(Some(&second), ReadLimit::Default)
                .await
                .unwrap(),
            Some(second.clone()),
            "nothing new"
        );
        // A later version adds d; one that removes data stops the stream.
        commit(dir.path(), 2, &[&add("d")]);
        let third = src
            .latest_offset(Some(&second), ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                third["reservoirVersion"].clone(),
                third["isStartingVersion"].clone()
            ),
            (2.into(), false.into())
        );
        commit(
            dir.path(),
            3,
            &["{\"remove\":{\"path\":\"a\",\"dataChange\":true}}"],
        );
        let err = src
            .latest_offset(Some(&third), ReadLimit::Default)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("removed data in version 3"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_compaction_counts_in_snapshots_and_is_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let action = |kind: &str, p: &str, change: bool| {
            format!("{{\"{kind}\":{{\"path\":\"{p}\",\"dataChange\":{change}}}}}")
        };
        commit(
            dir.path(),
            0,
            &[
                "{\"metaData\":{\"id\":\"t1\"}}",
                &action("add", "a", true),
                &action("add", "b", true),
            ],
        );
        // Version 1 rewrites a and b into ab; version 2 adds c.
        commit(
            dir.path(),
            1,
            &[
                &action("remove", "a", false),
                &action("remove", "b", false),
                &action("add", "ab", false),
            ],
        );
        commit(dir.path(), 2, &[&action("add", "c", true)]);
        let config = DeltaSourceConfig {
            path: dir.path().to_path_buf(),
            schema: Arc::new(datafusion::arrow::datatypes::Schema::empty()),
            starting_version: None,
            max_files_per_trigger: 100,
            ignore_deletes: false,
        };
        let mut src = DeltaSource::new(config.clone());
        src.refresh().unwrap();
        assert_eq!(src.snapshot_at(0), ["a", "b"]);
        assert_eq!(src.snapshot_at(1), ["ab"]);
        assert_eq!(src.snapshot_at(2), ["ab", "c"]);
        // From version 0 on, the stream reads a and b, then only c: the rewrite neither
        // stops it (no data removed) nor reads ab's rows again.
        let mut from_zero = DeltaSource::new(DeltaSourceConfig {
            starting_version: Some(0),
            ..config
        });
        from_zero.refresh().unwrap();
        let files: Vec<String> = from_zero
            .files_after(None)
            .unwrap()
            .into_iter()
            .map(|(_, f)| f)
            .collect();
        assert_eq!(files, ["a", "b", "c"]);
    }
}
