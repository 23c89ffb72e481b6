//! A streaming query's checkpoint, in Spark's layout (spec §1.4, §9.1):
//!
//! ```text
//! <checkpoint>/
//!   metadata            {"id":"<query uuid>"}, written once
//!   offsets/<N>         v1, batch metadata JSON, one offset JSON per source (write-ahead log)
//!   commits/<N>         v1, {"nextBatchWatermarkMs":...}   (batch N is done)
//!   sources/<i>/        source i's own log, if it keeps one (the file source's, see
//!                       `crate::source::file::log`)
//!   state/<op>/<part>/  state of stateful operator op (see `crate::state`)
//! ```
//!
//! The checkpoint knows no concrete source or sink: offsets are the JSON each source gives.
//!
//! Every entry is written atomically and fsynced, and never overwritten. The protocol is:
//! `offsets/N` before batch N commits anything, the state and sink commit, then `commits/N`,
//! written while batch N + 1 starts (so `offsets/N+1` can be durable first). On restart, an
//! `offsets/N` without `commits/N` means batch N is replayed with exactly those offsets; a
//! missing `commits/N-1` is then written back from it (`engine::query::resume`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, numbered, read_optional, write_atomic, write_new};
pub use crate::types::BatchId;

pub use crate::config::MIN_BATCHES_TO_RETAIN;

/// The metadata line of `offsets/N`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OffsetMetadata {
    pub batch_watermark_ms: i64,
    pub batch_timestamp_ms: i64,
    #[serde(default)]
    pub conf: BTreeMap<String, String>,
}

/// One `offsets/N` entry: the batch's metadata and each source's end offset.
#[derive(Debug, Clone, PartialEq)]
pub struct OffsetSeq {
    pub metadata: OffsetMetadata,
    /// One per source, in source order; `None` for a source with no offset yet (`-`).
    pub offsets: Vec<Option<serde_json::Value>>,
}

impl OffsetSeq {
    fn encode(&self) -> Result<String> {
        let mut s = String::from("v1\n");
        s.push_str(&to_json(&self.metadata)?);
        for o in &self.offsets {
            s.push('\n');
            match o {
                Some(v) => s.push_str(&v.to_string()),
                None => s.push('-'),
            }
        }
        Ok(s)
    }

    fn decode(text: &str, file: &Path) -> Result<OffsetSeq> {
        let corrupt =
            |why: &str| Error::Internal(format!("corrupt offsets log {}: {why}", file.display()));
        let mut lines = text.lines();
        if lines.next() != Some("v1") {
            return Err(corrupt("unsupported version"));
        }
        let metadata: OffsetMetadata =
            serde_json::from_str(lines.next().ok_or_else(|| corrupt("no metadata"))?)
                .map_err(|e| corrupt(&e.to_string()))?;
        let mut offsets = Vec::new();
        for l in lines {
            offsets.push(if l == "-" {
                None
            } else {
                Some(serde_json::from_str(l).map_err(|e| corrupt(&e.to_string()))?)
            });
        }
        Ok(OffsetSeq { metadata, offsets })
    }
}

/// One `commits/N` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitEntry {
    pub next_batch_watermark_ms: i64,
}

/// An open checkpoint directory.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    root: PathBuf,
    /// The query id: stable across restarts, the Delta application id.
    pub id: Uuid,
}

#[derive(Serialize, Deserialize)]
struct Metadata {
    id: Uuid,
}

