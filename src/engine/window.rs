//! Time windows (spec §4.1): which `[start, end)` windows a row belongs to.
//!
//! Windows are aligned to the Unix epoch plus `start`, in UTC, on microseconds. A row at
//! time `t` belongs to every window `[s, s + size)` with `s = last_start - k * slide`,
//! `last_start = t - ((t - start) mod slide)`, for which `s <= t < s + size`.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, RecordBatch, StructArray, UInt32Array,
};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit, TimestampMicrosecondType};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use datafusion::scalar::ScalarValue;

use crate::error::{Error, Result};
use crate::sql::options::parse_duration;

/// The name of the column that carries each row's window start.
pub const WINDOW_START: &str = "__window_start";
/// The name of the column that carries each row's window end.
pub const WINDOW_END: &str = "__window_end";

/// `window(ts, size [, slide [, start]])`, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    pub size: i64,
    pub slide: i64,
    pub start: i64,
}

fn us(d: Duration) -> i64 {
    d.as_micros() as i64
}

impl WindowSpec {
    /// Checks Spark's rules: size > 0, 0 < slide <= size, |start| < slide.
    pub fn try_new(size: Duration, slide: Option<Duration>, start: Option<i64>) -> Result<Self> {
        let size = us(size);
        let slide = slide.map(us).unwrap_or(size);
        let start = start.unwrap_or(0);
        let bad = |m: &str| Error::invalid_option(format!("invalid window: {m}"));
        if size <= 0 {
            return Err(bad("the window duration must be positive"));
        }
        if slide <= 0 {
            return Err(bad("the slide duration must be positive"));
        }
        if slide > size {
            return Err(bad(
                "the slide duration must not exceed the window duration",
            ));
        }
        if start.abs() >= slide {
            return Err(bad(
                "the start offset must be smaller than the slide duration",
            ));
        }
        Ok(WindowSpec { size, slide, start })
    }

    /// At most how many windows one row belongs to.
    pub fn max_windows(&self) -> i64 {
        (self.size + self.slide - 1) / self.slide
    }

    /// The windows of one time, oldest first.
    pub fn windows_of(&self, t: i64) -> Vec<(i64, i64)> {
        let r = (t - self.start).rem_euclid(self.slide);
        let last = t - r;
        let mut out: Vec<(i64, i64)> = (0..self.max_windows())
            .map(|k| last - k * self.slide)
            .filter(|&s| s <= t && t < s + self.size)
            .map(|s| (s, s + self.size))
            .collect();
        out.reverse();
        out
    }

    pub fn is_tumbling(&self) -> bool {
        self.size == self.slide
    }
}

/// Appends [`WINDOW_START`] and [`WINDOW_END`] to `batch`, one output row per (row, window).
/// Rows whose time is NULL belong to no window and are dropped (spec §4.1).
pub fn assign(batch: &RecordBatch, time_col: usize, spec: &WindowSpec) -> Result<RecordBatch> {
    let time = batch.column(time_col);
    let tz = match time.data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => {
            return Err(Error::invalid_option(format!(
                "window() needs a TIMESTAMP column, not {other}"
            )));
        }
    };
    let micros = cast(
        time,
        &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
    )?;
    let micros = micros.as_primitive::<TimestampMicrosecondType>();
    let n = batch.num_rows();
    let mut indices: Vec<u32> = Vec::with_capacity(n * spec.max_windows() as usize);
    let mut starts: Vec<i64> = Vec::with_capacity(indices.capacity());
    for k in 0..spec.max_windows() {
        for i in 0..n {
            if micros.is_null(i) {
                continue;
            }
            let t = micros.value(i);
            let s = t - (t - spec.start).rem_euclid(spec.slide) - k * spec.slide;
            if s <= t && t < s + spec.size {
                indices.push(i as u32);
                starts.push(s);
            }
        }
    }
    // Each row in exactly one window, in order (a tumbling window and no NULL time): the
    // rows are the input's, and its columns are kept as they are instead of copied.
    let mut columns: Vec<ArrayRef> = if spec.max_windows() == 1 && indices.len() == n {
        batch.columns().to_vec()
    } else {
        let indices = UInt32Array::from(indices);
        batch
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &indices, None).map_err(Error::from))
            .collect::<Result<_>>()?
    };
    let ts_type = DataType::Timestamp(TimeUnit::Microsecond, tz);
    let ends: Int64Array = starts
        .iter()
        .map(|s| s + spec.size)
        .collect::<Vec<_>>()
        .into();
    let starts: Int64Array = starts.into();
    columns.push(cast(&(Arc::new(starts) as ArrayRef), &ts_type)?);
    columns.push(cast(&(Arc::new(ends) as ArrayRef), &ts_type)?);
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(WINDOW_START, ts_type.clone(), true));
    fields.push(Field::new(WINDOW_END, ts_type, true));
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// The type of the `window` column: `struct<start: timestamp, end: timestamp>`.
pub fn window_type(tz: Option<Arc<str>>) -> DataType {
    let ts = DataType::Timestamp(TimeUnit::Microsecond, tz);
    DataType::Struct(
        vec![
            Field::new("start", ts.clone(), true),
            Field::new("end", ts, true),
        ]
        .into(),
    )
}

