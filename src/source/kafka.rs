//! The Kafka source (`connector = 'kafka'`), with the semantics of Spark's Kafka source.
//!
//! The offset is Spark's, `{"topic": {"0": 42, "1": 17}}`: per partition, the next offset
//! to read. Batch N reads offsets `[start, end)` of every partition (the records after the
//! previous batch's end, up to this batch's), the same records on every replay; nothing is
//! committed to Kafka. The first batch starts at `starting_offsets` (or
//! `starting_timestamp`), fixed once in `sources/<i>/0` so that a restart before the first
//! commit starts from the same place. Partitions that appear later are read from their
//! earliest offset; offsets that are gone (retention, a topic deleted or recreated) fail
//! the query unless `fail_on_data_loss = false`.
//!
//! With no declared columns the stream has Spark's Kafka columns (`key`, `value`, `topic`,
//! `partition`, `offset`, `timestamp`, `timestamp_type`, and `headers` when asked). With
//! declared columns, each value is decoded into them (`format = 'json' | 'csv' | 'raw'`)
//! by the file streams' decoders and malformed-record modes, and the Kafka columns follow
//! under their names (a declared column of the same name wins). `format = 'avro'` decodes
//! with an inline `avro_schema` into the declared columns, or, with none declared, into
//! the record's fields.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, BinaryBuilder, Int32Array, Int64Array, RecordBatch, StringArray,
    StringBuilder, TimestampMicrosecondArray, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::{concat_batches, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{Arrival, Backlog, BatchStream, MalformedRecord, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::format::avro::{AvroDecoder, Framing};
use crate::format::{FileDecoder, FileFormat, ParseMode};
use crate::kafka::watch::Watcher;
use crate::kafka::{
    Admin, BOOTSTRAP_SERVERS, Connection, Ends, Isolation, OffsetRange, PartitionOffsets,
    PartitionRead, Reader, SECURITY_OPTIONS,
};
use crate::sql::options::{OptionSpec, OptionTable, OptionType, Options, parse_duration};
use crate::sql::parser::ColumnSpec;
use crate::sql::types::{arrow_to_sql, sql_to_arrow};

const STREAM_OPTIONS: [OptionSpec; 23] = [
    OptionSpec::new(
        "connector",
        OptionType::OneOf(&["kafka"]),
        None,
        "The connector",
    )
    .required(),
    BOOTSTRAP_SERVERS,
    OptionSpec::new(
        "topic",
        OptionType::Text,
        None,
        "The topic to read, or a comma list of topics (Spark's subscribe); exactly one of \
         topic and topic_pattern",
    ),
    OptionSpec::new(
        "topic_pattern",
        OptionType::Text,
        None,
        "A regular expression the whole topic name matches (Spark's subscribePattern); \
         topics created later that match are read too",
    ),
    OptionSpec::new(
        "starting_offsets",
        OptionType::Text,
        Some("latest"),
        "Where a new query starts: earliest, latest, or Spark's JSON per partition, \
         {\"topic\": {\"0\": 23, \"1\": -2}} (-2 earliest, -1 latest), naming every \
         partition; a restart resumes from its checkpoint",
    ),
    OptionSpec::new(
        "starting_timestamp",
        OptionType::NonNegativeInt,
        None,
        "Where a new query starts, instead: in every partition, the first record at or \
         after this time (ms since the epoch); a partition with none fails the query",
    ),
    OptionSpec::new(
        "max_offsets_per_trigger",
        OptionType::PositiveInt,
        None,
        "At most this many offsets per batch, shared among partitions in proportion to \
         their backlog (Spark's maxOffsetsPerTrigger); a sink's own option overrides it",
    ),
    OptionSpec::new(
        "min_offsets_per_trigger",
        OptionType::PositiveInt,
        None,
        "A batch waits until this many new offsets are there, or max_trigger_delay has \
         passed since the last batch",
    ),
    OptionSpec::new(
        "max_trigger_delay",
        OptionType::Duration,
        Some("15 minutes"),
        "With min_offsets_per_trigger: the longest a batch waits",
    ),
    OptionSpec::new(
        "fail_on_data_loss",
        OptionType::Boolean,
        Some("true"),
        "Whether offsets that are gone (aged out by retention, a topic deleted or \
         recreated, a new partition that does not start at 0) fail the query; false skips \
         them, counts them (dataLoss in progress) and logs a warning",
    ),
    OptionSpec::new(
        "include_headers",
        OptionType::Boolean,
        Some("false"),
        "Adds the column headers: each record's headers as a JSON array of {\"key\", \
         \"value\"} (NULL for a record without headers)",
    ),
    OptionSpec::new(
        "isolation_level",
        OptionType::OneOf(&["read_uncommitted", "read_committed"]),
        Some("read_uncommitted"),
        "What is read of transactions: read_uncommitted, every record (Spark's default); \
         read_committed, only committed ones (what a Tidemark or Flink exactly-once sink \
         needs its readers to use)",
    ),
    OptionSpec::new(
        "format",
        OptionType::OneOf(&["json", "csv", "avro", "raw"]),
        None,
        "How the value is decoded into the declared columns (raw: the value as is, into the \
         one declared TEXT or BYTEA column; avro: with avro_schema, into the declared \
         columns or, with none declared, into the record's fields)",
    ),
    OptionSpec::new(
        "avro_schema",
        OptionType::Text,
        None,
        "avro: the writer's schema, an Avro record in JSON (as Spark's from_avro takes it); \
         declared columns take the fields of their names",
    ),
    OptionSpec::new(
        "avro_framing",
        OptionType::OneOf(&["raw", "confluent"]),
        Some("raw"),
        "avro: raw, each value is one bare datum (Avro's binary encoding, Spark's \
         from_avro); confluent, a zero byte and a 4-byte schema id come first (the id is \
         not looked up)",
    ),
    OptionSpec::new(
        "mode",
        OptionType::OneOf(&["PERMISSIVE", "DROPMALFORMED", "FAILFAST"]),
        Some("PERMISSIVE"),
        "json, csv and avro: what to do with a value that does not decode (as for file \
         streams)",
    ),
    OptionSpec::new(
        "delimiter",
        OptionType::Char,
        Some(","),
        "csv: the field delimiter",
    ),
    SECURITY_OPTIONS[0],
    SECURITY_OPTIONS[1],
    SECURITY_OPTIONS[2],
    SECURITY_OPTIONS[3],
    SECURITY_OPTIONS[4],
    OptionSpec::new(
        "broker_timeout",
        OptionType::Duration,
        Some("5 minutes"),
        "How long a running query waits for brokers that stopped answering (retrying, \
         with progress and the log saying so) before it fails",
    ),
];

/// The options of a `kafka` stream.
pub const OPTIONS: OptionTable = OptionTable {
    object: "stream",
    connector: "kafka",
    options: &STREAM_OPTIONS,
};

/// What a query subscribes to.
#[derive(Debug, Clone)]
pub enum Subscription {
    Topics(Vec<String>),
    /// Anchored at both ends, as Java's `matches`.
    Pattern(regex::Regex),
}

impl Subscription {
    fn matches(&self, topic: &str) -> bool {
        match self {
            Subscription::Topics(ts) => ts.iter().any(|t| t == topic),
            Subscription::Pattern(re) => re.is_match(topic),
        }
    }
}

/// Where a new query starts.
#[derive(Debug, Clone, PartialEq)]
pub enum Starting {
    Earliest,
    Latest,
    /// Per partition; -2 earliest, -1 latest.
    Offsets(PartitionOffsets),
    Timestamp(i64),
}

/// How values become the declared columns.
#[derive(Debug, Clone)]
pub enum ValueFormat {
    /// Spark's fixed Kafka columns.
    Fixed,
    /// JSON or CSV into the declared columns.
    Decoded(FileDecoder),
    /// The value as is into the one declared column (TEXT or BYTEA).
    Raw,
    /// Avro datums into the declared (or derived) columns.
    Avro(AvroDecoder),
}

/// A Kafka stream's configuration, from its options.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    pub conn: Connection,
    pub subscription: Subscription,
    pub starting: Starting,
    pub max_offsets_per_trigger: Option<u64>,
    pub min_offsets_per_trigger: Option<u64>,
    pub max_trigger_delay: Duration,
    pub fail_on_data_loss: bool,
    pub include_headers: bool,
    pub isolation: Isolation,
    pub value: ValueFormat,
    /// The declared columns (empty for the fixed schema).
    pub declared: usize,
    /// The stream's columns: the declared ones, then the Kafka columns not declared.
    pub schema: SchemaRef,
    pub broker_timeout: Duration,
}

/// Spark's Kafka columns, as SQL types.
fn kafka_columns(include_headers: bool) -> Vec<(&'static str, &'static str)> {
    let mut cols = vec![
        ("key", "BYTEA"),
        ("value", "BYTEA"),
        ("topic", "TEXT"),
        ("partition", "INTEGER"),
        ("offset", "BIGINT"),
        ("timestamp", "TIMESTAMP"),
        ("timestamp_type", "INTEGER"),
    ];
    if include_headers {
        cols.push(("headers", "TEXT"));
    }
    cols
}

impl KafkaSourceConfig {
    /// Validates a Kafka stream's declaration: its columns (as declared, or as the catalog
    /// stored them: the declared ones followed by the Kafka columns) and options. Gives the
    /// stream's columns and its configuration.
    pub fn declare(
        columns: Vec<ColumnSpec>,
        options: &Options,
    ) -> Result<(Vec<ColumnSpec>, KafkaSourceConfig)> {
        options.check(&OPTIONS)?;
        let conn = Connection::from_options(options)?;
        let subscription = match (options.get("topic"), options.get("topic_pattern")) {
            (Some(t), None) => {
                let topics: Vec<String> = t
                    .split(',')
                    .map(|t| t.trim().to_string())
                    .filter(|t| !t.is_empty())
                    .collect();
                if topics.is_empty() {
                    return Err(Error::invalid_option("option \"topic\" names no topic"));
                }
                Subscription::Topics(topics)
            }
            (None, Some(p)) => {
                Subscription::Pattern(regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                    Error::invalid_option(format!("invalid topic_pattern \"{p}\": {e}"))
                })?)
            }
            _ => {
                return Err(Error::InvalidOption {
                    message: "a kafka stream takes exactly one of the options \"topic\" and \
                              \"topic_pattern\""
                        .into(),
                    hint: Some("Add topic = 'events' (or a comma list).".into()),
                });
            }
        };
        let starting = match (
            options.get("starting_timestamp"),
            options.get("starting_offsets"),
        ) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid_option(
                    "give starting_offsets or starting_timestamp, not both",
                ));
            }
            (Some(_), None) => Starting::Timestamp(
                options.non_negative_int("starting_timestamp")?.unwrap_or(0) as i64,
            ),
            (None, s) => parse_starting(s.unwrap_or("latest"))?,
        };
        if let (Starting::Offsets(o), Subscription::Topics(ts)) = (&starting, &subscription)
            && let Some(t) = o.keys().find(|t| !ts.contains(t))
        {
            return Err(Error::invalid_option(format!(
                "starting_offsets names topic \"{t}\", which the stream does not read"
            )));
        }
        let max = options.positive_int("max_offsets_per_trigger")?;
        let min = options.positive_int("min_offsets_per_trigger")?;
        if let (Some(min), Some(max)) = (min, max)
            && min > max
        {
            return Err(Error::invalid_option(format!(
                "min_offsets_per_trigger ({min}) is above max_offsets_per_trigger ({max})"
            )));
        }
        let include_headers = options.bool("include_headers")?.unwrap_or(false);
        let fixed: Vec<ColumnSpec> = kafka_columns(include_headers)
            .into_iter()
            .map(|(n, t)| ColumnSpec {
                name: n.into(),
                sql_type: t.into(),
                data_type: sql_to_arrow(t).unwrap_or(DataType::Null),
                not_null: false,
            })
            .collect();
        // The catalog stores the declared columns followed by the Kafka columns: take those
        // back off (the shortest declared prefix that, with the Kafka columns it lacks,
        // makes the list; none without a format).
        let mut declared = columns;
        for c in &mut declared {
            c.data_type = sql_to_arrow(&c.sql_type)?;
        }
        let min_declared = usize::from(options.get("format").is_some());
        if let Some(k) = (min_declared..declared.len()).find(|&k| {
            let prefix = &declared[..k];
            let rest: Vec<&ColumnSpec> = fixed
                .iter()
                .filter(|f| !prefix.iter().any(|c| c.name == f.name))
                .collect();
            rest.len() == declared.len() - k
                && rest
                    .iter()
                    .zip(&declared[k..])
                    .all(|(f, c)| f.name == c.name && f.data_type == c.data_type)
        }) {
            declared.truncate(k);
        }
        if let Some(c) = declared.iter().find(|c| c.not_null) {
            return Err(Error::unsupported(format!(
                "NOT NULL is not supported in kafka streams (column \"{}\")",
                c.name
            )));
        }
        let mode = match options.get("mode") {
            Some(m) => ParseMode::parse(m)?,
            None => ParseMode::default(),
        };
        let is_avro = options
            .get("format")
            .is_some_and(|f| f.eq_ignore_ascii_case("avro"));
        if !is_avro
            && let Some(o) = ["avro_schema", "avro_framing"]
                .into_iter()
                .find(|o| options.get(o).is_some())
        {
            return Err(Error::invalid_option(format!(
                "option \"{o}\" applies only to format 'avro'"
            )));
        }
        let value = match (declared.is_empty(), options.get("format")) {
            (true, None) => ValueFormat::Fixed,
            (_, Some(_)) if is_avro => {
                let schema = options
                    .get("avro_schema")
                    .ok_or_else(|| Error::InvalidOption {
                        message: "format = 'avro' needs the option \"avro_schema\"".into(),
                        hint: Some("Give the writer's schema as Avro JSON.".into()),
                    })?;
                let framing = Framing::parse(options.get("avro_framing").unwrap_or("raw"))?;
                let cols: Vec<(String, DataType)> = declared
                    .iter()
                    .map(|c| (c.name.clone(), c.data_type.clone()))
                    .collect();
                let decoder = AvroDecoder::new(schema, framing, mode, &cols)?;
                if declared.is_empty() {
                    declared = decoder
                        .schema
                        .fields()
                        .iter()
                        .map(|f| ColumnSpec {
                            name: f.name().clone(),
                            sql_type: arrow_to_sql(f.data_type()),
                            data_type: f.data_type().clone(),
                            not_null: false,
                        })
                        .collect();
                }
                ValueFormat::Avro(decoder)
            }
            (true, Some(f)) => {
                return Err(Error::InvalidOption {
                    message: format!(
                        "format = '{f}' decodes the value into declared columns, and the \
                         stream declares none"
                    ),
                    hint: Some(
                        "Declare the value's columns, CREATE STREAM s (a INT, b TEXT) WITH \
                         (connector = 'kafka', format = 'json', ...), or leave format out for \
                         Spark's Kafka columns."
                            .into(),
                    ),
                });
            }
            (false, None) => {
                return Err(Error::InvalidOption {
                    message: "a kafka stream with declared columns needs the option \"format\""
                        .into(),
                    hint: Some("Add format = 'json', 'csv', 'avro' or 'raw'.".into()),
                });
            }
            (false, Some(f)) if f.eq_ignore_ascii_case("raw") => {
                if declared.len() != 1
                    || !matches!(declared[0].data_type, DataType::Utf8 | DataType::Binary)
                {
                    return Err(Error::invalid_option(
                        "format = 'raw' takes exactly one declared column, TEXT or BYTEA, for \
                         the value",
                    ));
                }
                ValueFormat::Raw
            }
            (false, Some(f)) => {
                let format = FileFormat::parse(f, options)?;
                let schema = Arc::new(Schema::new(
                    declared
                        .iter()
                        .map(|c| Field::new(&c.name, c.data_type.clone(), true))
                        .collect::<Vec<_>>(),
                ));
                ValueFormat::Decoded(FileDecoder {
                    format,
                    mode,
                    schema,
                })
            }
        };
        if matches!(value, ValueFormat::Fixed | ValueFormat::Raw) && options.get("mode").is_some() {
            return Err(Error::invalid_option(
                "option \"mode\" applies only to format 'json', 'csv' or 'avro'",
            ));
        }
        if !matches!(value, ValueFormat::Decoded(_)) && options.get("delimiter").is_some() {
            return Err(Error::invalid_option(
                "option \"delimiter\" applies only to format 'json' or 'csv'",
            ));
        }
        let n_declared = declared.len();
        let mut all = declared;
        for f in fixed {
            if !all.iter().any(|c| c.name == f.name) {
                all.push(f);
            }
        }
        let schema = Arc::new(Schema::new(
            all.iter()
                .map(|c| Field::new(&c.name, c.data_type.clone(), true))
                .collect::<Vec<_>>(),
        ));
        let config = KafkaSourceConfig {
            conn,
            subscription,
            starting,
            max_offsets_per_trigger: max,
            min_offsets_per_trigger: min,
            max_trigger_delay: match options.get("max_trigger_delay") {
                Some(d) => parse_duration(d)?,
                None => Duration::from_secs(15 * 60),
            },
            fail_on_data_loss: options.bool("fail_on_data_loss")?.unwrap_or(true),
            include_headers,
            isolation: Isolation::parse(
                options.get("isolation_level").unwrap_or("read_uncommitted"),
            )?,
            value,
            declared: n_declared,
            schema,
            broker_timeout: match options.get("broker_timeout") {
                Some(d) => parse_duration(d)?,
                None => Duration::from_secs(5 * 60),
            },
        };
        Ok((all, config))
    }

    /// `KafkaV2[Subscribe[t1,t2]]`, as Spark's progress names the source.
    pub fn describe(&self) -> String {
        match &self.subscription {
            Subscription::Topics(ts) => format!("KafkaV2[Subscribe[{}]]", ts.join(",")),
            Subscription::Pattern(re) => {
                let p = re.as_str();
                let p = p
                    .strip_prefix("^(?:")
                    .and_then(|p| p.strip_suffix(")$"))
                    .unwrap_or(p);
                format!("KafkaV2[SubscribePattern[{p}]]")
            }
        }
    }

    /// What a checkpoint's definition records of the source.
    pub fn identity(&self) -> String {
        format!("kafka:{}", self.describe())
    }
}

