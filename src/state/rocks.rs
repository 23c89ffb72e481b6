//! The RocksDB state backend (cargo feature `rocksdb`, `state_store = 'rocksdb'`), made
//! durable the way Spark's RocksDB store is with changelog checkpointing.
//!
//! Layout under `<checkpoint>/state/<operator>/rocksdb/`:
//!
//! ```text
//! work/          the live database a run reads and writes (no WAL: it is rebuilt from a
//!                version on every load, so nothing in it needs to survive a crash)
//! <v>.changelog  what version v changed: puts, deletes and range deletes in order, as
//!                LZ4-compressed Arrow IPC (key, value, end), written atomically at commit
//! <v>/           a RocksDB checkpoint of version v, every `snapshot_interval()` versions:
//!                hard links to the immutable SST files plus copies of the small metadata
//!                files, created under .tmp-<v>-<uuid>/ after the batch's commit log, and
//!                renamed
//! ```
//!
//! A commit writes the batch's changelog and nothing else: the memtables are flushed when
//! they fill or when a checkpoint is taken, not every batch, so lookups meet few small
//! files. Loading version `v` rebuilds `work/` from the newest checkpoint at or before `v`
//! (SST files are hard-linked, not copied) and replays the changelogs after it. Memory is
//! bounded by the block cache and the memtables, whatever the number of keys. A batch reads
//! with one sorted, batched `MultiGet` and writes through `WriteBatch`es.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::ipc::reader::FileReader;
use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DB,
    DBCompressionType, DEFAULT_COLUMN_FAMILY_NAME, Direction, IteratorMode, Options, ReadOptions,
    WriteBatch, WriteOptions,
};

use super::codec::ipc_file_writer;
use super::kv::{Backend, Op};
use super::snapshot_interval;
use crate::config::MIN_BATCHES_TO_RETAIN;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, numbered, sync_dir, write_atomic};

/// Block cache per store.
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Memtable size; two at most.
const WRITE_BUFFER_BYTES: usize = 64 << 20;
/// Changes go to the database in write batches of about this size.
const WRITE_BATCH_BYTES: usize = 4 << 20;
const CHANGELOG: &str = ".changelog";

