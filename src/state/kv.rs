//! State rows as byte keys and values ([`Codec`]) over a sorted, versioned key-value
//! [`Backend`] (RocksDB).
//!
//! Where a row's time is part of its key (a window's end, a grouped event time) and nobody
//! looks rows up by group, entries are ordered **by time first**: `e ++ time ++ key`. The
//! rows the watermark closes are then one contiguous range: read with one scan and removed
//! with one range delete, with no index to keep. Otherwise entries are ordered by key,
//! `d ++ key` (so a group is a prefix: sessions, join sides), and rows with a time are also
//! indexed by it, `t ++ time ++ key` → empty. Entries without a time are `d ++ key` in both
//! layouts. `m:count` holds the number of entries.
//!
//! Whether a write adds a key (the count, the time index) is known from the lookups the
//! operator made before it: [`StateStore::get`] remembers which keys it found and which it
//! did not, so an upsert of a key just read costs no second lookup.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use super::codec::{Codec, check_metadata};
use super::{StateLayout, StateMetrics, StateStore, StoreKind};
use crate::error::{Error, Result};

/// One change to a [`Backend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// Removes every key in `[from, to)`.
    DeleteRange(Vec<u8>, Vec<u8>),
}

/// A versioned, sorted key-value map: what a state store keeps its bytes in.
pub trait Backend: Send + Sync {
    /// Makes the map what it was when `version` was committed (0 = empty).
    fn load(&mut self, version: u64) -> Result<()>;
    /// The values of `keys`, which are sorted and distinct (in order).
    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>>;
    /// Calls `f` with every entry whose key is at or after `from` and before `to` (to the
    /// end without `to`), in key order.
    fn scan(&self, from: &[u8], to: Option<&[u8]>, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()>;
    /// Applies `ops`, in order. Visible at once; durable at [`Backend::commit`].
    fn write(&mut self, ops: Vec<Op>) -> Result<()>;
    /// Makes the map durable as `version`; the approximate memory it holds.
    fn commit(&mut self, version: u64) -> Result<u64>;
    /// Snapshots and clean-up after the commit log of the last committed version.
    fn maintain(&mut self) -> Result<()>;
}

/// Entries ordered by key (and time-indexed), or without a time.
const DATA: u8 = b'd';
/// Entries ordered by time first.
const BY_TIME: u8 = b'e';
/// The time index of entries ordered by key.
const TIME: u8 = b't';
const COUNT_KEY: &[u8] = b"m:count";

/// A time as a key prefix that sorts like the number.
fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

fn prefixed(tag: u8, time: Option<i64>, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 9);
    k.push(tag);
    if let Some(t) = time {
        k.extend_from_slice(&time_bytes(t));
    }
    k.extend_from_slice(key);
    k
}

/// The codec's key inside a stored data key.
fn codec_key(stored: &[u8]) -> &[u8] {
    match stored.first() {
        Some(&BY_TIME) => &stored[9..],
        _ => &stored[1..],
    }
}

/// The first key after every key that starts with `prefix` (`None`: the end).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The end of the range of times at or before `upto`, under `tag`.
fn time_range_end(tag: u8, upto: i64) -> Vec<u8> {
    match upto.checked_add(1) {
        Some(next) => prefixed(tag, Some(next), &[]),
        None => vec![tag + 1],
    }
}

/// The order in which [`StateStore::apply`] writes its operations.
fn op_order(op: &Op) -> (u8, &[u8]) {
    match op {
        Op::Delete(k) => (0, k),
        Op::Put(k, _) => (1, k),
        Op::DeleteRange(from, _) => (2, from),
    }
}

/// A [`StateStore`] over a [`Backend`]; see the module documentation.
pub struct KvState<B: Backend> {
    codec: Codec,
    backend: B,
    /// Entries are ordered by time first (see the module documentation).
    by_time: bool,
    /// Ordered by time: no entry is at or before this time (the last eviction's), so
    /// scans for the next one start after it instead of stepping over removed entries.
    evicted_upto: Option<i64>,
    count: u64,
    /// Stored keys looked up or written since the last eviction or load: whether each is
    /// present.
    known: Mutex<HashMap<Vec<u8>, bool>>,
    updated: u64,
    removed: u64,
}

impl<B: Backend> KvState<B> {
    /// Opens the store of an operator, checking the metadata of a store that exists.
    pub fn open(dir: &Path, layout: StateLayout, kind: StoreKind, backend: B) -> Result<Self> {
        check_metadata(dir, &layout, kind)?;
        let by_time = layout.orders_by_time();
        Ok(KvState {
            codec: Codec::new(layout)?,
            backend,
            by_time,
            evicted_upto: None,
            count: 0,
            known: Mutex::new(HashMap::new()),
            updated: 0,
            removed: 0,
        })
    }

