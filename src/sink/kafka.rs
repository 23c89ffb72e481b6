//! The Kafka sink (`connector = 'kafka'`): each micro-batch's rows as records of a topic.
//!
//! The rows' columns are Spark's: `value` (required, TEXT or BYTEA), `key`, `topic` (the
//! `topic` option overrides it, as in Spark), `partition`, `headers` (the JSON a Kafka
//! stream's `headers` column holds) and `timestamp`; other columns are ignored. With
//! `format = 'json'` each row becomes one record whose value is the row as a JSON object
//! (`to_json(struct(*))`) and whose key is the group key's JSON in update and complete
//! modes, or the `key` option's columns.
//!
//! Exactly once, where Spark's Kafka sink is at least once: each batch is one Kafka
//! transaction with a transactional id made from the query id, so a restarted query
//! fences its older self; each record carries the query and batch ids as headers, and a
//! replayed batch that the topic already holds is skipped (`kafka::producer`).
//! `delivery = 'at_least_once'` writes without transactions.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Int32Type, TimeUnit, TimestampMillisecondType,
};

use super::{BatchInfo, QueryOutput, Sink, SinkCommit};
use crate::error::{Error, Result};
use crate::kafka::{
    BOOTSTRAP_SERVERS, Connection, Delivery, KafkaProducer, OutRecord, SECURITY_OPTIONS,
};
use crate::sql::options::{OptionSpec, OptionTable, OptionType, Options, parse_duration};

const KAFKA_SINK_OPTIONS: [OptionSpec; 26] = [
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
        "The topic every row goes to, overriding a topic column (as in Spark); needed for \
         exactly once (its records' tidemark.batch headers say which batches it holds)",
    ),
    OptionSpec::new(
        "format",
        OptionType::OneOf(&["columns", "json"]),
        Some("columns"),
        "columns: the query's value, key, topic, partition, headers and timestamp columns \
         make the record (Spark's); json: each row is the value, as a JSON object",
    ),
    OptionSpec::new(
        "key",
        OptionType::Text,
        None,
        "json: the columns (a comma list) whose JSON is each record's key (default: the \
         group key in update and complete modes, none in append mode)",
    ),
    OptionSpec::new(
        "delivery",
        OptionType::OneOf(&["exactly_once", "at_least_once"]),
        Some("exactly_once"),
        "exactly_once: each batch one transaction, readers with isolation.level = \
         read_committed see every row once across crashes; at_least_once: no transactions \
         (for brokers without them, such as Event Hubs Standard), a replayed batch is \
         written again",
    ),
    OptionSpec::new(
        "transaction_timeout",
        OptionType::Duration,
        Some("1 minute"),
        "exactly_once: how long a batch's transaction may stay open before the broker aborts \
         it (at most the broker's transaction.max.timeout.ms, 15 minutes by default)",
    ),
    SECURITY_OPTIONS[0],
    SECURITY_OPTIONS[1],
    SECURITY_OPTIONS[2],
    SECURITY_OPTIONS[3],
    SECURITY_OPTIONS[4],
    super::TRIGGER,
    OptionSpec::new(
        "output_mode",
        OptionType::OneOf(&["append", "update", "complete"]),
        Some("append"),
        "What each batch writes: append, final rows; update, the rows that changed; \
         complete, every row (one record per row)",
    ),
    super::CHECKPOINT_LOCATION,
    super::WATERMARK,
    super::MULTIPLE_WATERMARK_POLICY,
    super::STATE_PARTITIONS,
    super::STATE_STORE,
    super::DEDUPLICATE,
    super::LATE_ROWS,
    super::MALFORMED_ROWS,
    super::MAX_EVENT_TIME_SKEW,
    super::MAX_FILES_PER_TRIGGER,
    super::MAX_ROWS_PER_TRIGGER,
    super::MAX_OFFSETS_PER_TRIGGER,
];

/// The options of a Kafka sink.
pub const OPTIONS: OptionTable = OptionTable {
    object: "sink",
    connector: "kafka",
    options: &KAFKA_SINK_OPTIONS,
};

/// How rows become records.
#[derive(Debug, Clone, PartialEq)]
enum Shape {
    /// Spark's columns, by index in the rows.
    Columns {
        value: usize,
        key: Option<usize>,
        topic: Option<usize>,
        partition: Option<usize>,
        headers: Option<usize>,
        timestamp: Option<usize>,
    },
    /// Each row as a JSON object; the key the JSON of these columns.
    Json { key: Vec<usize> },
}

