//! The default state store: in memory, durable through per-batch deltas and snapshots.
//!
//! Layout under `<checkpoint>/state/<operator>/`:
//!
//! ```text
//! _metadata            {"formatVersion":1,"partitions":4,"keyColumns":3,"fields":[...]}
//! <p>/<v>.delta        Arrow IPC: the rows version v upserted, then the keys it removed
//!                      (column __deleted = true, other columns null)
//! <p>/<v>.snapshot     Arrow IPC: every row of partition p at version v
//! ```
//!
//! Loading version `v` reads the newest snapshot at or before `v` and applies the deltas
//! after it, in order. Files of versions after `v` (left by a batch that crashed before
//! its commit log) are ignored and overwritten when that version is committed again.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::{concat_batches, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::row::{RowConverter, SortField};
use serde::{Deserialize, Serialize};

use super::{SNAPSHOT_INTERVAL, STATE_FORMAT_VERSION, StateMetrics, StateStore};
use crate::checkpoint::MIN_BATCHES_TO_RETAIN;
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, write_atomic};

const DELETED: &str = "__deleted";

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    format_version: u32,
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

/// See the module documentation.
pub struct MemoryStateStore {
    dir: PathBuf,
    schema: SchemaRef,
    key_columns: usize,
    /// One compacted batch per partition (`None` = empty).
    rows: Vec<Option<RecordBatch>>,
    /// Changes since the last commit, per partition: (upserts, removed keys).
    pending: Vec<(Vec<RecordBatch>, Vec<RecordBatch>)>,
    converter: RowConverter,
}

