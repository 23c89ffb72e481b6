//! The rate sources (spec §13), Spark's test sources: `connector = 'rate'` (rows per second
//! of wall time) and `connector = 'rate_micro_batch'` (a fixed number of rows per batch,
//! deterministic). Both produce `timestamp TIMESTAMP, value BIGINT`.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Int64Array, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;

use super::{BatchStream, Offset, ReadLimit, Source};
use crate::clock::Clock;
use crate::sql::options::{OptionSpec, OptionTable, OptionType};

/// The options of a `rate` stream (Spark's rate source).
pub const RATE_OPTIONS: OptionTable = OptionTable {
    object: "stream",
    connector: "rate",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&["rate"]),
            None,
            "The connector",
        )
        .required(),
        OptionSpec::new(
            "rows_per_second",
            OptionType::PositiveInt,
            Some("1"),
            "Rows generated per second of wall time",
        ),
        OptionSpec::new(
            "ramp_up_time",
            OptionType::Duration,
            Some("0 seconds"),
            "Time to reach rows_per_second (whole seconds)",
        ),
        OptionSpec::new(
            "num_partitions",
            OptionType::PositiveInt,
            None,
            "Partitions the values are spread over (default: the number of cores)",
        ),
    ],
};

/// The options of a `rate_micro_batch` stream (Spark's rate-micro-batch source).
pub const RATE_MICRO_BATCH_OPTIONS: OptionTable = OptionTable {
    object: "stream",
    connector: "rate_micro_batch",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&["rate_micro_batch"]),
            None,
            "The connector",
        )
        .required(),
        OptionSpec::new(
            "rows_per_batch",
            OptionType::PositiveInt,
            None,
            "Rows in every micro-batch",
        )
        .required(),
        OptionSpec::new(
            "num_partitions",
            OptionType::PositiveInt,
            None,
            "Partitions the values are spread over (default: the number of cores)",
        ),
        OptionSpec::new(
            "start_timestamp",
            OptionType::NonNegativeInt,
            Some("0"),
            "The timestamp of batch 0, in ms since the epoch",
        ),
        OptionSpec::new(
            "advance_millis_per_batch",
            OptionType::NonNegativeInt,
            Some("1000"),
            "How far each batch's timestamp moves, in ms",
        ),
    ],
};
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, read_optional, write_new};

/// Rows per Arrow batch a rate source emits.
const BATCH_ROWS: i64 = 64 * 1024;

/// `timestamp TIMESTAMP, value BIGINT`, both nullable as in Spark.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("value", DataType::Int64, true),
    ]))
}

/// `connector = 'rate'` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateConfig {
    pub rows_per_second: i64,
    /// Whole seconds.
    pub ramp_up_secs: i64,
    pub num_partitions: i64,
}

/// `connector = 'rate_micro_batch'` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateMicroBatchConfig {
    pub rows_per_batch: i64,
    pub num_partitions: i64,
    pub start_timestamp_ms: i64,
    pub advance_ms_per_batch: i64,
}

/// Rows generated in seconds `[0, s)` (Spark's `valueAtSecond`).
pub fn value_at_second(s: i64, rows_per_second: i64, ramp_up: i64) -> i64 {
    let speed = rows_per_second / (ramp_up + 1);
    if s <= ramp_up {
        // speed * s * (s + 1) / 2, halving the even factor first, as Spark does.
        if s % 2 == 1 {
            (s + 1) / 2 * s * speed
        } else {
            s / 2 * (s + 1) * speed
        }
    } else {
        value_at_second(ramp_up, rows_per_second, ramp_up) + (s - ramp_up) * rows_per_second
    }
}

/// The values `[start, end)` in Spark's partition order: partition `p` emits
/// `start + p + k * partitions`; with timestamps from `ts_ms(v)`.
fn emit(
    start: i64,
    end: i64,
    partitions: i64,
    ts_ms: impl Fn(i64) -> i64 + Send + Sync + 'static,
) -> BatchStream {
    let schema = schema();
    let partitions = partitions.max(1);
    let chunks: Vec<(i64, i64)> = (0..partitions)
        .flat_map(|p| {
            let first = start + p;
            let count = if first >= end {
                0
            } else {
                (end - first + partitions - 1) / partitions
            };
            (0..count)
                .step_by(BATCH_ROWS as usize)
                .map(move |k| (first + k * partitions, count.min(k + BATCH_ROWS) - k))
        })
        .collect();
    let ts_ms = Arc::new(ts_ms);
    futures::stream::iter(chunks)
        .map(move |(from, n)| {
            let values: Vec<i64> = (0..n).map(|k| from + k * partitions).collect();
            let ts: Vec<i64> = values.iter().map(|&v| ts_ms(v) * 1000).collect();
            Ok(RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(TimestampMicrosecondArray::from(ts)),
                    Arc::new(Int64Array::from(values)),
                ],
            )?)
        })
        .boxed()
}