/// A Kafka sink's settings, checked at `CREATE SINK`.
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    conn: Connection,
    topic: Option<String>,
    delivery: Delivery,
    transaction_timeout: Duration,
    shape: Shape,
}

impl KafkaSinkConfig {
    /// Checks a Kafka sink's options against the rows its query writes.
    pub fn new(options: &Options, output: &QueryOutput) -> Result<KafkaSinkConfig> {
        options.check(&OPTIONS)?;
        let conn = Connection::from_options(options)?;
        let topic = options.get("topic").map(|t| t.trim().to_string());
        let delivery = Delivery::parse(options.get("delivery").unwrap_or("exactly_once"))?;
        let schema = &output.schema;
        let find = |name: &str| schema.index_of(name).ok();
        let shape = match options.get("format").unwrap_or("columns") {
            f if f.eq_ignore_ascii_case("json") => {
                let key = match options.get("key") {
                    Some(k) => k
                        .split(',')
                        .map(|c| {
                            let c = c.trim();
                            find(c).ok_or_else(|| Error::UndefinedObject {
                                kind: "column",
                                name: c.to_string(),
                            })
                        })
                        .collect::<Result<Vec<_>>>()?,
                    None if output.mode != super::WriteMode::Append => output
                        .keys
                        .iter()
                        .flatten()
                        .filter_map(|k| find(k))
                        .collect(),
                    None => Vec::new(),
                };
                Shape::Json { key }
            }
            _ => {
                if options.get("key").is_some() {
                    return Err(Error::invalid_option(
                        "option \"key\" applies to format = 'json'; with columns, the key \
                         column is the key",
                    ));
                }
                let typed =
                    |name: &str, ok: &dyn Fn(&DataType) -> bool, want: &str| match find(name) {
                        Some(i) if ok(schema.field(i).data_type()) => Ok(Some(i)),
                        Some(i) => Err(Error::InvalidOption {
                            message: format!(
                                "a kafka sink's {name} column must be {want}, not {}",
                                crate::sql::types::arrow_to_sql(schema.field(i).data_type())
                            ),
                            hint: Some(format!("CAST({name} AS TEXT)")),
                        }),
                        None => Ok(None),
                    };
                let text_or_bytes = |t: &DataType| {
                    matches!(
                        t,
                        DataType::Utf8
                            | DataType::LargeUtf8
                            | DataType::Utf8View
                            | DataType::Binary
                            | DataType::LargeBinary
                            | DataType::BinaryView
                    )
                };
                let text = |t: &DataType| {
                    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
                };
                let value = typed("value", &text_or_bytes, "TEXT or BYTEA")?.ok_or_else(|| {
                    Error::InvalidOption {
                        message: "a kafka sink's query has no value column".into(),
                        hint: Some(
                            "Name the record's value: SELECT to_json(...) AS value, or \
                             format = 'json' to send each row as JSON."
                                .into(),
                        ),
                    }
                })?;
                let topic_col = typed("topic", &text, "TEXT")?;
                if topic.is_none() && topic_col.is_none() {
                    return Err(Error::InvalidOption {
                        message: "a kafka sink needs the option \"topic\" or a topic column".into(),
                        hint: Some("Add topic = 'out'.".into()),
                    });
                }
                Shape::Columns {
                    value,
                    key: typed("key", &text_or_bytes, "TEXT or BYTEA")?,
                    topic: topic_col,
                    partition: typed(
                        "partition",
                        &|t| matches!(t, DataType::Int32 | DataType::Int16 | DataType::Int64),
                        "INTEGER",
                    )?,
                    headers: typed("headers", &text, "TEXT (a JSON array of key and value)")?,
                    timestamp: typed(
                        "timestamp",
                        &|t| matches!(t, DataType::Timestamp(..)),
                        "TIMESTAMP",
                    )?,
                }
            }
        };
        if topic.is_none() && matches!(shape, Shape::Json { .. }) {
            return Err(Error::InvalidOption {
                message: "a kafka sink with format = 'json' needs the option \"topic\"".into(),
                hint: Some("Add topic = 'out'.".into()),
            });
        }
        if delivery == Delivery::ExactlyOnce && topic.is_none() {
            return Err(Error::InvalidOption {
                message: "an exactly-once kafka sink needs the option \"topic\" (its records \
                          say which batches it holds)"
                    .into(),
                hint: Some("Add topic = 'out', or delivery = 'at_least_once'.".into()),
            });
        }
        let transaction_timeout = match options.get("transaction_timeout") {
            Some(d) => parse_duration(d)?,
            None => Duration::from_secs(60),
        };
        Ok(KafkaSinkConfig {
            conn,
            topic,
            delivery,
            transaction_timeout,
            shape,
        })
    }

