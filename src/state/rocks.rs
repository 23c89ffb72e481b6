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

use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{
    BlockBasedOptions, Cache, DB, DBCompressionType, Direction, IteratorMode, Options, WriteOptions,
};

use super::kv::{Backend, time_bytes};
use crate::checkpoint::MIN_BATCHES_TO_RETAIN;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, sync_dir};

const DATA: u8 = b'd';
const TIME: u8 = b't';
const COUNT_KEY: &[u8] = b"m:count";
/// Block cache per store.
const BLOCK_CACHE_BYTES: usize = 64 << 20;
/// Memtable size; two at most.
const WRITE_BUFFER_BYTES: usize = 32 << 20;

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
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(BLOCK_CACHE_BYTES));
        table.set_cache_index_and_filter_blocks(true);
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

    fn exists(db: &DB, key: &[u8]) -> Result<bool> {
        Ok(db
            .get_pinned(key)
            .map_err(|e| rocks_err("reading", e))?
            .is_some())
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
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return vec![];
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect()
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
        let db = DB::open(&self.opts, &work).map_err(|e| rocks_err("opening state", e))?;
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
        db.multi_get(keys.iter().map(|k| Self::data_key(k)))
            .into_iter()
            .map(|r| r.map_err(|e| rocks_err("reading", e)))
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
        let end = time_bytes(upto);
        for item in db.iterator(IteratorMode::From(&[TIME], Direction::Forward)) {
            let (k, _) = item.map_err(|e| rocks_err("scanning", e))?;
            if k.first() != Some(&TIME) || k.len() < 9 || k[1..9] > end[..] {
                break;
            }
            f(&k[9..]);
        }
        Ok(())
    }

    fn put(&mut self, key: &[u8], value: &[u8], time: Option<i64>) -> Result<()> {
        self.clean_version = None;
        let db = self.db()?;
        let dk = Self::data_key(key);
        let existed = Self::exists(db, &dk)?;
        let wo = Self::write_opts();
        db.put_opt(&dk, value, &wo)
            .map_err(|e| rocks_err("writing", e))?;
        if let Some(t) = time {
            db.put_opt(Self::time_key(t, key), [], &wo)
                .map_err(|e| rocks_err("writing", e))?;
        }
        if !existed {
            self.count += 1;
        }
        Ok(())
    }

    fn delete(&mut self, key: &[u8], time: Option<i64>) -> Result<bool> {
        self.clean_version = None;
        let db = self.db()?;
        let dk = Self::data_key(key);
        if !Self::exists(db, &dk)? {
            return Ok(false);
        }
        let wo = Self::write_opts();
        db.delete_opt(&dk, &wo)
            .map_err(|e| rocks_err("writing", e))?;
        if let Some(t) = time {
            db.delete_opt(Self::time_key(t, key), &wo)
                .map_err(|e| rocks_err("writing", e))?;
        }
        self.count -= 1;
        Ok(true)
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