/// See the module documentation.
pub struct RocksBackend {
    root: PathBuf,
    /// Shared with the [`RocksReader`]s of a materialized view.
    db: Option<Arc<DB>>,
    opts: Options,
    /// The version `work/` holds, if it holds one unchanged since.
    clean_version: Option<u64>,
    /// The last version committed or loaded.
    version: u64,
    /// The changes since the last commit or load, for the next changelog.
    changes: Changelog,
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

/// The changes of one version, as they are written to its changelog file: a put has a
/// value, a delete has neither value nor end, a range delete has an end.
#[derive(Default)]
struct Changelog {
    keys: BinaryBuilder,
    values: BinaryBuilder,
    ends: BinaryBuilder,
}

impl Changelog {
    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("key", DataType::Binary, false),
            Field::new("value", DataType::Binary, true),
            Field::new("end", DataType::Binary, true),
        ])
    }

    fn push(&mut self, op: &Op) {
        let (key, value, end) = match op {
            Op::Put(k, v) => (k, Some(v), None),
            Op::Delete(k) => (k, None, None),
            Op::DeleteRange(from, to) => (from, None, Some(to)),
        };
        self.keys.append_value(key);
        self.values.append_option(value);
        self.ends.append_option(end);
    }

    /// The file's bytes.
    fn bytes(&self) -> Result<Vec<u8>> {
        let batch = RecordBatch::try_new(
            Arc::new(Self::schema()),
            vec![
                Arc::new(self.keys.finish_cloned()) as ArrayRef,
                Arc::new(self.values.finish_cloned()),
                Arc::new(self.ends.finish_cloned()),
            ],
        )?;
        let mut buf = Vec::new();
        let mut w = ipc_file_writer(&mut buf, &Self::schema())?;
        w.write(&batch)?;
        w.finish()?;
        drop(w);
        Ok(buf)
    }

    /// Calls `f` with every change of the changelog file `file`, in order.
    fn read(file: &Path, f: &mut dyn FnMut(Op) -> Result<()>) -> Result<()> {
        let fh =
            File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
        let corrupt = || Error::Internal(format!("corrupt state changelog {}", file.display()));
        for batch in FileReader::try_new(fh, None)? {
            let batch = batch?;
            if batch.num_columns() != 3 {
                return Err(corrupt());
            }
            let col = |i: usize| batch.column(i).as_binary_opt::<i32>().ok_or_else(corrupt);
            let (keys, values, ends) = (col(0)?, col(1)?, col(2)?);
            for i in 0..batch.num_rows() {
                let key = keys.value(i).to_vec();
                f(if !values.is_null(i) {
                    Op::Put(key, values.value(i).to_vec())
                } else if !ends.is_null(i) {
                    Op::DeleteRange(key, ends.value(i).to_vec())
                } else {
                    Op::Delete(key)
                })?;
            }
        }
        Ok(())
    }
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
        // A bloom filter over the memtables: most lookups of a batch are of keys that are
        // not there (new groups), and are answered without a search of the skip list.
        opts.set_memtable_prefix_bloom_ratio(0.1);
        opts.set_memtable_whole_key_filtering(true);
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
            clean_version: None,
            version: 0,
            changes: Changelog::default(),
        })
    }

    fn db(&self) -> Result<&DB> {
        self.db
            .as_deref()
            .ok_or_else(|| Error::Internal("rocksdb state used before load".into()))
    }

    fn work(&self) -> PathBuf {
        self.root.join("work")
    }

    fn changelog(&self, version: u64) -> PathBuf {
        self.root.join(format!("{version}{CHANGELOG}"))
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

    /// Rebuilds `work/` as a copy of version `v`'s checkpoint (SST files hard-linked).
    fn restore(&self, version: u64) -> Result<()> {
        let from = self.root.join(version.to_string());
        let to = self.work();
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

    /// The versions that have a checkpoint.
    fn checkpoints(&self) -> Vec<u64> {
        numbered(&self.root, "").unwrap_or_default()
    }

    /// Applies `ops` to the live database, in write batches of about [`WRITE_BATCH_BYTES`].
    fn apply(db: &DB, ops: &[Op]) -> Result<()> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                Op::Put(k, v) => batch.put(k, v),
                Op::Delete(k) => batch.delete(k),
                Op::DeleteRange(from, to) => batch.delete_range(from, to),
            }
            if batch.size_in_bytes() >= WRITE_BATCH_BYTES {
                db.write_opt(std::mem::take(&mut batch), &Self::write_opts())
                    .map_err(|e| rocks_err("writing", e))?;
            }
        }
        if !batch.is_empty() {
            db.write_opt(batch, &Self::write_opts())
                .map_err(|e| rocks_err("writing", e))?;
        }
        Ok(())
    }

    /// Takes a checkpoint of `work/` as version `self.version`, unless one exists.
    fn checkpoint(&self) -> Result<()> {
        let version = self.version;
        let target = self.root.join(version.to_string());
        if target.exists() {
            return Ok(());
        }
        let tmp = self
            .root
            .join(format!(".tmp-{version}-{}", uuid::Uuid::new_v4().simple()));
        // Flushes the memtables, then links the SST files.
        Checkpoint::new(self.db()?)
            .and_then(|c| c.create_checkpoint(&tmp))
            .map_err(|e| rocks_err("creating a checkpoint", e))?;
        sync_dir(&tmp)?;
        crate::testing::crash_point("mid_state_snapshot");
        std::fs::rename(&tmp, &target).map_err(io(format!("renaming to {}", target.display())))?;
        sync_dir(&self.root)
    }

    /// The newest version on disk: its changelog or its checkpoint (0 for none).
    pub fn latest_version(&self) -> u64 {
        let changelogs = numbered(&self.root, CHANGELOG).unwrap_or_default();
        changelogs
            .into_iter()
            .chain(self.checkpoints())
            .max()
            .unwrap_or(0)
    }

    /// Applies `ops` as one write: a [`RocksCursor`] sees all of them or none. For a
    /// materialized view, whose readers must see whole batches; [`Backend::write`] splits
    /// large writes to bound their memory.
    pub fn write_whole(&mut self, ops: Vec<Op>) -> Result<()> {
        self.clean_version = None;
        let mut batch = WriteBatch::default();
        for op in &ops {
            match op {
                Op::Put(k, v) => batch.put(k, v),
                Op::Delete(k) => batch.delete(k),
                Op::DeleteRange(from, to) => batch.delete_range(from, to),
            }
        }
        self.db()?
            .write_opt(batch, &Self::write_opts())
            .map_err(|e| rocks_err("writing", e))?;
        for op in &ops {
            self.changes.push(op);
        }
        Ok(())
    }

    /// A reader of the live database beside this writer, after [`Backend::load`].
    pub fn reader(&self) -> Result<RocksReader> {
        self.db
            .clone()
            .map(|db| RocksReader { db })
            .ok_or_else(|| Error::Internal("rocksdb state read before load".into()))
    }
}

/// Reads the live database of a [`RocksBackend`] while it is written: each
/// [`RocksCursor`] sees the database as it was when the cursor was made, whole writes
/// only.
#[derive(Clone)]
pub struct RocksReader {
    db: Arc<DB>,
}

impl std::fmt::Debug for RocksReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksReader").finish_non_exhaustive()
    }
}

impl RocksReader {
    /// A cursor over one point in time of the database.
    pub fn cursor(&self) -> RocksCursor<'_> {
        RocksCursor {
            it: self.db.raw_iterator(),
        }
    }
}

/// A position in the database as one point in time saw it (an iterator with its
/// implicit snapshot).
pub struct RocksCursor<'a> {
    it: rocksdb::DBRawIteratorWithThreadMode<'a, DB>,
}

