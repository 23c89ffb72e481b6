//! A keyed materialized view kept in RocksDB (`state_store = 'rocksdb'`): its rows live
//! on disk, so a view may hold more groups than memory.
//!
//! The view's rows are kept in a [`RocksBackend`], the store that keeps operator state,
//! under `<view dir>/rocksdb/`, with its durability: version `N + 1` is the view after
//! batch `N`, one changelog file per version (the batch's commit), a RocksDB checkpoint
//! every few versions. One key space, by a leading tag byte:
//!
//! ```text
//! 0 key            the group's whole row (Arrow's row format), by its key
//! 1 time key       empty, with a retention: the rows by the time they go
//! 2 "rows"         how many rows the view holds (u64, big-endian)
//! ```
//!
//! A batch is one RocksDB write (its upserts, the rows its retention removes, the count),
//! so a [`RowsCursor`], which reads one point in time, sees whole batches only.

use std::collections::HashSet;
use std::path::Path;

use datafusion::arrow::record_batch::RecordBatch;

use super::{KeyCodec, Retention, RowBytes, SortedRows};
use crate::error::{Error, Result};
use crate::state::kv::{Backend, Op};
use crate::state::rocks::{RocksBackend, RocksCursor, RocksReader};
use crate::types::BatchId;

const ROWS: u8 = 0;
const BY_TIME: u8 = 1;
const META_ROWS: &[u8] = b"\x02rows";

fn tagged(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + parts.iter().map(|p| p.len()).sum::<usize>());
    k.push(tag);
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

/// A time as bytes that sort as the times do.
fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// The write side: under the view's writer lock.
pub(super) struct RocksWriter {
    backend: RocksBackend,
    /// The last batch written to the database (and so shown), logged or not.
    shown: Option<BatchId>,
    rows: u64,
}

/// Opens the view's database in `dir` as of its last logged batch: the writer, a reader,
/// that batch, and how many rows the view holds.
pub(super) fn open(dir: &Path) -> Result<(RocksWriter, RocksReader, Option<BatchId>, u64)> {
    let mut backend = RocksBackend::new(dir)?;
    let version = backend.latest_version();
    backend.load(version)?;
    let reader = backend.reader()?;
    let mut cursor = reader.cursor();
    cursor.seek(META_ROWS);
    let rows = match cursor.entry()? {
        Some((k, v)) if k == META_ROWS => u64::from_be_bytes(
            v.try_into()
                .map_err(|_| Error::Internal("a view's row count is corrupt".into()))?,
        ),
        _ => 0,
    };
    drop(cursor);
    let batch = version.checked_sub(1).map(BatchId);
    Ok((
        RocksWriter {
            backend,
            shown: batch,
            rows,
        },
        reader,
        batch,
        rows,
    ))
}

