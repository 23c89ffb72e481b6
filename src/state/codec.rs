//! State rows as byte keys and values, shared by every store.
//!
//! A row's key is `partition (2 bytes, big-endian) ++ row-format(group columns ++ window
//! columns)`, its value `row-format(value columns)` (Arrow's row format: comparable,
//! self-delimiting per column, so the encoding of the group columns alone is a prefix of
//! every key of that group). The partition is a stable hash (FNV-1a) of the group bytes
//! modulo `state_partitions`. Encoding is vectorized: a batch's keys go into one buffer
//! ([`Encoded`]), never one allocation per key; decoding builds Arrow arrays from borrowed
//! byte slices.
//!
//! `<dir>/_metadata` records the store, the partition count and the row shape, and a
//! checkpoint whose state was written with another one is refused, naming the difference.

use std::path::Path;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::{cast, is_null};
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema, TimeUnit};
use datafusion::arrow::ipc::CompressionType;
use datafusion::arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use datafusion::arrow::row::{RowConverter, SortField};
use serde::{Deserialize, Serialize};

use super::{StateLayout, StoreKind};
use crate::error::{Error, Result};
use crate::fsutil::write_atomic;

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
    /// RocksDB store: whether rows are ordered by time first (see `kv.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ordered_by_time: Option<bool>,
}

fn describe_fields(schema: &Schema) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect()
}

fn read_metadata(dir: &Path) -> Result<Option<Metadata>> {
    let meta_file = dir.join("_metadata");
    let text = match std::fs::read_to_string(&meta_file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", meta_file.display()), e)),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        Error::Internal(format!(
            "corrupt state metadata {}: {e}",
            meta_file.display()
        ))
    })
}

/// The store kind recorded in an operator state directory.
pub fn stored_kind(dir: &Path) -> Result<StoreKind> {
    read_metadata(dir)?.map(|m| m.store).ok_or_else(|| {
        Error::Internal(format!(
            "{} has no state metadata",
            dir.join("_metadata").display()
        ))
    })
}