/// The type `window()` and `session_window()` return for a time column of type `time`.
fn window_return_type(function: &str, time: &DataType) -> datafusion::error::Result<DataType> {
    match time {
        DataType::Timestamp(_, tz) => Ok(window_type(tz.clone())),
        other => datafusion::common::plan_err!(
            "{function}() needs a TIMESTAMP as its first argument, not {other}"
        ),
    }
}

/// Reads a duration argument of `window(...)`: a string such as `'5 minutes'` or an
/// interval literal.
pub fn duration_arg(v: &ScalarValue) -> Result<Duration> {
    let bad = || Error::invalid_option(format!("window durations are literals, not {v}"));
    match v {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => parse_duration(s),
        ScalarValue::IntervalMonthDayNano(Some(i)) => {
            if i.months != 0 {
                return Err(Error::invalid_option(
                    "window durations in months or years are not allowed",
                ));
            }
            let nanos = i.days as i128 * 86_400_000_000_000 + i.nanoseconds as i128;
            u64::try_from(nanos / 1000)
                .map(Duration::from_micros)
                .map_err(|_| bad())
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            let ms = i.days as i64 * 86_400_000 + i.milliseconds as i64;
            u64::try_from(ms)
                .map(Duration::from_millis)
                .map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// Reads the window spec of `window(ts, size [, slide [, start]])` from its literal arguments.
pub fn spec_from_args(args: &[ScalarValue]) -> Result<WindowSpec> {
    let size = duration_arg(&args[0])?;
    let slide = args.get(1).map(duration_arg).transpose()?;
    let start = args
        .get(2)
        .map(|a| duration_arg(a).map(|d| d.as_micros() as i64))
        .transpose()?;
    WindowSpec::try_new(size, slide, start)
}

/// `window(ts, size [, slide [, start]])` as a scalar function. A sink's GROUP BY is
/// planned by the streaming engine, which expands sliding windows itself; evaluated as a
/// plain function (in a batch query), only tumbling windows are possible.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct WindowUdf {
    signature: Signature,
}

impl Default for WindowUdf {
    fn default() -> Self {
        WindowUdf {
            signature: Signature::one_of(
                vec![
                    TypeSignature::Any(2),
                    TypeSignature::Any(3),
                    TypeSignature::Any(4),
                ],
                Volatility::Immutable,
            ),
        }
    }
}

impl ScalarUDFImpl for WindowUdf {
    fn name(&self) -> &str {
        "window"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        window_return_type(self.name(), &args[0])
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let literals = args.args[1..]
            .iter()
            .map(|a| match a {
                ColumnarValue::Scalar(s) => Ok(s.clone()),
                ColumnarValue::Array(_) => {
                    datafusion::common::exec_err!("window durations must be literals")
                }
            })
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let spec = spec_from_args(&literals).map_err(|e| DataFusionError::External(Box::new(e)))?;
        if !spec.is_tumbling() {
            return datafusion::common::exec_err!(
                "sliding windows are computed only in the GROUP BY of a sink"
            );
        }
        let time = args.args[0].to_array(args.number_rows)?;
        let DataType::Timestamp(_, tz) = time.data_type().clone() else {
            return datafusion::common::exec_err!("window() needs a TIMESTAMP");
        };
        let micros = cast(
            &time,
            &DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        )?;
        let micros = micros.as_primitive::<TimestampMicrosecondType>();
        let starts: Int64Array = micros
            .iter()
            .map(|t| t.map(|t| t - (t - spec.start).rem_euclid(spec.slide)))
            .collect();
        let ends: Int64Array = starts.iter().map(|s| s.map(|s| s + spec.size)).collect();
        let ts_type = DataType::Timestamp(TimeUnit::Microsecond, tz.clone());
        let DataType::Struct(fields) = window_type(tz) else {
            unreachable!("window_type is a struct")
        };
        let nulls = micros.nulls().cloned();
        let array = StructArray::try_new(
            fields,
            vec![
                cast(&(Arc::new(starts) as ArrayRef), &ts_type)?,
                cast(&(Arc::new(ends) as ArrayRef), &ts_type)?,
            ],
            nulls,
        )?;
        Ok(ColumnarValue::Array(Arc::new(array)))
    }
}

/// `window_time(window)`: the last instant of a window, `end - 1 microsecond` (spec §4.3).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct WindowTimeUdf {
    signature: Signature,
}

impl Default for WindowTimeUdf {
    fn default() -> Self {
        WindowTimeUdf {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for WindowTimeUdf {
    fn name(&self) -> &str {
        "window_time"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        match &args[0] {
            DataType::Struct(fields) if fields.find("end").is_some() => Ok(fields
                .find("end")
                .map(|(_, f)| f.data_type().clone())
                .unwrap_or(DataType::Null)),
            other => {
                datafusion::common::plan_err!("window_time() takes a window column, not {other}")
            }
        }
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let w = args.args[0].to_array(args.number_rows)?;
        let w = w.as_struct();
        let end = w
            .column_by_name("end")
            .ok_or_else(|| DataFusionError::Execution("window_time() needs a window".into()))?;
        let DataType::Timestamp(_, tz) = end.data_type().clone() else {
            return datafusion::common::exec_err!("window_time() needs a window");
        };
        let micros = cast(end, &DataType::Int64)?;
        let minus_one: Int64Array = micros
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .iter()
            .map(|v| v.map(|v| v - 1))
            .collect();
        Ok(ColumnarValue::Array(cast(
            &(Arc::new(minus_one) as ArrayRef),
            &DataType::Timestamp(TimeUnit::Microsecond, tz),
        )?))
    }
}

/// `session_window(ts, gap)` for planning. Sessions are merged by the streaming engine in
/// a sink's GROUP BY; evaluated as a plain function it is an error.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct SessionWindowUdf {
    signature: Signature,
}

impl Default for SessionWindowUdf {
    fn default() -> Self {
        SessionWindowUdf {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SessionWindowUdf {
    fn name(&self) -> &str {
        "session_window"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        window_return_type(self.name(), &args[0])
    }

    fn invoke_with_args(
        &self,
        _args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        datafusion::common::exec_err!("session windows are computed only in the GROUP BY of a sink")
    }
}

/// Appends [`WINDOW_START`] = `t` and [`WINDOW_END`] = `t + gap`: each row's own session
/// before merging (spec §4.2). Rows with a NULL time are dropped.
pub fn assign_session(batch: &RecordBatch, time_col: usize, gap_us: i64) -> Result<RecordBatch> {
    let time = batch.column(time_col);
    let DataType::Timestamp(_, tz) = time.data_type().clone() else {
        return Err(Error::invalid_option(
            "session_window() needs a TIMESTAMP column",
        ));
    };
    let ts_type = DataType::Timestamp(TimeUnit::Microsecond, tz);
    let micros = cast(time, &ts_type)?;
    let keep = datafusion::arrow::compute::is_not_null(&micros)?;
    let batch = datafusion::arrow::compute::filter_record_batch(batch, &keep)?;
    let micros = datafusion::arrow::compute::filter(&micros, &keep)?;
    let starts = cast(&micros, &DataType::Int64)?;
    let ends: Int64Array = starts
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .iter()
        .map(|v| v.map(|v| v + gap_us))
        .collect();
    let mut columns = batch.columns().to_vec();
    columns.push(micros);
    columns.push(cast(&(Arc::new(ends) as ArrayRef), &ts_type)?);
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(WINDOW_START, ts_type.clone(), true));
    fields.push(Field::new(WINDOW_END, ts_type, true));
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Merges sessions (spec §4.2): per key, over rows sorted by start, a row joins the current
/// session iff `start <= current end` (touching sessions merge). Returns each row's merged
/// (start, end). `keys[i]` identifies the group of row `i`.
pub fn merge_sessions(keys: &[Vec<u8>], starts: &[i64], ends: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]).then(starts[a].cmp(&starts[b])));
    let mut merged_start = vec![0; keys.len()];
    let mut merged_end = vec![0; keys.len()];
    let mut i = 0;
    while i < order.len() {
        // One session: extend while the next row of the same key starts before its end.
        let (first, mut end) = (order[i], ends[order[i]]);
        let mut j = i + 1;
        while j < order.len() && keys[order[j]] == keys[first] && starts[order[j]] <= end {
            end = end.max(ends[order[j]]);
            j += 1;
        }
        for &row in &order[i..j] {
            merged_start[row] = starts[first];
            merged_end[row] = end;
        }
        i = j;
    }
    (merged_start, merged_end)
}

/// Registers `window`, `session_window` and `window_time` in a session.
pub fn register_udfs(ctx: &datafusion::prelude::SessionContext) {
    ctx.register_udf(ScalarUDF::new_from_impl(WindowUdf::default()));
    ctx.register_udf(ScalarUDF::new_from_impl(SessionWindowUdf::default()));
    ctx.register_udf(ScalarUDF::new_from_impl(WindowTimeUdf::default()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, NaiveDateTime};
    use datafusion::arrow::array::{StringArray, TimestampMicrosecondArray};

    fn t(s: &str) -> i64 {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M")
            .unwrap()
            .and_utc()
            .timestamp_micros()
    }

    fn min(m: u64) -> Duration {
        Duration::from_secs(m * 60)
    }

    fn fmt(w: &[(i64, i64)]) -> Vec<String> {
        w.iter()
            .map(|(s, e)| {
                let f = |x: i64| {
                    chrono::DateTime::from_timestamp_micros(x)
                        .unwrap()
                        .format("%H:%M")
                        .to_string()
                };
                format!("[{},{})", f(*s), f(*e))
            })
            .collect()
    }

    /// The examples of spec §4.1.
    #[test]
    fn windows_match_the_spec_examples() {
        let w = WindowSpec::try_new(min(10), None, None).unwrap();
        assert_eq!(fmt(&w.windows_of(t("2026-06-10 12:07"))), ["[12:00,12:10)"]);
        let w = WindowSpec::try_new(min(10), Some(min(5)), None).unwrap();
        assert_eq!(
            fmt(&w.windows_of(t("2026-06-10 12:07"))),
            ["[12:00,12:10)", "[12:05,12:15)"]
        );
        let w = WindowSpec::try_new(min(12), Some(min(5)), None).unwrap();
        assert_eq!(
            fmt(&w.windows_of(t("2026-06-10 12:05"))),
            ["[11:55,12:07)", "[12:00,12:12)", "[12:05,12:17)"]
        );
        let w = WindowSpec::try_new(min(12), Some(min(5)), Some(2 * 60_000_000)).unwrap();
        assert_eq!(
            fmt(&w.windows_of(t("2026-06-10 12:05"))),
            ["[11:57,12:09)", "[12:02,12:14)"]
        );
        let w = WindowSpec::try_new(min(60), Some(min(60)), Some(15 * 60_000_000)).unwrap();
        assert_eq!(fmt(&w.windows_of(t("2026-06-10 12:07"))), ["[11:15,12:15)"]);
        // Negative times: 1969-12-31 23:55 is in [23:50, 00:00).
        let w = WindowSpec::try_new(min(10), None, None).unwrap();
        let before_epoch = NaiveDate::from_ymd_opt(1969, 12, 31)
            .unwrap()
            .and_hms_opt(23, 55, 0)
            .unwrap()
            .and_utc()
            .timestamp_micros();
        assert_eq!(fmt(&w.windows_of(before_epoch)), ["[23:50,00:00)"]);
    }

    /// Spec §4.2: touching sessions merge; one microsecond apart they do not.
    #[test]
    fn sessions_merge_when_they_touch() {
        let k = |s: &str| s.as_bytes().to_vec();
        let gap = 5 * 60_000_000;
        let t0 = t("2026-06-10 10:00");
        let t5 = t("2026-06-10 10:05");
        let keys = vec![k("a"), k("a"), k("a"), k("b")];
        let starts = vec![t5, t0, t5 + gap + 1, t0];
        let ends: Vec<i64> = starts.iter().map(|s| s + gap).collect();
        let (ms, me) = merge_sessions(&keys, &starts, &ends);
        assert_eq!(ms, vec![t0, t0, t5 + gap + 1, t0]);
        assert_eq!(me, vec![t5 + gap, t5 + gap, t5 + 2 * gap + 1, t0 + gap]);
    }

    #[test]
    fn window_checks_follow_spark() {
        assert!(WindowSpec::try_new(Duration::ZERO, None, None).is_err());
        assert!(WindowSpec::try_new(min(5), Some(min(10)), None).is_err());
        assert!(WindowSpec::try_new(min(10), Some(min(5)), Some(5 * 60_000_000)).is_err());
    }

    /// A tumbling window keeps the input's columns (no copy) and gives the rows a copy
    /// would; with a NULL time the row is dropped, as before.
    #[test]
    fn tumbling_assign_keeps_the_columns_and_their_rows() {
        let times = [
            Some(t("2026-06-10 12:07")),
            Some(t("2026-06-10 12:11")),
            None,
        ];
        let spec = WindowSpec::try_new(min(5), None, None).unwrap();
        for rows in [2, 3] {
            let ts = TimestampMicrosecondArray::from(times[..rows].to_vec());
            let names = StringArray::from(vec!["a", "b", "c"][..rows].to_vec());
            let schema = Arc::new(Schema::new(vec![
                Field::new("ts", ts.data_type().clone(), true),
                Field::new("name", DataType::Utf8, true),
            ]));
            let batch = RecordBatch::try_new(schema, vec![Arc::new(ts), Arc::new(names)]).unwrap();
            let out = assign(&batch, 0, &spec).unwrap();
            assert_eq!(out.num_rows(), 2);
            // The windows by an independent computation: chrono's truncation to 5 minutes.
            let (want_starts, want_ends): (Vec<i64>, Vec<i64>) = times
                .iter()
                .flatten()
                .map(|&us| {
                    use chrono::DurationRound;
                    let at = chrono::DateTime::from_timestamp_micros(us).unwrap();
                    let start = at.duration_trunc(chrono::TimeDelta::minutes(5)).unwrap();
                    let end = start + chrono::TimeDelta::minutes(5);
                    (start.timestamp_micros(), end.timestamp_micros())
                })
                .unzip();
            let starts = out.column(2).as_primitive::<TimestampMicrosecondType>();
            let ends = out.column(3).as_primitive::<TimestampMicrosecondType>();
            assert_eq!(starts.values().to_vec(), want_starts);
            assert_eq!(ends.values().to_vec(), want_ends);
            let names = out.column(1).as_string::<i32>();
            assert_eq!(names.iter().collect::<Vec<_>>(), vec![Some("a"), Some("b")]);
            // Without a NULL time the columns are the input's own arrays.
            assert_eq!(
                Arc::ptr_eq(out.column(1), batch.column(1)),
                rows == 2,
                "{rows} rows"
            );
        }
    }

    #[test]
    fn assign_expands_rows_and_drops_null_times() {
        let ts = TimestampMicrosecondArray::from(vec![Some(t("2026-06-10 12:07")), None]);
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            ts.data_type().clone(),
            true,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(ts)]).unwrap();
        let spec = WindowSpec::try_new(min(10), Some(min(5)), None).unwrap();
        let out = assign(&batch, 0, &spec).unwrap();
        assert_eq!(out.num_rows(), 2);
        assert_eq!(out.num_columns(), 3);
        let starts = out.column(1).as_primitive::<TimestampMicrosecondType>();
        let mut got: Vec<i64> = starts.values().to_vec();
        got.sort();
        assert_eq!(got, vec![t("2026-06-10 12:00"), t("2026-06-10 12:05")]);
    }
}
