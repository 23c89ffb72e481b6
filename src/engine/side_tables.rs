//! Side tables (beyond Spark): rows a query would otherwise drop without a trace, kept in a
//! Delta table beside its sink or view.
//!
//! With `late_rows = 'table'`, a sink or view `name` writes to the table `name_late_rows`
//! (made at `CREATE`, an ordinary table afterwards) one row per input row it dropped:
//! - `reason = 'late'`: a stateful operator dropped the row as late (its event time at or
//!   before `WM(N-1)`, spec §3); `operator` is the operator's name and id, the row is the
//!   operator's input row;
//! - `reason = 'skew'`: with `max_event_time_skew`, the row's event time was further ahead
//!   of its batch's processing time (`batchTimestampMs`) than the skew: it neither moves
//!   the watermark nor reaches the query (one future-dated row cannot make every later row
//!   late); `operator` is the watermark node, the row is the stream's row.
//!
//! Each row carries the batch id, the watermark that judged it, its event time and the
//! whole row as JSON.
//!
//! With `malformed_rows = 'table'`, it writes to `name_malformed_rows` one row per input
//! record that did not parse (JSON or CSV files, whatever the stream's `mode`): the batch
//! id, the stream, the file, the line number, the raw line and the decoder's reason.
//!
//! A batch's rows are appended with Delta's `txn(query id + "/<option>", batch id)` before
//! the batch's commit-log entry, so a replayed batch writes them once.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::aggregate::time_micros;
use crate::error::{Error, Result};

/// A kind of side table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideTable {
    /// `late_rows = 'table'`: rows the watermark dropped or the skew guard set aside.
    LateRows,
    /// `malformed_rows = 'table'`: input records that did not parse.
    MalformedRows,
}

impl SideTable {
    pub const ALL: [SideTable; 2] = [SideTable::LateRows, SideTable::MalformedRows];

    /// The option that asks for it, and the suffix of its table's name.
    fn option(self) -> &'static str {
        match self {
            SideTable::LateRows => "late_rows",
            SideTable::MalformedRows => "malformed_rows",
        }
    }

    /// The side table of sink or view `name`: `name_late_rows`, `name_malformed_rows`.
    pub fn table(self, name: &str) -> String {
        format!("{name}_{}", self.option())
    }

    /// The app id of a query's commits to it: a batch's rows are appended with
    /// `txn(app id, batch id)`, so a replay writes them once.
    pub fn app_id(self, query_id: &str) -> String {
        format!("{query_id}/{}", self.option())
    }

    /// Its columns.
    pub fn schema(self) -> SchemaRef {
        match self {
            SideTable::LateRows => late_rows_schema(),
            SideTable::MalformedRows => malformed_rows_schema(),
        }
    }

    /// Whether a sink's or view's options ask for it (`<option> = 'table'`).
    pub fn wanted(self, options: &crate::sql::options::Options) -> bool {
        options
            .get(self.option())
            .is_some_and(|v| v.eq_ignore_ascii_case("table"))
    }

    /// The side tables a sink's or view's options ask for.
    pub fn wanted_by(options: &crate::sql::options::Options) -> Vec<SideTable> {
        Self::ALL
            .into_iter()
            .filter(|k| k.wanted(options))
            .collect()
    }
}

/// The columns of a late-rows table.
fn late_rows_schema() -> SchemaRef {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    Arc::new(Schema::new(vec![
        Field::new("batch_id", DataType::Int64, false),
        Field::new("operator", DataType::Utf8, false),
        Field::new("reason", DataType::Utf8, false),
        Field::new("watermark", ts.clone(), true),
        Field::new("event_time", ts, true),
        Field::new("row", DataType::Utf8, false),
    ]))
}

/// The columns of a malformed-rows table (`path`, `record` and `reason` as in Databricks'
/// `badRecordsPath` files).
fn malformed_rows_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("batch_id", DataType::Int64, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("line_number", DataType::Int64, false),
        Field::new("record", DataType::Utf8, false),
        Field::new("reason", DataType::Utf8, false),
    ]))
}