/// A query's `rate` source.
pub struct RateSource {
    config: RateConfig,
    clock: Arc<dyn Clock>,
    /// The creation time `C`, kept in `sources/<i>/0`.
    created_ms: i64,
    last_ms: i64,
}

impl RateSource {
    /// Opens the source, reading (or writing, at the first start) its creation time.
    pub fn open(config: RateConfig, dir: PathBuf, clock: Arc<dyn Clock>) -> Result<RateSource> {
        create_dir_all(&dir)?;
        let file = dir.join("0");
        let created_ms = match read_optional(&file)? {
            Some(text) => text
                .lines()
                .nth(1)
                .and_then(|l| l.trim().parse().ok())
                .ok_or_else(|| {
                    Error::Internal(format!("corrupt rate source log {}", file.display()))
                })?,
            None => {
                let now = clock.now_ms();
                write_new(&file, format!("v1\n{now}").as_bytes())?;
                now
            }
        };
        Ok(RateSource {
            config,
            clock,
            created_ms,
            last_ms: created_ms,
        })
    }
}

fn seconds(o: Option<&Offset>) -> Result<i64> {
    match o {
        None => Ok(0),
        Some(v) => v
            .as_i64()
            .ok_or_else(|| Error::Internal(format!("unexpected rate source offset {v}"))),
    }
}

#[async_trait]
impl Source for RateSource {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn describe(&self) -> String {
        // Spark's toString has no closing bracket.
        format!(
            "RateStreamV2[rowsPerSecond={}, rampUpTimeSeconds={}, numPartitions={}",
            self.config.rows_per_second, self.config.ramp_up_secs, self.config.num_partitions
        )
    }

    fn supports_available_now(&self) -> bool {
        false
    }

    async fn latest_offset(
        &mut self,
        _start: Option<&Offset>,
        _limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        self.last_ms = self.last_ms.max(self.clock.now_ms());
        Ok(Some(serde_json::json!(
            (self.last_ms - self.created_ms).div_euclid(1000)
        )))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let (s0, s1) = (seconds(start)?, seconds(Some(end))?);
        let c = &self.config;
        let from = value_at_second(s0, c.rows_per_second, c.ramp_up_secs);
        let to = value_at_second(s1, c.rows_per_second, c.ramp_up_secs);
        let base = self.created_ms + s0 * 1000;
        let ms_per_value = if to > from {
            ((s1 - s0) * 1000) as f64 / (to - from) as f64
        } else {
            0.0
        };
        Ok(emit(from, to, c.num_partitions, move |v| {
            base + ((v - from) as f64 * ms_per_value).round() as i64
        }))
    }
}

/// A query's `rate_micro_batch` source.
pub struct RateMicroBatchSource {
    config: RateMicroBatchConfig,
    /// `available_now`: the end fixed at the first call.
    fixed: Option<Option<Offset>>,
}

impl RateMicroBatchSource {
    pub fn new(config: RateMicroBatchConfig) -> RateMicroBatchSource {
        RateMicroBatchSource {
            config,
            fixed: None,
        }
    }

    fn parse(&self, o: Option<&Offset>) -> Result<(i64, i64)> {
        match o {
            None => Ok((0, self.config.start_timestamp_ms)),
            Some(v) => match (
                v.get("offset").and_then(|x| x.as_i64()),
                v.get("timestamp").and_then(|x| x.as_i64()),
            ) {
                (Some(o), Some(t)) => Ok((o, t)),
                _ => Err(Error::Internal(format!(
                    "unexpected rate_micro_batch offset {v}"
                ))),
            },
        }
    }

    fn next(&self, start: Option<&Offset>) -> Result<Offset> {
        let (o, t) = self.parse(start)?;
        Ok(serde_json::json!({
            "offset": o + self.config.rows_per_batch,
            "timestamp": t + self.config.advance_ms_per_batch,
        }))
    }
}