impl Checkpoint {
    /// Opens (creating if needed) the checkpoint at `root`.
    pub fn open(root: &Path) -> Result<Checkpoint> {
        for d in ["offsets", "commits"] {
            create_dir_all(&root.join(d))?;
        }
        let meta = root.join("metadata");
        let id = match std::fs::read_to_string(&meta) {
            Ok(text) => {
                let m: Metadata = serde_json::from_str(text.trim()).map_err(|e| {
                    Error::Internal(format!(
                        "corrupt checkpoint metadata {}: {e}",
                        meta.display()
                    ))
                })?;
                m.id
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = Uuid::new_v4();
                write_atomic(&meta, to_json(&Metadata { id })?.as_bytes())?;
                id
            }
            Err(e) => return Err(Error::io(format!("reading {}", meta.display()), e)),
        };
        Ok(Checkpoint {
            root: root.to_path_buf(),
            id,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn offsets_dir(&self) -> PathBuf {
        self.root.join("offsets")
    }

    fn commits_dir(&self) -> PathBuf {
        self.root.join("commits")
    }

    /// The directory of source `i`'s own log (`sources/<i>`).
    pub fn source_dir(&self, i: usize) -> PathBuf {
        self.root.join("sources").join(i.to_string())
    }

    /// The newest `offsets/N`, if any.
    pub fn latest_offsets(&self) -> Result<Option<(BatchId, OffsetSeq)>> {
        match latest_id(&self.offsets_dir())? {
            None => Ok(None),
            Some(n) => Ok(Some((
                n,
                self.offsets(n)?
                    .ok_or_else(|| Error::Internal(format!("offsets/{n} vanished")))?,
            ))),
        }
    }

    /// `offsets/N`, if it exists.
    pub fn offsets(&self, n: BatchId) -> Result<Option<OffsetSeq>> {
        let file = self.offsets_dir().join(n.to_string());
        match read_optional(&file)? {
            None => Ok(None),
            Some(text) => OffsetSeq::decode(&text, &file).map(Some),
        }
    }

    /// The newest `commits/N`, if any.
    pub fn latest_commit(&self) -> Result<Option<(BatchId, CommitEntry)>> {
        let Some(n) = latest_id(&self.commits_dir())? else {
            return Ok(None);
        };
        let file = self.commits_dir().join(n.to_string());
        let text = read_optional(&file)?.unwrap_or_default();
        let mut lines = text.lines();
        let corrupt = || Error::Internal(format!("corrupt commit log {}", file.display()));
        if lines.next() != Some("v1") {
            return Err(corrupt());
        }
        let entry =
            serde_json::from_str(lines.next().ok_or_else(corrupt)?).map_err(|_| corrupt())?;
        Ok(Some((n, entry)))
    }

    /// Writes `offsets/N` durably. Refuses to overwrite: the log is append-only.
    pub fn write_offsets(&self, n: BatchId, seq: &OffsetSeq) -> Result<()> {
        let file = self.offsets_dir().join(n.to_string());
        if !write_new(&file, seq.encode()?.as_bytes())? {
            return Err(Error::Internal(format!(
                "offsets/{n} already exists in {}: is another run of this query active?",
                self.root.display()
            )));
        }
        Ok(())
    }

    /// Writes `commits/N` durably.
    pub fn write_commit(&self, n: BatchId, entry: &CommitEntry) -> Result<()> {
        let file = self.commits_dir().join(n.to_string());
        let text = format!("v1\n{}", to_json(entry)?);
        if !write_new(&file, text.as_bytes())? {
            return Err(Error::Internal(format!("commits/{n} already exists")));
        }
        Ok(())
    }

    /// Deletes log entries older than the retention window, once batch `n` is committed.
    pub fn purge(&self, n: BatchId) {
        if n.get() <= MIN_BATCHES_TO_RETAIN {
            return;
        }
        let keep_from = n.get() - MIN_BATCHES_TO_RETAIN;
        for dir in [self.offsets_dir(), self.commits_dir()] {
            if let Ok(ids) = numbered(&dir, "") {
                for id in ids.into_iter().filter(|&id| id < keep_from) {
                    let _ = std::fs::remove_file(dir.join(id.to_string()));
                }
            }
        }
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Internal(format!("encoding JSON: {e}")))
}

fn latest_id(dir: &Path) -> Result<Option<BatchId>> {
    Ok(numbered(dir, "")?.into_iter().max().map(BatchId))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_in_spark_format() {
        let dir = tempfile::tempdir().unwrap();
        let ck = Checkpoint::open(dir.path()).unwrap();
        let seq = OffsetSeq {
            metadata: OffsetMetadata {
                batch_watermark_ms: 0,
                batch_timestamp_ms: 1781085600000,
                conf: BTreeMap::new(),
            },
            offsets: vec![Some(serde_json::json!({"logOffset": 0}))],
        };
        ck.write_offsets(BatchId(0), &seq).unwrap();
        let text = std::fs::read_to_string(dir.path().join("offsets/0")).unwrap();
        assert_eq!(
            text,
            "v1\n{\"batchWatermarkMs\":0,\"batchTimestampMs\":1781085600000,\"conf\":{}}\n{\"logOffset\":0}"
        );
        assert_eq!(
            ck.latest_offsets().unwrap(),
            Some((BatchId(0), seq.clone()))
        );
        assert!(
            ck.write_offsets(BatchId(0), &seq).is_err(),
            "the log is append-only"
        );
        assert_eq!(ck.latest_commit().unwrap(), None);
        ck.write_commit(
            BatchId(0),
            &CommitEntry {
                next_batch_watermark_ms: 5,
            },
        )
        .unwrap();
        assert_eq!(ck.latest_commit().unwrap().unwrap().0, BatchId(0));
        // The id survives reopening.
        assert_eq!(Checkpoint::open(dir.path()).unwrap().id, ck.id);
    }
}

/// What a checkpoint was written for: the parts of a sink's definition that its offsets and
/// state depend on (spec §9.3–9.4), kept in `<checkpoint>/tidemark.json`. Triggers, rate
/// limits, filters before the stateful operator and projections after it are not in it:
/// changing them is safe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointDefinition {
    /// `connector:path (format)` of the source.
    pub source: String,
    /// Group keys of the stateful operator (empty for a stateless sink).
    pub group_keys: Vec<String>,
    /// Aggregates of the stateful operator.
    pub aggregates: Vec<String>,
    /// The event-time column of the watermark, if any.
    pub watermark_column: Option<String>,
    /// How several watermarks combine (`min` in checkpoints from before the option).
    #[serde(default = "min_policy")]
    pub watermark_policy: String,
    pub output_mode: String,
    pub state_partitions: usize,
    pub state_store: String,
}

impl CheckpointDefinition {
    /// The first difference that makes `self` (the checkpoint's) unusable for `wanted`.
    fn incompatibility(&self, wanted: &CheckpointDefinition) -> Option<String> {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        if self.source != wanted.source {
            return Some(format!(
                "the source changed from {} to {}",
                self.source, wanted.source
            ));
        }
        if self.group_keys != wanted.group_keys {
            return Some(format!(
                "the group keys changed from [{}] to [{}]",
                list(&self.group_keys),
                list(&wanted.group_keys)
            ));
        }
        if self.aggregates != wanted.aggregates {
            return Some(format!(
                "the aggregates changed from [{}] to [{}]",
                list(&self.aggregates),
                list(&wanted.aggregates)
            ));
        }
        if self.watermark_column != wanted.watermark_column {
            let col = |c: &Option<String>| c.clone().unwrap_or_else(|| "none".into());
            return Some(format!(
                "the watermark column changed from {} to {}",
                col(&self.watermark_column),
                col(&wanted.watermark_column)
            ));
        }
        if self.watermark_policy != wanted.watermark_policy {
            return Some(format!(
                "multiple_watermark_policy changed from '{}' to '{}'",
                self.watermark_policy, wanted.watermark_policy
            ));
        }
        if self.output_mode != wanted.output_mode {
            return Some(format!(
                "the output mode changed from {} to {}",
                self.output_mode, wanted.output_mode
            ));
        }
        if self.state_partitions != wanted.state_partitions {
            return Some(format!(
                "state_partitions changed from {} to {}",
                self.state_partitions, wanted.state_partitions
            ));
        }
        if self.state_store != wanted.state_store {
            return Some(format!(
                "state_store changed from '{}' to '{}'",
                self.state_store, wanted.state_store
            ));
        }
        None
    }
}

const DEFINITION_FILE: &str = "tidemark.json";

fn min_policy() -> String {
    "min".into()
}

/// Checks that the checkpoint at `root` (if it has a recorded definition) can serve
/// `wanted`, the definition of `query` (`sink "x"`, `materialized view "x"`: how the error
/// names it); names the change if not.
pub fn check_definition(root: &Path, query: &str, wanted: &CheckpointDefinition) -> Result<()> {
    let file = root.join(DEFINITION_FILE);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("reading {}", file.display()), e)),
    };
    let found: CheckpointDefinition = serde_json::from_str(&text).map_err(|e| {
        Error::Internal(format!(
            "corrupt checkpoint definition {}: {e}",
            file.display()
        ))
    })?;
    match found.incompatibility(wanted) {
        None => Ok(()),
        Some(change) => Err(Error::IncompatibleCheckpoint {
            message: format!(
                "{query} cannot continue from checkpoint \"{}\": {change}",
                root.display()
            ),
            hint: "Restore the previous definition, or use a new checkpoint_location (the \
                   query then starts over from the first file)."
                .into(),
        }),
    }
}

