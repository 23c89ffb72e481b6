//! Streaming deduplication (spec §7): Spark's `dropDuplicates(cols)` and
//! `dropDuplicatesWithinWatermark(cols)`, behind the stateful-operator contract.
//!
//! `SELECT DISTINCT ...` and `SELECT DISTINCT ON (cols) ...` over a stream become a
//! `StatefulDedup` node (`engine::plan`) whose execution runs a [`DedupOperator`] over the
//! rows its input produced in the batch. Per batch:
//!
//! 1. rows whose event time (the input's first column carrying the watermark mark) is at or
//!    before `WM_late` are dropped as late, whether or not the time is a key;
//! 2. the first row of each key not yet in state is emitted and its key stored; the others
//!    are dropped as duplicates (`numDroppedDuplicateRows`);
//! 3. stored keys whose time is at or before `WM_evict` are evicted: the event time when it
//!    is a key column (`dropDuplicates`), or `event time + delay` of the first row kept
//!    (`dropDuplicatesWithinWatermark`). Without either, keys stay forever.
//!
//! State rows are the key columns, plus `expires_at` within the watermark; the emitted rows
//! are the input's rows, unchanged.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, TimestampMicrosecondArray, UInt32Array,
};
use datafusion::arrow::compute::{cast, concat_batches, filter_record_batch, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::row::{RowConverter, SortField};

use super::operator::OperatorBatch;
use crate::error::{Error, Result};
use crate::state::{StateLayout, StateMetrics, StateStore};

/// The state column that holds when a key expires (within the watermark).
pub const EXPIRES_AT: &str = "expires_at";

/// What a query's deduplication is, as the plan found it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct DedupInfo {
    /// The input columns whose values make the key, in order.
    pub keys: Vec<String>,
    /// The input's event-time column, if it has one: rows at or before `WM_late` are late.
    pub time: Option<String>,
    /// `dropDuplicatesWithinWatermark`: a key expires this long (µs) after the event time of
    /// the first row kept for it.
    pub within_watermark_us: Option<i64>,
}

impl DedupInfo {
    /// The index among the keys of the event-time column, if it is a key.
    fn time_key(&self) -> Option<usize> {
        let t = self.time.as_ref()?;
        self.keys.iter().position(|k| k == t)
    }

    /// Whether the watermark ever removes a key.
    pub fn evicts(&self) -> bool {
        self.within_watermark_us.is_some() || self.time_key().is_some()
    }

    /// What EXPLAIN shows after `StatefulDedup: id=N`.
    pub fn describe(&self) -> String {
        let keys = self.keys.join(", ");
        let rule = match (&self.time, self.within_watermark_us) {
            (Some(t), Some(delay)) => format!(
                " late: {t} <= WM(N-1); evict: {t} + {} <= WM(N)",
                crate::sql::options::format_duration(std::time::Duration::from_micros(
                    delay as u64
                ))
            ),
            (Some(t), None) if self.time_key().is_some() => {
                format!(" late/evict: {t} <= WM(N-1) / WM(N)")
            }
            (Some(t), None) => {
                format!(" late: {t} <= WM(N-1); {t} is not a key: nothing evicted")
            }
            (None, _) => " no watermarked column: nothing late, nothing evicted".to_string(),
        };
        let kind = if self.within_watermark_us.is_some() {
            "within watermark"
        } else {
            "first row"
        };
        format!("keys=[{keys}] keep={kind}{rule}")
    }
}

/// Spark's `StreamingDeduplicateExec` / `StreamingDeduplicateWithinWatermarkExec`.
pub struct DedupOperator {
    info: DedupInfo,
    state: Box<dyn StateStore>,
    input_schema: SchemaRef,
    /// Indices in the input of the key columns, and of the event time.
    key_indices: Vec<usize>,
    time_index: Option<usize>,
    keys: RowConverter,
}