impl RocksWriter {
    /// Writes batch `batch`'s rows as one write: each row upserted by its key, then the
    /// rows older than `cutoff` removed. Visible to new cursors at once; durable at
    /// [`RocksWriter::log`]. A batch already written is not written again. Returns how
    /// many rows the view holds.
    pub(super) fn show(
        &mut self,
        batch: BatchId,
        rows: &[RecordBatch],
        codec: &KeyCodec,
        retention: Option<&Retention>,
        cutoff: Option<i64>,
    ) -> Result<u64> {
        if self.shown.is_some_and(|b| b >= batch) {
            return Ok(self.rows);
        }
        // (key, row, time) of every row, the row kept in its bytes.
        let mut entries = Vec::new();
        for b in rows.iter().filter(|b| b.num_rows() > 0) {
            let times = match retention {
                Some(r) => r.times(b)?,
                None => Vec::new(),
            };
            for (i, (k, v)) in codec.encode(b)?.into_iter().enumerate() {
                entries.push((k, v, times.get(i).copied().flatten()));
            }
        }
        // Which keys are new, by one sorted lookup.
        let mut order: Vec<usize> = (0..entries.len()).collect();
        order.sort_by(|&a, &b| entries[a].0.cmp(&entries[b].0));
        let keys: Vec<Vec<u8>> = order
            .iter()
            .map(|&i| tagged(ROWS, &[&entries[i].0]))
            .collect();
        let present = self.backend.multi_get(&keys)?;
        let mut count = self.rows;
        let mut ops = Vec::with_capacity(entries.len() * 2 + 2);
        let mut added: HashSet<&[u8]> = HashSet::new();
        for (&i, (key, present)) in order.iter().zip(keys.into_iter().zip(present)) {
            let (k, v, time) = &entries[i];
            // A row already past the retention is not kept (if the view had it, it goes
            // below with the others).
            if let (Some(t), Some(c)) = (time, cutoff)
                && *t < c
            {
                continue;
            }
            if present.is_none() && added.insert(k) {
                count += 1;
            }
            ops.push(Op::Put(key, v.to_vec()));
            if let Some(t) = time {
                ops.push(Op::Put(tagged(BY_TIME, &[&time_bytes(*t), k]), Vec::new()));
            }
        }
        if let Some(cutoff) = cutoff {
            let (from, to) = (vec![BY_TIME], tagged(BY_TIME, &[&time_bytes(cutoff)]));
            let mut gone = Vec::new();
            self.backend.scan(&from, Some(&to), &mut |k, _| {
                if let Some(key) = k.get(9..) {
                    gone.push(tagged(ROWS, &[key]));
                }
            })?;
            count = count.saturating_sub(gone.len() as u64);
            ops.extend(gone.into_iter().map(Op::Delete));
            ops.push(Op::DeleteRange(from, to));
        }
        ops.push(Op::Put(META_ROWS.to_vec(), count.to_be_bytes().to_vec()));
        self.backend.write_whole(ops)?;
        self.shown = Some(batch);
        self.rows = count;
        Ok(count)
    }

    /// Makes batch `batch` (written by [`RocksWriter::show`]) durable: its changelog file.
    pub(super) fn log(&mut self, batch: BatchId) -> Result<()> {
        self.backend.commit(batch.get() + 1)?;
        Ok(())
    }

    /// A checkpoint every few versions, and the removal of files no longer needed.
    pub(super) fn maintain(&mut self) -> Result<()> {
        self.backend.maintain()
    }
}

/// A read of the view's rows as one point in time saw them.
pub(super) struct RowsCursor<'a> {
    cursor: RocksCursor<'a>,
}

impl<'a> RowsCursor<'a> {
    pub(super) fn new(reader: &'a RocksReader) -> RowsCursor<'a> {
        RowsCursor {
            cursor: reader.cursor(),
        }
    }

    /// The key (without its tag) and row here, if a row is here.
    fn here(&self) -> Result<Option<(&[u8], &[u8])>> {
        Ok(match self.cursor.entry()? {
            Some((k, v)) if k.first() == Some(&ROWS) => Some((&k[1..], v)),
            _ => None,
        })
    }
}

impl SortedRows for RowsCursor<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<RowBytes>> {
        self.cursor.seek(&tagged(ROWS, &[key]));
        Ok(match self.here()? {
            Some((k, v)) if k == key => Some(RowBytes::from(v)),
            _ => None,
        })
    }

    fn first_key(&mut self, from: &[u8]) -> Result<Option<Vec<u8>>> {
        self.cursor.seek(&tagged(ROWS, &[from]));
        Ok(self.here()?.map(|(k, _)| k.to_vec()))
    }

    fn range(
        &mut self,
        from: &[u8],
        end: Option<&[u8]>,
        f: &mut dyn FnMut(RowBytes) -> bool,
    ) -> Result<bool> {
        self.cursor.seek(&tagged(ROWS, &[from]));
        while let Some((k, v)) = self.here()? {
            if end.is_some_and(|e| k >= e) {
                break;
            }
            if !f(RowBytes::from(v)) {
                return Ok(false);
            }
            self.cursor.next();
        }
        Ok(true)
    }
}
