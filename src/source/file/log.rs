//! The file source's log, `<checkpoint>/sources/<i>/<k>` (Spark's `FileStreamSourceLog`):
//! entry `k` lists the files taken at log offset `k`, one JSON line each. Written before
//! the batch's `offsets/N`, never overwritten.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ListedFile;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, numbered, read_optional, write_new};

/// One line of a file-source log entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceFileEntry {
    pub path: String,
    pub timestamp: i64,
    pub batch_id: u64,
}

/// The log of files a file source has taken: entry `k` lists the files of log offset `k`.
#[derive(Debug, Clone)]
pub struct FileSourceLog {
    dir: PathBuf,
}

impl FileSourceLog {
    /// Opens (creating) the log in `dir`: the checkpoint's `sources/<i>`.
    pub fn open(dir: PathBuf) -> Result<FileSourceLog> {
        create_dir_all(&dir)?;
        Ok(FileSourceLog { dir })
    }

    /// The newest entry id, if any.
    pub fn latest(&self) -> Result<Option<u64>> {
        Ok(numbered(&self.dir, "")?.into_iter().max())
    }

    /// The files of entry `k`.
    pub fn entry(&self, k: u64) -> Result<Vec<SourceFileEntry>> {
        let file = self.dir.join(k.to_string());
        let text = read_optional(&file)?.ok_or_else(|| {
            Error::Internal(format!(
                "file source log entry {} is missing",
                file.display()
            ))
        })?;
        let mut lines = text.lines();
        if lines.next() != Some("v1") {
            return Err(Error::Internal(format!(
                "corrupt file source log {}",
                file.display()
            )));
        }
        lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                serde_json::from_str(l).map_err(|e| {
                    Error::Internal(format!("corrupt file source log {}: {e}", file.display()))
                })
            })
            .collect()
    }

    /// Writes entry `k` durably.
    pub fn write(&self, k: u64, files: &[ListedFile]) -> Result<()> {
        let mut text = String::from("v1");
        for f in files {
            text.push('\n');
            text.push_str(&to_json(&SourceFileEntry {
                path: f.path.clone(),
                timestamp: f.timestamp,
                batch_id: k,
            })?);
        }
        if !write_new(&self.dir.join(k.to_string()), text.as_bytes())? {
            return Err(Error::Internal(format!(
                "file source log entry {k} already exists"
            )));
        }
        Ok(())
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Internal(format!("encoding JSON: {e}")))
}
