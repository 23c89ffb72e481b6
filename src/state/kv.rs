//! State rows as byte keys and values over a key-value [`Backend`].
//!
//! A row's key is `partition (2 bytes, big-endian) ++ row-format(group columns ++ window
//! columns)`, its value `row-format(value columns)` (Arrow's row format: comparable,
//! self-delimiting per column, so the encoding of the group columns alone is a prefix of
//! every key of that group). The partition is a stable hash (FNV-1a) of the group bytes
//! modulo `state_partitions`. Rows whose layout has a time column are also indexed by that
//! time, so the watermark finds what it closes without a scan.
//!
//! `<dir>/_metadata` records the store, the partition count and the row shape, and a
//! checkpoint whose state was written with another one is refused, naming the difference.

use std::path::Path;
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::row::{RowConverter, SortField};
use serde::{Deserialize, Serialize};

use super::{STATE_FORMAT_VERSION, StateLayout, StateMetrics, StateStore, StoreKind};
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;

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

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    format_version: u32,
    #[serde(default)]
    store: StoreKind,
    partitions: usize,
    key_columns: usize,
    /// `name: type` of every state column, to refuse a checkpoint of another query shape.
    fields: Vec<String>,
}

fn describe_fields(schema: &Schema) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect()
}

/// The store kind recorded in an operator state directory.
pub fn stored_kind(dir: &Path) -> Result<StoreKind> {
    let meta_file = dir.join("_metadata");
    let text = std::fs::read_to_string(&meta_file)
        .map_err(|e| Error::io(format!("reading {}", meta_file.display()), e))?;
    let found: Metadata = serde_json::from_str(&text).map_err(|e| {
        Error::Internal(format!(
            "corrupt state metadata {}: {e}",
            meta_file.display()
        ))
    })?;
    Ok(found.store)
}

/// Writes the metadata of a new store, or checks that of an existing one.
fn check_metadata(dir: &Path, meta: &Metadata) -> Result<()> {
    let meta_file = dir.join("_metadata");
    let text = match std::fs::read_to_string(&meta_file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = serde_json::to_string(meta)
                .map_err(|e| Error::Internal(format!("encoding state metadata: {e}")))?;
            return write_atomic(&meta_file, text.as_bytes());
        }
        Err(e) => return Err(Error::io(format!("reading {}", meta_file.display()), e)),
    };
    let found: Metadata = serde_json::from_str(&text).map_err(|e| {
        Error::Internal(format!(
            "corrupt state metadata {}: {e}",
            meta_file.display()
        ))
    })?;
    let incompatible =
        |message: String, hint: String| Error::IncompatibleCheckpoint { message, hint };
    if found.format_version != meta.format_version {
        return Err(incompatible(
            format!(
                "the checkpoint's state has format version {}, this build reads {}",
                found.format_version, meta.format_version
            ),
            "Use a new checkpoint_location, or the Tidemark version that wrote it.".into(),
        ));
    }
    if found.store != meta.store {
        return Err(incompatible(
            format!(
                "the checkpoint's state is in state_store '{}', the sink asks for '{}'",
                found.store.as_str(),
                meta.store.as_str()
            ),
            format!(
                "state_store is fixed once the checkpoint exists: use state_store = '{}', \
                 or a new checkpoint_location.",
                found.store.as_str()
            ),
        ));
    }
    if found.partitions != meta.partitions {
        return Err(incompatible(
            format!(
                "the checkpoint's state has {} partitions, the sink asks for {}",
                found.partitions, meta.partitions
            ),
            format!(
                "state_partitions is fixed once the checkpoint exists: use \
                 state_partitions = {}, or a new checkpoint_location.",
                found.partitions
            ),
        ));
    }
    if found != *meta {
        return Err(incompatible(
            "the checkpoint's state was written by a query with other group keys or \
             aggregates"
                .into(),
            format!(
                "The checkpoint holds [{}]; this query needs [{}]. Use a new \
                 checkpoint_location.",
                found.fields.join(", "),
                meta.fields.join(", ")
            ),
        ));
    }
    Ok(())
}

