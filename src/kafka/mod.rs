//! The Kafka client: connecting to a broker (or a service that speaks its protocol: Event
//! Hubs, Confluent Cloud, Redpanda, MSK), reading exact offset ranges, and producing in
//! transactions. rdkafka (librdkafka) lives here and nowhere else; `source::kafka` and
//! `sink::kafka` use only this module's types.
//!
//! Every call here blocks (librdkafka's own threads do the I/O): callers run them on the
//! blocking pool. Every call has a deadline, so an unreachable broker is an error within
//! a bounded time, never a hang.

pub mod producer;
pub mod watch;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};

use crate::error::{Error, Result};
use crate::sql::options::{OptionSpec, OptionType, Options};

pub use producer::{Delivery, KafkaProducer, OutRecord};

/// How long one metadata or offsets request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a read of an offset range may go without a record before it fails.
const READ_STALL: Duration = Duration::from_secs(60);

/// `bootstrap_servers`: both sides' first option.
pub const BOOTSTRAP_SERVERS: OptionSpec = OptionSpec::new(
    "bootstrap_servers",
    OptionType::Text,
    None,
    "The brokers to connect to first, host:port[,host:port...] (Spark's \
     kafka.bootstrap.servers)",
)
.required();

/// The connection's security options, the same for sources and sinks.
pub const SECURITY_OPTIONS: [OptionSpec; 5] = [
    OptionSpec::new(
        "security_protocol",
        OptionType::OneOf(&["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"]),
        Some("plaintext"),
        "How the connection is secured (Event Hubs and Confluent Cloud: sasl_ssl)",
    ),
    OptionSpec::new(
        "sasl_mechanism",
        OptionType::OneOf(&["plain", "scram-sha-256", "scram-sha-512"]),
        Some("plain"),
        "The SASL mechanism, with security_protocol sasl_plaintext or sasl_ssl",
    ),
    OptionSpec::new(
        "sasl_username",
        OptionType::Text,
        None,
        "The SASL user (Event Hubs: $ConnectionString; Confluent Cloud: the API key)",
    ),
    OptionSpec::new(
        "sasl_password",
        OptionType::Text,
        None,
        "The SASL password (Event Hubs: the namespace's connection string; Confluent Cloud: \
         the API secret); never shown by SHOW or the catalog tables, kept in catalog.json, \
         which only the server's user may read",
    ),
    OptionSpec::new(
        "ssl_ca_location",
        OptionType::Path,
        None,
        "A PEM file of the certificate authorities to trust (default: the system's)",
    ),
];

/// Where a broker is and how to talk to it: the connection options of a Kafka stream or
/// sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub bootstrap_servers: String,
    security_protocol: String,
    sasl_mechanism: Option<String>,
    sasl_username: Option<String>,
    sasl_password: Option<String>,
    ssl_ca_location: Option<String>,
}