/// Checks, then records, the definition the checkpoint at `root` serves.
pub fn record_definition(root: &Path, query: &str, wanted: &CheckpointDefinition) -> Result<()> {
    check_definition(root, query, wanted)?;
    let file = root.join(DEFINITION_FILE);
    if !file.exists() {
        write_atomic(&file, to_json(wanted)?.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod definition_tests {
    use super::*;

    fn def() -> CheckpointDefinition {
        CheckpointDefinition {
            source: "file:/in (json)".into(),
            group_keys: vec!["page".into()],
            aggregates: vec!["count(1)".into()],
            watermark_column: Some("event_time".into()),
            watermark_policy: "min".into(),
            output_mode: "append".into(),
            state_partitions: 4,
            state_store: "memory".into(),
        }
    }

    #[test]
    fn incompatible_definitions_are_named_and_safe_ones_pass() {
        let dir = tempfile::tempdir().unwrap();
        record_definition(dir.path(), "s", &def()).unwrap();
        record_definition(dir.path(), "s", &def()).unwrap();
        let mut other = def();
        other.state_store = "rocksdb".into();
        let e = check_definition(dir.path(), "s", &other).unwrap_err();
        assert_eq!(e.sqlstate().code(), "55000");
        assert!(
            e.to_string()
                .ends_with("state_store changed from 'memory' to 'rocksdb'"),
            "{e}"
        );
        // A checkpoint without a recorded definition (older, or new) accepts any.
        let fresh = tempfile::tempdir().unwrap();
        check_definition(fresh.path(), "s", &other).unwrap();
        // A definition recorded before the watermark policy existed was made under `min`.
        let old = tempfile::tempdir().unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&to_json(&def()).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("watermarkPolicy");
        std::fs::write(old.path().join(DEFINITION_FILE), json.to_string()).unwrap();
        check_definition(old.path(), "s", &def()).unwrap();
        let mut max = def();
        max.watermark_policy = "max".into();
        let e = check_definition(old.path(), "s", &max).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("multiple_watermark_policy changed from 'min' to 'max'"),
            "{e}"
        );
    }
}