/// `earliest`, `latest` or Spark's JSON.
fn parse_starting(s: &str) -> Result<Starting> {
    match s.trim().to_ascii_lowercase().as_str() {
        "earliest" => Ok(Starting::Earliest),
        "latest" => Ok(Starting::Latest),
        _ => parse_offsets(s)
            .map(Starting::Offsets)
            .map_err(|e| Error::InvalidOption {
                message: format!("invalid starting_offsets \"{s}\": {e}"),
                hint: Some(
                    "Use 'earliest', 'latest' or JSON such as {\"topic\": {\"0\": 23, \"1\": -2}}."
                        .into(),
                ),
            }),
    }
}

/// Spark's offsets JSON, `{"topic": {"0": 42}}`.
pub fn parse_offsets(s: &str) -> std::result::Result<PartitionOffsets, String> {
    let v: serde_json::Value = serde_json::from_str(s).map_err(|e| e.to_string())?;
    let topics = v.as_object().ok_or("not a JSON object")?;
    let mut out = PartitionOffsets::new();
    for (t, parts) in topics {
        let parts = parts
            .as_object()
            .ok_or_else(|| format!("topic \"{t}\": not an object of partitions"))?;
        let mut m = BTreeMap::new();
        for (p, o) in parts {
            let p: i32 = p
                .parse()
                .map_err(|_| format!("topic \"{t}\": partition \"{p}\" is not a number"))?;
            let o = o
                .as_i64()
                .ok_or_else(|| format!("topic \"{t}\" partition {p}: offset is not an integer"))?;
            if o < -2 {
                return Err(format!(
                    "topic \"{t}\" partition {p}: offset {o} is below -2"
                ));
            }
            m.insert(p, o);
        }
        out.insert(t.clone(), m);
    }
    Ok(out)
}