impl Connection {
    /// The connection a stream's or sink's options describe (checked by its option table
    /// first).
    pub fn from_options(options: &Options) -> Result<Connection> {
        let bootstrap_servers = options
            .get("bootstrap_servers")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| Error::InvalidOption {
                message: "missing required option \"bootstrap_servers\" for a kafka connector"
                    .into(),
                hint: Some("Add bootstrap_servers = 'host:9092'.".into()),
            })?
            .to_string();
        let security_protocol = options
            .get("security_protocol")
            .unwrap_or("plaintext")
            .trim()
            .to_ascii_lowercase();
        let sasl = security_protocol.starts_with("sasl");
        let sasl_username = options.get("sasl_username").map(str::to_string);
        let sasl_password = options.get("sasl_password").map(str::to_string);
        if sasl && (sasl_username.is_none() || sasl_password.is_none()) {
            return Err(Error::InvalidOption {
                message: format!(
                    "security_protocol = '{security_protocol}' needs sasl_username and \
                     sasl_password"
                ),
                hint: Some(
                    "Event Hubs: sasl_username = '$ConnectionString', sasl_password = the \
                     namespace's connection string."
                        .into(),
                ),
            });
        }
        if !sasl
            && ["sasl_mechanism", "sasl_username", "sasl_password"]
                .iter()
                .any(|k| options.get(k).is_some())
        {
            return Err(Error::invalid_option(format!(
                "SASL options need security_protocol = 'sasl_plaintext' or 'sasl_ssl', not \
                 '{security_protocol}'"
            )));
        }
        Ok(Connection {
            bootstrap_servers,
            sasl_mechanism: sasl.then(|| {
                options
                    .get("sasl_mechanism")
                    .unwrap_or("plain")
                    .to_ascii_uppercase()
            }),
            security_protocol,
            sasl_username,
            sasl_password,
            ssl_ca_location: options.get("ssl_ca_location").map(str::to_string),
        })
    }

    /// librdkafka's configuration for this connection.
    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers)
            .set("security.protocol", &self.security_protocol)
            .set("socket.keepalive.enable", "true")
            // Event Hubs closes idle connections after 240 s.
            .set("metadata.max.age.ms", "180000")
            .set("log_level", "4");
        if let Some(m) = &self.sasl_mechanism {
            c.set("sasl.mechanisms", m);
        }
        if let Some(u) = &self.sasl_username {
            c.set("sasl.username", u);
        }
        if let Some(p) = &self.sasl_password {
            c.set("sasl.password", p);
        }
        if let Some(ca) = &self.ssl_ca_location {
            c.set("ssl.ca.location", ca);
        }
        c
    }

    /// A consumer that reads by assignment only: no group membership, no commits.
    fn consumer(&self, isolation: Isolation) -> Result<BaseConsumer> {
        let mut c = self.config();
        c.set(
            "group.id",
            format!("tidemark-reader-{}", uuid::Uuid::new_v4()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "error")
        .set("isolation.level", isolation.as_str())
        // A batch reads ranges that are there: no long poll. With the default (500 ms),
        // the fetch left waiting at the end of the previous batch's ranges held up the
        // next batch's first fetch: every read of a few records took 400 ms.
        .set("fetch.wait.max.ms", "10");
        c.create()
            .map_err(|e| self.error("cannot create a consumer", &e))
    }

    /// An error of this connection, naming the brokers.
    pub fn error(&self, what: &str, e: &KafkaError) -> Error {
        Error::Broker {
            message: format!("kafka at {}: {what}: {e}", self.bootstrap_servers),
        }
    }
}

/// What a consumer reads of transactions (Kafka's `isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Every record, committed or not (Spark's default: the Java client's).
    ReadUncommitted,
    /// Only committed transactions' records; latest is the last stable offset.
    ReadCommitted,
}

impl Isolation {
    pub fn parse(s: &str) -> Result<Isolation> {
        match s.trim().to_ascii_lowercase().as_str() {
            "read_uncommitted" => Ok(Isolation::ReadUncommitted),
            "read_committed" => Ok(Isolation::ReadCommitted),
            other => Err(Error::invalid_option(format!(
                "invalid isolation_level \"{other}\""
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Isolation::ReadUncommitted => "read_uncommitted",
            Isolation::ReadCommitted => "read_committed",
        }
    }
}

/// Which end of partitions [`Admin::ends`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ends {
    Earliest,
    Latest,
}

/// Offsets by topic and partition: the next offset to read of each (Spark's form in
/// `offsets/N`: `{"topic": {"0": 42}}`).
pub type PartitionOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// One record as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// 0: the producer's time (CreateTime); 1: the broker's (LogAppendTime).
    pub timestamp_type: i32,
    /// `None` when the record has no headers (Spark gives NULL, not an empty list).
    pub headers: Option<Vec<(String, Option<Vec<u8>>)>>,
}

/// The records of one partition's offset range.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionRead {
    pub topic: String,
    pub partition: i32,
    pub records: Vec<Record>,
}

/// A range of one partition: the offsets `from..until` (`until` exclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetRange {
    pub topic: String,
    pub partition: i32,
    pub from: i64,
    pub until: i64,
}

/// A connection's metadata and offsets lookups, on one consumer kept between batches.
pub struct Admin {
    conn: Connection,
    consumer: BaseConsumer,
}

