//! The RocksDB state backend (cargo feature `rocksdb`, `state_store = 'rocksdb'`).
//!
//! Layout under `<checkpoint>/state/<operator>/rocksdb/`:
//!
//! ```text
//! work/     the live database a run reads and writes (no WAL: it is rebuilt from a
//!           version on every load, so nothing in it needs to survive a crash)
//! <v>/      a RocksDB checkpoint of version v: hard links to the immutable SST files plus
//!           copies of the small metadata files, created under .tmp-<v>-<uuid>/ and renamed
//! ```
//!
//! Keys: `d ++ key` → value, `t ++ time ++ key` → empty (the time index), and `m:count`,
//! the number of entries. Loading version `v` rebuilds `work/` from `<v>/` (SST files are
//! hard-linked, not copied), so a load costs the metadata files, not the state's size.
//! Memory is bounded by the block cache and the memtables, whatever the number of keys.
//! A batch reads with one sorted, batched `MultiGet` and writes through `WriteBatch`es;
//! the time index is written when a key is new, and removed with it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DB,
    DBCompressionType, DEFAULT_COLUMN_FAMILY_NAME, Direction, IteratorMode, Options, ReadOptions,
    WriteBatch, WriteOptions,
};

use super::kv::{Backend, Changes, time_bytes};
use crate::config::MIN_BATCHES_TO_RETAIN;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, numbered, sync_dir};

const DATA: u8 = b'd';
const TIME: u8 = b't';
const COUNT_KEY: &[u8] = b"m:count";
/// Block cache per store.
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Memtable size; two at most.
const WRITE_BUFFER_BYTES: usize = 32 << 20;
/// Changes go to the database in write batches of about this size.
const WRITE_BATCH_BYTES: usize = 4 << 20;

/// See the module documentation.
pub struct RocksBackend {
    root: PathBuf,
    db: Option<DB>,
    opts: Options,
    count: u64,
    /// The version `work/` holds, if it holds one unchanged since.
    clean_version: Option<u64>,
    /// The last version committed or loaded.
    version: u64,
}

