//! Read-ahead: the files the next batch will most likely take, decoded while the current
//! batch runs, so that reading batch N + 1 overlaps with running batch N.
//!
//! The guess is the next `max_files_per_trigger` unseen files of the listing that planned
//! the current batch; a file that lands later but sorts before them makes the guess wrong,
//! and then the decoded rows are dropped. A decoded file is used only if it is unchanged
//! (same length and modification time) since its decode started; otherwise, and for any
//! file whose decode has not started when its batch reads it, the batch decodes it itself.
//! Either way the batch gets exactly the rows a fresh decode would give.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::StreamExt;
use tokio::sync::oneshot;

use crate::error::Result;
use crate::format::{FileDecoder, FileRead};

/// What identifies a file's content for the read-ahead: its length and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
    })
}

type Decoded = (Stamp, Result<FileRead>);

/// A file the read-ahead took on: once `claimed`, by the read-ahead (it decodes it) or by a
/// batch that came first (the read-ahead then skips it).
struct Pending {
    claimed: Arc<AtomicBool>,
    decoded: oneshot::Receiver<Decoded>,
}

/// A file's read-ahead, as a batch takes it.
pub struct Ahead {
    path: PathBuf,
    decoded: oneshot::Receiver<Decoded>,
}

impl Ahead {
    /// The decoded file, if it is still what was decoded; `None`: decode it now.
    pub async fn get(self) -> Option<FileRead> {
        usable(&self.path, self.decoded.await.ok()?)
    }
}

/// A decode's rows, if it succeeded and the file is unchanged since it started.
fn usable(path: &Path, (was, read): Decoded) -> Option<FileRead> {
    let read = read.ok()?;
    (stamp(path) == Some(was)).then_some(read)
}

/// The read-ahead of one file source: the guessed next files, and those being decoded.
#[derive(Default)]
pub struct ReadAhead {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next: Vec<PathBuf>,
    pending: HashMap<PathBuf, Pending>,
}

impl ReadAhead {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The files the next batch will most likely read, in order.
    pub fn guess(&self, files: Vec<PathBuf>) {
        self.state().next = files;
    }

    /// Starts decoding the guessed files in the background, in order, as many at a time as
    /// there are cores (the batch under way shares them); with fewer files than cores, each
    /// on its share of the cores (a large file is cut into pieces, as a batch's own read
    /// does), so one large file a batch is not decoded on one core.
    pub fn start(&self, decoder: Arc<FileDecoder>) {
        let mut state = self.state();
        let files = std::mem::take(&mut state.next);
        let mut work = Vec::with_capacity(files.len());
        for path in files {
            let claimed = Arc::new(AtomicBool::new(false));
            let (tx, rx) = oneshot::channel();
            let old = state.pending.insert(
                path.clone(),
                Pending {
                    claimed: claimed.clone(),
                    decoded: rx,
                },
            );
            if let Some(old) = old {
                old.claimed.store(true, Ordering::SeqCst);
            }
            work.push((path, claimed, tx));
        }
        if work.is_empty() {
            return;
        }
        let cores = crate::config::parallelism();
        let threads = (cores / work.len()).max(1);
        let decode = move |(path, claimed, tx): (PathBuf, Arc<AtomicBool>, oneshot::Sender<_>)| {
            let decoder = decoder.clone();
            async move {
                if claimed
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    return;
                }
                let decoded = tokio::task::spawn_blocking(move || {
                    // A file that is gone is not read ahead: its batch counts it missing.
                    let was = stamp(&path)?;
                    Some((was, decoder.read_on(&path, threads)))
                })
                .await;
                if let Ok(Some(decoded)) = decoded {
                    let _ = tx.send(decoded);
                }
            }
        };
        tokio::spawn(futures::stream::iter(work).for_each_concurrent(cores, decode));
    }

    /// Takes `path`'s read-ahead, if its decode has started; `None`: the caller decodes it
    /// (and the read-ahead, if it gets to it, skips it).
    pub fn take(&self, path: &Path) -> Option<Ahead> {
        let pending = self.state().pending.remove(path)?;
        let unstarted = pending
            .claimed
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        (!unstarted).then(|| Ahead {
            path: path.to_path_buf(),
            decoded: pending.decoded,
        })
    }

    /// Drops whatever was read ahead and not taken (a wrong guess): files not started are
    /// skipped, those being decoded are dropped when done.
    pub fn forget(&self) {
        for (_, p) in self.state().pending.drain() {
            p.claimed.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::format::{FileFormat, ParseMode};

    fn decoder() -> Arc<FileDecoder> {
        Arc::new(FileDecoder {
            format: FileFormat::Json,
            mode: ParseMode::Permissive,
            schema: Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)])),
        })
    }

    fn values(read: &FileRead) -> Vec<i64> {
        read.batches
            .iter()
            .flat_map(|b| {
                let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..a.len()).map(|i| a.value(i)).collect::<Vec<_>>()
            })
            .collect()
    }

    fn land(path: &Path, text: &str) {
        let hidden =
            path.with_file_name(format!(".{}", path.file_name().unwrap().to_string_lossy()));
        std::fs::write(&hidden, text).unwrap();
        std::fs::rename(&hidden, path).unwrap();
    }

    /// Starts the read-ahead of `path` and waits (with a deadline) until it has claimed it.
    async fn started(ahead: &ReadAhead, path: &Path) -> Ahead {
        ahead.guess(vec![path.to_path_buf()]);
        ahead.start(decoder());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let claimed = ahead.state().pending[path].claimed.load(Ordering::SeqCst);
            if claimed {
                return ahead.take(path).expect("a started read-ahead is taken");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "read-ahead never started"
            );
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_guessed_file_is_decoded_ahead_and_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        land(&a, "{\"n\":1}\n{\"n\":2}\n");
        let ahead = ReadAhead::default();
        let read = started(&ahead, &a).await.get().await.expect("decoded");
        assert_eq!(values(&read), vec![1, 2]);
        assert!(ahead.take(&a).is_none(), "taken twice");
    }

    #[tokio::test]
    async fn a_file_changed_since_its_read_ahead_is_decoded_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        land(&a, "{\"n\":1}\n");
        let ahead = ReadAhead::default();
        let taken = started(&ahead, &a).await;
        let (was, read) = taken.decoded.await.expect("decoded");
        let read = read.unwrap();
        assert_eq!(values(&read), vec![1]);
        land(&a, "{\"n\":1}\n{\"n\":3}\n");
        assert!(
            usable(&a, (was, Ok(read))).is_none(),
            "a stale read-ahead was used"
        );
        // The same rows for the unchanged file are used.
        let now = stamp(&a).unwrap();
        let fresh = decoder().read(&a).unwrap();
        assert_eq!(values(&usable(&a, (now, Ok(fresh))).unwrap()), vec![1, 3]);
    }

    #[tokio::test]
    async fn a_file_taken_before_its_read_ahead_started_is_skipped_by_it() {
        let ahead = ReadAhead::default();
        let a = PathBuf::from("/nonexistent/a.json");
        ahead.guess(vec![a.clone()]);
        // No runtime turn between start and take: the background task cannot have run.
        ahead.start(decoder());
        assert!(ahead.take(&a).is_none());
        ahead.forget();
        assert!(ahead.state().pending.is_empty());
    }
}