#[async_trait]
impl Source for RateMicroBatchSource {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "RatePerMicroBatchStream[rowsPerBatch={}, numPartitions={}, startTimestamp={}, advanceMsPerBatch={}]",
            c.rows_per_batch, c.num_partitions, c.start_timestamp_ms, c.advance_ms_per_batch
        )
    }

    async fn prepare_available_now(&mut self) -> Result<()> {
        // Fixed at the first latest_offset call (spec §13.2).
        self.fixed = Some(None);
        Ok(())
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        _limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        match &self.fixed {
            Some(Some(end)) => Ok(Some(end.clone())),
            Some(None) => {
                let end = self.next(start)?;
                self.fixed = Some(Some(end.clone()));
                Ok(Some(end))
            }
            None => self.next(start).map(Some),
        }
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let (from, ts) = self.parse(start)?;
        let (to, _) = self.parse(Some(end))?;
        Ok(emit(from, to, self.config.num_partitions, move |_| ts))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{Int64Type, TimestampMicrosecondType};

    use super::*;
    use crate::clock::ManualClock;

    async fn rows(s: BatchStream) -> Vec<(i64, i64)> {
        let batches: Vec<RecordBatch> = s.map(|b| b.unwrap()).collect().await;
        batches
            .iter()
            .flat_map(|b| {
                let ts = b.column(0).as_primitive::<TimestampMicrosecondType>();
                let v = b.column(1).as_primitive::<Int64Type>();
                (0..b.num_rows())
                    .map(|i| (v.value(i), ts.value(i) / 1000))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn values_at_second_as_the_spec_gives_them() {
        // rowsPerSecond=10, rampUpTime=4s: speed 2; 0, 2, 6, 12, 20, 30, 40 (spec §13.1).
        let got: Vec<i64> = (0..=6).map(|s| value_at_second(s, 10, 4)).collect();
        assert_eq!(got, vec![0, 2, 6, 12, 20, 30, 40]);
    }

    #[tokio::test]
    async fn rate_offsets_are_seconds_since_creation_and_replays_are_identical() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_000_000);
        let config = RateConfig {
            rows_per_second: 10,
            ramp_up_secs: 0,
            num_partitions: 2,
        };
        let mut src =
            RateSource::open(config.clone(), dir.path().join("0"), clock.clone()).unwrap();
        assert_eq!(
            src.latest_offset(None, ReadLimit::Default).await.unwrap(),
            Some(serde_json::json!(0))
        );
        clock.advance(2_500);
        let end = src
            .latest_offset(None, ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(end, serde_json::json!(2));
        // Offsets 0 -> 2: values 0..19, timestamp C + 100 v; even values first (partition 0).
        let got = rows(src.read(Some(&serde_json::json!(0)), &end).await.unwrap()).await;
        let mut want: Vec<(i64, i64)> = (0..20)
            .step_by(2)
            .map(|v| (v, 1_000_000 + 100 * v))
            .collect();
        want.extend((1..20).step_by(2).map(|v| (v, 1_000_000 + 100 * v)));
        assert_eq!(got, want);
        // A restart keeps the creation time, so the same range gives the same rows.
        clock.advance(60_000);
        let again = RateSource::open(config, dir.path().join("0"), clock.clone()).unwrap();
        assert_eq!(
            rows(again.read(Some(&serde_json::json!(0)), &end).await.unwrap()).await,
            want
        );
    }

    #[tokio::test]
    async fn rate_micro_batch_advances_every_trigger_and_fixes_available_now() {
        let mut src = RateMicroBatchSource::new(RateMicroBatchConfig {
            rows_per_batch: 5,
            num_partitions: 1,
            start_timestamp_ms: 1000,
            advance_ms_per_batch: 500,
        });
        let first = src
            .latest_offset(None, ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first, serde_json::json!({"offset": 5, "timestamp": 1500}));
        let got = rows(src.read(None, &first).await.unwrap()).await;
        assert_eq!(got, (0..5).map(|v| (v, 1000)).collect::<Vec<_>>());
        let second = src
            .latest_offset(Some(&first), ReadLimit::AllAvailable)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(second, serde_json::json!({"offset": 10, "timestamp": 2000}));
        let got = rows(src.read(Some(&first), &second).await.unwrap()).await;
        assert_eq!(got, (5..10).map(|v| (v, 1500)).collect::<Vec<_>>());
        src.prepare_available_now().await.unwrap();
        let fixed = src
            .latest_offset(Some(&second), ReadLimit::Default)
            .await
            .unwrap();
        assert_eq!(
            src.latest_offset(fixed.as_ref(), ReadLimit::Default)
                .await
                .unwrap(),
            fixed,
            "one batch, then idle"
        );
    }
}