/// Microseconds since the epoch of a timestamp column (NULL stays NULL).
fn micros(column: &ArrayRef) -> Result<ArrayRef> {
    let c = cast(column, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    Ok(cast(&c, &DataType::Int64)?)
}

impl DedupOperator {
    /// Builds the operator for rows of `input_schema`, over the store `open_store` opens.
    pub fn try_new(
        info: DedupInfo,
        input_schema: &Schema,
        partitions: usize,
        open_store: impl FnOnce(StateLayout) -> Result<Box<dyn StateStore>>,
    ) -> Result<DedupOperator> {
        let input_schema = Arc::new(input_schema.clone());
        let key_indices = info
            .keys
            .iter()
            .map(|k| Ok(input_schema.index_of(k)?))
            .collect::<Result<Vec<_>>>()?;
        let time_index = match &info.time {
            Some(t) => {
                let i = input_schema.index_of(t)?;
                // A timestamp, or a window over one (its end is the time, as in Spark).
                let ok = match input_schema.field(i).data_type() {
                    DataType::Timestamp(..) => true,
                    DataType::Struct(_) => info.within_watermark_us.is_none(),
                    _ => false,
                };
                if !ok {
                    return Err(Error::unsupported(format!(
                        "deduplication{} over the event-time column \"{t}\" of type {}: it \
                         must be a timestamp",
                        if info.within_watermark_us.is_some() {
                            " within the watermark"
                        } else {
                            ""
                        },
                        input_schema.field(i).data_type()
                    )));
                }
                Some(i)
            }
            None => None,
        };
        let mut fields: Vec<Field> = key_indices
            .iter()
            .map(|&i| input_schema.field(i).clone().with_nullable(true))
            .collect();
        if info.within_watermark_us.is_some() {
            fields.push(Field::new(
                EXPIRES_AT,
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ));
        }
        let time_column = match info.within_watermark_us {
            Some(_) => Some(key_indices.len()),
            None => info.time_key(),
        };
        let state = open_store(StateLayout {
            schema: Arc::new(Schema::new(fields)),
            key_columns: key_indices.len(),
            window_columns: 0,
            time_column,
            partitions,
            group_lookups: false,
        })?;
        let keys = RowConverter::new(
            key_indices
                .iter()
                .map(|&i| SortField::new(input_schema.field(i).data_type().clone()))
                .collect(),
        )?;
        Ok(DedupOperator {
            info,
            state,
            input_schema,
            key_indices,
            time_index,
            keys,
        })
    }

    pub fn info(&self) -> &DedupInfo {
        &self.info
    }

    pub fn state_mut(&mut self) -> &mut dyn StateStore {
        self.state.as_mut()
    }

    /// The state rows of `rows`: their key columns, and when they expire.
    fn state_rows(&self, rows: &RecordBatch) -> Result<RecordBatch> {
        let schema = self.state.schema();
        let mut cols: Vec<ArrayRef> = self
            .key_indices
            .iter()
            .zip(schema.fields())
            .map(|(&i, f)| {
                let c = rows.column(i);
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    Ok(cast(c, f.data_type())?)
                }
            })
            .collect::<Result<_>>()?;
        if let Some(delay) = self.info.within_watermark_us {
            let t = match self.time_index {
                Some(t) => micros(rows.column(t))?,
                None => {
                    return Err(Error::Internal(
                        "deduplication within the watermark without an event time".into(),
                    ));
                }
            };
            let expires: TimestampMicrosecondArray = t
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.map(|v| v.saturating_add(delay)))
                .collect();
            cols.push(Arc::new(expires));
        }
        Ok(RecordBatch::try_new(schema, cols)?)
    }

    /// Runs one batch: `WM_late` judges late rows, `WM_evict` evicts keys (µs).
    pub fn process(
        &mut self,
        rows: Vec<RecordBatch>,
        wm_late_us: i64,
        wm_evict_us: i64,
    ) -> Result<OperatorBatch> {
        let mut out = OperatorBatch::default();
        let started = Instant::now();
        let mut input = Vec::with_capacity(rows.len());
        for b in rows {
            let b = RecordBatch::try_new(self.input_schema.clone(), b.columns().to_vec())?;
            let b = out.keep_on_time(b, self.time_index, wm_late_us)?;
            if b.num_rows() > 0 {
                input.push(b);
            }
        }
        let input = concat_batches(&self.input_schema, &input)?;
        let mut duplicates = 0;
        if input.num_rows() > 0 {
            let key_columns: Vec<ArrayRef> = self
                .key_indices
                .iter()
                .map(|&i| input.column(i).clone())
                .collect();
            let keys = self.keys.convert_columns(&key_columns)?;
            // The first row of each key in the batch (NULLs equal, as in Spark).
            let mut seen = HashSet::with_capacity(input.num_rows());
            let first: Vec<u32> = (0..input.num_rows())
                .filter(|&i| seen.insert(keys.row(i)))
                .map(|i| i as u32)
                .collect();
            let candidates = take_record_batch(&input, &UInt32Array::from(first.clone()))?;
            let candidate_state = self.state_rows(&candidates)?;
            let stored = self.state.get(&candidate_state)?;
            let stored_columns: Vec<ArrayRef> = stored.columns()[..self.key_indices.len()]
                .iter()
                .zip(&key_columns)
                .map(|(c, k)| {
                    if c.data_type() == k.data_type() {
                        Ok(c.clone())
                    } else {
                        Ok(cast(c, k.data_type())?)
                    }
                })
                .collect::<Result<_>>()?;
            let stored_keys = self.keys.convert_columns(&stored_columns)?;
            let stored: HashSet<_> = stored_keys.iter().collect();
            let new: BooleanArray = first
                .iter()
                .map(|&i| Some(!stored.contains(&keys.row(i as usize))))
                .collect();
            let emitted = filter_record_batch(&candidates, &new)?;
            let added = filter_record_batch(&candidate_state, &new)?;
            self.state
                .apply(&added, &RecordBatch::new_empty(self.state.schema()))?;
            out.rows_updated = added.num_rows() as u64;
            duplicates = (input.num_rows() - emitted.num_rows()) as u64;
            if emitted.num_rows() > 0 {
                out.emitted.push(emitted.columns().to_vec());
            }
        }
        out.all_updates_ms = started.elapsed().as_millis() as u64;
        let started = Instant::now();
        if self.info.evicts() && wm_evict_us > 0 {
            out.rows_removed = self.state.evict_expired(wm_evict_us)?.num_rows() as u64;
        }
        out.all_removals_ms = started.elapsed().as_millis() as u64;
        out.custom_metrics = vec![("numDroppedDuplicateRows", duplicates)];
        Ok(out)
    }

    pub fn commit(&mut self, version: u64) -> Result<StateMetrics> {
        self.state.commit(version)
    }

    pub fn maintain(&mut self) -> Result<()> {
        self.state.maintain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StoreKind;
    use datafusion::arrow::array::{StringArray, TimestampMicrosecondArray};

    const MIN: i64 = 60_000_000;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("user_id", DataType::Utf8, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ]))
    }

    fn rows(v: &[(Option<&str>, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(StringArray::from_iter(v.iter().map(|r| r.0))),
                Arc::new(TimestampMicrosecondArray::from_iter_values(
                    v.iter().map(|r| r.1 * MIN),
                )),
            ],
        )
        .unwrap()
    }

    /// The operator over an empty state (version 0), as a query's first batch opens it.
    fn op(info: DedupInfo, dir: &std::path::Path, kind: StoreKind) -> DedupOperator {
        let mut op = DedupOperator::try_new(info, &schema(), 2, |layout| {
            crate::state::open(kind, dir, layout)
        })
        .unwrap();
        op.state_mut().load(0).unwrap();
        op
    }

    /// The stores this build has: every test runs on each.
    fn kinds() -> Vec<StoreKind> {
        let mut k = vec![StoreKind::Memory];
        if cfg!(feature = "rocksdb") {
            k.push(StoreKind::Rocksdb);
        }
        k
    }

    /// The emitted `(user, minute)` pairs and the duplicates count.
    fn emitted(b: &OperatorBatch) -> (Vec<(Option<String>, i64)>, u64) {
        let mut out = vec![];
        for cols in &b.emitted {
            let u = cols[0].as_string::<i32>();
            let t = micros(&cols[1]).unwrap();
            let t = t.as_primitive::<Int64Type>();
            for i in 0..u.len() {
                out.push((
                    (!u.is_null(i)).then(|| u.value(i).to_string()),
                    t.value(i) / MIN,
                ));
            }
        }
        (out, b.custom_metrics[0].1)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn the_first_row_of_a_key_wins_and_a_key_with_its_time_is_evicted_by_the_watermark() {
        for kind in kinds() {
            let dir = tempfile::tempdir().unwrap();
            let mut d = op(
                DedupInfo {
                    keys: vec!["user_id".into(), "t".into()],
                    time: Some("t".into()),
                    within_watermark_us: None,
                },
                dir.path(),
                kind,
            );
            // One batch: a duplicate inside it, and NULL keys equal to each other.
            let b = d
                .process(
                    vec![rows(&[
                        (Some("a"), 10),
                        (Some("a"), 10),
                        (None, 11),
                        (None, 11),
                    ])],
                    0,
                    0,
                )
                .unwrap();
            assert_eq!(emitted(&b), (vec![(s("a"), 10), (None, 11)], 2));
            assert_eq!(b.rows_updated, 2);
            // The next batch: a duplicate of the stored key; eviction at WM 10 removes (a, 10).
            let b = d
                .process(vec![rows(&[(Some("a"), 10), (Some("b"), 12)])], 0, 10 * MIN)
                .unwrap();
            assert_eq!(emitted(&b), (vec![(s("b"), 12)], 1));
            assert_eq!(b.rows_removed, 1);
            // (a, 10) again is now late (10 <= WM_late), not a new row.
            let b = d
                .process(
                    vec![rows(&[(Some("a"), 10), (Some("c"), 30)])],
                    10 * MIN,
                    10 * MIN,
                )
                .unwrap();
            assert_eq!(emitted(&b), (vec![(s("c"), 30)], 0));
            assert_eq!(b.dropped_late, 1);
        }
    }

    #[test]
    fn within_the_watermark_a_key_expires_delay_after_its_first_row() {
        for kind in kinds() {
            let dir = tempfile::tempdir().unwrap();
            let mut d = op(
                DedupInfo {
                    keys: vec!["user_id".into()],
                    time: Some("t".into()),
                    within_watermark_us: Some(10 * MIN),
                },
                dir.path(),
                kind,
            );
            let b = d.process(vec![rows(&[(Some("g"), 0)])], 0, 0).unwrap();
            assert_eq!(emitted(&b).0, vec![(s("g"), 0)]);
            // A later duplicate does not move the expiry (0 + 10 minutes).
            let b = d
                .process(vec![rows(&[(Some("g"), 8)])], 0, 9 * MIN)
                .unwrap();
            assert_eq!(emitted(&b), (vec![], 1));
            assert_eq!(b.rows_removed, 0);
            let b = d.process(vec![], 9 * MIN, 10 * MIN).unwrap();
            assert_eq!(b.rows_removed, 1);
            // Expired: the key is emitted again.
            let b = d
                .process(vec![rows(&[(Some("g"), 25)])], 10 * MIN, 10 * MIN)
                .unwrap();
            assert_eq!(emitted(&b).0, vec![(s("g"), 25)]);
        }
    }

    #[test]
    fn keys_without_the_event_time_are_never_evicted_but_late_rows_still_drop() {
        for kind in kinds() {
            let dir = tempfile::tempdir().unwrap();
            let info = DedupInfo {
                keys: vec!["user_id".into()],
                time: Some("t".into()),
                within_watermark_us: None,
            };
            assert!(!info.evicts());
            let mut d = op(info, dir.path(), kind);
            d.process(vec![rows(&[(Some("a"), 10)])], 0, 0).unwrap();
            let b = d
                .process(
                    vec![rows(&[(Some("a"), 50), (Some("b"), 5)])],
                    20 * MIN,
                    60 * MIN,
                )
                .unwrap();
            assert_eq!(emitted(&b), (vec![], 1));
            assert_eq!((b.dropped_late, b.rows_removed), (1, 0));
            // State survives a commit and a reload.
            d.commit(1).unwrap();
            let info = d.info().clone();
            drop(d);
            let mut again = op(info, dir.path(), kind);
            again.state_mut().load(1).unwrap();
            let b = again.process(vec![rows(&[(Some("a"), 70)])], 0, 0).unwrap();
            assert_eq!(emitted(&b), (vec![], 1));
        }
    }
}
