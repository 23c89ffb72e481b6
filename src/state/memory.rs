//! The default state store: a hash table over keys packed into per-time-bucket arenas,
//! durable through per-version deltas and periodic snapshots.
//!
//! In memory:
//! - every entry is a record `slot (u32) ++ key length (u32) ++ value length (u32) ++ key ++
//!   value` appended to the arena of its **time bucket** (the entry's time, from the
//!   layout's time column, divided into buckets of 2^26 µs ≈ 67 s; entries without a time
//!   share one bucket). No allocation per key.
//! - a slot per entry (16 bytes: bucket, offset, time), and a `hashbrown::HashTable` of
//!   slot ids keyed by the key bytes. Lookups and upserts take a batch's keys encoded into
//!   one buffer ([`Codec::keys`]); results are decoded into Arrow arrays from borrowed
//!   slices.
//! - eviction by the watermark is a range operation: every bucket that ends at or before
//!   the watermark is decoded, its keys leave the table, and its arena is dropped whole;
//!   only the bucket the watermark falls in is checked entry by entry.
//! - an update that keeps the value's length overwrites it in place; other updates and
//!   removals leave garbage, and an arena is compacted when more than half of it is garbage.
//! - session windows look stored sessions up by group ([`StateStore::get_groups`]) through
//!   a second table, keyed by the group's bytes, built on first use.
//!
//! On disk, under `<checkpoint>/state/<operator>/` (unchanged from format version 2):
//!
//! ```text
//! _metadata       {"formatVersion":2,"store":"memory","partitions":4,...}  (see codec.rs)
//! <v>.delta       Arrow IPC, LZ4-compressed (key binary, value binary, time int64): what
//!                 version v changed. First the evictions by the watermark, each one
//!                 record (empty key, null value, time = the watermark: every entry at or
//!                 before it goes); then the removed keys (null value, null time); then
//!                 the upserts.
//! <v>.snapshot    the same columns: every entry at version v, in batches of 64 k entries
//! ```
//!
//! (Files written before evictions were recorded as ranges, and before compression, have
//! only key removals and upserts; they read the same way.)
//!
//! Loading version `v` reads the newest snapshot at or before `v` and applies the deltas
//! after it, in order. Files of versions after `v` (left by a batch that crashed before its
//! commit log) are ignored and overwritten when that version is committed again. Snapshots
//! are written by [`StateStore::maintain`], every [`super::SNAPSHOT_INTERVAL`] versions,
//! through a temporary file and a rename, and old versions are removed only after the
//! snapshot is durable. A state of at most [`BACKGROUND_SNAPSHOT_MAX_BYTES`] is encoded into
//! memory and written on its own thread while the next batch runs (off the batch's path);
//! a larger one is streamed to its file in place.

use std::collections::BTreeMap;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, Int64Builder, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use hashbrown::DefaultHashBuilder;
use hashbrown::HashTable;

use super::codec::{Codec, Encoded, check_metadata, ipc_file_writer};
use super::{StateLayout, StateMetrics, StateStore, StoreKind, snapshot_interval};
use crate::config::MIN_BATCHES_TO_RETAIN;
use crate::error::{Error, Result};
use crate::fsutil::{numbered, write_atomic, write_atomic_then, write_atomic_with};

/// Times are grouped into buckets of `2^BUCKET_SHIFT` microseconds (about 67 s).
const BUCKET_SHIFT: u32 = 26;
/// Entries per batch in snapshot files and in [`StateStore::rows`].
const CHUNK_ROWS: usize = 1 << 16;
const SCAN_BATCH_ROWS: usize = 8192;
/// Bytes of a record before its key.
const HEADER: usize = 12;
/// Slot flags, in the high bits of [`Slot::bucket`].
const LIVE: u32 = 1 << 31;
const DIRTY: u32 = 1 << 30;
const BUCKET_MASK: u32 = DIRTY - 1;
/// A snapshot of a state at most this large (by [`MemoryState::memory_bytes`]) is encoded
/// into memory and written on its own thread, off the batch's path; a larger one is
/// streamed to its file in [`StateStore::maintain`], as a copy would double its memory.
pub(super) const BACKGROUND_SNAPSHOT_MAX_BYTES: u64 = if cfg!(test) { 256 << 10 } else { 64 << 20 };
/// Arenas smaller than this are never compacted.
const COMPACT_MIN_BYTES: usize = if cfg!(test) { 4096 } else { 1 << 20 };