impl RocksCursor<'_> {
    /// Moves to the first key at or after `key`.
    pub fn seek(&mut self, key: &[u8]) {
        self.it.seek(key);
    }

    /// Moves to the next key.
    pub fn next(&mut self) {
        self.it.next();
    }

    /// The key and value here; `None` past the last key.
    pub fn entry(&self) -> Result<Option<(&[u8], &[u8])>> {
        if !self.it.valid() {
            self.it.status().map_err(|e| rocks_err("reading", e))?;
            return Ok(None);
        }
        Ok(self.it.key().zip(self.it.value()))
    }
}

impl Backend for RocksBackend {
    fn load(&mut self, version: u64) -> Result<()> {
        self.changes = Changelog::default();
        if self.db.is_some() && self.clean_version == Some(version) {
            return Ok(());
        }
        self.db = None;
        self.clean_version = None;
        let work = self.work();
        if work.exists() {
            std::fs::remove_dir_all(&work).map_err(io(format!("removing {}", work.display())))?;
        }
        let base = self
            .checkpoints()
            .into_iter()
            .filter(|&v| v <= version)
            .max()
            .unwrap_or(0);
        if base > 0 {
            self.restore(base)?;
        }
        // Named explicitly so that `cf_handle` finds it (batched lookups need a handle).
        let cf = ColumnFamilyDescriptor::new(DEFAULT_COLUMN_FAMILY_NAME, self.opts.clone());
        let db = DB::open_cf_descriptors(&self.opts, &work, [cf])
            .map_err(|e| rocks_err("opening state", e))?;
        for v in base + 1..=version {
            let file = self.changelog(v);
            if !file.exists() {
                return Err(Error::Internal(format!(
                    "state version {v} is missing ({})",
                    file.display()
                )));
            }
            let mut ops = Vec::new();
            Changelog::read(&file, &mut |op| {
                ops.push(op);
                Ok(())
            })?;
            Self::apply(&db, &ops)?;
        }
        self.db = Some(Arc::new(db));
        self.clean_version = Some(version);
        self.version = version;
        Ok(())
    }

    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        let db = self.db()?;
        db.batched_multi_get_cf(Self::default_cf(db)?, keys, true)
            .into_iter()
            .map(|r| {
                r.map(|v| v.map(|v| v.to_vec()))
                    .map_err(|e| rocks_err("reading", e))
            })
            .collect()
    }

    fn scan(&self, from: &[u8], to: Option<&[u8]>, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<()> {
        let db = self.db()?;
        let mut read = ReadOptions::default();
        if let Some(to) = to {
            read.set_iterate_upper_bound(to.to_vec());
        }
        for item in db.iterator_opt(IteratorMode::From(from, Direction::Forward), read) {
            let (k, v) = item.map_err(|e| rocks_err("scanning", e))?;
            f(&k, &v);
        }
        Ok(())
    }

    fn write(&mut self, ops: Vec<Op>) -> Result<()> {
        self.clean_version = None;
        Self::apply(self.db()?, &ops)?;
        for op in &ops {
            self.changes.push(op);
        }
        Ok(())
    }

    fn commit(&mut self, version: u64) -> Result<u64> {
        // Kept until the file is written: a commit that fails can be tried again.
        let log = self.changes.bytes()?;
        write_atomic(&self.changelog(version), &log)?;
        self.changes = Changelog::default();
        let db = self.db()?;
        let prop = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        let memory = prop("rocksdb.cur-size-all-mem-tables")
            + prop("rocksdb.estimate-table-readers-mem")
            + prop("rocksdb.block-cache-usage");
        self.version = version;
        self.clean_version = Some(version);
        Ok(memory)
    }

    fn maintain(&mut self) -> Result<()> {
        let version = self.version;
        if version > 0
            && version.is_multiple_of(snapshot_interval())
            && self.clean_version == Some(version)
        {
            self.checkpoint()?;
        }
        // Temporary checkpoints of a crashed run.
        if let Ok(entries) = std::fs::read_dir(&self.root) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(".tmp-") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        // Keep what loading any of the last MIN_BATCHES_TO_RETAIN versions needs: the
        // newest checkpoint at or before the oldest of them, and the changelogs after it.
        let oldest = version.saturating_sub(MIN_BATCHES_TO_RETAIN);
        let checkpoints = self.checkpoints();
        let Some(base) = checkpoints.iter().copied().filter(|&v| v <= oldest).max() else {
            return Ok(());
        };
        for v in checkpoints.into_iter().filter(|&v| v < base) {
            let _ = std::fs::remove_dir_all(self.root.join(v.to_string()));
        }
        for v in numbered(&self.root, CHANGELOG)
            .unwrap_or_default()
            .into_iter()
            .filter(|&v| v <= base)
        {
            let _ = std::fs::remove_file(self.changelog(v));
        }
        Ok(())
    }
}