    /// The data keys of `batch`'s rows, with each row's time.
    fn stored_keys(&self, batch: &RecordBatch) -> Result<Vec<(Vec<u8>, Option<i64>)>> {
        let keys = self.codec.keys(batch)?;
        let times = self.codec.times(batch)?;
        Ok(keys
            .iter()
            .zip(times)
            .map(|(k, t)| (self.data_key(k, t), t))
            .collect())
    }

    fn data_key(&self, key: &[u8], time: Option<i64>) -> Vec<u8> {
        match time {
            Some(t) if self.by_time => prefixed(BY_TIME, Some(t), key),
            _ => prefixed(DATA, None, key),
        }
    }

    fn known(&self) -> MutexGuard<'_, HashMap<Vec<u8>, bool>> {
        // The map is only a cache of lookups: one left by a panicking thread is still valid.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known of whether each of `keys` (sorted, distinct) is stored, completed by
    /// one batched lookup of the rest.
    fn presence(&self, keys: &[Vec<u8>]) -> Result<MutexGuard<'_, HashMap<Vec<u8>, bool>>> {
        let mut known = self.known();
        let unknown: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| !known.contains_key(*k))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            let found = self.backend.multi_get(&unknown)?;
            for (k, v) in unknown.into_iter().zip(found) {
                known.insert(k, v.is_some());
            }
        }
        Ok(known)
    }

    /// The entries whose time is at or before `wm_us`, as stored keys and values.
    fn expired_entries(&self, wm_us: i64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut entries = Vec::new();
        if self.by_time {
            let from = match self.evicted_upto {
                Some(t) if t >= wm_us => return Ok(entries),
                Some(t) => time_range_end(BY_TIME, t),
                None => vec![BY_TIME],
            };
            let to = time_range_end(BY_TIME, wm_us);
            self.backend.scan(&from, Some(&to), &mut |k, v| {
                entries.push((k.to_vec(), v.to_vec()));
            })?;
            return Ok(entries);
        }
        let mut keys = Vec::new();
        let to = time_range_end(TIME, wm_us);
        self.backend.scan(&[TIME], Some(&to), &mut |k, _| {
            if k.len() >= 9 {
                keys.push(prefixed(DATA, None, &k[9..]));
            }
        })?;
        keys.sort_unstable();
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
        self.codec.decode(
            entries
                .iter()
                .map(|(k, v)| (codec_key(k.as_slice()), v.as_slice())),
        )
    }
}

/// Rows per batch that [`StateStore::rows`] returns.
const SCAN_BATCH_ROWS: usize = 8192;

/// Every data entry of `backend` as the codec's keys and values, in key order.
pub fn dump<B: Backend>(backend: &B) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    backend.scan(&[DATA], Some(&[BY_TIME + 1]), &mut |k, v| {
        out.push((codec_key(k).to_vec(), v.to_vec()));
    })?;
    out.sort_unstable();
    Ok(out)
}

impl<B: Backend> StateStore for KvState<B> {
    fn schema(&self) -> SchemaRef {
        self.codec.layout.schema.clone()
    }

