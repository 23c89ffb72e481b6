//! The default state backend: a sorted map in memory, durable through per-version deltas
//! and periodic snapshots.
//!
//! Layout under `<checkpoint>/state/<operator>/`:
//!
//! ```text
//! _metadata       {"formatVersion":2,"store":"memory","partitions":4,...}  (see kv.rs)
//! <v>.delta       Arrow IPC (key binary, value binary, time int64): what version v set;
//!                 a null value removes the key
//! <v>.snapshot    the same columns: every entry at version v
//! ```
//!
//! Loading version `v` reads the newest snapshot at or before `v` and applies the deltas
//! after it, in order. Files of versions after `v` (left by a batch that crashed before its
//! commit log) are ignored and overwritten when that version is committed again. Snapshots
//! are written after the commit log ([`Backend::maintain`]), every
//! [`super::SNAPSHOT_INTERVAL`] versions, through a temporary file and a rename.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;

use super::kv::{Backend, Changes};
use super::snapshot_interval;
use crate::config::MIN_BATCHES_TO_RETAIN;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, numbered, write_atomic_then};

/// Per-entry overhead counted in the memory estimate (map node, vectors).
const ENTRY_OVERHEAD: u64 = 96;

/// A value and its time.
type Entry = (Vec<u8>, Option<i64>);

/// See the module documentation.
pub struct MemoryBackend {
    dir: PathBuf,
    map: BTreeMap<Vec<u8>, Entry>,
    by_time: BTreeSet<(i64, Vec<u8>)>,
    /// Changes since the last commit: `None` removes.
    pending: BTreeMap<Vec<u8>, Option<Entry>>,
    bytes: u64,
    /// The last version loaded or committed.
    version: u64,
}

fn file_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Binary, false),
        Field::new("value", DataType::Binary, true),
        Field::new("time", DataType::Int64, true),
    ]))
}

impl MemoryBackend {
    pub fn new(dir: &Path) -> MemoryBackend {
        MemoryBackend {
            dir: dir.to_path_buf(),
            map: BTreeMap::new(),
            by_time: BTreeSet::new(),
            pending: BTreeMap::new(),
            bytes: 0,
            version: 0,
        }
    }

    fn set(&mut self, key: Vec<u8>, entry: Option<Entry>) -> bool {
        let old = match entry {
            Some((value, time)) => {
                if let Some(t) = time {
                    self.by_time.insert((t, key.clone()));
                }
                self.bytes += (key.len() + value.len()) as u64 + ENTRY_OVERHEAD;
                self.map.insert(key.clone(), (value, time))
            }
            None => self.map.remove(&key),
        };
        match old {
            Some((value, time)) => {
                self.bytes -= (key.len() + value.len()) as u64 + ENTRY_OVERHEAD;
                if let Some(t) = time
                    && self.map.get(&key).is_none_or(|(_, t2)| *t2 != Some(t))
                {
                    self.by_time.remove(&(t, key));
                }
                true
            }
            None => false,
        }
    }

    fn encode<'a>(
        entries: impl Iterator<Item = (&'a Vec<u8>, Option<(&'a Vec<u8>, Option<i64>)>)>,
    ) -> Result<Vec<u8>> {
        let mut keys: Vec<&[u8]> = Vec::new();
        let mut values: Vec<Option<&[u8]>> = Vec::new();
        let mut times: Vec<Option<i64>> = Vec::new();
        for (k, e) in entries {
            keys.push(k);
            values.push(e.map(|(v, _)| v.as_slice()));
            times.push(e.and_then(|(_, t)| t));
        }
        let schema = file_schema();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(BinaryArray::from(keys)) as ArrayRef,
                Arc::new(BinaryArray::from(values)),
                Arc::new(Int64Array::from(times)),
            ],
        )?;
        let mut buf = Vec::new();
        let mut w = FileWriter::try_new(&mut buf, &schema)?;
        w.write(&batch)?;
        w.finish()?;
        drop(w);
        Ok(buf)
    }

    /// Applies a delta or snapshot file.
    fn read_into(&mut self, file: &Path) -> Result<()> {
        let f =
            File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
        let corrupt = || Error::Internal(format!("corrupt state file {}", file.display()));
        for batch in FileReader::try_new(f, None)? {
            let batch = batch?;
            if batch.num_columns() != 3 {
                return Err(corrupt());
            }
            let keys = batch.column(0).as_binary_opt::<i32>().ok_or_else(corrupt)?;
            let values = batch.column(1).as_binary_opt::<i32>().ok_or_else(corrupt)?;
            let times = batch
                .column(2)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(corrupt)?;
            for i in 0..batch.num_rows() {
                let entry = (!values.is_null(i)).then(|| {
                    (
                        values.value(i).to_vec(),
                        (!times.is_null(i)).then(|| times.value(i)),
                    )
                });
                self.set(keys.value(i).to_vec(), entry);
            }
        }
        Ok(())
    }

    fn versions(&self, ext: &str) -> Vec<u64> {
        numbered(&self.dir, ext).unwrap_or_default()
    }
}