fn to_offset(o: &PartitionOffsets) -> Offset {
    serde_json::Value::Object(
        o.iter()
            .map(|(t, ps)| {
                (
                    t.clone(),
                    serde_json::Value::Object(
                        ps.iter()
                            .map(|(p, o)| (p.to_string(), serde_json::Value::from(*o)))
                            .collect(),
                    ),
                )
            })
            .collect(),
    )
}

fn from_offset(o: &Offset) -> Result<PartitionOffsets> {
    parse_offsets(&o.to_string())
        .map_err(|e| Error::Internal(format!("a kafka offset in the checkpoint: {e}")))
}

fn flat(o: &PartitionOffsets) -> impl Iterator<Item = ((&str, i32), i64)> + '_ {
    o.iter()
        .flat_map(|(t, ps)| ps.iter().map(move |(p, o)| ((t.as_str(), *p), *o)))
}

fn get(o: &PartitionOffsets, t: &str, p: i32) -> Option<i64> {
    o.get(t).and_then(|ps| ps.get(&p)).copied()
}

fn set(o: &mut PartitionOffsets, t: &str, p: i32, v: i64) {
    o.entry(t.to_string()).or_default().insert(p, v);
}

/// Spark's `rateLimit`: at most `limit` offsets after `from`, shared among partitions in
/// proportion to what each has up to `until`; a share below 1 rounds up (no partition
/// starves), others down; never past `until`. A partition `from` does not have (a new one)
/// starts at `earliest`.
pub fn rate_limit(
    limit: u64,
    from: &PartitionOffsets,
    until: &PartitionOffsets,
    earliest: &PartitionOffsets,
) -> PartitionOffsets {
    let begin_of = |t: &str, p: i32| get(from, t, p).or_else(|| get(earliest, t, p));
    let sizes: Vec<((&str, i32), i64)> = flat(until)
        .filter_map(|((t, p), end)| begin_of(t, p).map(|b| ((t, p), end - b)))
        .collect();
    let total: f64 = sizes.iter().map(|(_, s)| *s as f64).sum();
    if total < 1.0 {
        return until.clone();
    }
    let mut out = PartitionOffsets::new();
    for ((t, p), end) in flat(until) {
        let v = match (sizes.iter().find(|(k, _)| *k == (t, p)), begin_of(t, p)) {
            (Some((_, size)), Some(begin)) => {
                let prorate = limit as f64 * (*size as f64 / total);
                let n = if prorate < 1.0 {
                    prorate.ceil()
                } else {
                    prorate.floor()
                } as i64;
                let off = begin.checked_add(n).unwrap_or(i64::MAX);
                off.min(end)
            }
            _ => end,
        };
        set(&mut out, t, p, v);
    }
    out
}

