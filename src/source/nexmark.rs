//! The Nexmark source (`connector = 'nexmark'`): the auction benchmark's three streams,
//! person, auction and bid, from the `nexmark` crate's generator, for benchmarks and tests.
//!
//! The generator numbers the events of all three kinds in one sequence (person : auction :
//! bid = 1 : 3 : 46) and seeds each event by its number, so any range of events can be made
//! again, in any order, on any thread. The offset is `{"events": n}`, the number of events
//! of all kinds before the batch's end; a stream declared with `table = 'bid'` emits the bids
//! among them. Event time is synthetic: event `n` happens at `base_time + n / event_rate`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use futures::StreamExt;
use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use nexmark::event::{Event, EventType};

use super::{BatchStream, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::sql::options::{OptionSpec, OptionTable, OptionType};

/// The options of a `nexmark` stream.
pub const OPTIONS: OptionTable = OptionTable {
    object: "stream",
    connector: "nexmark",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&["nexmark"]),
            None,
            "The connector",
        )
        .required(),
        OptionSpec::new(
            "table",
            OptionType::OneOf(&["bid", "auction", "person"]),
            Some("bid"),
            "Which of the three Nexmark streams this is",
        ),
        OptionSpec::new(
            "events_per_batch",
            OptionType::PositiveInt,
            Some("1000000"),
            "Events of all three kinds per micro-batch",
        ),
        OptionSpec::new(
            "max_events",
            OptionType::PositiveInt,
            None,
            "Events of all three kinds after which the stream ends (default: never)",
        ),
        OptionSpec::new(
            "event_rate",
            OptionType::PositiveInt,
            Some("100000"),
            "Events per second of event time (Nexmark's first_event_rate)",
        ),
        OptionSpec::new(
            "base_time",
            OptionType::NonNegativeInt,
            Some("1436918400000"),
            "The event time of event 0, in ms since the epoch (Beam's 2015-07-15)",
        ),
    ],
};

/// Events of all kinds per block of the sequence, and the kinds' shares of it.
const PERSONS: u64 = 1;
const AUCTIONS: u64 = 3;
const BIDS: u64 = 46;
const BLOCK: u64 = PERSONS + AUCTIONS + BIDS;

/// Rows per Arrow batch the source emits.
const BATCH_ROWS: u64 = 64 * 1024;

/// One of Nexmark's three streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NexmarkTable {
    Person,
    Auction,
    Bid,
}

impl NexmarkTable {
    pub fn parse(name: &str) -> Result<NexmarkTable> {
        match name {
            "person" => Ok(NexmarkTable::Person),
            "auction" => Ok(NexmarkTable::Auction),
            "bid" => Ok(NexmarkTable::Bid),
            other => Err(Error::invalid_option(format!(
                "unknown nexmark table \"{other}\": use 'bid', 'auction' or 'person'"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NexmarkTable::Person => "person",
            NexmarkTable::Auction => "auction",
            NexmarkTable::Bid => "bid",
        }
    }

    /// The columns, as `CREATE STREAM` would declare them: (name, SQL type).
    pub fn columns(self) -> &'static [(&'static str, &'static str)] {
        match self {
            NexmarkTable::Person => &[
                ("id", "BIGINT"),
                ("name", "TEXT"),
                ("email_address", "TEXT"),
                ("credit_card", "TEXT"),
                ("city", "TEXT"),
                ("state", "TEXT"),
                ("date_time", "TIMESTAMP"),
                ("extra", "TEXT"),
            ],
            NexmarkTable::Auction => &[
                ("id", "BIGINT"),
                ("item_name", "TEXT"),
                ("description", "TEXT"),
                ("initial_bid", "BIGINT"),
                ("reserve", "BIGINT"),
                ("date_time", "TIMESTAMP"),
                ("expires", "TIMESTAMP"),
                ("seller", "BIGINT"),
                ("category", "BIGINT"),
                ("extra", "TEXT"),
            ],
            NexmarkTable::Bid => &[
                ("auction", "BIGINT"),
                ("bidder", "BIGINT"),
                ("price", "BIGINT"),
                ("channel", "TEXT"),
                ("url", "TEXT"),
                ("date_time", "TIMESTAMP"),
                ("extra", "TEXT"),
            ],
        }
    }

    pub fn schema(self) -> SchemaRef {
        Arc::new(Schema::new(
            self.columns()
                .iter()
                .map(|(name, ty)| {
                    let dt = match *ty {
                        "BIGINT" => DataType::Int64,
                        "TEXT" => DataType::Utf8,
                        _ => DataType::Timestamp(TimeUnit::Microsecond, None),
                    };
                    Field::new(*name, dt, true)
                })
                .collect::<Vec<_>>(),
        ))
    }

    fn event_type(self) -> EventType {
        match self {
            NexmarkTable::Person => EventType::Person,
            NexmarkTable::Auction => EventType::Auction,
            NexmarkTable::Bid => EventType::Bid,
        }
    }

    /// How many of the first `events` events (of all kinds) are of this kind.
    pub fn count_in(self, events: u64) -> u64 {
        let (before, share) = match self {
            NexmarkTable::Person => (0, PERSONS),
            NexmarkTable::Auction => (PERSONS, AUCTIONS),
            NexmarkTable::Bid => (PERSONS + AUCTIONS, BIDS),
        };
        events / BLOCK * share + (events % BLOCK).saturating_sub(before).min(share)
    }
}

/// `connector = 'nexmark'` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexmarkSourceConfig {
    pub table: NexmarkTable,
    pub events_per_batch: u64,
    pub max_events: Option<u64>,
    pub event_rate: u64,
    pub base_time_ms: u64,
}

impl NexmarkSourceConfig {
    /// The generator's configuration: the crate's defaults (Beam's and Flink's), with a
    /// constant rate and a fixed base time so that every run makes the same events.
    fn generator(&self) -> NexmarkConfig {
        NexmarkConfig {
            base_time: self.base_time_ms,
            first_rate: self.event_rate as usize,
            next_rate: self.event_rate as usize,
            ..NexmarkConfig::default()
        }
    }