#[derive(Clone, Copy, Default)]
struct Slot {
    /// Flags, then the bucket id.
    bucket: u32,
    /// The record's offset in its bucket's arena.
    off: u32,
    time: i64,
}

impl Slot {
    fn live(&self) -> bool {
        self.bucket & LIVE != 0
    }
    fn bucket(&self) -> usize {
        (self.bucket & BUCKET_MASK) as usize
    }
}

#[derive(Default)]
struct Bucket {
    /// Records, see the module documentation.
    arena: Vec<u8>,
    /// Bytes of the records still live.
    live_bytes: usize,
    /// Its key in `by_time`, or `None` for the bucket of entries without a time.
    coarse: Option<i64>,
}

fn read_u32(arena: &[u8], at: usize) -> usize {
    u32::from_le_bytes(arena[at..at + 4].try_into().unwrap_or_default()) as usize
}

/// The entries of the store, apart from the parts that are not about where bytes are.
#[derive(Default)]
struct Entries {
    slots: Vec<Slot>,
    buckets: Vec<Option<Bucket>>,
}

impl Entries {
    fn record(&self, id: u32) -> (&[u8], &[u8]) {
        let s = self.slots[id as usize];
        let arena = &self.buckets[s.bucket()]
            .as_ref()
            .map_or(&[][..], |b| &b.arena);
        let off = s.off as usize;
        let klen = read_u32(arena, off + 4);
        let vlen = read_u32(arena, off + 8);
        let k = off + HEADER;
        (&arena[k..k + klen], &arena[k + klen..k + klen + vlen])
    }

    fn key(&self, id: u32) -> &[u8] {
        self.record(id).0
    }

    /// Live slots whose record is in bucket `b` (each once), in arena order.
    fn live_in(&self, b: usize) -> Vec<u32> {
        let Some(bucket) = &self.buckets[b] else {
            return vec![];
        };
        let arena = &bucket.arena;
        let mut out = Vec::new();
        let mut off = 0;
        while off + HEADER <= arena.len() {
            let id = read_u32(arena, off) as u32;
            let len = HEADER + read_u32(arena, off + 4) + read_u32(arena, off + 8);
            if let Some(s) = self.slots.get(id as usize)
                && s.live()
                && s.bucket() == b
                && s.off as usize == off
            {
                out.push(id);
            }
            off += len;
        }
        out
    }
}

/// See the module documentation.
pub struct MemoryState {
    dir: PathBuf,
    codec: Codec,
    hasher: DefaultHashBuilder,
    table: HashTable<u32>,
    entries: Entries,
    free_slots: Vec<u32>,
    free_buckets: Vec<u32>,
    by_time: BTreeMap<i64, u32>,
    untimed: Option<u32>,
    /// Slots of the groups' sessions, keyed by `partition ++ group` bytes; built on the
    /// first [`StateStore::get_groups`].
    groups: Option<HashTable<u32>>,
    /// Bytes of a key after its group (the window columns), when they are fixed.
    window_len: Option<usize>,
    /// Slots changed since the last commit (each once: [`DIRTY`]).
    dirty: Vec<u32>,
    /// Keys removed since the last commit.
    removed_keys: Encoded,
    /// Watermarks evicted up to since the last commit.
    evictions: Vec<i64>,
    updated: u64,
    removed: u64,
    version: u64,
    /// The snapshot being written on its own thread, then the removal of the versions it
    /// makes unneeded ([`StateStore::maintain`]); joined before the next one, a load, or
    /// the store's end.
    snapshotting: Option<std::thread::JoinHandle<Result<()>>>,
}

fn file_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Binary, false),
        Field::new("value", DataType::Binary, true),
        Field::new("time", DataType::Int64, true),
    ]))
}