/// A data loss found when a batch's ranges are made (Spark's `reportDataLoss` messages).
#[derive(Debug, Clone, PartialEq)]
pub struct DataLoss {
    pub message: String,
    /// Offsets known to be skipped, when that can be counted.
    pub offsets: u64,
}

/// The ranges a batch reads: for each partition of `end`, from its `start` (a new
/// partition from its earliest offset) to its end; and the data losses on the way (a
/// partition gone, one whose offsets went back, offsets aged out, a new partition that
/// does not start at 0).
pub fn offset_ranges(
    start: &PartitionOffsets,
    end: &PartitionOffsets,
    earliest: &PartitionOffsets,
) -> (Vec<OffsetRange>, Vec<DataLoss>) {
    let mut ranges = Vec::new();
    let mut losses = Vec::new();
    for ((t, p), s) in flat(start) {
        if get(end, t, p).is_none() {
            losses.push(DataLoss {
                message: format!("partition {t}-{p} is gone; some data may have been missed"),
                offsets: 0,
            });
        }
        let _ = s;
    }
    for ((t, p), until) in flat(end) {
        let low = get(earliest, t, p).unwrap_or(0);
        let from = match get(start, t, p) {
            Some(s) => s,
            None => {
                if low != 0 {
                    losses.push(DataLoss {
                        message: format!(
                            "added partition {t}-{p} starts from {low} instead of 0; some data \
                             may have been missed"
                        ),
                        offsets: low as u64,
                    });
                }
                low
            }
        };
        if until < from {
            losses.push(DataLoss {
                message: format!(
                    "partition {t}-{p}'s offset was changed from {from} to {until}; some data \
                     may have been missed"
                ),
                offsets: 0,
            });
            continue;
        }
        let from = if from < low && until > from {
            losses.push(DataLoss {
                message: format!(
                    "offsets {from} to {} of partition {t}-{p} are no longer in Kafka (aged \
                     out by retention, or the topic was deleted before they were read)",
                    low.min(until) - 1
                ),
                offsets: (low.min(until) - from) as u64,
            });
            low.min(until)
        } else {
            from
        };
        ranges.push(OffsetRange {
            topic: t.to_string(),
            partition: p,
            from,
            until,
        });
    }
    (ranges, losses)
}

/// What the brokers hold now, for the subscription.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    earliest: PartitionOffsets,
    latest: PartitionOffsets,
}

fn snapshot(admin: &Admin, sub: &Subscription) -> Result<Snapshot> {
    let topics: Vec<(String, Vec<i32>)> = match sub {
        Subscription::Topics(ts) => ts
            .iter()
            .map(|t| Ok((t.clone(), admin.partitions(t)?)))
            .collect::<Result<_>>()?,
        Subscription::Pattern(_) => admin
            .topics()?
            .into_iter()
            .filter(|(t, _)| sub.matches(t))
            .collect(),
    };
    let parts: Vec<(String, i32)> = topics
        .into_iter()
        .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
        .collect();
    let mut s = Snapshot::default();
    for ((t, p), o) in admin.ends(&parts, Ends::Earliest)? {
        set(&mut s.earliest, &t, p, o);
    }
    for ((t, p), o) in admin.ends(&parts, Ends::Latest)? {
        set(&mut s.latest, &t, p, o);
    }
    Ok(s)
}

/// What the last planned batch and the last read saw, for progress.
#[derive(Default)]
struct Seen {
    /// The end of the last planned batch, and the latest offsets it was planned against.
    end: Option<PartitionOffsets>,
    latest: Option<PartitionOffsets>,
    earliest: PartitionOffsets,
    malformed: Vec<MalformedRecord>,
    arrivals: Vec<Arrival>,
    /// Offsets skipped as lost (fail_on_data_loss = false), since the query started.
    data_loss: u64,
    held_back: bool,
}

/// A running query's Kafka source.
pub struct KafkaSource {
    config: Arc<KafkaSourceConfig>,
    dir: PathBuf,
    admin: Option<Arc<Admin>>,
    initial: Option<PartitionOffsets>,
    available_now: Option<PartitionOffsets>,
    /// When the last batch was planned (none yet: Spark's `lastTriggerMillis` of 0, so
    /// `min_offsets_per_trigger` never delays the first batch).
    last_trigger: Option<Instant>,
    down_since: Option<Instant>,
    seen: Mutex<Seen>,
    /// The consumer batches read with, made at the first read and again after a failed one.
    reader: Arc<Mutex<Option<Reader>>>,
    /// Bumped when records arrive ([`Source::arrivals`]), by `watcher`.
    arrived: tokio::sync::watch::Sender<u64>,
    /// Long-polls the partitions in `watched` (not under available_now, which stops).
    watcher: Option<Watcher>,
    watched: Vec<(String, i32)>,
}

impl KafkaSource {
    /// The source of a query, keeping its starting offsets in `dir` (`sources/<i>/`).
    pub fn open(config: Arc<KafkaSourceConfig>, dir: PathBuf) -> Result<KafkaSource> {
        crate::fsutil::create_dir_all(&dir)?;
        Ok(KafkaSource {
            config,
            dir,
            admin: None,
            initial: None,
            available_now: None,
            last_trigger: None,
            down_since: None,
            seen: Mutex::new(Seen::default()),
            reader: Arc::new(Mutex::new(None)),
            arrived: tokio::sync::watch::channel(0).0,
            watcher: None,
            watched: Vec::new(),
        })
    }