    /// `NexmarkSource[table=bid, events_per_batch=1000000, ...]`.
    pub fn describe(&self) -> String {
        format!(
            "NexmarkSource[table={}, events_per_batch={}, max_events={}, event_rate={}, base_time={}]",
            self.table.name(),
            self.events_per_batch,
            self.max_events
                .map_or_else(|| "none".to_string(), |n| n.to_string()),
            self.event_rate,
            self.base_time_ms
        )
    }
}

/// Rows `[from, from + n)` of one kind (numbered within the kind) as an Arrow batch.
fn generate(
    config: &NexmarkConfig,
    table: NexmarkTable,
    schema: &SchemaRef,
    from: u64,
    n: u64,
) -> Result<RecordBatch> {
    let events = EventGenerator::new(config.clone())
        .with_type_filter(table.event_type())
        .with_offset(from)
        .take(n as usize);
    let n = n as usize;
    let ints = |k: usize| -> Vec<Int64Builder> {
        (0..k).map(|_| Int64Builder::with_capacity(n)).collect()
    };
    let texts = |k: usize, bytes: usize| -> Vec<StringBuilder> {
        (0..k)
            .map(|_| StringBuilder::with_capacity(n, n * bytes))
            .collect()
    };
    let times = |k: usize| -> Vec<TimestampMicrosecondBuilder> {
        (0..k)
            .map(|_| TimestampMicrosecondBuilder::with_capacity(n))
            .collect()
    };
    let us = |ms: u64| (ms as i64).saturating_mul(1000);
    let columns: Vec<ArrayRef> = match table {
        NexmarkTable::Bid => {
            let (mut i, mut s, mut t) = (ints(3), texts(3, 32), times(1));
            for e in events {
                let Event::Bid(b) = e else { continue };
                i[0].append_value(b.auction as i64);
                i[1].append_value(b.bidder as i64);
                i[2].append_value(b.price as i64);
                s[0].append_value(&b.channel);
                s[1].append_value(&b.url);
                t[0].append_value(us(b.date_time));
                s[2].append_value(&b.extra);
            }
            let [a, bd, p] = finish(i);
            let [c, u, x] = finish(s);
            let [d] = finish(t);
            vec![a, bd, p, c, u, d, x]
        }
        NexmarkTable::Auction => {
            let (mut i, mut s, mut t) = (ints(5), texts(3, 64), times(2));
            for e in events {
                let Event::Auction(a) = e else { continue };
                i[0].append_value(a.id as i64);
                s[0].append_value(&a.item_name);
                s[1].append_value(&a.description);
                i[1].append_value(a.initial_bid as i64);
                i[2].append_value(a.reserve as i64);
                t[0].append_value(us(a.date_time));
                t[1].append_value(us(a.expires));
                i[3].append_value(a.seller as i64);
                i[4].append_value(a.category as i64);
                s[2].append_value(&a.extra);
            }
            let [id, init, res, seller, cat] = finish(i);
            let [item, desc, extra] = finish(s);
            let [dt, exp] = finish(t);
            vec![id, item, desc, init, res, dt, exp, seller, cat, extra]
        }
        NexmarkTable::Person => {
            let (mut i, mut s, mut t) = (ints(1), texts(6, 32), times(1));
            for e in events {
                let Event::Person(p) = e else { continue };
                i[0].append_value(p.id as i64);
                s[0].append_value(&p.name);
                s[1].append_value(&p.email_address);
                s[2].append_value(&p.credit_card);
                s[3].append_value(&p.city);
                s[4].append_value(&p.state);
                t[0].append_value(us(p.date_time));
                s[5].append_value(&p.extra);
            }
            let [id] = finish(i);
            let [name, email, card, city, state, extra] = finish(s);
            let [dt] = finish(t);
            vec![id, name, email, card, city, state, dt, extra]
        }
    };
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Finishes builders into arrays, as many as the caller destructures.
fn finish<B: datafusion::arrow::array::ArrayBuilder, const K: usize>(
    builders: Vec<B>,
) -> [ArrayRef; K] {
    let arrays: Vec<ArrayRef> = builders.into_iter().map(|mut b| b.finish()).collect();
    arrays
        .try_into()
        .unwrap_or_else(|a: Vec<ArrayRef>| unreachable!("{} builders for {K} columns", a.len()))
}

/// A query's `nexmark` source.
pub struct NexmarkSource {
    config: NexmarkSourceConfig,
    schema: SchemaRef,
    /// `available_now`: whether the run has a fixed end, and the end once fixed.
    available_now: bool,
    fixed: Option<u64>,
    /// CPU time the generator took in the last read (the thread time of its chunks), so
    /// benchmarks can tell the engine's cost from the generator's.
    generator_nanos: Arc<AtomicU64>,
    /// Whether the last `latest_offset` stopped short of `max_events` (a bounded stream's
    /// events are all available at once; an unbounded one makes one batch at a time).
    held_back: bool,
}

impl NexmarkSource {
    pub fn new(config: NexmarkSourceConfig) -> NexmarkSource {
        let schema = config.table.schema();
        NexmarkSource {
            config,
            schema,
            available_now: false,
            fixed: None,
            generator_nanos: Arc::new(AtomicU64::new(0)),
            held_back: false,
        }
    }
}

/// The events count of an offset (`None`: nothing read yet).
fn events(o: Option<&Offset>) -> Result<u64> {
    match o {
        None => Ok(0),
        Some(v) => v
            .get("events")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| Error::Internal(format!("unexpected nexmark offset {v}"))),
    }
}

#[async_trait]
impl Source for NexmarkSource {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    fn metrics(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(
            "generatorCpuNanos".to_string(),
            self.generator_nanos.load(Ordering::Relaxed).to_string(),
        )])
    }

    async fn prepare_available_now(&mut self) -> Result<()> {
        self.available_now = true;
        Ok(())
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        // A batch without data reads nothing: its report must not repeat the last read's.
        self.generator_nanos.store(0, Ordering::Relaxed);
        let s = events(start)?;
        let c = &self.config;
        let one_batch = s.saturating_add(c.events_per_batch);
        // An available_now run ends at max_events, or after one batch without it.
        if self.available_now && self.fixed.is_none() {
            self.fixed = Some(c.max_events.unwrap_or(one_batch));
        }
        let end = self.fixed.or(c.max_events).unwrap_or(u64::MAX);
        let next = match limit {
            ReadLimit::AllAvailable => c.max_events.unwrap_or(one_batch).min(end),
            ReadLimit::Default => one_batch.min(end),
        };
        self.held_back = c.max_events.is_some() && next < end;
        Ok(Some(serde_json::json!({ "events": next.max(s) })))
    }

    fn held_back(&self) -> bool {
        self.held_back
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let table = self.config.table;
        let from = table.count_in(events(start)?);
        let to = table.count_in(events(Some(end))?);
        let chunks: Vec<(u64, u64)> = (from..to)
            .step_by(BATCH_ROWS as usize)
            .map(|k| (k, BATCH_ROWS.min(to - k)))
            .collect();
        let generator = Arc::new(self.config.generator());
        let schema = self.schema.clone();
        let nanos = self.generator_nanos.clone();
        nanos.store(0, Ordering::Relaxed);
        // Generating is CPU work: chunks run on the blocking pool, one per core at a time,
        // and come out in order.
        Ok(futures::stream::iter(chunks)
            .map(move |(k, n)| {
                let (generator, schema, nanos) = (generator.clone(), schema.clone(), nanos.clone());
                async move {
                    tokio::task::spawn_blocking(move || {
                        let cpu = cpu_time::ThreadTime::now();
                        let batch = generate(&generator, table, &schema, k, n);
                        nanos.fetch_add(cpu.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        batch
                    })
                    .await
                    .map_err(|e| Error::Internal(format!("nexmark generator failed: {e}")))?
                }
            })
            .buffered(crate::config::parallelism())
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(table: NexmarkTable) -> NexmarkSourceConfig {
        NexmarkSourceConfig {
            table,
            events_per_batch: 1000,
            max_events: Some(2500),
            event_rate: 1000,
            base_time_ms: 1_436_918_400_000,
        }
    }

    #[test]
    fn kinds_share_the_sequence() {
        for n in [0, 1, 3, 4, 5, 49, 50, 51, 54, 1234, 100_000] {
            let total: u64 = [
                NexmarkTable::Person,
                NexmarkTable::Auction,
                NexmarkTable::Bid,
            ]
            .iter()
            .map(|t| t.count_in(n))
            .sum();
            assert_eq!(total, n, "events {n}");
        }
        // The generator's own sequence: event k is a person, an auction or a bid by k mod 50.
        let all: Vec<Event> = EventGenerator::new(config(NexmarkTable::Bid).generator())
            .take(200)
            .collect();
        for t in [
            NexmarkTable::Person,
            NexmarkTable::Auction,
            NexmarkTable::Bid,
        ] {
            let counted = all
                .iter()
                .filter(|e| e.event_type() == t.event_type())
                .count() as u64;
            assert_eq!(counted, t.count_in(200), "{}", t.name());
        }
    }

    #[tokio::test]
    async fn batches_are_the_generators_events_in_order() {
        let c = config(NexmarkTable::Bid);
        let mut source = NexmarkSource::new(c.clone());
        let o1 = source
            .latest_offset(None, ReadLimit::Default)
            .await
            .unwrap();
        assert_eq!(o1, Some(serde_json::json!({"events": 1000})));
        let o2 = source
            .latest_offset(o1.as_ref(), ReadLimit::Default)
            .await
            .unwrap();
        let o3 = source
            .latest_offset(o2.as_ref(), ReadLimit::Default)
            .await
            .unwrap();
        assert_eq!(o3, Some(serde_json::json!({"events": 2500})));
        let o4 = source
            .latest_offset(o3.as_ref(), ReadLimit::Default)
            .await
            .unwrap();
        assert_eq!(o4, o3, "the stream ends at max_events");

        let mut prices = Vec::new();
        let mut times = Vec::new();
        for (s, e) in [(None, &o1), (o1.as_ref(), &o2), (o2.as_ref(), &o3)] {
            let batches: Vec<RecordBatch> = source
                .read(s, e.as_ref().unwrap())
                .await
                .unwrap()
                .map(|b| b.unwrap())
                .collect()
                .await;
            for b in batches {
                let p = b
                    .column(2)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .unwrap();
                prices.extend(p.values().iter().copied());
                let t = b
                    .column(5)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::TimestampMicrosecondArray>()
                    .unwrap();
                times.extend(t.values().iter().copied());
            }
        }
        // The same bids as the crate's generator makes over the whole sequence.
        let expected: Vec<(i64, i64)> = EventGenerator::new(c.generator())
            .take(2500)
            .filter_map(|e| match e {
                Event::Bid(b) => Some((b.price as i64, b.date_time as i64 * 1000)),
                _ => None,
            })
            .collect();
        assert_eq!(expected.len(), 2300);
        let got: Vec<(i64, i64)> = prices.into_iter().zip(times).collect();
        assert_eq!(got, expected);
    }

    #[tokio::test]
    async fn available_now_ends_at_max_events() {
        let mut source = NexmarkSource::new(config(NexmarkTable::Person));
        source.prepare_available_now().await.unwrap();
        let mut o = None;
        let mut ends = Vec::new();
        loop {
            let next = source
                .latest_offset(o.as_ref(), ReadLimit::Default)
                .await
                .unwrap();
            if next == o {
                break;
            }
            ends.push(events(next.as_ref()).unwrap());
            o = next;
        }
        assert_eq!(ends, vec![1000, 2000, 2500]);
    }
}