/// Writes the metadata of a new store in `dir`, or checks that of an existing one against
/// `layout` and `kind`.
pub fn check_metadata(dir: &Path, layout: &StateLayout, kind: StoreKind) -> Result<()> {
    let meta = Metadata {
        format_version: kind.format_version(),
        store: kind,
        partitions: layout.partitions,
        key_columns: layout.key_columns,
        fields: describe_fields(&layout.schema),
        ordered_by_time: (kind == StoreKind::Rocksdb).then(|| layout.orders_by_time()),
    };
    let Some(found) = read_metadata(dir)? else {
        let text = serde_json::to_string(&meta)
            .map_err(|e| Error::Internal(format!("encoding state metadata: {e}")))?;
        return write_atomic(&dir.join("_metadata"), text.as_bytes());
    };
    let incompatible =
        |message: String, hint: String| Error::IncompatibleCheckpoint { message, hint };
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
    if found.format_version != meta.format_version {
        return Err(incompatible(
            format!(
                "the checkpoint's state has format version {}, this build reads {}",
                found.format_version, meta.format_version
            ),
            "Use a new checkpoint_location, or the Tidemark version that wrote it.".into(),
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
    if found != meta {
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

/// A writer of an LZ4-compressed Arrow IPC file: the stores' delta, changelog and snapshot
/// files.
pub fn ipc_file_writer<W: std::io::Write>(out: W, schema: &Schema) -> Result<FileWriter<W>> {
    let options =
        IpcWriteOptions::default().try_with_compression(Some(CompressionType::LZ4_FRAME))?;
    Ok(FileWriter::try_new_with_options(out, schema, options)?)
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

/// Byte strings in one buffer: string `i` is `data[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Default, Clone)]
pub struct Encoded {
    data: Vec<u8>,
    offsets: Vec<usize>,
}

impl Encoded {
    pub fn with_capacity(items: usize, bytes: usize) -> Encoded {
        let mut offsets = Vec::with_capacity(items + 1);
        offsets.push(0);
        Encoded {
            data: Vec::with_capacity(bytes),
            offsets,
        }
    }

    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> &[u8] {
        &self.data[self.offsets[i]..self.offsets[i + 1]]
    }

    pub fn push(&mut self, parts: &[&[u8]]) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        for p in parts {
            self.data.extend_from_slice(p);
        }
        self.offsets.push(self.data.len());
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.capacity() + self.offsets.capacity() * size_of::<usize>()
    }
}

/// Encodes and decodes the state rows of one layout.
pub struct Codec {
    pub layout: StateLayout,
    /// Group columns, then window columns: the key's encoding order.
    key_order: Vec<usize>,
    group_columns: Vec<usize>,
    value_columns: Vec<usize>,
    key_conv: Option<RowConverter>,
    group_conv: Option<RowConverter>,
    value_conv: Option<RowConverter>,
}

impl Codec {
    pub fn new(layout: StateLayout) -> Result<Codec> {
        let schema = layout.schema.clone();
        let group_columns: Vec<usize> = (layout.window_columns..layout.key_columns).collect();
        let mut key_order = group_columns.clone();
        key_order.extend(0..layout.window_columns);
        let value_columns: Vec<usize> = (layout.key_columns..schema.fields().len()).collect();
        Ok(Codec {
            key_conv: converter(&schema, &key_order)?,
            group_conv: converter(&schema, &group_columns)?,
            value_conv: converter(&schema, &value_columns)?,
            layout,
            key_order,
            group_columns,
            value_columns,
        })
    }

    fn partition_prefix(&self, group: &[u8]) -> [u8; 2] {
        let p = (fnv1a(group) % self.layout.partitions.max(1) as u64) as u16;
        p.to_be_bytes()
    }

    fn rows(
        conv: &Option<RowConverter>,
        batch: &RecordBatch,
        columns: &[usize],
    ) -> Result<Option<datafusion::arrow::row::Rows>> {
        match conv {
            None => Ok(None),
            Some(c) => {
                let cols: Vec<ArrayRef> =
                    columns.iter().map(|&i| batch.column(i).clone()).collect();
                Ok(Some(c.convert_columns(&cols)?))
            }
        }
    }

    /// The full keys of `batch`'s rows (its first columns are the key columns).
    pub fn keys(&self, batch: &RecordBatch) -> Result<Encoded> {
        let n = batch.num_rows();
        let groups = Self::rows(&self.group_conv, batch, &self.group_columns)?;
        let full = Self::rows(&self.key_conv, batch, &self.key_order)?;
        let bytes = full.as_ref().map_or(0, |r| r.size());
        let mut out = Encoded::with_capacity(n, bytes + 2 * n);
        for i in 0..n {
            let g = groups.as_ref().map_or(&[][..], |r| r.row(i).data());
            let f = full.as_ref().map_or(&[][..], |r| r.row(i).data());
            out.push(&[&self.partition_prefix(g), f]);
        }
        Ok(out)
    }

    /// `partition ++ group` of `batch`'s rows: the prefix of every key of their groups.
    pub fn group_prefixes(&self, batch: &RecordBatch) -> Result<Encoded> {
        let n = batch.num_rows();
        let groups = Self::rows(&self.group_conv, batch, &self.group_columns)?;
        let mut out = Encoded::with_capacity(n, groups.as_ref().map_or(0, |r| r.size()) + 2 * n);
        for i in 0..n {
            let g = groups.as_ref().map_or(&[][..], |r| r.row(i).data());
            out.push(&[&self.partition_prefix(g), g]);
        }
        Ok(out)
    }

    /// The values of `batch`'s rows.
    pub fn values(&self, batch: &RecordBatch) -> Result<Encoded> {
        let n = batch.num_rows();
        let rows = Self::rows(&self.value_conv, batch, &self.value_columns)?;
        let mut out = Encoded::with_capacity(n, rows.as_ref().map_or(0, |r| r.size()));
        for i in 0..n {
            out.push(&[rows.as_ref().map_or(&[][..], |r| r.row(i).data())]);
        }
        Ok(out)
    }

    /// The time of each row, from the layout's time column: a timestamp, or a window's end.
    pub fn times(&self, batch: &RecordBatch) -> Result<Vec<Option<i64>>> {
        let Some(col) = self.layout.time_column else {
            return Ok(vec![None; batch.num_rows()]);
        };
        let column = batch.column(col);
        let column = match column.data_type() {
            DataType::Struct(fields) => {
                let end = fields.iter().position(|f| f.name() == "end").unwrap_or(1);
                let s = column.as_struct();
                if end >= s.num_columns() {
                    return Err(Error::Internal(format!(
                        "state time column {col} is a struct without an end"
                    )));
                }
                // A NULL window has no time.
                datafusion::arrow::compute::nullif(s.column(end), &is_null(column)?)?
            }
            _ => column.clone(),
        };
        let c = cast(&column, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
        let c = cast(&c, &DataType::Int64)?;
        Ok(c.as_primitive::<Int64Type>().iter().collect())
    }

    /// Rows from `(key, value)` byte strings.
    pub fn decode<'a, I>(&self, entries: I) -> Result<RecordBatch>
    where
        I: Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
    {
        let schema = &self.layout.schema;
        if entries.clone().next().is_none() {
            return Ok(RecordBatch::new_empty(schema.clone()));
        }
        let mut cols: Vec<Option<ArrayRef>> = vec![None; schema.fields().len()];
        if let Some(conv) = &self.key_conv {
            let parser = conv.parser();
            let decoded = conv.convert_rows(entries.clone().map(|(k, _)| parser.parse(&k[2..])))?;
            for (pos, &i) in self.key_order.iter().enumerate() {
                cols[i] = Some(decoded[pos].clone());
            }
        }
        if let Some(conv) = &self.value_conv {
            let parser = conv.parser();
            let decoded = conv.convert_rows(entries.map(|(_, v)| parser.parse(v)))?;
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
}