    /// Whether the brokers answer (at `CREATE SINK`, within a bounded time).
    pub async fn check_reachable(&self) -> Result<()> {
        crate::kafka::check_reachable(&self.conn).await?;
        let Some(topic) = self.topic.clone() else {
            return Ok(());
        };
        let conn = self.conn.clone();
        let parts = tokio::task::spawn_blocking(move || {
            crate::kafka::Admin::new(&conn, crate::kafka::Isolation::ReadUncommitted)?
                .partitions(&topic)
        })
        .await
        .map_err(|e| Error::Internal(format!("kafka check task: {e}")))??;
        if parts.is_empty() {
            let topic = self.topic.as_deref().unwrap_or_default();
            return Err(Error::InvalidOption {
                message: format!(
                    "kafka topic \"{topic}\" does not exist at {}",
                    self.conn.bootstrap_servers
                ),
                hint: Some(
                    "Create the topic first (kafka-topics.sh --create, or the service's portal): \
                     a sink does not create topics."
                        .into(),
                ),
            });
        }
        Ok(())
    }
}

/// A sink's producer and the last batch the topic held when it was opened (exactly once).
type OpenProducer = (KafkaProducer, Option<i64>);

/// A running query's Kafka sink.
pub struct KafkaSink {
    config: Arc<KafkaSinkConfig>,
    /// Opened at the first batch (the transactional id is the query's), with the last
    /// batch the topic held then.
    producer: Arc<Mutex<Option<OpenProducer>>>,
}