    /// Has the watcher (started at the first call) long-poll the partitions of `latest`.
    fn watch(&mut self, latest: &PartitionOffsets) {
        if self.available_now.is_some() || self.arrived.receiver_count() == 0 {
            return;
        }
        let parts: Vec<(String, i32)> =
            flat(latest).map(|((t, p), _)| (t.to_string(), p)).collect();
        if parts == self.watched && self.watcher.is_some() {
            return;
        }
        if self.watcher.is_none() {
            match Watcher::start(
                &self.config.conn,
                self.config.isolation,
                self.arrived.clone(),
            ) {
                Ok(w) => self.watcher = Some(w),
                Err(e) => {
                    // The trigger loop's polling still finds new records.
                    tracing::warn!(source = %self.config.describe(), error = %e, "no kafka watcher");
                    return;
                }
            }
        }
        if let Some(w) = &self.watcher {
            w.watch(parts.clone());
        }
        self.watched = parts;
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admin(&mut self) -> Result<Arc<Admin>> {
        if let Some(a) = &self.admin {
            return Ok(a.clone());
        }
        let a = Arc::new(Admin::new(&self.config.conn, self.config.isolation)?);
        self.admin = Some(a.clone());
        Ok(a)
    }

    async fn snapshot(&mut self) -> Result<Snapshot> {
        let admin = self.admin()?;
        let config = self.config.clone();
        tokio::task::spawn_blocking(move || snapshot(&admin, &config.subscription))
            .await
            .map_err(|e| Error::Internal(format!("kafka metadata task: {e}")))?
    }

    /// The offsets the query started from, as `sources/<i>/0` keeps them, if fixed yet.
    fn stored_initial(&self) -> Result<Option<PartitionOffsets>> {
        let file = self.dir.join("0");
        let Some(text) = crate::fsutil::read_optional(&file)? else {
            return Ok(None);
        };
        let json = text.strip_prefix("v1\n").unwrap_or(&text);
        parse_offsets(json.trim())
            .map(Some)
            .map_err(|e| Error::Internal(format!("{}: bad starting offsets: {e}", file.display())))
    }

    /// The offsets the query started from: read back from `sources/<i>/0`, or fixed now
    /// from `starting_offsets` and written there.
    async fn initial(&mut self, snap: &Snapshot) -> Result<PartitionOffsets> {
        if let Some(i) = &self.initial {
            return Ok(i.clone());
        }
        if let Some(o) = self.stored_initial()? {
            self.initial = Some(o.clone());
            return Ok(o);
        }
        let file = self.dir.join("0");
        let config = self.config.clone();
        let o = match &config.starting {
            Starting::Earliest => snap.earliest.clone(),
            Starting::Latest => snap.latest.clone(),
            Starting::Offsets(given) => {
                let mut o = PartitionOffsets::new();
                for ((t, p), _) in flat(&snap.latest) {
                    let v = get(given, t, p).ok_or_else(|| Error::InvalidOption {
                        message: format!(
                            "starting_offsets does not name partition {t}-{p}: it must name \
                             every partition of the topics read"
                        ),
                        hint: Some("Use -2 for earliest or -1 for latest.".into()),
                    })?;
                    let v = match v {
                        -2 => get(&snap.earliest, t, p).unwrap_or(0),
                        -1 => get(&snap.latest, t, p).unwrap_or(0),
                        v => v,
                    };
                    set(&mut o, t, p, v);
                }
                o
            }
            Starting::Timestamp(ts) => {
                let parts: Vec<(String, i32)> = flat(&snap.latest)
                    .map(|((t, p), _)| (t.to_string(), p))
                    .collect();
                let admin = self.admin()?;
                let ts = *ts;
                let found = tokio::task::spawn_blocking(move || admin.offsets_for_time(&parts, ts))
                    .await
                    .map_err(|e| Error::Internal(format!("kafka offsets task: {e}")))??;
                let mut o = PartitionOffsets::new();
                for ((t, p), v) in found {
                    let v = v.ok_or_else(|| {
                        Error::WrongState(format!(
                            "partition {t}-{p} has no record at or after starting_timestamp \
                             {ts}"
                        ))
                    })?;
                    set(&mut o, &t, p, v);
                }
                o
            }
        };
        let json = to_offset(&o).to_string();
        crate::fsutil::write_atomic(&file, format!("v1\n{json}").as_bytes())?;
        self.initial = Some(o.clone());
        Ok(o)
    }

    /// Brokers that stopped answering: within `broker_timeout` the batch waits (nothing
    /// new); past it, the error.
    fn broker_down(&mut self, e: Error) -> Result<()> {
        let since = *self.down_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.config.broker_timeout {
            return Err(e);
        }
        tracing::warn!(
            source = %self.config.describe(),
            error = %e,
            down_for_s = since.elapsed().as_secs(),
            "kafka brokers are not answering; retrying"
        );
        Ok(())
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn schema(&self) -> SchemaRef {
        self.config.schema.clone()
    }

    fn describe(&self) -> String {
        self.config.describe()
    }

    async fn prepare_available_now(&mut self) -> Result<()> {
        let snap = self.snapshot().await?;
        self.available_now = Some(snap.latest);
        Ok(())
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: ReadLimit,
    ) -> Result<Option<Offset>> {
        let snap = match self.snapshot().await {
            Ok(s) => {
                if let Some(since) = self.down_since.take() {
                    tracing::info!(
                        source = %self.config.describe(),
                        down_for_s = since.elapsed().as_secs(),
                        "kafka brokers answer again"
                    );
                }
                s
            }
            Err(e @ Error::Broker { .. }) if self.initial.is_some() || start.is_some() => {
                self.broker_down(e)?;
                return Ok(start.cloned());
            }
            Err(e) => return Err(e),
        };
        let start = match start {
            Some(s) => from_offset(s)?,
            None => self.initial(&snap).await?,
        };
        self.watch(&snap.latest);
        let mut latest = snap.latest.clone();
        if let Some(cap) = &self.available_now {
            // available_now: never past what was there when the run started; partitions
            // that appeared since wait for the next run.
            latest = flat(cap)
                .filter_map(|((t, p), c)| get(&latest, t, p).map(|l| ((t, p), l.min(c))))
                .fold(PartitionOffsets::new(), |mut o, ((t, p), v)| {
                    set(&mut o, t, p, v);
                    o
                });
        }
        let end = match limit {
            ReadLimit::AllAvailable => latest.clone(),
            ReadLimit::Default => {
                let delay = match self.config.min_offsets_per_trigger {
                    Some(min)
                        if self
                            .last_trigger
                            .is_some_and(|t| t.elapsed() < self.config.max_trigger_delay) =>
                    {
                        let new: i64 = flat(&latest)
                            .map(|((t, p), l)| {
                                l - get(&start, t, p)
                                    .or_else(|| get(&snap.earliest, t, p))
                                    .unwrap_or(0)
                            })
                            .sum();
                        (new as f64) < min as f64
                    }
                    _ => false,
                };
                if delay {
                    start.clone()
                } else {
                    match self.config.max_offsets_per_trigger {
                        Some(max) => rate_limit(max, &start, &latest, &snap.earliest),
                        None => latest.clone(),
                    }
                }
            }
        };
        if end != start {
            self.last_trigger = Some(Instant::now());
        }
        let mut seen = self.seen();
        seen.held_back = end != latest;
        seen.end = Some(end.clone());
        seen.latest = Some(snap.latest);
        seen.earliest = snap.earliest;
        drop(seen);
        Ok(Some(to_offset(&end)))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let start = match start {
            Some(s) => from_offset(s)?,
            // The first batch, perhaps replayed after a restart: from the offsets fixed
            // when it was planned.
            None => match &self.initial {
                Some(i) => i.clone(),
                None => self.stored_initial()?.ok_or_else(|| {
                    Error::Internal("a kafka batch without its starting offsets".into())
                })?,
            },
        };
        let end = from_offset(end)?;
        let config = self.config.clone();
        let earliest = self.seen().earliest.clone();
        let admin = self.admin.clone();
        let reader = self.reader.clone();
        let (reads, losses) = tokio::task::spawn_blocking(move || -> Result<_> {
            // Earliest offsets as of now, for the partitions this batch reads (new ones
            // start there; offsets below it are gone).
            let mut earliest = earliest;
            if let Some(admin) = &admin {
                let parts: Vec<(String, i32)> =
                    flat(&end).map(|((t, p), _)| (t.to_string(), p)).collect();
                if let Ok(now) = admin.ends(&parts, Ends::Earliest) {
                    for ((t, p), low) in now {
                        set(&mut earliest, &t, p, low);
                    }
                }
            }
            let (ranges, losses) = offset_ranges(&start, &end, &earliest);
            if config.fail_on_data_loss
                && let Some(l) = losses.first()
            {
                return Err(Error::WrongState(format!(
                    "{}: {} (set fail_on_data_loss = false to skip lost offsets and go on)",
                    config.describe(),
                    l.message
                )));
            }
            let mut reader = reader.lock().unwrap_or_else(|p| p.into_inner());
            if reader.is_none() {
                *reader = Some(Reader::new(&config.conn, config.isolation)?);
            }
            let read = match reader.as_ref() {
                Some(r) => r.read(&ranges, config.include_headers),
                None => Err(Error::Internal("no kafka reader".into())),
            };
            if read.is_err() {
                *reader = None;
            }
            Ok((read?, losses))
        })
        .await
        .map_err(|e| Error::Internal(format!("kafka read task: {e}")))??;
        for l in &losses {
            tracing::warn!(source = %self.config.describe(), "data loss: {}", l.message);
        }
        let mut malformed = Vec::new();
        let mut arrivals: BTreeMap<i64, u64> = BTreeMap::new();
        let mut batches = Vec::new();
        for read in &reads {
            for r in &read.records {
                if let Some(t) = r.timestamp_ms {
                    *arrivals.entry(t).or_default() += 1;
                }
            }
            if let Some(b) = to_batch(&self.config, read, &mut malformed)? {
                batches.push(b);
            }
        }
        let mut seen = self.seen();
        seen.data_loss += losses.iter().map(|l| l.offsets.max(1)).sum::<u64>();
        seen.malformed = malformed;
        seen.arrivals = arrivals
            .into_iter()
            .map(|(at_ms, rows)| Arrival { at_ms, rows })
            .collect();
        drop(seen);
        Ok(Box::pin(futures::stream::iter(batches.into_iter().map(Ok))))
    }

    fn metrics(&self) -> BTreeMap<String, String> {
        let seen = self.seen();
        let mut out = BTreeMap::new();
        if let (Some(end), Some(latest)) = (&seen.end, &seen.latest) {
            let behind: Vec<i64> = flat(latest)
                .map(|((t, p), l)| (l - get(end, t, p).unwrap_or(l)).max(0))
                .collect();
            if !behind.is_empty() {
                let min = behind.iter().min().copied().unwrap_or(0);
                let max = behind.iter().max().copied().unwrap_or(0);
                let avg = behind.iter().sum::<i64>() as f64 / behind.len() as f64;
                out.insert("minOffsetsBehindLatest".into(), min.to_string());
                out.insert("maxOffsetsBehindLatest".into(), max.to_string());
                out.insert("avgOffsetsBehindLatest".into(), format!("{avg:?}"));
            }
        }
        if seen.data_loss > 0 {
            out.insert("dataLoss".into(), seen.data_loss.to_string());
        }
        if let Some(since) = self.down_since {
            out.insert(
                "brokerDownForMs".into(),
                since.elapsed().as_millis().to_string(),
            );
        }
        out
    }

    fn take_malformed(&self) -> Vec<MalformedRecord> {
        std::mem::take(&mut self.seen().malformed)
    }

    fn take_arrivals(&self) -> Vec<Arrival> {
        std::mem::take(&mut self.seen().arrivals)
    }

    fn backlog(&self, end: Option<&Offset>) -> Backlog {
        let seen = self.seen();
        let Some(latest) = &seen.latest else {
            return Backlog::default();
        };
        let end = match end.map(from_offset) {
            Some(Ok(e)) => e,
            _ => match &seen.end {
                Some(e) => e.clone(),
                None => return Backlog::default(),
            },
        };
        let rows: i64 = flat(latest)
            .map(|((t, p), l)| (l - get(&end, t, p).unwrap_or(l)).max(0))
            .sum();
        Backlog {
            files: None,
            rows: Some(rows as u64),
            bytes: None,
        }
    }

    fn held_back(&self) -> bool {
        self.seen().held_back
    }

    fn arrivals(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.arrived.subscribe())
    }

    fn reported_latest(&self) -> Option<Offset> {
        self.seen().latest.as_ref().map(to_offset)
    }
}

/// One partition's records as rows of the stream.
fn to_batch(
    config: &KafkaSourceConfig,
    read: &PartitionRead,
    malformed: &mut Vec<MalformedRecord>,
) -> Result<Option<RecordBatch>> {
    let recs = &read.records;
    if recs.is_empty() {
        return Ok(None);
    }
    let schema = config.schema.clone();
    // Which records become rows, and their declared columns.
    let (keep, declared): (Vec<usize>, Vec<ArrayRef>) = match &config.value {
        ValueFormat::Fixed => ((0..recs.len()).collect(), Vec::new()),
        ValueFormat::Raw => {
            let col: ArrayRef = match schema.field(0).data_type() {
                DataType::Binary => {
                    let mut b = BinaryBuilder::new();
                    for r in recs {
                        b.append_option(r.value.as_deref());
                    }
                    Arc::new(b.finish())
                }
                _ => {
                    let mut b = StringBuilder::new();
                    for r in recs {
                        b.append_option(r.value.as_deref().map(String::from_utf8_lossy));
                    }
                    Arc::new(b.finish())
                }
            };
            ((0..recs.len()).collect(), vec![col])
        }
        ValueFormat::Decoded(_) | ValueFormat::Avro(_) => {
            decode_values(&config.value, read, malformed)?
        }
    };
    let n = keep.len();
    let idx = |i: usize| keep[i];
    let mut cols: Vec<ArrayRef> = declared;
    for f in schema.fields().iter().skip(config.declared) {
        let col: ArrayRef = match f.name().as_str() {
            "key" => {
                let mut b = BinaryBuilder::new();
                for i in 0..n {
                    b.append_option(recs[idx(i)].key.as_deref());
                }
                Arc::new(b.finish())
            }
            "value" => {
                let mut b = BinaryBuilder::new();
                for i in 0..n {
                    b.append_option(recs[idx(i)].value.as_deref());
                }
                Arc::new(b.finish())
            }
            "topic" => Arc::new(StringArray::from(vec![read.topic.as_str(); n])),
            "partition" => Arc::new(Int32Array::from(vec![read.partition; n])),
            "offset" => Arc::new(Int64Array::from_iter_values(
                (0..n).map(|i| recs[idx(i)].offset),
            )),
            "timestamp" => Arc::new(TimestampMicrosecondArray::from_iter(
                (0..n).map(|i| recs[idx(i)].timestamp_ms.map(|t| t * 1000)),
            )),
            "timestamp_type" => Arc::new(Int32Array::from_iter(
                (0..n).map(|i| Some(recs[idx(i)].timestamp_type)),
            )),
            "headers" => {
                let mut b = StringBuilder::new();
                for i in 0..n {
                    b.append_option(recs[idx(i)].headers.as_ref().map(|h| headers_json(h)));
                }
                Arc::new(b.finish())
            }
            other => {
                return Err(Error::Internal(format!("unknown kafka column {other}")));
            }
        };
        let col = if col.data_type() != f.data_type() {
            datafusion::arrow::compute::cast(&col, f.data_type())?
        } else {
            col
        };
        cols.push(col);
    }
    debug_assert!(matches!(
        schema
            .field_with_name("timestamp")
            .map(|f| f.data_type().clone()),
        Ok(DataType::Timestamp(TimeUnit::Microsecond, _)) | Err(_)
    ));
    Ok(Some(RecordBatch::try_new(schema, cols)?))
}

/// A Kafka stream as a table, for a `SELECT` of the stream itself: Spark's batch read of
/// a topic with its default range, every record from the earliest offsets to the latest
/// ones as of the scan (whatever the stream's `starting_offsets`, which is where a
/// streaming query starts). Values decode as the stream decodes them; malformed ones follow
/// the mode (the side table belongs to sinks). The records read are held in memory.
#[derive(Debug)]
pub struct KafkaTable {
    config: Arc<KafkaSourceConfig>,
}

impl KafkaTable {
    pub fn new(config: Arc<KafkaSourceConfig>) -> KafkaTable {
        KafkaTable { config }
    }