/// Entries `(key, value or None for a removal, time)` for a delta or snapshot file.
#[derive(Default)]
struct FileBatch {
    keys: BinaryBuilder,
    values: BinaryBuilder,
    times: Int64Builder,
    rows: usize,
}

impl FileBatch {
    fn push(&mut self, key: &[u8], value: Option<&[u8]>, time: Option<i64>) {
        self.keys.append_value(key);
        self.values.append_option(value);
        self.times.append_option(time);
        self.rows += 1;
    }

    fn finish(&mut self) -> Result<RecordBatch> {
        self.rows = 0;
        Ok(RecordBatch::try_new(
            file_schema(),
            vec![
                Arc::new(self.keys.finish()) as ArrayRef,
                Arc::new(self.values.finish()),
                Arc::new(self.times.finish()),
            ],
        )?)
    }
}

/// A writer of delta and snapshot files.
fn file_writer<W: Write>(out: W) -> Result<FileWriter<W>> {
    ipc_file_writer(out, &file_schema())
}

/// A delta record that evicts every entry at or before its time.
fn is_eviction(key: &[u8], value: Option<&[u8]>, time: Option<i64>) -> Option<i64> {
    (key.is_empty() && value.is_none())
        .then_some(time)
        .flatten()
}

/// What [`read_records`] calls for each record: key, value (`None` removes), time.
type RecordFn<'f> = dyn FnMut(&[u8], Option<&[u8]>, Option<i64>) + 'f;

/// Calls `f` with every record of a delta or snapshot file, in order.
fn read_records(file: &Path, f: &mut RecordFn<'_>) -> Result<()> {
    let fh = File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
    let corrupt = || Error::Internal(format!("corrupt state file {}", file.display()));
    for batch in FileReader::try_new(fh, None)? {
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
            f(
                keys.value(i),
                (!values.is_null(i)).then(|| values.value(i)),
                (!times.is_null(i)).then(|| times.value(i)),
            );
        }
    }
    Ok(())
}

/// The files that make version `version` in `dir`, in the order to apply them.
fn version_files(dir: &Path, version: u64) -> Result<Vec<PathBuf>> {
    if version == 0 {
        return Ok(vec![]);
    }
    let snapshot = numbered(dir, ".snapshot")?
        .into_iter()
        .filter(|&v| v <= version)
        .max();
    let mut files = Vec::new();
    let from = match snapshot {
        Some(s) => {
            files.push(dir.join(format!("{s}.snapshot")));
            s + 1
        }
        None => 1,
    };
    for v in from..=version {
        let file = dir.join(format!("{v}.delta"));
        if !file.exists() {
            return Err(Error::Internal(format!(
                "state version {v} is missing ({})",
                file.display()
            )));
        }
        files.push(file);
    }
    Ok(files)
}

/// Every entry of the memory store in `dir` at `version`, in key order (for [`super::dump`]).
pub fn dump(dir: &Path, version: u64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut map: BTreeMap<Vec<u8>, (Vec<u8>, Option<i64>)> = BTreeMap::new();
    for file in version_files(dir, version)? {
        read_records(&file, &mut |k, v, t| {
            if let Some(wm) = is_eviction(k, v, t) {
                map.retain(|_, (_, t)| t.is_none_or(|t| t > wm));
                return;
            }
            match v {
                Some(v) => {
                    map.insert(k.to_vec(), (v.to_vec(), t));
                }
                None => {
                    map.remove(k);
                }
            }
        })?;
    }
    Ok(map.into_iter().map(|(k, (v, _))| (k, v)).collect())
}