/// `records`, read by stream `stream` in batch `batch_id`, as rows of the malformed-rows
/// table.
pub fn malformed_rows(
    batch_id: i64,
    stream: &str,
    records: &[crate::source::MalformedRecord],
) -> Result<RecordBatch> {
    let n = records.len();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![batch_id; n])),
        Arc::new(StringArray::from(vec![stream; n])),
        Arc::new(StringArray::from_iter_values(
            records.iter().map(|r| r.path.as_str()),
        )),
        Arc::new(Int64Array::from_iter_values(
            records
                .iter()
                .map(|r| i64::try_from(r.record.line).unwrap_or(i64::MAX)),
        )),
        Arc::new(StringArray::from_iter_values(
            records.iter().map(|r| r.record.text.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            records.iter().map(|r| r.record.error.as_str()),
        )),
    ];
    Ok(RecordBatch::try_new(malformed_rows_schema(), columns)?)
}

/// The `max_event_time_skew` option in microseconds, if set.
pub fn skew_of(options: &crate::sql::options::Options) -> Result<Option<i64>> {
    options
        .get("max_event_time_skew")
        .map(|v| {
            let d = crate::sql::options::parse_duration(v)?;
            Ok(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        })
        .transpose()
}

/// Rows an operator (or a watermark node) dropped, as its input; their event time is in
/// column `time`.
#[derive(Debug, Clone)]
pub struct DroppedRows {
    pub rows: RecordBatch,
    pub time: usize,
}

/// Why rows went to the side table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Late,
    Skew,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Late => "late",
            Reason::Skew => "skew",
        }
    }
}

/// `dropped` as rows of the late-rows table.
pub fn late_rows(
    batch_id: i64,
    operator: &str,
    reason: Reason,
    watermark_us: i64,
    dropped: &DroppedRows,
) -> Result<RecordBatch> {
    let n = dropped.rows.num_rows();
    // The operator's own columns (`__window_start`) under the names users know.
    let fields: Vec<Field> = dropped
        .rows
        .schema()
        .fields()
        .iter()
        .map(|f| {
            let name = f.name().trim_start_matches("__");
            f.as_ref().clone().with_name(name)
        })
        .collect();
    let named = RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        dropped.rows.columns().to_vec(),
    )?;
    let mut json = datafusion::arrow::json::LineDelimitedWriter::new(Vec::new());
    json.write(&named)?;
    json.finish()?;
    let text = String::from_utf8(json.into_inner())
        .map_err(|e| Error::Internal(format!("a row as JSON: {e}")))?;
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() != n {
        return Err(Error::Internal(format!(
            "{n} dropped rows gave {} JSON lines",
            lines.len()
        )));
    }
    let times = time_micros(dropped.rows.column(dropped.time))?;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![batch_id; n])),
        Arc::new(StringArray::from(vec![operator; n])),
        Arc::new(StringArray::from(vec![reason.as_str(); n])),
        Arc::new(TimestampMicrosecondArray::from(vec![watermark_us; n])),
        Arc::new(TimestampMicrosecondArray::new(
            times.values().clone(),
            times.nulls().cloned(),
        )),
        Arc::new(StringArray::from(lines)),
    ];
    Ok(RecordBatch::try_new(late_rows_schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;

    #[test]
    fn dropped_rows_keep_the_whole_row_and_its_time() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        ]));
        let rows = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![Some("/a"), None])),
                Arc::new(TimestampMicrosecondArray::from(vec![
                    Some(60_000_000),
                    None,
                ])),
            ],
        )
        .unwrap();
        let out = late_rows(
            3,
            "stateStoreSave 0",
            Reason::Late,
            120_000_000,
            &DroppedRows { rows, time: 1 },
        )
        .unwrap();
        assert_eq!(out.num_rows(), 2);
        let json = out.column(5).as_string::<i32>();
        let first: serde_json::Value = serde_json::from_str(json.value(0)).unwrap();
        assert_eq!(first["page"], "/a");
        assert_eq!(first["t"], "1970-01-01T00:01:00");
        let second: serde_json::Value = serde_json::from_str(json.value(1)).unwrap();
        assert!(second.get("page").is_none(), "NULL columns are left out");
        let times = out.column(4);
        assert!(times.is_valid(0) && times.is_null(1));
        assert_eq!(out.column(2).as_string::<i32>().value(0), "late");
    }
}