impl Admin {
    pub fn new(conn: &Connection, isolation: Isolation) -> Result<Admin> {
        Ok(Admin {
            consumer: conn.consumer(isolation)?,
            conn: conn.clone(),
        })
    }

    /// Whether the brokers answer: one metadata request within [`REQUEST_TIMEOUT`].
    pub fn check(conn: &Connection) -> Result<()> {
        let admin = Admin::new(conn, Isolation::ReadUncommitted)?;
        admin
            .consumer
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map(|_| ())
            .map_err(|e| conn.error("cannot reach the brokers", &e))
    }

    /// The partitions of every topic the brokers have, by topic (internal topics, whose
    /// names start with `__`, left out).
    pub fn topics(&self) -> Result<BTreeMap<String, Vec<i32>>> {
        let md = self
            .consumer
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|e| self.conn.error("cannot read the topics", &e))?;
        let mut out = BTreeMap::new();
        for t in md.topics() {
            if t.name().starts_with("__") || t.error().is_some() {
                continue;
            }
            let mut parts: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            parts.sort_unstable();
            out.insert(t.name().to_string(), parts);
        }
        Ok(out)
    }

    /// The partitions of one topic; empty when the topic does not exist.
    pub fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
            .map_err(|e| self.conn.error(&format!("cannot read topic {topic}"), &e))?;
        let mut parts: Vec<i32> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        parts.sort_unstable();
        Ok(parts)
    }

    /// A partition's earliest offset and its latest (the high watermark; under
    /// `read_committed`, the last stable offset).
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        self.consumer
            .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
            .map_err(|e| {
                self.conn.error(
                    &format!("cannot read the offsets of {topic}-{partition}"),
                    &e,
                )
            })
    }

    /// For each partition, the earliest offset whose record's timestamp is at or after
    /// `timestamp_ms`; `None` for a partition that has no such record.
    pub fn offsets_for_time(
        &self,
        parts: &[(String, i32)],
        timestamp_ms: i64,
    ) -> Result<BTreeMap<(String, i32), Option<i64>>> {
        self.list_offsets(parts, timestamp_ms)
    }

    /// Every partition's earliest offset (`Ends::Earliest`) or latest (the high
    /// watermark; under `read_committed`, the last stable offset), in one request to each
    /// leader rather than one per partition.
    pub fn ends(
        &self,
        parts: &[(String, i32)],
        which: Ends,
    ) -> Result<BTreeMap<(String, i32), i64>> {
        let at = match which {
            Ends::Earliest => -2,
            Ends::Latest => -1,
        };
        let found = self.list_offsets(parts, at)?;
        found
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => Ok((k, v)),
                None => Err(Error::Broker {
                    message: format!(
                        "kafka at {}: no offsets for {}-{}",
                        self.conn.bootstrap_servers, k.0, k.1
                    ),
                }),
            })
            .collect()
    }

    /// Kafka's ListOffsets: `at` is a time in ms, or -1 (latest) or -2 (earliest).
    fn list_offsets(
        &self,
        parts: &[(String, i32)],
        at: i64,
    ) -> Result<BTreeMap<(String, i32), Option<i64>>> {
        if parts.is_empty() {
            return Ok(BTreeMap::new());
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts {
            let o = match at {
                -1 => KOffset::End,
                -2 => KOffset::Beginning,
                t => KOffset::Offset(t),
            };
            tpl.add_partition_offset(t, *p, o)
                .map_err(|e| self.conn.error("bad partition list", &e))?;
        }
        let found = self
            .consumer
            .offsets_for_times(tpl, REQUEST_TIMEOUT)
            .map_err(|e| self.conn.error("cannot list offsets", &e))?;
        Ok(found
            .elements()
            .iter()
            .map(|e| {
                let o = match e.offset() {
                    KOffset::Offset(o) if o >= 0 => Some(o),
                    KOffset::Beginning if at == -2 => Some(0),
                    _ => None,
                };
                ((e.topic().to_string(), e.partition()), o)
            })
            .collect())
    }

    /// The offset group `group` committed for `topic`/`partition`, if any (a sink's batch
    /// marker).
    pub fn committed(
        conn: &Connection,
        group: &str,
        topic: &str,
        partition: i32,
    ) -> Result<Option<i64>> {
        let mut c = conn.config();
        c.set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let consumer: BaseConsumer = c
            .create()
            .map_err(|e| conn.error("cannot create a consumer", &e))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let got = consumer
            .committed_offsets(tpl, REQUEST_TIMEOUT)
            .map_err(|e| conn.error(&format!("cannot read group {group}'s offsets"), &e))?;
        Ok(got.elements().iter().find_map(|e| match e.offset() {
            KOffset::Offset(o) if o >= 0 => Some(o),
            _ => None,
        }))
    }
}