impl MemoryState {
    /// Opens the store of an operator in `dir`, checking the metadata of one that exists.
    pub fn open(dir: &Path, layout: StateLayout) -> Result<MemoryState> {
        check_metadata(dir, &layout, StoreKind::Memory)?;
        let window_len = (0..layout.window_columns)
            .map(|i| {
                layout
                    .schema
                    .field(i)
                    .data_type()
                    .primitive_width()
                    .map(|w| w + 1)
            })
            .sum::<Option<usize>>();
        Ok(MemoryState {
            dir: dir.to_path_buf(),
            codec: Codec::new(layout)?,
            hasher: DefaultHashBuilder::default(),
            table: HashTable::new(),
            entries: Entries::default(),
            free_slots: Vec::new(),
            free_buckets: Vec::new(),
            by_time: BTreeMap::new(),
            untimed: None,
            groups: None,
            window_len,
            dirty: Vec::new(),
            removed_keys: Encoded::default(),
            evictions: Vec::new(),
            updated: 0,
            removed: 0,
            version: 0,
            snapshotting: None,
        })
    }

    /// Waits for the snapshot being written on its own thread, if any, with its outcome.
    fn settle(&mut self) -> Result<()> {
        match self.snapshotting.take() {
            Some(h) => h
                .join()
                .map_err(|_| Error::Internal("the state snapshot thread panicked".into()))?,
            None => Ok(()),
        }
    }

    fn reset(&mut self) {
        self.table = HashTable::new();
        self.entries = Entries::default();
        self.free_slots.clear();
        self.free_buckets.clear();
        self.by_time.clear();
        self.untimed = None;
        self.groups = None;
        self.dirty.clear();
        self.removed_keys = Encoded::default();
        self.evictions.clear();
        self.updated = 0;
        self.removed = 0;
    }

    fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        self.table
            .find(hash, |&id| self.entries.key(id) == key)
            .copied()
    }

    /// The group prefix (`partition ++ group`) of a stored key.
    fn group_of(window_len: Option<usize>, key: &[u8]) -> &[u8] {
        &key[..key.len() - window_len.unwrap_or(0)]
    }

    fn mark_dirty(&mut self, id: u32) {
        let s = &mut self.entries.slots[id as usize];
        if s.bucket & DIRTY == 0 {
            s.bucket |= DIRTY;
            self.dirty.push(id);
        }
    }

    /// The bucket for entries at `time`, created if needed.
    fn bucket_for(&mut self, time: Option<i64>) -> u32 {
        let coarse = time.map(|t| t >> BUCKET_SHIFT);
        let existing = match coarse {
            Some(c) => self.by_time.get(&c).copied(),
            None => self.untimed,
        };
        if let Some(b) = existing {
            return b;
        }
        let bucket = Bucket {
            coarse,
            ..Bucket::default()
        };
        let b = match self.free_buckets.pop() {
            Some(b) => {
                self.entries.buckets[b as usize] = Some(bucket);
                b
            }
            None => {
                self.entries.buckets.push(Some(bucket));
                (self.entries.buckets.len() - 1) as u32
            }
        };
        match coarse {
            Some(c) => {
                self.by_time.insert(c, b);
            }
            None => self.untimed = Some(b),
        }
        b
    }

    /// Appends the record of slot `id` to bucket `b`; its offset.
    fn append(&mut self, b: u32, id: u32, key: &[u8], value: &[u8]) -> Result<u32> {
        self.compact_if_wasteful(b as usize);
        let bucket = self.entries.buckets[b as usize]
            .as_mut()
            .ok_or_else(|| Error::Internal("state bucket missing".into()))?;
        let off = bucket.arena.len();
        let len = HEADER + key.len() + value.len();
        if off + len > u32::MAX as usize {
            return Err(Error::Unsupported {
                message: "the memory state store holds at most 4 GiB of keys and values per \
                          time bucket"
                    .into(),
                hint: Some("Use state_store = 'rocksdb' for state this large.".into()),
            });
        }
        bucket.arena.extend_from_slice(&id.to_le_bytes());
        bucket
            .arena
            .extend_from_slice(&(key.len() as u32).to_le_bytes());
        bucket
            .arena
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        bucket.arena.extend_from_slice(key);
        bucket.arena.extend_from_slice(value);
        bucket.live_bytes += len;
        Ok(off as u32)
    }

    /// Rewrites bucket `b`'s arena with its live records only, when most of it is garbage.
    fn compact_if_wasteful(&mut self, b: usize) {
        let Some(bucket) = &self.entries.buckets[b] else {
            return;
        };
        if bucket.arena.len() < COMPACT_MIN_BYTES || bucket.live_bytes * 2 > bucket.arena.len() {
            return;
        }
        let live = self.entries.live_in(b);
        let mut arena = Vec::with_capacity(bucket.live_bytes + bucket.live_bytes / 4);
        for id in live {
            let s = &mut self.entries.slots[id as usize];
            let old = &self.entries.buckets[b]
                .as_ref()
                .map_or(&[][..], |b| &b.arena);
            let off = s.off as usize;
            let len = HEADER + read_u32(old, off + 4) + read_u32(old, off + 8);
            s.off = arena.len() as u32;
            arena.extend_from_slice(&old[off..off + len]);
        }
        if let Some(bucket) = &mut self.entries.buckets[b] {
            bucket.live_bytes = arena.len();
            bucket.arena = arena;
        }
    }

    /// Writes slot `id`'s record into the bucket of `time` and points the slot at it.
    fn place(&mut self, id: u32, key: &[u8], value: &[u8], time: Option<i64>) -> Result<()> {
        let b = self.bucket_for(time);
        let off = self.append(b, id, key, value)?;
        let slot = &mut self.entries.slots[id as usize];
        slot.bucket = b | LIVE | (slot.bucket & DIRTY);
        slot.off = off;
        slot.time = time.unwrap_or(i64::MIN);
        Ok(())
    }

    fn record_len(&self, id: u32) -> usize {
        let (k, v) = self.entries.record(id);
        HEADER + k.len() + v.len()
    }

    /// Sets `key` to `value`; `track` records the change for the next commit.
    fn upsert(&mut self, key: &[u8], value: &[u8], time: Option<i64>, track: bool) -> Result<()> {
        let hash = self.hasher.hash_one(key);
        let time_value = time.unwrap_or(i64::MIN);
        if let Some(id) = self.find(hash, key) {
            let s = self.entries.slots[id as usize];
            let same_bucket = s.time == time_value;
            let (_, old_value) = self.entries.record(id);
            if same_bucket && old_value.len() == value.len() {
                let off = s.off as usize + HEADER + key.len();
                if let Some(bucket) = &mut self.entries.buckets[s.bucket()] {
                    bucket.arena[off..off + value.len()].copy_from_slice(value);
                }
            } else {
                let len = self.record_len(id);
                if let Some(bucket) = &mut self.entries.buckets[s.bucket()] {
                    bucket.live_bytes -= len;
                }
                self.place(id, key, value, time)?;
            }
            if track {
                self.mark_dirty(id);
            }
            return Ok(());
        }
        let id = match self.free_slots.pop() {
            Some(id) => id,
            None => {
                self.entries.slots.push(Slot::default());
                (self.entries.slots.len() - 1) as u32
            }
        };
        self.place(id, key, value, time)?;
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.table
            .insert_unique(hash, id, |&x| hasher.hash_one(entries.key(x)));
        if let Some(groups) = &mut self.groups {
            let g = Self::group_of(self.window_len, key);
            let window_len = self.window_len;
            groups.insert_unique(hasher.hash_one(g), id, |&x| {
                hasher.hash_one(Self::group_of(window_len, entries.key(x)))
            });
        }
        if track {
            self.mark_dirty(id);
        }
        Ok(())
    }

    /// Removes the entry of slot `id`, recording its key when `track`.
    fn remove_slot(&mut self, id: u32, track: bool) {
        let key = self.entries.key(id);
        let hash = self.hasher.hash_one(key);
        if track {
            self.removed_keys.push(&[key]);
        }
        if let Some(groups) = &mut self.groups {
            let g = Self::group_of(self.window_len, key);
            if let Ok(e) = groups.find_entry(self.hasher.hash_one(g), |&x| x == id) {
                e.remove();
            }
        }
        if let Ok(e) = self.table.find_entry(hash, |&x| x == id) {
            e.remove();
        }
        let len = self.record_len(id);
        let s = &mut self.entries.slots[id as usize];
        let b = s.bucket();
        s.bucket &= DIRTY;
        if let Some(bucket) = &mut self.entries.buckets[b] {
            bucket.live_bytes -= len;
        }
        self.free_slots.push(id);
    }

    /// Removes `key` if it is there; whether it was.
    fn remove(&mut self, key: &[u8], track: bool) -> bool {
        match self.find(self.hasher.hash_one(key), key) {
            Some(id) => {
                self.remove_slot(id, track);
                true
            }
            None => false,
        }
    }

    /// Drops bucket `b`, whose entries have all been removed.
    fn drop_bucket(&mut self, b: u32) {
        if let Some(bucket) = self.entries.buckets[b as usize].take() {
            match bucket.coarse {
                Some(c) => {
                    self.by_time.remove(&c);
                }
                None => self.untimed = None,
            }
            self.free_buckets.push(b);
        }
    }

    fn decode_slots(&self, ids: &[u32]) -> Result<RecordBatch> {
        self.codec
            .decode(ids.iter().map(|&id| self.entries.record(id)))
    }

    /// Buckets whose entries may be at or before `wm_us`, each with whether all of them are.
    fn buckets_upto(&self, wm_us: i64) -> Vec<(u32, bool)> {
        let last = wm_us >> BUCKET_SHIFT;
        self.by_time
            .range(..=last)
            .map(|(&c, &b)| {
                let end = c.saturating_add(1).saturating_mul(1 << BUCKET_SHIFT) - 1;
                (b, end <= wm_us)
            })
            .collect()
    }

    /// Live slots whose time is at or before `wm_us`; with the buckets they empty.
    fn expired_slots(&self, wm_us: i64) -> (Vec<u32>, Vec<u32>) {
        let mut ids = Vec::new();
        let mut emptied = Vec::new();
        for (b, whole) in self.buckets_upto(wm_us) {
            let live = self.entries.live_in(b as usize);
            if whole {
                ids.extend(live);
                emptied.push(b);
            } else {
                ids.extend(
                    live.into_iter()
                        .filter(|&id| self.entries.slots[id as usize].time <= wm_us),
                );
            }
        }
        (ids, emptied)
    }

    /// Removes every entry at or before `wm_us`: whole buckets, and the entries of the
    /// bucket it falls in. Recorded as one range by the caller, not key by key.
    fn evict(&mut self, wm_us: i64) {
        let (ids, emptied) = self.expired_slots(wm_us);
        self.remove_expired(&ids, emptied);
    }

    /// Removes the slots and buckets [`MemoryState::expired_slots`] found.
    fn remove_expired(&mut self, ids: &[u32], emptied: Vec<u32>) {
        for &id in ids {
            self.remove_slot(id, false);
        }
        for b in emptied {
            self.drop_bucket(b);
        }
    }

    fn build_group_index(&mut self) {
        let mut groups = HashTable::with_capacity(self.table.len());
        let (entries, hasher, window_len) = (&self.entries, &self.hasher, self.window_len);
        let group_hash = |x: u32| hasher.hash_one(Self::group_of(window_len, entries.key(x)));
        for &id in self.table.iter() {
            groups.insert_unique(group_hash(id), id, |&x| group_hash(x));
        }
        self.groups = Some(groups);
    }

    fn memory_bytes(&self) -> u64 {
        let arenas: usize = self
            .entries
            .buckets
            .iter()
            .flatten()
            .map(|b| b.arena.capacity())
            .sum();
        (arenas
            + self.entries.slots.capacity() * size_of::<Slot>()
            + self.table.allocation_size()
            + self.groups.as_ref().map_or(0, |g| g.allocation_size())
            + self.free_slots.capacity() * 4
            + self.dirty.capacity() * 4
            + self.removed_keys.bytes()) as u64
    }

    /// Writes a snapshot of every entry to `path`.
    fn write_snapshot(&self, out: &mut dyn Write) -> Result<()> {
        let mut w = file_writer(out)?;
        let mut batch = FileBatch::default();
        for &id in self.table.iter() {
            let (k, v) = self.entries.record(id);
            let s = self.entries.slots[id as usize];
            let time = (Some(s.bucket() as u32) != self.untimed).then_some(s.time);
            batch.push(k, Some(v), time);
            if batch.rows == CHUNK_ROWS {
                w.write(&batch.finish()?)?;
            }
        }
        if batch.rows > 0 || self.table.is_empty() {
            w.write(&batch.finish()?)?;
        }
        w.finish()?;
        Ok(())
    }
}