impl MemoryStateStore {
    /// Opens the store of an operator. `partitions` must match a store that exists.
    pub fn open(
        dir: &Path,
        schema: SchemaRef,
        key_columns: usize,
        partitions: usize,
    ) -> Result<MemoryStateStore> {
        let meta = Metadata {
            format_version: STATE_FORMAT_VERSION,
            partitions,
            key_columns,
            fields: describe_fields(&schema),
        };
        let meta_file = dir.join("_metadata");
        match std::fs::read_to_string(&meta_file) {
            Ok(text) => {
                let found: Metadata = serde_json::from_str(&text).map_err(|e| {
                    Error::Internal(format!(
                        "corrupt state metadata {}: {e}",
                        meta_file.display()
                    ))
                })?;
                if found.format_version != STATE_FORMAT_VERSION {
                    return Err(Error::Internal(format!(
                        "state in {} has format version {}, this build reads {STATE_FORMAT_VERSION}",
                        dir.display(),
                        found.format_version
                    )));
                }
                if found.partitions != partitions {
                    return Err(Error::InvalidOption {
                        message: format!(
                            "the checkpoint's state has {} partitions, the sink asks for {partitions}",
                            found.partitions
                        ),
                        hint: Some(format!(
                            "state_partitions is fixed once the checkpoint exists: use \
                             state_partitions = {}, or a new checkpoint_location.",
                            found.partitions
                        )),
                    });
                }
                if found != meta {
                    return Err(Error::InvalidOption {
                        message: "the checkpoint's state was written by a query with other \
                                  group keys or aggregates"
                            .into(),
                        hint: Some(format!(
                            "The checkpoint holds [{}]; this query needs [{}]. Use a new \
                             checkpoint_location.",
                            found.fields.join(", "),
                            meta.fields.join(", ")
                        )),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let text = serde_json::to_string(&meta)
                    .map_err(|e| Error::Internal(format!("encoding state metadata: {e}")))?;
                write_atomic(&meta_file, text.as_bytes())?;
            }
            Err(e) => return Err(Error::io(format!("reading {}", meta_file.display()), e)),
        }
        let sort_fields = schema.fields()[..key_columns]
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(MemoryStateStore {
            dir: dir.to_path_buf(),
            schema,
            key_columns,
            rows: vec![None; partitions],
            pending: vec![(vec![], vec![]); partitions],
            converter: RowConverter::new(sort_fields)?,
        })
    }

    fn partition_dir(&self, p: usize) -> PathBuf {
        self.dir.join(p.to_string())
    }

    /// Encoded keys of the first `key_columns` columns.
    fn keys(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let rows = self
            .converter
            .convert_columns(&batch.columns()[..self.key_columns])?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }

    fn partition_of(&self, key: &[u8]) -> usize {
        // FNV-1a: stable across builds, unlike std's hasher.
        let mut h: u64 = 0xcbf29ce484222325;
        for b in key {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        (h % self.rows.len() as u64) as usize
    }

    /// Splits a batch's rows by partition.
    fn split(&self, batch: &RecordBatch) -> Result<Vec<(RecordBatch, HashSet<Vec<u8>>)>> {
        let keys = self.keys(batch)?;
        let mut idx: Vec<Vec<u32>> = vec![vec![]; self.rows.len()];
        let mut sets: Vec<HashSet<Vec<u8>>> = vec![HashSet::new(); self.rows.len()];
        for (i, k) in keys.into_iter().enumerate() {
            let p = self.partition_of(&k);
            idx[p].push(i as u32);
            sets[p].insert(k);
        }
        idx.into_iter()
            .zip(sets)
            .map(|(ix, set)| {
                let ix = UInt32Array::from(ix);
                let cols = batch
                    .columns()
                    .iter()
                    .map(|c| take(c.as_ref(), &ix, None).map_err(Error::from))
                    .collect::<Result<Vec<_>>>()?;
                Ok((RecordBatch::try_new(batch.schema(), cols)?, set))
            })
            .collect()
    }

    /// Upserts and removes within one partition.
    fn apply_partition(
        &mut self,
        p: usize,
        upserts: &RecordBatch,
        removed_keys: &HashSet<Vec<u8>>,
        upsert_keys: &HashSet<Vec<u8>>,
    ) -> Result<u64> {
        let mut removed = 0;
        let kept = match self.rows[p].take() {
            None => None,
            Some(current) => {
                let keys = self.keys(&current)?;
                let keep: BooleanArray = keys
                    .iter()
                    .map(|k| {
                        let gone = removed_keys.contains(k);
                        if gone && !upsert_keys.contains(k) {
                            removed += 1;
                        }
                        Some(!gone && !upsert_keys.contains(k))
                    })
                    .collect();
                Some(filter_record_batch(&current, &keep)?)
            }
        };
        let merged = match kept {
            None if upserts.num_rows() == 0 => None,
            None => Some(upserts.clone()),
            Some(k) => Some(concat_batches(&self.schema, [&k, upserts])?),
        };
        self.rows[p] = merged.filter(|b| b.num_rows() > 0);
        Ok(removed)
    }

    fn delta_schema(&self) -> SchemaRef {
        let mut fields: Vec<Field> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        fields.push(Field::new(DELETED, DataType::Boolean, false));
        Arc::new(Schema::new(fields))
    }

    /// The rows of a delta file: upserts with `__deleted = false`, removed keys with `true`.
    fn delta_batch(&self, upserts: &[RecordBatch], removed: &[RecordBatch]) -> Result<RecordBatch> {
        let schema = self.delta_schema();
        let mut parts = Vec::new();
        for u in upserts.iter().filter(|b| b.num_rows() > 0) {
            let mut cols: Vec<ArrayRef> = u.columns().to_vec();
            cols.push(Arc::new(BooleanArray::from(vec![false; u.num_rows()])));
            parts.push(RecordBatch::try_new(schema.clone(), cols)?);
        }
        for r in removed.iter().filter(|b| b.num_rows() > 0) {
            let mut cols: Vec<ArrayRef> = r.columns()[..self.key_columns].to_vec();
            for f in &self.schema.fields()[self.key_columns..] {
                cols.push(new_null_array(f.data_type(), r.num_rows()));
            }
            cols.push(Arc::new(BooleanArray::from(vec![true; r.num_rows()])));
            parts.push(RecordBatch::try_new(schema.clone(), cols)?);
        }
        Ok(concat_batches(&schema, &parts)?)
    }

    fn read_ipc(file: &Path) -> Result<Vec<RecordBatch>> {
        let f =
            File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
        let reader = FileReader::try_new(f, None)?;
        reader.map(|b| b.map_err(Error::from)).collect()
    }

    fn write_ipc(file: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<()> {
        let mut buf = Vec::new();
        {
            let mut w = FileWriter::try_new(&mut buf, schema)?;
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
        write_atomic(file, &buf)
    }

    /// Applies a delta file's rows to partition `p`.
    fn apply_delta(&mut self, p: usize, delta: &RecordBatch) -> Result<()> {
        let deleted = delta
            .column(delta.num_columns() - 1)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| Error::Internal("corrupt state delta: no __deleted column".into()))?
            .clone();
        let cols: Vec<ArrayRef> = delta.columns()[..delta.num_columns() - 1].to_vec();
        let rows = RecordBatch::try_new(self.schema_nullable(), cols)?;
        let not_deleted = datafusion::arrow::compute::not(&deleted)?;
        let upserts = self.cast_to_schema(&filter_record_batch(&rows, &not_deleted)?)?;
        let removed = filter_record_batch(&rows, &deleted)?;
        let upsert_keys: HashSet<Vec<u8>> = self.keys(&upserts)?.into_iter().collect();
        let removed_keys: HashSet<Vec<u8>> = self.keys(&removed)?.into_iter().collect();
        self.apply_partition(p, &upserts, &removed_keys, &upsert_keys)?;
        Ok(())
    }

    fn schema_nullable(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true))
                .collect::<Vec<_>>(),
        ))
    }

    fn cast_to_schema(&self, b: &RecordBatch) -> Result<RecordBatch> {
        Ok(RecordBatch::try_new(
            self.schema.clone(),
            b.columns().to_vec(),
        )?)
    }

    fn versions(dir: &Path, ext: &str) -> Vec<u64> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return vec![];
        };
        let mut v: Vec<u64> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(ext)?.parse().ok()
            })
            .collect();
        v.sort();
        v
    }
}