    fn read_all(config: &KafkaSourceConfig) -> Result<Vec<RecordBatch>> {
        let admin = Admin::new(&config.conn, config.isolation)?;
        let snap = snapshot(&admin, &config.subscription)?;
        let (ranges, _) = offset_ranges(&snap.earliest, &snap.latest, &snap.earliest);
        let reads =
            Reader::new(&config.conn, config.isolation)?.read(&ranges, config.include_headers)?;
        let mut malformed = Vec::new();
        let mut out = Vec::new();
        for read in &reads {
            out.extend(to_batch(config, read, &mut malformed)?);
        }
        Ok(out)
    }
}

#[async_trait]
impl datafusion::datasource::TableProvider for KafkaTable {
    fn schema(&self) -> SchemaRef {
        self.config.schema.clone()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        use datafusion::error::DataFusionError;
        let config = self.config.clone();
        let batches = tokio::task::spawn_blocking(move || KafkaTable::read_all(&config))
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(
            datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
                &[batches],
                self.config.schema.clone(),
                projection.cloned(),
            )?,
        )
    }
}

/// Headers as JSON: `[{"key": "k", "value": "v"}]`, a value that is not UTF-8 as
/// `{"key": "k", "value_base64": "..."}`.
fn headers_json(h: &[(String, Option<Vec<u8>>)]) -> String {
    use base64::Engine;
    serde_json::Value::Array(
        h.iter()
            .map(|(k, v)| match v {
                None => serde_json::json!({"key": k, "value": null}),
                Some(v) => match std::str::from_utf8(v) {
                    Ok(s) => serde_json::json!({"key": k, "value": s}),
                    Err(_) => serde_json::json!({
                        "key": k,
                        "value_base64": base64::engine::general_purpose::STANDARD.encode(v)
                    }),
                },
            })
            .collect(),
    )
    .to_string()
}