    fn load(&mut self, version: u64) -> Result<()> {
        self.updated = 0;
        self.removed = 0;
        self.known().clear();
        self.evicted_upto = None;
        self.backend.load(version)?;
        let count = self.backend.multi_get(&[COUNT_KEY.to_vec()])?;
        self.count = match count.into_iter().next().flatten() {
            Some(v) => u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| Error::Internal("corrupt state entry count".into()))?,
            ),
            None => 0,
        };
        Ok(())
    }

    fn get(&self, keys: &RecordBatch) -> Result<RecordBatch> {
        let mut ks: Vec<Vec<u8>> = self
            .stored_keys(keys)?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        ks.sort_unstable();
        ks.dedup();
        let values = self.backend.multi_get(&ks)?;
        let mut entries = Vec::with_capacity(ks.len());
        let mut known = self.known();
        for (k, v) in ks.into_iter().zip(values) {
            known.insert(k.clone(), v.is_some());
            if let Some(v) = v {
                entries.push((k, v));
            }
        }
        self.decode(&entries)
    }

    fn get_groups(&self, rows: &RecordBatch) -> Result<RecordBatch> {
        if self.by_time {
            return Err(Error::Internal(
                "state ordered by time looked up by group".into(),
            ));
        }
        let prefixes = self.codec.group_prefixes(rows)?;
        let mut prefixes: Vec<Vec<u8>> = prefixes.iter().map(|p| prefixed(DATA, None, p)).collect();
        prefixes.sort_unstable();
        prefixes.dedup();
        let mut entries = Vec::new();
        for prefix in prefixes {
            let end = prefix_end(&prefix);
            self.backend.scan(&prefix, end.as_deref(), &mut |k, v| {
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
        if self.by_time {
            self.evicted_upto = Some(self.evicted_upto.map_or(wm_us, |t| t.max(wm_us)));
        }
        if entries.is_empty() {
            return Ok(rows);
        }
        self.known().clear();
        let ops = if self.by_time {
            vec![Op::DeleteRange(
                vec![BY_TIME],
                time_range_end(BY_TIME, wm_us),
            )]
        } else {
            // Each data key, and the time index as one range tombstone instead of one per
            // key that later scans of the index would step over.
            let mut ops: Vec<Op> = entries.into_iter().map(|(k, _)| Op::Delete(k)).collect();
            ops.push(Op::DeleteRange(vec![TIME], time_range_end(TIME, wm_us)));
            ops
        };
        self.backend.write(ops)?;
        let removed = rows.num_rows() as u64;
        self.count -= removed.min(self.count);
        self.removed += removed;
        Ok(rows)
    }

    fn rows(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut chunk = Vec::new();
        let mut failed = None;
        self.backend
            .scan(&[DATA], Some(&[BY_TIME + 1]), &mut |k, v| {
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
        if rows.num_rows() == 0 && removed.num_rows() == 0 {
            return Ok(());
        }
        let deletes = if removed.num_rows() > 0 {
            self.stored_keys(removed)?
        } else {
            vec![]
        };
        let puts = if rows.num_rows() > 0 {
            self.stored_keys(rows)?
        } else {
            vec![]
        };
        let mut all: Vec<Vec<u8>> = deletes
            .iter()
            .chain(&puts)
            .map(|(k, _)| k.clone())
            .collect();
        all.sort_unstable();
        all.dedup();
        let indexed = !self.by_time;
        if let Some(upto) = self.evicted_upto
            && puts.iter().any(|(_, t)| t.is_some_and(|t| t <= upto))
        {
            self.evicted_upto = None;
        }
        let mut ops = Vec::with_capacity(deletes.len() + 2 * puts.len());
        let (mut added, mut gone) = (0, 0);
        let mut known = self.presence(&all)?;
        for (key, time) in deletes {
            let Some(p) = known.get_mut(&key).filter(|p| **p) else {
                continue;
            };
            *p = false;
            gone += 1;
            if let (true, Some(t)) = (indexed, time) {
                ops.push(Op::Delete(prefixed(TIME, Some(t), codec_key(&key))));
            }
            ops.push(Op::Delete(key));
        }
        let values = self.codec.values(rows)?;
        for ((key, time), value) in puts.into_iter().zip(values.iter()) {
            // `presence` put every key in the map, so this clones only in theory.
            let was_there = match known.get_mut(&key) {
                Some(p) => std::mem::replace(p, true),
                None => known.insert(key.clone(), true).unwrap_or(false),
            };
            if !was_there {
                added += 1;
                if let (true, Some(t)) = (indexed, time) {
                    ops.push(Op::Put(prefixed(TIME, Some(t), codec_key(&key)), vec![]));
                }
            }
            ops.push(Op::Put(key, value.to_vec()));
        }
        drop(known);
        self.count = self.count + added - gone;
        self.removed += gone;
        self.updated += rows.num_rows() as u64;
        // Removals before upserts, each in key order, so that the memtable's skip list
        // inserts them one after another instead of searching from its top for each. The
        // sort is stable: a key written twice keeps its last value.
        ops.sort_by(|a, b| op_order(a).cmp(&op_order(b)));
        self.backend.write(ops)
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        let start = Instant::now();
        self.backend.write(vec![Op::Put(
            COUNT_KEY.to_vec(),
            self.count.to_be_bytes().to_vec(),
        )])?;
        let memory_bytes = self.backend.commit(version)?;
        let m = StateMetrics {
            rows_total: self.count,
            rows_updated: self.updated,
            rows_removed: self.removed,
            memory_bytes,
            commit_ms: start.elapsed().as_millis() as u64,
        };
        self.updated = 0;
        self.removed = 0;
        self.known().clear();
        Ok(m)
    }

    fn maintain(&mut self) -> Result<()> {
        self.backend.maintain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_prefixes_sort_like_times_and_prefix_ends_bound_prefixes() {
        let times = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for w in times.windows(2) {
            assert!(time_bytes(w[0]) < time_bytes(w[1]), "{w:?}");
        }
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(time_range_end(BY_TIME, i64::MAX), vec![BY_TIME + 1]);
        let key = prefixed(BY_TIME, Some(3), b"k");
        assert_eq!(codec_key(&key), b"k");
        assert!(key < time_range_end(BY_TIME, 3) && key >= time_range_end(BY_TIME, 2));
    }
}
