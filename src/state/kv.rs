//! State rows as byte keys and values ([`Codec`]) over a sorted, versioned key-value
//! [`Backend`] (RocksDB). Rows whose layout has a time column are also indexed by that
//! time, so the watermark finds what it closes without a scan.

use std::path::Path;
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use super::codec::{Codec, check_metadata};
use super::{StateLayout, StateMetrics, StateStore, StoreKind};
use crate::error::{Error, Result};

/// A versioned, sorted key-value map: what a state store keeps its bytes in.
pub trait Backend: Send + Sync {
    /// Makes the map what it was when `version` was committed (0 = empty).
    fn load(&mut self, version: u64) -> Result<()>;
    /// The values of `keys` (in order).
    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>>;
    /// Calls `f` with every entry whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()>;
    /// Calls `f` with every key whose time is at or before `upto`.
    fn scan_time(&self, upto: i64, f: &mut dyn FnMut(&[u8])) -> Result<()>;
    /// Applies `changes` at once: its removals, then its upserts. Returns how many of the
    /// removed keys were there.
    fn write(&mut self, changes: Changes) -> Result<u64>;
    /// Removes `keys`, the keys whose time is at or before `upto` (as [`Backend::scan_time`]
    /// listed them), and their time index entries as one range. Returns how many were there.
    fn evict(&mut self, upto: i64, keys: &[Vec<u8>]) -> Result<u64>;
    /// Entries in the map.
    fn entries(&self) -> u64;
    /// Makes the map durable as `version`; the approximate memory it holds.
    fn commit(&mut self, version: u64) -> Result<u64>;
    /// Snapshots and clean-up after the commit log of the last committed version.
    fn maintain(&mut self) -> Result<()>;
}

/// A set of changes to a [`Backend`], applied together.
#[derive(Default)]
pub struct Changes {
    /// Keys to remove, with the time they are indexed by.
    pub deletes: Vec<(Vec<u8>, Option<i64>)>,
    /// Keys to set, with their values and times (applied after the removals).
    pub puts: Vec<(Vec<u8>, Vec<u8>, Option<i64>)>,
}

/// A [`StateStore`] over a [`Backend`]; see the module documentation.
pub struct KvState<B: Backend> {
    codec: Codec,
    backend: B,
    updated: u64,
    removed: u64,
}

impl<B: Backend> KvState<B> {
    /// Opens the store of an operator, checking the metadata of a store that exists.
    pub fn open(dir: &Path, layout: StateLayout, kind: StoreKind, backend: B) -> Result<Self> {
        check_metadata(dir, &layout, kind)?;
        Ok(KvState {
            codec: Codec::new(layout)?,
            backend,
            updated: 0,
            removed: 0,
        })
    }

    fn keys(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        Ok(self.codec.keys(batch)?.iter().map(<[u8]>::to_vec).collect())
    }

    /// The entries whose time is at or before `wm_us`, through the time index.
    fn expired_entries(&self, wm_us: i64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut keys = Vec::new();
        self.backend
            .scan_time(wm_us, &mut |k| keys.push(k.to_vec()))?;
        let values = self.backend.multi_get(&keys)?;
        keys.into_iter()
            .zip(values)
            .map(|(k, v)| {
                v.map(|v| (k, v))
                    .ok_or_else(|| Error::Internal("state time index names a missing key".into()))
            })
            .collect()
    }

    fn decode(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<RecordBatch> {
        self.codec
            .decode(entries.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
    }
}

/// Rows per batch that [`StateStore::rows`] returns.
const SCAN_BATCH_ROWS: usize = 8192;

impl<B: Backend> StateStore for KvState<B> {
    fn schema(&self) -> SchemaRef {
        self.codec.layout.schema.clone()
    }

    fn load(&mut self, version: u64) -> Result<()> {
        self.updated = 0;
        self.removed = 0;
        self.backend.load(version)
    }

    fn get(&self, keys: &RecordBatch) -> Result<RecordBatch> {
        let mut ks = self.keys(keys)?;
        ks.sort();
        ks.dedup();
        let values = self.backend.multi_get(&ks)?;
        let entries: Vec<(Vec<u8>, Vec<u8>)> = ks
            .into_iter()
            .zip(values)
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        self.decode(&entries)
    }

    fn get_groups(&self, rows: &RecordBatch) -> Result<RecordBatch> {
        let prefixes = self.codec.group_prefixes(rows)?;
        let mut prefixes: Vec<&[u8]> = prefixes.iter().collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let mut entries = Vec::new();
        for prefix in prefixes {
            self.backend.scan_prefix(prefix, &mut |k, v| {
                entries.push((k.to_vec(), v.to_vec()));
            })?;
        }
        self.decode(&entries)
    }

    fn expired(&self, wm_us: i64) -> Result<RecordBatch> {
        self.decode(&self.expired_entries(wm_us)?)
    }

    fn evict_expired(&mut self, wm_us: i64) -> Result<RecordBatch> {
        let entries = self.expired_entries(wm_us)?;
        let rows = self.decode(&entries)?;
        if !entries.is_empty() {
            let keys: Vec<Vec<u8>> = entries.into_iter().map(|(k, _)| k).collect();
            self.removed += self.backend.evict(wm_us, &keys)?;
        }
        Ok(rows)
    }

    fn rows(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut chunk = Vec::new();
        let mut failed = None;
        self.backend.scan_prefix(&[], &mut |k, v| {
            chunk.push((k.to_vec(), v.to_vec()));
            if chunk.len() == SCAN_BATCH_ROWS && failed.is_none() {
                match self.decode(&chunk) {
                    Ok(b) => out.push(b),
                    Err(e) => failed = Some(e),
                }
                chunk.clear();
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        if !chunk.is_empty() {
            out.push(self.decode(&chunk)?);
        }
        Ok(out)
    }

    fn apply(&mut self, rows: &RecordBatch, removed: &RecordBatch) -> Result<()> {
        let mut changes = Changes::default();
        if removed.num_rows() > 0 {
            changes.deletes = self
                .keys(removed)?
                .into_iter()
                .zip(self.codec.times(removed)?)
                .collect();
        }
        if rows.num_rows() > 0 {
            changes.puts = self
                .keys(rows)?
                .into_iter()
                .zip(self.codec.values(rows)?.iter())
                .zip(self.codec.times(rows)?)
                .map(|((k, v), t)| (k, v.to_vec(), t))
                .collect();
            self.updated += rows.num_rows() as u64;
        }
        if !changes.deletes.is_empty() || !changes.puts.is_empty() {
            self.removed += self.backend.write(changes)?;
        }
        Ok(())
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        let start = Instant::now();
        let memory_bytes = self.backend.commit(version)?;
        let m = StateMetrics {
            rows_total: self.backend.entries(),
            rows_updated: self.updated,
            rows_removed: self.removed,
            memory_bytes,
            commit_ms: start.elapsed().as_millis() as u64,
        };
        self.updated = 0;
        self.removed = 0;
        Ok(m)
    }

    fn maintain(&mut self) -> Result<()> {
        self.backend.maintain()
    }
}

/// A time as an index key prefix that sorts like the number.
pub fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}