/// Whether the brokers answer, off the async threads: [`Admin::check`].
pub async fn check_reachable(conn: &Connection) -> Result<()> {
    let conn = conn.clone();
    tokio::task::spawn_blocking(move || Admin::check(&conn))
        .await
        .map_err(|e| Error::Internal(format!("kafka check task: {e}")))?
}

/// Reads offset ranges with one consumer, kept from one read to the next (a query's
/// batches), so that a batch does not pay for new connections.
pub struct Reader {
    conn: Connection,
    consumer: BaseConsumer,
}

impl Reader {
    pub fn new(conn: &Connection, isolation: Isolation) -> Result<Reader> {
        Ok(Reader {
            consumer: conn.consumer(isolation)?,
            conn: conn.clone(),
        })
    }

    /// [`read_ranges`] with this reader's consumer.
    pub fn read(
        &self,
        ranges: &[OffsetRange],
        include_headers: bool,
    ) -> Result<Vec<PartitionRead>> {
        read_with(&self.conn, &self.consumer, ranges, include_headers)
    }
}

/// Reads the records of `ranges`, each from its `from` up to (not including) its
/// `until`, in offset order per partition. Records the broker no longer has (retention)
/// are not there; a range whose records a `read_committed` reader skips (aborted
/// transactions, transaction markers) ends at the partition's end.
pub fn read_ranges(
    conn: &Connection,
    isolation: Isolation,
    ranges: &[OffsetRange],
    include_headers: bool,
) -> Result<Vec<PartitionRead>> {
    Reader::new(conn, isolation)?.read(ranges, include_headers)
}

