//! Spark's file-sink manifest, `_spark_metadata/` (spec §11.1): which files of a sink
//! folder are committed, batch by batch.
//!
//! Batch `N` commits by writing `_spark_metadata/<N>`: `v1` and one JSON line per file, in
//! the format of Spark's `FileStreamSinkLog`. Every [`COMPACT_INTERVAL`] batches the
//! manifest is compacted: batch `N` with `(N + 1) % 10 == 0` writes `<N>.compact`, every
//! committed file so far; readers take the newest compaction and the batch files after it.
//! Writers ([`crate::sink::file`]) and readers (the file source, a sink's table) both go
//! through here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fsutil::{numbered, write_new};

/// The manifest directory, named as Spark names it.
pub const MANIFEST_DIR: &str = "_spark_metadata";
/// Every this many batches the manifest is compacted (Spark's
/// `spark.sql.streaming.fileSink.log.compactInterval` default).
pub const COMPACT_INTERVAL: u64 = 10;
pub const COMPACT_SUFFIX: &str = ".compact";

/// One line of a manifest (Spark's `SinkFileStatus`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkFileStatus {
    pub path: String,
    pub size: u64,
    pub is_dir: bool,
    pub modification_time: i64,
    pub block_replication: u32,
    pub block_size: u64,
    pub action: String,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Whether `dir` is the folder of a file sink (it has a manifest).
pub fn is_sink_folder(dir: &Path) -> bool {
    manifest_dir(dir).is_dir()
}

pub fn manifest_dir(dir: &Path) -> PathBuf {
    dir.join(MANIFEST_DIR)
}

/// Manifest files: batch id and whether the file is a compaction, ascending.
pub fn manifests(dir: &Path) -> Result<Vec<(u64, bool)>> {
    let m = manifest_dir(dir);
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
    manifest_dir(dir).join(format!("{id}{suffix}"))
}

/// The newest batch id the manifest holds.
pub fn last_batch(dir: &Path) -> Result<Option<u64>> {
    Ok(manifests(dir)?.last().map(|&(id, _)| id))
}

/// The entries (JSON lines) of the newest compaction and of the batches after it.
fn live_entries(dir: &Path) -> Result<Vec<String>> {
    let manifests = manifests(dir)?;
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
        let file = manifest_file(dir, id, compact);
        let text =
            std::fs::read_to_string(&file).map_err(io(format!("reading {}", file.display())))?;
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
    for line in live_entries(dir)? {
        let status: SinkFileStatus = serde_json::from_str(&line).map_err(|e| {
            Error::Internal(format!(
                "corrupt manifest entry in {}: {e}",
                manifest_dir(dir).display()
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

/// Commits batch `batch_id` with its files: `<N>` or, every [`COMPACT_INTERVAL`] batches,
/// `<N>.compact`. Returns false if the manifest already had the batch (a replay).
pub fn commit(dir: &Path, batch_id: u64, files: &[SinkFileStatus]) -> Result<bool> {
    let compact = (batch_id + 1).is_multiple_of(COMPACT_INTERVAL);
    let mut entries = if compact {
        live_entries(dir)?
    } else {
        Vec::new()
    };
    for s in files {
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
    if !write_new(&manifest_file(dir, batch_id, compact), text.as_bytes())? {
        return Ok(false);
    }
    if compact {
        remove_old_manifests(dir, batch_id)?;
    }
    Ok(true)
}

/// After compaction `compacted`: removes the manifest files before the previous
/// compaction (what readers of the last two compactions do not need).
fn remove_old_manifests(dir: &Path, compacted: u64) -> Result<()> {
    let keep_from = compacted.saturating_sub(COMPACT_INTERVAL);
    for (id, compact) in manifests(dir)? {
        if id < keep_from {
            let file = manifest_file(dir, id, compact);
            if let Err(e) = std::fs::remove_file(&file)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %file.display(), error = %e, "removing an old manifest");
            }
        }
    }
    Ok(())
}