impl Backend for MemoryBackend {
    fn load(&mut self, version: u64) -> Result<()> {
        self.map.clear();
        self.by_time.clear();
        self.pending.clear();
        self.bytes = 0;
        self.version = version;
        if version == 0 {
            return Ok(());
        }
        let snapshot = self
            .versions(".snapshot")
            .into_iter()
            .filter(|&v| v <= version)
            .max();
        let from = match snapshot {
            Some(s) => {
                self.read_into(&self.dir.join(format!("{s}.snapshot")))?;
                s + 1
            }
            None => 1,
        };
        for v in from..=version {
            let file = self.dir.join(format!("{v}.delta"));
            if !file.exists() {
                return Err(Error::Internal(format!(
                    "state version {v} is missing ({})",
                    file.display()
                )));
            }
            self.read_into(&file)?;
        }
        Ok(())
    }

    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        Ok(keys
            .iter()
            .map(|k| self.map.get(k).map(|(v, _)| v.clone()))
            .collect())
    }

    fn scan_prefix(&self, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        for (k, (v, _)) in self.map.range(prefix.to_vec()..) {
            if !k.starts_with(prefix) {
                break;
            }
            f(k, v);
        }
        Ok(())
    }

    fn scan_time(&self, upto: i64, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        for (t, k) in &self.by_time {
            if *t > upto {
                break;
            }
            f(k);
        }
        Ok(())
    }

    fn write(&mut self, changes: Changes) -> Result<u64> {
        let mut removed = 0;
        for (key, _) in changes.deletes {
            if self.set(key.clone(), None) {
                self.pending.insert(key, None);
                removed += 1;
            }
        }
        for (key, value, time) in changes.puts {
            let entry = Some((value, time));
            self.pending.insert(key.clone(), entry.clone());
            self.set(key, entry);
        }
        Ok(removed)
    }

    fn entries(&self) -> u64 {
        self.map.len() as u64
    }

    fn commit(&mut self, version: u64) -> Result<u64> {
        create_dir_all(&self.dir)?;
        let pending = std::mem::take(&mut self.pending);
        let bytes = Self::encode(
            pending
                .iter()
                .map(|(k, e)| (k, e.as_ref().map(|(v, t)| (v, *t)))),
        )?;
        write_atomic_then(&self.dir.join(format!("{version}.delta")), &bytes, || {})?;
        self.version = version;
        Ok(self.bytes)
    }

    fn maintain(&mut self) -> Result<()> {
        let version = self.version;
        let interval = snapshot_interval();
        if version == 0 || !version.is_multiple_of(interval) {
            return Ok(());
        }
        let bytes = Self::encode(self.map.iter().map(|(k, (v, t))| (k, Some((v, *t)))))?;
        write_atomic_then(
            &self.dir.join(format!("{version}.snapshot")),
            &bytes,
            || crate::testing::crash_point("mid_state_snapshot"),
        )?;
        // Keep what loading any of the last MIN_BATCHES_TO_RETAIN versions needs.
        let keep_from = version.saturating_sub(MIN_BATCHES_TO_RETAIN + interval);
        for ext in [".delta", ".snapshot"] {
            for v in self.versions(ext).into_iter().filter(|&v| v < keep_from) {
                let _ = std::fs::remove_file(self.dir.join(format!("{v}{ext}")));
            }
        }
        Ok(())
    }
}