impl KafkaSink {
    pub fn new(config: KafkaSinkConfig) -> KafkaSink {
        KafkaSink {
            config: Arc::new(config),
            producer: Arc::new(Mutex::new(None)),
        }
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn add_batch(&self, batch: &BatchInfo<'_>, rows: Vec<RecordBatch>) -> Result<SinkCommit> {
        let records = rows
            .iter()
            .map(|b| to_records(&self.config, b))
            .collect::<Result<Vec<_>>>()?
            .concat();
        let config = self.config.clone();
        let producer = self.producer.clone();
        let id = batch.id.get() as i64;
        let txn_id = format!("tidemark-{}", batch.query_id);
        tokio::task::spawn_blocking(move || {
            let mut guard = producer.lock().unwrap_or_else(|p| p.into_inner());
            if guard.is_none() {
                let p = KafkaProducer::open(
                    &config.conn,
                    config.delivery,
                    &txn_id,
                    config.topic.as_deref().unwrap_or_default(),
                    config.transaction_timeout,
                )?;
                let last = p.last_committed_batch()?;
                *guard = Some((p, last));
            }
            let Some((p, last)) = guard.as_mut() else {
                return Err(Error::Internal("kafka producer not open".into()));
            };
            if last.is_some_and(|l| id <= l) {
                return Ok(SinkCommit::AlreadyCommitted);
            }
            if let Err(e) = p.write_batch(id, &records) {
                // Start again from a fresh producer next time (a fenced or broken one
                // cannot go on).
                *guard = None;
                return Err(e);
            }
            *last = Some(id);
            Ok(SinkCommit::Committed { version: id })
        })
        .await
        .map_err(|e| Error::Internal(format!("kafka sink task: {e}")))?
    }

    fn describe(&self) -> String {
        format!(
            "KafkaSink[{}]",
            self.config.topic.as_deref().unwrap_or("<topic column>")
        )
    }
}

/// A batch's rows as records.
fn to_records(config: &KafkaSinkConfig, batch: &RecordBatch) -> Result<Vec<OutRecord>> {
    let n = batch.num_rows();
    match &config.shape {
        Shape::Json { key } => {
            let values = json_lines(batch)?;
            let keys = if key.is_empty() {
                None
            } else {
                Some(json_lines(&batch.project(key)?)?)
            };
            Ok(values
                .into_iter()
                .enumerate()
                .map(|(i, v)| OutRecord {
                    topic: config.topic.clone().unwrap_or_default(),
                    value: Some(v),
                    key: keys.as_ref().map(|k| k[i].clone()),
                    ..OutRecord::default()
                })
                .collect())
        }
        Shape::Columns {
            value,
            key,
            topic,
            partition,
            headers,
            timestamp,
        } => {
            let bytes = |i: usize| -> Result<Vec<Option<Vec<u8>>>> {
                let col = datafusion::arrow::compute::cast(batch.column(i), &DataType::Binary)?;
                let col = col.as_binary::<i32>();
                Ok((0..n)
                    .map(|r| col.is_valid(r).then(|| col.value(r).to_vec()))
                    .collect())
            };
            let texts = |i: usize| -> Result<Vec<Option<String>>> {
                let col = datafusion::arrow::compute::cast(batch.column(i), &DataType::Utf8)?;
                let col = col.as_string::<i32>();
                Ok((0..n)
                    .map(|r| col.is_valid(r).then(|| col.value(r).to_string()))
                    .collect())
            };
            let values = bytes(*value)?;
            let keys = key.map(bytes).transpose()?;
            let topics = topic.map(texts).transpose()?;
            let headers = headers.map(texts).transpose()?;
            let partitions = partition
                .map(|i| primitives::<Int32Type>(batch, i, &DataType::Int32))
                .transpose()?;
            let times = timestamp
                .map(|i| {
                    primitives::<TimestampMillisecondType>(
                        batch,
                        i,
                        &DataType::Timestamp(TimeUnit::Millisecond, None),
                    )
                })
                .transpose()?;
            (0..n)
                .map(|r| {
                    let topic = match (&config.topic, &topics) {
                        (Some(t), _) => t.clone(),
                        (None, Some(ts)) => ts[r].clone().ok_or_else(|| Error::DataException {
                            state: crate::error::SqlState::NotNullViolation,
                            message: "a kafka sink's row has a NULL topic".into(),
                        })?,
                        (None, None) => String::new(),
                    };
                    Ok(OutRecord {
                        topic,
                        partition: partitions.as_ref().and_then(|p| p[r]),
                        key: keys.as_ref().and_then(|k| k[r].clone()),
                        value: values[r].clone(),
                        headers: match headers.as_ref().and_then(|h| h[r].as_deref()) {
                            Some(h) => parse_headers(h)?,
                            None => Vec::new(),
                        },
                        timestamp_ms: times.as_ref().and_then(|t| t[r]),
                    })
                })
                .collect()
        }
    }
}

/// Column `i` of `batch` cast to `to`, as values.
fn primitives<T: ArrowPrimitiveType>(
    batch: &RecordBatch,
    i: usize,
    to: &DataType,
) -> Result<Vec<Option<T::Native>>> {
    let c = datafusion::arrow::compute::cast(batch.column(i), to)?;
    let c = c.as_primitive::<T>();
    Ok((0..c.len())
        .map(|r| c.is_valid(r).then(|| c.value(r)))
        .collect())
}

/// Each row of `batch` as a JSON object (arrow's JSON writer: Spark's `to_json(struct(*))`
/// up to number and time formatting).
fn json_lines(batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
    let mut buf = Vec::new();
    {
        let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(batch)?;
        w.finish()?;
    }
    Ok(buf
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Headers as a Kafka stream's `headers` column holds them: `[{"key": "k", "value": "v"}]`.
fn parse_headers(text: &str) -> Result<Vec<(String, Option<Vec<u8>>)>> {
    use base64::Engine;
    let bad = |why: &str| Error::DataException {
        state: crate::error::SqlState::InvalidTextRepresentation,
        message: format!("invalid kafka headers \"{text}\": {why}"),
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    let items = v.as_array().ok_or_else(|| bad("not a JSON array"))?;
    items
        .iter()
        .map(|h| {
            let key = h
                .get("key")
                .and_then(|k| k.as_str())
                .ok_or_else(|| bad("a header without a text key"))?;
            let value = match (h.get("value"), h.get("value_base64")) {
                (Some(serde_json::Value::String(s)), _) => Some(s.as_bytes().to_vec()),
                (_, Some(serde_json::Value::String(b))) => Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(b)
                        .map_err(|e| bad(&e.to_string()))?,
                ),
                _ => None,
            };
            Ok((key.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    fn opts(pairs: &[(&str, &str)]) -> Options {
        Options::of(pairs)
    }

    fn output(
        fields: Vec<Field>,
        mode: super::super::WriteMode,
        keys: Option<Vec<&str>>,
    ) -> QueryOutput {
        QueryOutput {
            schema: Arc::new(Schema::new(fields)),
            mode,
            keys: keys.map(|k| k.into_iter().map(String::from).collect()),
            time: None,
        }
    }

    #[test]
    fn spark_columns_make_records_and_the_topic_option_wins() {
        let out = output(
            vec![
                Field::new("key", DataType::Utf8, true),
                Field::new("value", DataType::Utf8, true),
                Field::new("topic", DataType::Utf8, true),
                Field::new("n", DataType::Int64, true),
            ],
            super::super::WriteMode::Append,
            None,
        );
        let cfg = KafkaSinkConfig::new(
            &opts(&[
                ("connector", "kafka"),
                ("bootstrap_servers", "b"),
                ("topic", "out"),
            ]),
            &out,
        )
        .unwrap();
        let batch = RecordBatch::try_new(
            out.schema.clone(),
            vec![
                Arc::new(StringArray::from(vec![Some("k"), None])),
                Arc::new(StringArray::from(vec![Some("v1"), Some("v2")])),
                Arc::new(StringArray::from(vec![Some("elsewhere"), Some("x")])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let recs = to_records(&cfg, &batch).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].topic, "out");
        assert_eq!(recs[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(recs[1].key, None);
        assert_eq!(recs[1].value.as_deref(), Some(&b"v2"[..]));
    }

    #[test]
    fn json_rows_are_keyed_by_the_group_key_in_update_mode() {
        let out = output(
            vec![
                Field::new("user", DataType::Utf8, true),
                Field::new("n", DataType::Int64, true),
            ],
            super::super::WriteMode::Merge {
                keys: vec!["user".into()],
            },
            Some(vec!["user"]),
        );
        let cfg = KafkaSinkConfig::new(
            &opts(&[
                ("connector", "kafka"),
                ("bootstrap_servers", "b"),
                ("topic", "out"),
                ("format", "json"),
            ]),
            &out,
        )
        .unwrap();
        let batch = RecordBatch::try_new(
            out.schema.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a"])),
                Arc::new(Int64Array::from(vec![3])),
            ],
        )
        .unwrap();
        let recs = to_records(&cfg, &batch).unwrap();
        assert_eq!(
            recs[0].value.as_deref(),
            Some(&br#"{"user":"a","n":3}"#[..])
        );
        assert_eq!(recs[0].key.as_deref(), Some(&br#"{"user":"a"}"#[..]));
    }

    #[test]
    fn a_query_without_value_or_topic_is_refused() {
        let out = output(
            vec![Field::new("n", DataType::Int64, true)],
            super::super::WriteMode::Append,
            None,
        );
        let e = KafkaSinkConfig::new(
            &opts(&[
                ("connector", "kafka"),
                ("bootstrap_servers", "b"),
                ("topic", "t"),
            ]),
            &out,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no value column"), "{e}");
        let out = output(
            vec![Field::new("value", DataType::Utf8, true)],
            super::super::WriteMode::Append,
            None,
        );
        let e = KafkaSinkConfig::new(
            &opts(&[("connector", "kafka"), ("bootstrap_servers", "b")]),
            &out,
        )
        .unwrap_err();
        assert!(e.to_string().contains("topic"), "{e}");
        let e = KafkaSinkConfig::new(
            &opts(&[
                ("connector", "kafka"),
                ("bootstrap_servers", "b"),
                ("topic", "t"),
                ("path", "/x"),
            ]),
            &out,
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown option \"path\""), "{e}");
    }

    #[test]
    fn headers_round_trip_through_their_json() {
        let h = parse_headers(r#"[{"key":"a","value":"1"},{"key":"b","value":null},{"key":"c","value_base64":"/w=="}]"#).unwrap();
        assert_eq!(
            h,
            vec![
                ("a".to_string(), Some(b"1".to_vec())),
                ("b".to_string(), None),
                ("c".to_string(), Some(vec![0xff])),
            ]
        );
        assert!(parse_headers("{}").is_err());
    }
}