/// Decodes one partition's values (JSON, CSV or Avro) into the declared columns: the
/// records kept (all but the malformed ones DROPMALFORMED drops) and their columns. A
/// record without a value (a tombstone) or with an empty one (JSON, CSV: blank) is a row
/// of NULLs.
fn decode_values(
    value: &ValueFormat,
    read: &PartitionRead,
    malformed: &mut Vec<MalformedRecord>,
) -> Result<(Vec<usize>, Vec<ArrayRef>)> {
    let (mode, schema) = match value {
        ValueFormat::Decoded(d) => (d.mode, d.schema.clone()),
        ValueFormat::Avro(d) => (d.mode, d.schema.clone()),
        ValueFormat::Fixed | ValueFormat::Raw => {
            return Err(Error::Internal("kafka: not a decoded format".into()));
        }
    };
    let recs = &read.records;
    let with_value: Vec<usize> = (0..recs.len())
        .filter(|&i| {
            recs[i].value.as_ref().is_some_and(|v| match value {
                ValueFormat::Avro(_) => !v.is_empty(),
                _ => !v.iter().all(u8::is_ascii_whitespace),
            })
        })
        .collect();
    let place = |line: u64| {
        let offset = (line as usize)
            .checked_sub(1)
            .and_then(|l| with_value.get(l))
            .map(|&i| recs[i].offset);
        match offset {
            Some(o) => format!("{}-{} offset {o}", read.topic, read.partition),
            None => format!("{}-{}", read.topic, read.partition),
        }
    };
    let decoded = match value {
        _ if with_value.is_empty() => crate::format::FileRead::default(),
        ValueFormat::Avro(d) => {
            let values: Vec<&[u8]> = with_value
                .iter()
                .map(|&i| recs[i].value.as_deref().unwrap_or_default())
                .collect();
            d.decode(&values, &place)?
        }
        ValueFormat::Decoded(d) => {
            let mut text = Vec::new();
            for &i in &with_value {
                let v = recs[i].value.as_deref().unwrap_or_default();
                text.extend(
                    v.iter()
                        .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
                );
                text.push(b'\n');
            }
            d.read_text(&text, &place)?
        }
        ValueFormat::Fixed | ValueFormat::Raw => {
            return Err(Error::Internal("kafka: not a decoded format".into()));
        }
    };
    let rejected: std::collections::BTreeSet<usize> = decoded
        .rejected
        .iter()
        .filter_map(|r| with_value.get((r.line as usize).checked_sub(1)?).copied())
        .collect();
    for r in &decoded.rejected {
        let Some(&i) = with_value.get((r.line as usize).saturating_sub(1)) else {
            continue;
        };
        malformed.push(MalformedRecord {
            path: format!("{}-{}", read.topic, read.partition),
            record: crate::format::Rejected {
                line: recs[i].offset as u64,
                text: r.text.clone(),
                error: r.error.clone(),
            },
        });
    }
    let dropped = mode == ParseMode::DropMalformed;
    // The decoded rows, in order: one per value (PERMISSIVE), or one per good value.
    let rows = if decoded.batches.is_empty() {
        RecordBatch::new_empty(schema.clone())
    } else {
        concat_batches(&schema, &decoded.batches)?
    };
    let mut keep = Vec::with_capacity(recs.len());
    let mut take_idx: Vec<Option<u32>> = Vec::with_capacity(recs.len());
    let mut next_row = 0u32;
    let mut values = with_value.iter().peekable();
    for i in 0..recs.len() {
        if values.peek() == Some(&&i) {
            values.next();
            if dropped && rejected.contains(&i) {
                continue;
            }
            keep.push(i);
            take_idx.push(Some(next_row));
            next_row += 1;
        } else {
            keep.push(i);
            take_idx.push(None);
        }
    }
    if next_row as usize != rows.num_rows() {
        return Err(Error::Internal(format!(
            "kafka decode: {} rows for {} values",
            rows.num_rows(),
            next_row
        )));
    }
    let indices = UInt32Array::from(take_idx);
    let cols = rows
        .columns()
        .iter()
        .map(|c| {
            if c.is_empty() {
                Ok(new_null_array(c.data_type(), indices.len()))
            } else {
                Ok(take(c.as_ref(), &indices, None)?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((keep, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(pairs: &[(&str, i32, i64)]) -> PartitionOffsets {
        let mut o = PartitionOffsets::new();
        for (t, p, v) in pairs {
            set(&mut o, t, *p, *v);
        }
        o
    }

    #[test]
    fn offsets_round_trip_in_sparks_form() {
        let o = offsets(&[("t", 0, 42), ("t", 1, 17), ("u", 0, 0)]);
        let json = to_offset(&o).to_string();
        assert_eq!(json, r#"{"t":{"0":42,"1":17},"u":{"0":0}}"#);
        assert_eq!(parse_offsets(&json).unwrap(), o);
        assert!(parse_offsets(r#"{"t":{"x":1}}"#).is_err());
        assert!(parse_offsets(r#"{"t":{"0":-3}}"#).is_err());
    }

    #[test]
    fn rate_limit_shares_in_proportion_and_never_starves() {
        // Spark's KafkaMicroBatchSourceSuite: backlogs 100 and 1, limit 10 → 9 (floor of
        // 9.9) and 1 (ceil of 0.099).
        let from = offsets(&[("t", 0, 0), ("t", 1, 0)]);
        let until = offsets(&[("t", 0, 100), ("t", 1, 1)]);
        let got = rate_limit(10, &from, &until, &PartitionOffsets::new());
        assert_eq!(got, offsets(&[("t", 0, 9), ("t", 1, 1)]));
        // Never past the end; nothing new: the end.
        let got = rate_limit(1000, &from, &until, &PartitionOffsets::new());
        assert_eq!(got, until);
        assert_eq!(
            rate_limit(5, &until, &until, &PartitionOffsets::new()),
            until
        );
        // A new partition starts at its earliest offset.
        let until = offsets(&[("t", 0, 10), ("t", 1, 10), ("t", 2, 30)]);
        let from = offsets(&[("t", 0, 0), ("t", 1, 0)]);
        let earliest = offsets(&[("t", 2, 20)]);
        let got = rate_limit(6, &from, &until, &earliest);
        assert_eq!(got, offsets(&[("t", 0, 2), ("t", 1, 2), ("t", 2, 22)]));
    }

    #[test]
    fn ranges_start_new_partitions_at_earliest_and_report_losses() {
        let start = offsets(&[("t", 0, 5), ("t", 1, 7), ("gone", 0, 3)]);
        let end = offsets(&[("t", 0, 9), ("t", 1, 4), ("t", 2, 6)]);
        let earliest = offsets(&[("t", 0, 0), ("t", 1, 0), ("t", 2, 0)]);
        let (ranges, losses) = offset_ranges(&start, &end, &earliest);
        assert_eq!(
            ranges,
            vec![
                OffsetRange {
                    topic: "t".into(),
                    partition: 0,
                    from: 5,
                    until: 9
                },
                OffsetRange {
                    topic: "t".into(),
                    partition: 2,
                    from: 0,
                    until: 6
                },
            ]
        );
        let messages: Vec<&str> = losses.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains("gone-0 is gone"), "{messages:?}");
        assert!(messages[1].contains("changed from 7 to 4"), "{messages:?}");
        // Aged out: the range starts at the earliest offset left, and says how many went.
        let (ranges, losses) = offset_ranges(
            &offsets(&[("t", 0, 2)]),
            &offsets(&[("t", 0, 10)]),
            &offsets(&[("t", 0, 6)]),
        );
        assert_eq!(ranges[0].from, 6);
        assert_eq!(losses[0].offsets, 4);
        // A new partition that does not start at 0.
        let (_, losses) = offset_ranges(
            &PartitionOffsets::new(),
            &offsets(&[("t", 0, 10)]),
            &offsets(&[("t", 0, 3)]),
        );
        assert!(losses[0].message.contains("starts from 3 instead of 0"));
    }

    fn opts(pairs: &[(&str, &str)]) -> Options {
        Options::of(pairs)
    }

    fn col(name: &str, ty: &str) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            sql_type: ty.into(),
            data_type: DataType::Null,
            not_null: false,
        }
    }

    #[test]
    fn declared_columns_come_first_and_survive_a_reload() {
        let o = opts(&[
            ("connector", "kafka"),
            ("bootstrap_servers", "b:9092"),
            ("topic", "t"),
            ("format", "json"),
        ]);
        let (cols, cfg) =
            KafkaSourceConfig::declare(vec![col("a", "INT"), col("timestamp", "TIMESTAMP")], &o)
                .unwrap();
        let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "a",
                "timestamp",
                "key",
                "value",
                "topic",
                "partition",
                "offset",
                "timestamp_type"
            ]
        );
        assert_eq!(cfg.declared, 2);
        // The catalog passes the whole list back on load.
        let (again, cfg2) = KafkaSourceConfig::declare(cols.clone(), &o).unwrap();
        assert_eq!(again.len(), cols.len());
        assert_eq!(cfg2.declared, 2);
        // No columns: Spark's.
        let fixed = opts(&[
            ("connector", "kafka"),
            ("bootstrap_servers", "b"),
            ("topic", "t"),
        ]);
        let (cols, cfg) = KafkaSourceConfig::declare(vec![], &fixed).unwrap();
        assert_eq!(cols.len(), 7);
        assert_eq!(cfg.declared, 0);
        let (cols2, _) = KafkaSourceConfig::declare(cols.clone(), &fixed).unwrap();
        assert_eq!(cols2.len(), 7);
        // Avro without declared columns: the record's fields, the same after a reload.
        let avro = opts(&[
            ("connector", "kafka"),
            ("bootstrap_servers", "b"),
            ("topic", "t"),
            ("format", "avro"),
            (
                "avro_schema",
                r#"{"type": "record", "name": "r", "fields": [{"name": "n", "type": "long"},
                    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}"#,
            ),
        ]);
        let (cols, cfg) = KafkaSourceConfig::declare(vec![], &avro).unwrap();
        let typed: Vec<(&str, &str)> = cols
            .iter()
            .take(3)
            .map(|c| (c.name.as_str(), c.sql_type.as_str()))
            .collect();
        assert_eq!(
            typed,
            [("n", "bigint"), ("at", "timestamptz"), ("key", "BYTEA")]
        );
        assert_eq!(cfg.declared, 2);
        let (cols2, cfg2) = KafkaSourceConfig::declare(cols.clone(), &avro).unwrap();
        assert_eq!(cols2.len(), cols.len());
        assert_eq!(cfg2.declared, 2);
    }

    #[test]
    fn bad_options_are_refused_with_the_reason() {
        let base = [("connector", "kafka"), ("bootstrap_servers", "b:9092")];
        let err = |extra: &[(&str, &str)], cols: Vec<ColumnSpec>| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            KafkaSourceConfig::declare(cols, &opts(&all))
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[], vec![]).contains("exactly one of"));
        assert!(err(&[("topic", "a"), ("topic_pattern", "a.*")], vec![]).contains("exactly one"));
        assert!(err(&[("topic_pattern", "(")], vec![]).contains("invalid topic_pattern"));
        assert!(
            err(&[("topic", "t"), ("starting_offsets", "soon")], vec![])
                .contains("invalid starting_offsets")
        );
        assert!(
            err(&[("topic", "t")], vec![col("a", "INT")]).contains("needs the option \"format\"")
        );
        assert!(err(&[("topic", "t"), ("format", "json")], vec![]).contains("declares none"));
        assert!(err(&[("topic", "t"), ("colour", "red")], vec![]).contains("unknown option"));
        assert!(
            err(
                &[
                    ("topic", "t"),
                    ("min_offsets_per_trigger", "10"),
                    ("max_offsets_per_trigger", "5")
                ],
                vec![]
            )
            .contains("above")
        );
        assert!(
            err(
                &[("topic", "t"), ("starting_offsets", r#"{"u":{"0":1}}"#)],
                vec![]
            )
            .contains("does not read")
        );
    }

    #[test]
    fn values_decode_into_columns_with_malformed_ones_as_the_mode_says() {
        let decoder = |mode| {
            ValueFormat::Decoded(FileDecoder {
                format: FileFormat::Json,
                mode,
                schema: Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, true)])),
            })
        };
        let rec = |offset, v: Option<&str>| crate::kafka::Record {
            key: None,
            value: v.map(|v| v.as_bytes().to_vec()),
            partition: 0,
            offset,
            timestamp_ms: Some(1000),
            timestamp_type: 0,
            headers: None,
        };
        let read = PartitionRead {
            topic: "t".into(),
            partition: 0,
            records: vec![
                rec(10, Some(r#"{"a": 1}"#)),
                rec(11, Some("not json")),
                rec(12, None),
                rec(13, Some("{\"a\":\n 4}")),
            ],
        };
        let mut bad = Vec::new();
        let (keep, cols) = decode_values(&decoder(ParseMode::Permissive), &read, &mut bad).unwrap();
        assert_eq!(keep, vec![0, 1, 2, 3]);
        let a = cols[0].as_any().downcast_ref::<Int32Array>().unwrap();
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            vec![Some(1), None, None, Some(4)]
        );
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].path, "t-0");
        assert_eq!(bad[0].record.line, 11);
        let mut bad = Vec::new();
        let (keep, cols) =
            decode_values(&decoder(ParseMode::DropMalformed), &read, &mut bad).unwrap();
        assert_eq!(keep, vec![0, 2, 3]);
        assert_eq!(cols[0].len(), 3);
        let e = decode_values(&decoder(ParseMode::FailFast), &read, &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("t-0 offset 11"), "{e}");
    }
}