fn rocks_err(what: &str, e: rocksdb::Error) -> Error {
    Error::Io {
        context: format!("rocksdb: {what}"),
        source: std::io::Error::other(e.to_string()),
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

impl RocksBackend {
    pub fn new(dir: &Path) -> Result<RocksBackend> {
        let root = dir.join("rocksdb");
        create_dir_all(&root)?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(DBCompressionType::Lz4);
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
        opts.set_max_write_buffer_number(2);
        opts.set_max_open_files(256);
        // Flushes and compactions in the background, so that writes rarely stall.
        opts.increase_parallelism(2);
        opts.set_max_background_jobs(4);
        opts.set_bytes_per_sync(1 << 20);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(BLOCK_CACHE_BYTES));
        // Index and filter blocks live in the block cache, partitioned into small blocks:
        // a whole-file filter of a large SST is bigger than a cache shard, would never
        // stay cached, and would be read again for every lookup. Only the top level of
        // each partitioned index and filter is pinned.
        table.set_cache_index_and_filter_blocks(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_bloom_filter(10.0, false);
        opts.set_block_based_table_factory(&table);
        Ok(RocksBackend {
            root,
            db: None,
            opts,
            count: 0,
            clean_version: None,
            version: 0,
        })
    }

    fn db(&self) -> Result<&DB> {
        self.db
            .as_ref()
            .ok_or_else(|| Error::Internal("rocksdb state used before load".into()))
    }

    fn work(&self) -> PathBuf {
        self.root.join("work")
    }

    /// The handle batched lookups need.
    fn default_cf(db: &DB) -> Result<&ColumnFamily> {
        db.cf_handle(DEFAULT_COLUMN_FAMILY_NAME)
            .ok_or_else(|| Error::Internal("rocksdb state has no default column family".into()))
    }

    fn write_opts() -> WriteOptions {
        let mut w = WriteOptions::default();
        w.disable_wal(true);
        w
    }

    fn data_key(key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(key.len() + 1);
        k.push(DATA);
        k.extend_from_slice(key);
        k
    }

    fn time_key(time: i64, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(key.len() + 9);
        k.push(TIME);
        k.extend_from_slice(&time_bytes(time));
        k.extend_from_slice(key);
        k
    }

    /// Rebuilds `work/` as a copy of version `v`'s checkpoint (SST files hard-linked).
    fn restore(&self, version: u64) -> Result<()> {
        let from = self.root.join(version.to_string());
        let to = self.work();
        if !from.is_dir() {
            return Err(Error::Internal(format!(
                "state version {version} is missing ({})",
                from.display()
            )));
        }
        create_dir_all(&to)?;
        let entries =
            std::fs::read_dir(&from).map_err(io(format!("reading {}", from.display())))?;
        for e in entries {
            let e = e.map_err(io(format!("reading {}", from.display())))?;
            let name = e.file_name();
            let target = to.join(&name);
            if name.to_string_lossy().ends_with(".sst") {
                std::fs::hard_link(e.path(), &target)
                    .map_err(io(format!("linking {}", target.display())))?;
            } else {
                std::fs::copy(e.path(), &target)
                    .map_err(io(format!("copying {}", target.display())))?;
            }
        }
        Ok(())
    }

    fn versions(&self) -> Vec<u64> {
        numbered(&self.root, "").unwrap_or_default()
    }
}

/// Writes in batches of [`WRITE_BATCH_BYTES`], without the write-ahead log.
struct Batcher<'a> {
    db: &'a DB,
    batch: WriteBatch,
}

impl<'a> Batcher<'a> {
    fn new(db: &'a DB) -> Self {
        Batcher {
            db,
            batch: WriteBatch::default(),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.batch.put(key, value);
        self.flush_if_full()
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.batch.delete(key);
        self.flush_if_full()
    }

    fn flush_if_full(&mut self) -> Result<()> {
        if self.batch.size_in_bytes() >= WRITE_BATCH_BYTES {
            self.finish()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        self.db
            .write_opt(batch, &RocksBackend::write_opts())
            .map_err(|e| rocks_err("writing", e))
    }
}

impl Backend for RocksBackend {
    fn load(&mut self, version: u64) -> Result<()> {
        if self.db.is_some() && self.clean_version == Some(version) {
            return Ok(());
        }
        self.db = None;
        let work = self.work();
        if work.exists() {
            std::fs::remove_dir_all(&work).map_err(io(format!("removing {}", work.display())))?;
        }
        if version > 0 {
            self.restore(version)?;
        }
        // Named explicitly so that `cf_handle` finds it (batched lookups need a handle).
        let cf = ColumnFamilyDescriptor::new(DEFAULT_COLUMN_FAMILY_NAME, self.opts.clone());
        let db = DB::open_cf_descriptors(&self.opts, &work, [cf])
            .map_err(|e| rocks_err("opening state", e))?;
        self.count = match db.get(COUNT_KEY).map_err(|e| rocks_err("reading", e))? {
            Some(v) => u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| Error::Internal("corrupt rocksdb state count".into()))?,
            ),
            None => 0,
        };
        self.db = Some(db);
        self.clean_version = Some(version);
        self.version = version;
        Ok(())
    }

    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let db = self.db()?;
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| Self::data_key(k)).collect();
        let sorted = keys.is_sorted();
        db.batched_multi_get_cf(Self::default_cf(db)?, &keys, sorted)
            .into_iter()
            .map(|r| {
                r.map(|v| v.map(|v| v.to_vec()))
                    .map_err(|e| rocks_err("reading", e))
            })
            .collect()
    }

    fn scan_prefix(&self, prefix: &[u8], f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        let db = self.db()?;
        let start = Self::data_key(prefix);
        for item in db.iterator(IteratorMode::From(&start, Direction::Forward)) {
            let (k, v) = item.map_err(|e| rocks_err("scanning", e))?;
            if !k.starts_with(&start) {
                break;
            }
            f(&k[1..], &v);
        }
        Ok(())
    }

    fn scan_time(&self, upto: i64, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let db = self.db()?;
        let mut read = ReadOptions::default();
        read.set_iterate_upper_bound(match upto.checked_add(1) {
            Some(next) => Self::time_key(next, &[]),
            None => vec![TIME + 1],
        });
        for item in db.iterator_opt(IteratorMode::From(&[TIME], Direction::Forward), read) {
            let (k, _) = item.map_err(|e| rocks_err("scanning", e))?;
            if k.first() != Some(&TIME) || k.len() < 9 {
                break;
            }
            f(&k[9..]);
        }
        Ok(())
    }

    fn write(&mut self, changes: Changes) -> Result<u64> {
        self.clean_version = None;
        let db = self.db()?;
        // Which keys exist: one sorted, batched lookup for the whole change set. The entry
        // count needs it, and the time index is written only for keys that are new.
        let mut keys: Vec<Vec<u8>> = changes
            .deletes
            .iter()
            .map(|(k, _)| Self::data_key(k))
            .chain(changes.puts.iter().map(|(k, _, _)| Self::data_key(k)))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let cf = Self::default_cf(db)?;
        let mut present: HashMap<&[u8], bool> = HashMap::with_capacity(keys.len());
        for (k, found) in keys.iter().zip(db.batched_multi_get_cf(cf, &keys, true)) {
            let found = found.map_err(|e| rocks_err("reading", e))?.is_some();
            present.insert(&k[1..], found);
        }
        let mut batch = Batcher::new(db);
        let mut removed = 0;
        for (key, time) in &changes.deletes {
            let Some(p) = present.get_mut(key.as_slice()).filter(|p| **p) else {
                continue;
            };
            *p = false;
            removed += 1;
            batch.delete(&Self::data_key(key))?;
            if let Some(t) = time {
                batch.delete(&Self::time_key(*t, key))?;
            }
        }
        let mut added = 0;
        for (key, value, time) in &changes.puts {
            batch.put(&Self::data_key(key), value)?;
            let Some(p) = present.get_mut(key.as_slice()).filter(|p| !**p) else {
                continue;
            };
            *p = true;
            added += 1;
            if let Some(t) = time {
                batch.put(&Self::time_key(*t, key), &[])?;
            }
        }
        batch.finish()?;
        self.count = self.count + added - removed;
        Ok(removed)
    }

    fn evict(&mut self, upto: i64, keys: &[Vec<u8>]) -> Result<u64> {
        self.clean_version = None;
        let db = self.db()?;
        let mut batch = Batcher::new(db);
        for key in keys {
            batch.delete(&Self::data_key(key))?;
        }
        // One range tombstone for the time index, instead of one per key that later
        // scans of the index would step over.
        let end = match upto.checked_add(1) {
            Some(next) => Self::time_key(next, &[]),
            None => vec![TIME + 1],
        };
        batch.batch.delete_range(vec![TIME], end);
        batch.finish()?;
        let removed = keys.len() as u64;
        self.count -= removed.min(self.count);
        Ok(removed)
    }

    fn entries(&self) -> u64 {
        self.count
    }

    fn commit(&mut self, version: u64) -> Result<u64> {
        let db = self.db()?;
        db.put_opt(COUNT_KEY, self.count.to_be_bytes(), &Self::write_opts())
            .map_err(|e| rocks_err("writing", e))?;
        let tmp = self
            .root
            .join(format!(".tmp-{version}-{}", uuid::Uuid::new_v4().simple()));
        // Flushes the memtables, then links the SST files.
        Checkpoint::new(db)
            .and_then(|c| c.create_checkpoint(&tmp))
            .map_err(|e| rocks_err("creating a checkpoint", e))?;
        sync_dir(&tmp)?;
        crate::testing::crash_point("mid_state_snapshot");
        let target = self.root.join(version.to_string());
        if target.exists() {
            // A replayed batch recomputes a version that was never in a commit log.
            std::fs::remove_dir_all(&target)
                .map_err(io(format!("removing {}", target.display())))?;
        }
        std::fs::rename(&tmp, &target).map_err(io(format!("renaming to {}", target.display())))?;
        sync_dir(&self.root)?;
        let prop = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        let memory = prop("rocksdb.cur-size-all-mem-tables")
            + prop("rocksdb.estimate-table-readers-mem")
            + prop("rocksdb.block-cache-usage");
        self.version = version;
        self.clean_version = Some(version);
        Ok(memory)
    }

    fn maintain(&mut self) -> Result<()> {
        let keep_from = self.version.saturating_sub(MIN_BATCHES_TO_RETAIN);
        for v in self.versions().into_iter().filter(|&v| v < keep_from) {
            let _ = std::fs::remove_dir_all(self.root.join(v.to_string()));
        }
        // Temporary checkpoints of a crashed commit.
        if let Ok(entries) = std::fs::read_dir(&self.root) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(".tmp-") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(())
    }
}