impl StateStore for MemoryState {
    fn schema(&self) -> SchemaRef {
        self.codec.layout.schema.clone()
    }

    fn load(&mut self, version: u64) -> Result<()> {
        // Files are listed only once the snapshot under way is in place and the removal
        // after it done. Its failure loses nothing: the deltas are removed only after it.
        if let Err(e) = self.settle() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "state snapshot failed");
        }
        self.reset();
        self.version = version;
        let mut failed = None;
        for file in version_files(&self.dir, version)? {
            read_records(&file, &mut |k, v, t| {
                if let Some(wm) = is_eviction(k, v, t) {
                    self.evict(wm);
                    return;
                }
                let r = match v {
                    Some(v) => self.upsert(k, v, t, false),
                    None => {
                        self.remove(k, false);
                        Ok(())
                    }
                };
                if let Err(e) = r {
                    failed.get_or_insert(e);
                }
            })?;
        }
        for s in &mut self.entries.slots {
            s.bucket &= !DIRTY;
        }
        failed.map_or(Ok(()), Err)
    }

    fn get(&self, keys: &RecordBatch) -> Result<RecordBatch> {
        let encoded = self.codec.keys(keys)?;
        let mut ids: Vec<u32> = encoded
            .iter()
            .filter_map(|k| self.find(self.hasher.hash_one(k), k))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        self.decode_slots(&ids)
    }

    fn get_groups(&self, rows: &RecordBatch) -> Result<RecordBatch> {
        let prefixes = self.codec.group_prefixes(rows)?;
        let mut ids = Vec::new();
        match &self.groups {
            Some(groups) => {
                for g in prefixes.iter() {
                    ids.extend(
                        groups.iter_hash(self.hasher.hash_one(g)).filter(|&&id| {
                            Self::group_of(self.window_len, self.entries.key(id)) == g
                        }),
                    );
                }
            }
            // Before the group index exists (`apply` builds it): a scan.
            None => {
                let wanted: std::collections::HashSet<&[u8]> = prefixes.iter().collect();
                ids.extend(self.table.iter().filter(|&&id| {
                    wanted.contains(Self::group_of(self.window_len, self.entries.key(id)))
                }));
            }
        }
        ids.sort_unstable();
        ids.dedup();
        self.decode_slots(&ids)
    }

    fn expired(&self, wm_us: i64) -> Result<RecordBatch> {
        let (ids, _) = self.expired_slots(wm_us);
        self.decode_slots(&ids)
    }

    fn evict_expired(&mut self, wm_us: i64) -> Result<RecordBatch> {
        let (ids, emptied) = self.expired_slots(wm_us);
        let rows = self.decode_slots(&ids)?;
        self.remove_expired(&ids, emptied);
        self.evictions.push(wm_us);
        self.removed += ids.len() as u64;
        Ok(rows)
    }

    fn rows(&self) -> Result<Vec<RecordBatch>> {
        let ids: Vec<u32> = self.table.iter().copied().collect();
        ids.chunks(SCAN_BATCH_ROWS)
            .map(|c| self.decode_slots(c))
            .collect()
    }

    fn apply(&mut self, rows: &RecordBatch, removed: &RecordBatch) -> Result<()> {
        if removed.num_rows() > 0 {
            if self.groups.is_none() && self.codec.layout.window_columns > 0 {
                // Removals of whole sessions come with lookups by group.
                self.build_group_index();
            }
            for k in self.codec.keys(removed)?.iter() {
                if self.remove(k, true) {
                    self.removed += 1;
                }
            }
        }
        if rows.num_rows() > 0 {
            let keys = self.codec.keys(rows)?;
            let values = self.codec.values(rows)?;
            let times = self.codec.times(rows)?;
            self.table.reserve(rows.num_rows(), |&x| {
                self.hasher.hash_one(self.entries.key(x))
            });
            for (i, time) in times.into_iter().enumerate() {
                self.upsert(keys.get(i), values.get(i), time, true)?;
            }
            self.updated += rows.num_rows() as u64;
        }
        Ok(())
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        let start = Instant::now();
        let mut batch = FileBatch::default();
        for &wm in &self.evictions {
            batch.push(&[], None, Some(wm));
        }
        for k in self.removed_keys.iter() {
            batch.push(k, None, None);
        }
        for &id in &self.dirty {
            let s = &mut self.entries.slots[id as usize];
            s.bucket &= !DIRTY;
            let s = *s;
            if s.live() {
                let (k, v) = self.entries.record(id);
                let time = (Some(s.bucket() as u32) != self.untimed).then_some(s.time);
                batch.push(k, Some(v), time);
            }
        }
        let mut buf = Vec::new();
        {
            let mut w = file_writer(&mut buf)?;
            w.write(&batch.finish()?)?;
            w.finish()?;
        }
        write_atomic(&self.dir.join(format!("{version}.delta")), &buf)?;
        self.dirty.clear();
        self.removed_keys = Encoded::default();
        self.evictions.clear();
        self.version = version;
        let m = StateMetrics {
            rows_total: self.table.len() as u64,
            rows_updated: self.updated,
            rows_removed: self.removed,
            memory_bytes: self.memory_bytes(),
            commit_ms: start.elapsed().as_millis() as u64,
        };
        self.updated = 0;
        self.removed = 0;
        Ok(m)
    }

    fn maintain(&mut self) -> Result<()> {
        let version = self.version;
        let interval = snapshot_interval();
        if version == 0 || !version.is_multiple_of(interval) {
            return Ok(());
        }
        // One snapshot at a time; the previous one's failure fails this batch, as it would
        // have failed its own had it been written in place.
        self.settle()?;
        let path = self.dir.join(format!("{version}.snapshot"));
        // Keep what loading any of the last MIN_BATCHES_TO_RETAIN versions needs.
        let keep_from = version.saturating_sub(MIN_BATCHES_TO_RETAIN + interval);
        let dir = self.dir.clone();
        if self.memory_bytes() > BACKGROUND_SNAPSHOT_MAX_BYTES {
            write_atomic_with(
                &path,
                |out| self.write_snapshot(out),
                || crate::testing::crash_point("mid_state_snapshot"),
            )?;
            remove_versions_before(&dir, keep_from);
            return Ok(());
        }
        // Encoded now (the next batch changes the table), written while the next batch
        // runs. Loading never needs it: the deltas it covers stay until it is durable.
        let mut bytes = Vec::new();
        self.write_snapshot(&mut bytes)?;
        let thread = std::thread::Builder::new()
            .name("state-snapshot".into())
            .spawn(move || {
                write_atomic_then(&path, &bytes, || {
                    crate::testing::crash_point("mid_state_snapshot")
                })?;
                remove_versions_before(&dir, keep_from);
                Ok(())
            })
            .map_err(|e| Error::io("starting the state snapshot thread", e))?;
        self.snapshotting = Some(thread);
        Ok(())
    }
}

impl Drop for MemoryState {
    /// Waits for the snapshot under way, so that nothing writes into the store's folder
    /// after the store is gone (a dropped query's folder is removed).
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "state snapshot failed");
        }
    }
}

/// Removes the deltas and snapshots of versions before `keep_from` (best effort: a file
/// left is only space).
fn remove_versions_before(dir: &Path, keep_from: u64) {
    for ext in [".delta", ".snapshot"] {
        for v in numbered(dir, ext)
            .unwrap_or_default()
            .into_iter()
            .filter(|&v| v < keep_from)
        {
            let _ = std::fs::remove_file(dir.join(format!("{v}{ext}")));
        }
    }
}