/// FNV-1a: stable across builds and platforms, unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn converter(schema: &Schema, columns: &[usize]) -> Result<Option<RowConverter>> {
    if columns.is_empty() {
        return Ok(None);
    }
    let fields = columns
        .iter()
        .map(|&i| SortField::new(schema.field(i).data_type().clone()))
        .collect::<Vec<_>>();
    if !RowConverter::supports_fields(&fields) {
        return Err(Error::Unsupported {
            message: format!(
                "state of type [{}] cannot be stored",
                columns
                    .iter()
                    .map(|&i| schema.field(i).data_type().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            hint: None,
        });
    }
    Ok(Some(RowConverter::new(fields)?))
}

/// Encodes the given columns of `batch`, one byte string per row (empty without columns).
fn encode(
    conv: &Option<RowConverter>,
    batch: &RecordBatch,
    columns: &[usize],
) -> Result<Vec<Vec<u8>>> {
    match conv {
        None => Ok(vec![Vec::new(); batch.num_rows()]),
        Some(c) => {
            let cols: Vec<ArrayRef> = columns.iter().map(|&i| batch.column(i).clone()).collect();
            let rows = c.convert_columns(&cols)?;
            Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
        }
    }
}

/// A [`StateStore`] over a [`Backend`]; see the module documentation.
pub struct KvState<B: Backend> {
    layout: StateLayout,
    backend: B,
    /// Group columns, then window columns: the key's encoding order.
    key_order: Vec<usize>,
    group_columns: Vec<usize>,
    value_columns: Vec<usize>,
    key_conv: Option<RowConverter>,
    group_conv: Option<RowConverter>,
    value_conv: Option<RowConverter>,
    updated: u64,
    removed: u64,
}

impl<B: Backend> KvState<B> {
    /// Opens the store of an operator, checking the metadata of a store that exists.
    pub fn open(dir: &Path, layout: StateLayout, kind: StoreKind, backend: B) -> Result<Self> {
        check_metadata(
            dir,
            &Metadata {
                format_version: STATE_FORMAT_VERSION,
                store: kind,
                partitions: layout.partitions,
                key_columns: layout.key_columns,
                fields: describe_fields(&layout.schema),
            },
        )?;
        let schema = layout.schema.clone();
        let group_columns: Vec<usize> = (layout.window_columns..layout.key_columns).collect();
        let mut key_order = group_columns.clone();
        key_order.extend(0..layout.window_columns);
        let value_columns: Vec<usize> = (layout.key_columns..schema.fields().len()).collect();
        Ok(KvState {
            key_conv: converter(&schema, &key_order)?,
            group_conv: converter(&schema, &group_columns)?,
            value_conv: converter(&schema, &value_columns)?,
            layout,
            backend,
            key_order,
            group_columns,
            value_columns,
            updated: 0,
            removed: 0,
        })
    }

    fn partition_prefix(&self, group: &[u8]) -> [u8; 2] {
        let p = (fnv1a(group) % self.layout.partitions.max(1) as u64) as u16;
        p.to_be_bytes()
    }

    /// The full keys of `batch`'s rows (its first columns are the key columns).
    fn keys(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let groups = encode(&self.group_conv, batch, &self.group_columns)?;
        let full = encode(&self.key_conv, batch, &self.key_order)?;
        Ok(groups
            .iter()
            .zip(full)
            .map(|(g, f)| {
                let mut k = Vec::with_capacity(2 + f.len());
                k.extend_from_slice(&self.partition_prefix(g));
                k.extend_from_slice(&f);
                k
            })
            .collect())
    }

    /// The time of each row, from the layout's time column.
    fn times(&self, batch: &RecordBatch) -> Result<Vec<Option<i64>>> {
        let Some(col) = self.layout.time_column else {
            return Ok(vec![None; batch.num_rows()]);
        };
        let c = cast(
            batch.column(col),
            &DataType::Timestamp(TimeUnit::Microsecond, None),
        )?;
        let c = cast(&c, &DataType::Int64)?;
        Ok(c.as_primitive::<Int64Type>().iter().collect())
    }

    /// Rows from `(key, value)` entries.
    fn decode(&self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<RecordBatch> {
        let schema = &self.layout.schema;
        if entries.is_empty() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let mut cols: Vec<Option<ArrayRef>> = vec![None; schema.fields().len()];
        if let Some(conv) = &self.key_conv {
            let parser = conv.parser();
            let decoded = conv.convert_rows(entries.iter().map(|(k, _)| parser.parse(&k[2..])))?;
            for (pos, &i) in self.key_order.iter().enumerate() {
                cols[i] = Some(decoded[pos].clone());
            }
        }
        if let Some(conv) = &self.value_conv {
            let parser = conv.parser();
            let decoded = conv.convert_rows(entries.iter().map(|(_, v)| parser.parse(v)))?;
            for (pos, &i) in self.value_columns.iter().enumerate() {
                cols[i] = Some(decoded[pos].clone());
            }
        }
        let cols = cols
            .into_iter()
            .zip(schema.fields())
            .map(|(c, f)| {
                let c = c.ok_or_else(|| {
                    Error::Internal(format!("state column {} not decoded", f.name()))
                })?;
                if c.data_type() == f.data_type() {
                    Ok(c)
                } else {
                    Ok(cast(&c, f.data_type())?)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(schema.clone(), cols)?)
    }

    fn values(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        encode(&self.value_conv, batch, &self.value_columns)
    }
}

/// Rows per batch that [`StateStore::rows`] returns.
const SCAN_BATCH_ROWS: usize = 8192;

impl<B: Backend> StateStore for KvState<B> {
    fn schema(&self) -> SchemaRef {
        self.layout.schema.clone()
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
        let mut groups = encode(&self.group_conv, rows, &self.group_columns)?;
        groups.sort();
        groups.dedup();
        let mut entries = Vec::new();
        for g in groups {
            let mut prefix = self.partition_prefix(&g).to_vec();
            prefix.extend_from_slice(&g);
            self.backend.scan_prefix(&prefix, &mut |k, v| {
                entries.push((k.to_vec(), v.to_vec()));
            })?;
        }
        self.decode(&entries)
    }

    fn expired(&self, wm_us: i64) -> Result<RecordBatch> {
        let mut keys = Vec::new();
        self.backend
            .scan_time(wm_us, &mut |k| keys.push(k.to_vec()))?;
        let values = self.backend.multi_get(&keys)?;
        let entries = keys
            .into_iter()
            .zip(values)
            .map(|(k, v)| {
                v.map(|v| (k, v))
                    .ok_or_else(|| Error::Internal("state time index names a missing key".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        self.decode(&entries)
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
                .zip(self.times(removed)?)
                .collect();
        }
        if rows.num_rows() > 0 {
            changes.puts = self
                .keys(rows)?
                .into_iter()
                .zip(self.values(rows)?)
                .zip(self.times(rows)?)
                .map(|((k, v), t)| (k, v, t))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::Field;

    use super::*;
    use crate::state::open;

    /// State rows `(start, end, k, n)`: a window, a group key and a value.
    fn layout(partitions: usize) -> StateLayout {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        StateLayout {
            schema: Arc::new(Schema::new(vec![
                Field::new("start", ts.clone(), false),
                Field::new("end", ts, false),
                Field::new("k", DataType::Utf8, true),
                Field::new("n", DataType::Int64, false),
            ])),
            key_columns: 3,
            window_columns: 2,
            time_column: Some(1),
            partitions,
        }
    }

    fn rows(r: &[(i64, &str, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            layout(1).schema,
            vec![
                Arc::new(TimestampMicrosecondArray::from(
                    r.iter().map(|x| x.0).collect::<Vec<_>>(),
                )),
                Arc::new(TimestampMicrosecondArray::from(
                    r.iter().map(|x| x.0 + 10).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(r.iter().map(|x| x.1).collect::<Vec<_>>())),
                Arc::new(Int64Array::from(r.iter().map(|x| x.2).collect::<Vec<_>>())),
            ],
        )
        .unwrap()
    }

    fn contents(batches: &[RecordBatch]) -> Vec<(i64, String, i64)> {
        let mut out = Vec::new();
        for b in batches {
            let s = b
                .column(0)
                .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
            let k = b.column(2).as_string::<i32>();
            let n = b.column(3).as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                out.push((s.value(i), k.value(i).to_string(), n.value(i)));
            }
        }
        out.sort();
        out
    }

    fn kinds() -> Vec<StoreKind> {
        let mut k = vec![StoreKind::Memory];
        if cfg!(feature = "rocksdb") {
            k.push(StoreKind::Rocksdb);
        }
        k
    }

    #[test]
    fn versions_survive_reopening_and_replays_start_from_the_right_one() {
        for kind in kinds() {
            let dir = tempfile::tempdir().unwrap();
            let none = rows(&[]);
            let mut s = open(kind, dir.path(), layout(4)).unwrap();
            s.load(0).unwrap();
            s.apply(&rows(&[(0, "a", 1), (0, "b", 2), (10, "c", 3)]), &none)
                .unwrap();
            let m = s.commit(1).unwrap();
            assert_eq!(
                (m.rows_total, m.rows_updated, m.rows_removed),
                (3, 3, 0),
                "{kind:?}"
            );
            s.maintain().unwrap();
            s.apply(&rows(&[(0, "b", 20)]), &rows(&[(0, "a", 0)]))
                .unwrap();
            let m = s.commit(2).unwrap();
            assert_eq!(
                (m.rows_total, m.rows_updated, m.rows_removed),
                (2, 1, 1),
                "{kind:?}"
            );
            // Version 3 is written by a batch that then "crashes": a reload of 2 ignores it.
            s.apply(&rows(&[(20, "z", 9)]), &none).unwrap();
            s.commit(3).unwrap();
            drop(s);

            let mut r = open(kind, dir.path(), layout(4)).unwrap();
            r.load(2).unwrap();
            assert_eq!(
                contents(&r.rows().unwrap()),
                vec![(0, "b".into(), 20), (10, "c".into(), 3)],
                "{kind:?}"
            );
            r.load(1).unwrap();
            assert_eq!(
                contents(&r.rows().unwrap()),
                vec![(0, "a".into(), 1), (0, "b".into(), 2), (10, "c".into(), 3)],
                "{kind:?}"
            );
            // Lookups by key, by group, and by time.
            let got = r
                .get(&rows(&[(0, "b", 0), (0, "x", 0), (10, "b", 0)]))
                .unwrap();
            assert_eq!(contents(&[got]), vec![(0, "b".into(), 2)], "{kind:?}");
            r.apply(&rows(&[(30, "b", 7)]), &none).unwrap();
            let got = r.get_groups(&rows(&[(99, "b", 0)])).unwrap();
            assert_eq!(
                contents(&[got]),
                vec![(0, "b".into(), 2), (30, "b".into(), 7)],
                "{kind:?}"
            );
            // Ends are start + 10: 10, 10, 20, 40.
            let got = r.expired(10).unwrap();
            assert_eq!(
                contents(&[got]),
                vec![(0, "a".into(), 1), (0, "b".into(), 2)],
                "{kind:?}"
            );
            assert_eq!(r.expired(9).unwrap().num_rows(), 0, "{kind:?}");
        }
    }

    #[test]
    fn counts_and_the_time_index_follow_updates_removals_and_re_insertions() {
        for kind in kinds() {
            let dir = tempfile::tempdir().unwrap();
            let none = rows(&[]);
            let mut s = open(kind, dir.path(), layout(3)).unwrap();
            s.load(0).unwrap();
            s.apply(&rows(&[(0, "a", 1), (0, "b", 1), (50, "c", 1)]), &none)
                .unwrap();
            // Updates of existing keys, twice in one batch for "a"; a removal of a key that
            // is not there; a key removed and set again in one change (a session that did
            // not move).
            s.apply(&rows(&[(0, "a", 2), (0, "a", 3)]), &rows(&[(0, "zz", 0)]))
                .unwrap();
            s.apply(&rows(&[(0, "b", 5)]), &rows(&[(0, "b", 0)]))
                .unwrap();
            let m = s.commit(1).unwrap();
            assert_eq!((m.rows_total, m.rows_removed), (3, 1), "{kind:?}");
            // Each key once in the time index, whatever the number of writes.
            assert_eq!(
                contents(&[s.expired(10).unwrap()]),
                vec![(0, "a".into(), 3), (0, "b".into(), 5)],
                "{kind:?}"
            );
            s.apply(&none, &s.expired(10).unwrap()).unwrap();
            let m = s.commit(2).unwrap();
            assert_eq!((m.rows_total, m.rows_removed), (1, 2), "{kind:?}");
            assert_eq!(s.expired(100).unwrap().num_rows(), 1, "{kind:?}");
            drop(s);
            let mut r = open(kind, dir.path(), layout(3)).unwrap();
            r.load(2).unwrap();
            assert_eq!(r.expired(10).unwrap().num_rows(), 0, "{kind:?}");
            r.apply(&rows(&[(0, "a", 9)]), &none).unwrap();
            let m = r.commit(3).unwrap();
            assert_eq!(m.rows_total, 2, "{kind:?}");
            assert_eq!(
                contents(&[r.expired(10).unwrap()]),
                vec![(0, "a".into(), 9)],
                "{kind:?}"
            );
        }
    }

    #[test]
    fn snapshots_are_used_and_partitions_and_store_are_fixed() {
        for kind in kinds() {
            let dir = tempfile::tempdir().unwrap();
            let none = rows(&[]);
            let mut s = open(kind, dir.path(), layout(2)).unwrap();
            s.load(0).unwrap();
            for v in 1..=25 {
                s.apply(&rows(&[(0, "k", v), (v, "t", v)]), &none).unwrap();
                s.commit(v as u64).unwrap();
                s.maintain().unwrap();
            }
            drop(s);
            if kind == StoreKind::Memory {
                // Versions 1..=19 are only reachable through the snapshot of 10 and 20.
                std::fs::remove_file(dir.path().join("5.delta")).unwrap();
            }
            let mut r = open(kind, dir.path(), layout(2)).unwrap();
            r.load(25).unwrap();
            let all = contents(&r.rows().unwrap());
            assert_eq!(all.len(), 26, "{kind:?}");
            assert!(all.contains(&(0, "k".into(), 25)), "{kind:?}");
            let e = open(kind, dir.path(), layout(4))
                .err()
                .expect("other partition count refused");
            assert_eq!(e.sqlstate().code(), "55000");
            assert!(e.to_string().contains("2 partitions"), "{e}");
        }
        if cfg!(feature = "rocksdb") {
            let dir = tempfile::tempdir().unwrap();
            open(StoreKind::Memory, dir.path(), layout(2)).unwrap();
            let e = open(StoreKind::Rocksdb, dir.path(), layout(2))
                .err()
                .expect("other store refused");
            assert!(e.to_string().contains("state_store 'memory'"), "{e}");
        }
    }
}