fn read_with(
    conn: &Connection,
    consumer: &BaseConsumer,
    ranges: &[OffsetRange],
    include_headers: bool,
) -> Result<Vec<PartitionRead>> {
    let mut out: Vec<PartitionRead> = ranges
        .iter()
        .map(|r| PartitionRead {
            topic: r.topic.clone(),
            partition: r.partition,
            records: Vec::with_capacity((r.until - r.from).clamp(0, 1 << 20) as usize),
        })
        .collect();
    // Per partition: its range's index, and the range.
    let mut pending: BTreeMap<(String, i32), (usize, i64, i64)> = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for (i, r) in ranges.iter().enumerate() {
        if r.until > r.from {
            pending.insert((r.topic.clone(), r.partition), (i, r.from, r.until));
            tpl.add_partition_offset(&r.topic, r.partition, KOffset::Offset(r.from))
                .map_err(|e| conn.error("bad partition list", &e))?;
        }
    }
    if pending.is_empty() {
        return Ok(out);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| conn.error("cannot assign partitions", &e))?;
    let mut last_progress = Instant::now();
    while !pending.is_empty() {
        if last_progress.elapsed() > READ_STALL {
            let left: Vec<String> = pending.keys().map(|(t, p)| format!("{t}-{p}")).collect();
            return Err(Error::Broker {
                message: format!(
                    "kafka at {}: no record of {} arrived for {} s",
                    conn.bootstrap_servers,
                    left.join(", "),
                    READ_STALL.as_secs()
                ),
            });
        }
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        match msg {
            Ok(m) => {
                let key = (m.topic().to_string(), m.partition());
                let Some(&(i, from, until)) = pending.get(&key) else {
                    continue;
                };
                last_progress = Instant::now();
                let offset = m.offset();
                // A record fetched for an earlier assignment of the partition is not ours.
                if offset < from {
                    continue;
                }
                if offset < until {
                    let headers = if include_headers {
                        m.headers().map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                                .collect()
                        })
                    } else {
                        None
                    };
                    let (timestamp_ms, timestamp_type) = match m.timestamp() {
                        rdkafka::Timestamp::NotAvailable => (None, -1),
                        rdkafka::Timestamp::CreateTime(t) => (Some(t), 0),
                        rdkafka::Timestamp::LogAppendTime(t) => (Some(t), 1),
                    };
                    out[i].records.push(Record {
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        partition: m.partition(),
                        offset,
                        timestamp_ms,
                        timestamp_type,
                        headers,
                    });
                }
                if offset + 1 >= until {
                    pending.remove(&key);
                }
            }
            Err(KafkaError::PartitionEOF(p)) => {
                // The partition's end: whatever of the range was there has been read.
                let done: Vec<_> = pending.keys().filter(|(_, q)| *q == p).cloned().collect();
                for key in done {
                    let position = consumer.position().ok().and_then(|tpl| {
                        tpl.find_partition(&key.0, key.1)
                            .and_then(|e| e.offset().to_raw())
                    });
                    let until = pending.get(&key).map_or(0, |v| v.2);
                    // With several topics, an EOF names only the partition: only a
                    // partition whose position has reached its range's end is done,
                    // unless the broker has nothing more (its end is before `until`).
                    let high = consumer
                        .fetch_watermarks(&key.0, key.1, REQUEST_TIMEOUT)
                        .map(|w| w.1)
                        .unwrap_or(i64::MAX);
                    if position.is_some_and(|pos| pos >= until.min(high)) {
                        pending.remove(&key);
                    }
                }
            }
            Err(KafkaError::MessageConsumption(code))
                if code == rdkafka::types::RDKafkaErrorCode::OffsetOutOfRange =>
            {
                return Err(Error::Broker {
                    message: format!(
                        "kafka at {}: offsets out of range: {code}",
                        conn.bootstrap_servers
                    ),
                });
            }
            Err(e) if is_fatal(&e) => return Err(conn.error("cannot read", &e)),
            // Transient (a broker restarting): librdkafka retries; the stall deadline bounds it.
            Err(e) => tracing::debug!(error = %e, "kafka read: transient error"),
        }
    }
    // Nothing more to fetch until the next read assigns its ranges.
    let _ = consumer.unassign();
    Ok(out)
}

fn is_fatal(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::SaslAuthenticationFailed
                | C::Authentication
                | C::Fatal
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Options {
        Options::of(pairs)
    }

    #[test]
    fn sasl_needs_a_user_and_a_password() {
        let e = Connection::from_options(&opts(&[
            ("bootstrap_servers", "ns.servicebus.windows.net:9093"),
            ("security_protocol", "sasl_ssl"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("sasl_username"), "{e}");
        let c = Connection::from_options(&opts(&[
            ("bootstrap_servers", "ns.servicebus.windows.net:9093"),
            ("security_protocol", "SASL_SSL"),
            ("sasl_username", "$ConnectionString"),
            ("sasl_password", "Endpoint=sb://ns/;SharedAccessKey=x"),
        ]))
        .unwrap();
        assert_eq!(c.sasl_mechanism.as_deref(), Some("PLAIN"));
        assert_eq!(c.security_protocol, "sasl_ssl");
    }

    #[test]
    fn sasl_options_without_sasl_are_refused() {
        let e = Connection::from_options(&opts(&[
            ("bootstrap_servers", "b:9092"),
            ("sasl_username", "u"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("security_protocol"), "{e}");
    }

    #[test]
    fn an_unreachable_broker_is_an_error_within_the_request_timeout() {
        // A port nothing listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Connection::from_options(&opts(&[(
            "bootstrap_servers",
            &format!("127.0.0.1:{port}"),
        )]))
        .unwrap();
        let t = Instant::now();
        let e = Admin::check(&c).unwrap_err();
        assert!(t.elapsed() < REQUEST_TIMEOUT + Duration::from_secs(5));
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