impl StateStore for MemoryStateStore {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn load(&mut self, version: u64) -> Result<()> {
        for p in 0..self.rows.len() {
            self.rows[p] = None;
            self.pending[p] = (vec![], vec![]);
            if version == 0 {
                continue;
            }
            let dir = self.partition_dir(p);
            let snapshot = Self::versions(&dir, ".snapshot")
                .into_iter()
                .filter(|&v| v <= version)
                .max();
            let from = match snapshot {
                Some(s) => {
                    let batches = Self::read_ipc(&dir.join(format!("{s}.snapshot")))?;
                    let batches = batches
                        .iter()
                        .map(|b| self.cast_to_schema(b))
                        .collect::<Result<Vec<_>>>()?;
                    let all = concat_batches(&self.schema, &batches)?;
                    self.rows[p] = Some(all).filter(|b| b.num_rows() > 0);
                    s + 1
                }
                None => 1,
            };
            for v in from..=version {
                let file = dir.join(format!("{v}.delta"));
                if !file.exists() {
                    return Err(Error::Internal(format!(
                        "state version {v} of partition {p} is missing ({})",
                        file.display()
                    )));
                }
                for delta in Self::read_ipc(&file)? {
                    self.apply_delta(p, &delta)?;
                }
            }
        }
        Ok(())
    }

    fn rows(&self) -> Result<Vec<RecordBatch>> {
        Ok(self.rows.iter().flatten().cloned().collect())
    }

    fn apply(&mut self, rows: &RecordBatch, removed: &RecordBatch) -> Result<()> {
        let rows = self.cast_to_schema(rows)?;
        let ups = self.split(&rows)?;
        let rem = self.split(removed)?;
        for (p, ((u, uk), (r, rk))) in ups.into_iter().zip(rem).enumerate() {
            self.apply_partition(p, &u, &rk, &uk)?;
            self.pending[p].0.push(u);
            self.pending[p].1.push(r);
        }
        Ok(())
    }

    fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        let start = Instant::now();
        let mut m = StateMetrics::default();
        for p in 0..self.rows.len() {
            let dir = self.partition_dir(p);
            create_dir_all(&dir)?;
            let (ups, rems) = std::mem::take(&mut self.pending[p]);
            m.rows_updated += ups.iter().map(|b| b.num_rows() as u64).sum::<u64>();
            m.rows_removed += rems.iter().map(|b| b.num_rows() as u64).sum::<u64>();
            let delta = self.delta_batch(&ups, &rems)?;
            Self::write_ipc(
                &dir.join(format!("{version}.delta")),
                &delta.schema(),
                &[delta],
            )?;
            if version.is_multiple_of(SNAPSHOT_INTERVAL) {
                crate::testing::crash_point("mid_state_snapshot");
                let rows: Vec<RecordBatch> = self.rows[p].iter().cloned().collect();
                Self::write_ipc(
                    &dir.join(format!("{version}.snapshot")),
                    &self.schema,
                    &rows,
                )?;
                // Keep what loading any of the last MIN_BATCHES_TO_RETAIN versions needs.
                let keep_from = version.saturating_sub(MIN_BATCHES_TO_RETAIN + SNAPSHOT_INTERVAL);
                for ext in [".delta", ".snapshot"] {
                    for v in Self::versions(&dir, ext)
                        .into_iter()
                        .filter(|&v| v < keep_from)
                    {
                        let _ = std::fs::remove_file(dir.join(format!("{v}{ext}")));
                    }
                }
            }
            if let Some(b) = &self.rows[p] {
                m.rows_total += b.num_rows() as u64;
                m.memory_bytes += b.get_array_memory_size() as u64;
            }
        }
        m.commit_ms = start.elapsed().as_millis() as u64;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]))
    }

    fn batch(keys: &[&str], ns: &[i64]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from(keys.to_vec())),
                Arc::new(Int64Array::from(ns.to_vec())),
            ],
        )
        .unwrap()
    }

    fn contents(s: &MemoryStateStore) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for b in s.rows().unwrap() {
            let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let n = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            for i in 0..b.num_rows() {
                out.push((k.value(i).to_string(), n.value(i)));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn versions_survive_reopening_and_replays_start_from_the_right_one() {
        let dir = tempfile::tempdir().unwrap();
        let empty = batch(&[], &[]);
        let mut s = MemoryStateStore::open(dir.path(), schema(), 1, 4).unwrap();
        s.load(0).unwrap();
        s.apply(&batch(&["a", "b", "c"], &[1, 2, 3]), &empty)
            .unwrap();
        let m = s.commit(1).unwrap();
        assert_eq!((m.rows_total, m.rows_updated, m.rows_removed), (3, 3, 0));
        s.apply(&batch(&["b"], &[20]), &batch(&["a"], &[0]))
            .unwrap();
        s.commit(2).unwrap();
        // Version 3 is written by a batch that then "crashes": a reload of 2 ignores it.
        s.apply(&batch(&["z"], &[9]), &empty).unwrap();
        s.commit(3).unwrap();

        let mut r = MemoryStateStore::open(dir.path(), schema(), 1, 4).unwrap();
        r.load(2).unwrap();
        assert_eq!(contents(&r), vec![("b".into(), 20), ("c".into(), 3)]);
        r.load(1).unwrap();
        assert_eq!(
            contents(&r),
            vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
        );
    }

    #[test]
    fn snapshots_are_used_and_partitions_are_fixed() {
        let dir = tempfile::tempdir().unwrap();
        let empty = batch(&[], &[]);
        let mut s = MemoryStateStore::open(dir.path(), schema(), 1, 2).unwrap();
        for v in 1..=12 {
            s.apply(&batch(&["k"], &[v]), &empty).unwrap();
            s.commit(v as u64).unwrap();
        }
        let mut r = MemoryStateStore::open(dir.path(), schema(), 1, 2).unwrap();
        r.load(12).unwrap();
        assert_eq!(contents(&r), vec![("k".into(), 12)]);
        let e = MemoryStateStore::open(dir.path(), schema(), 1, 4)
            .err()
            .expect("other partition count refused");
        assert_eq!(e.sqlstate().code(), "22023");
        assert!(e.to_string().contains("2 partitions"), "{e}");
    }
}
