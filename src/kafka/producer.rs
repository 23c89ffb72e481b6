//! Producing: one micro-batch as one Kafka transaction (exactly once), or idempotently
//! without transactions (at least once, for brokers without them).
//!
//! A transactional producer's id is stable across restarts, so `init_transactions` fences
//! an older instance of the same query and aborts its open transaction. Every record
//! carries the headers `tidemark.query` (the transactional id) and `tidemark.batch` (the
//! batch id): after a crash, the last batch the topic holds is the batch of the last
//! committed record of this query (a `read_committed` read of each partition's tail), and
//! a replayed batch it already holds is skipped. A batch without rows leaves no record,
//! and writing it again writes nothing. (Kafka's own alternative, committing the batch id
//! as a consumer group's offset in the transaction, cannot be tested here: librdkafka's
//! mock cluster does not keep transactional offset commits, and tansu 0.6 does not end
//! transactions that librdkafka starts.)

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

use super::{Admin, Connection, Isolation, OffsetRange, REQUEST_TIMEOUT};
use crate::error::{Error, Result};

/// How long a transaction's commit (which flushes its records) may take.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(120);

/// How a sink delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One transaction per batch; `read_committed` readers see each row once.
    ExactlyOnce,
    /// An idempotent producer without transactions: a replayed batch is written again.
    AtLeastOnce,
}

impl Delivery {
    pub fn parse(s: &str) -> Result<Delivery> {
        match s.trim().to_ascii_lowercase().as_str() {
            "exactly_once" => Ok(Delivery::ExactlyOnce),
            "at_least_once" => Ok(Delivery::AtLeastOnce),
            other => Err(Error::invalid_option(format!(
                "invalid delivery \"{other}\""
            ))),
        }
    }
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutRecord {
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub timestamp_ms: Option<i64>,
}

/// Keeps the first delivery failure (librdkafka reports deliveries on `poll`).
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

/// The headers every record of an exactly-once sink carries.
pub const QUERY_HEADER: &str = "tidemark.query";
pub const BATCH_HEADER: &str = "tidemark.batch";

/// A producer for one sink.
pub struct KafkaProducer {
    conn: Connection,
    producer: BaseProducer<Deliveries>,
    delivery: Delivery,
    /// The transactional id, in every record's `tidemark.query` header.
    id: String,
    /// Exactly once: the topic whose records say which batches it holds.
    marker_topic: Option<String>,
}

impl KafkaProducer {
    /// A producer with transactional id `id` (exactly once; `marker_topic` is the topic
    /// whose records say which batches are there), or an idempotent one (at least once).
    pub fn open(
        conn: &Connection,
        delivery: Delivery,
        id: &str,
        marker_topic: &str,
        transaction_timeout: Duration,
    ) -> Result<KafkaProducer> {
        let mut c = conn.config();
        c.set("enable.idempotence", "true")
            // The Java producer's partitioner, so keys land where Spark's sink puts them.
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("request.timeout.ms", "60000");
        if delivery == Delivery::ExactlyOnce {
            c.set("transactional.id", id).set(
                "transaction.timeout.ms",
                transaction_timeout.as_millis().to_string(),
            );
        }
        let producer: BaseProducer<Deliveries> = c
            .create_with_context(Deliveries::default())
            .map_err(|e| conn.error("cannot create a producer", &e))?;
        if delivery == Delivery::ExactlyOnce {
            producer
                .init_transactions(REQUEST_TIMEOUT * 3)
                .map_err(|e| conn.error(&format!("cannot start transactional id {id}"), &e))?;
        }
        Ok(KafkaProducer {
            conn: conn.clone(),
            producer,
            delivery,
            id: id.to_string(),
            marker_topic: (delivery == Delivery::ExactlyOnce).then(|| marker_topic.to_string()),
        })
    }

    /// The last batch of this producer's id that the marker topic holds committed (exactly
    /// once only): the `tidemark.batch` header of this query's last committed record, found
    /// by reading each partition's tail, further back until one is found.
    pub fn last_committed_batch(&self) -> Result<Option<i64>> {
        let Some(topic) = &self.marker_topic else {
            return Ok(None);
        };
        let admin = Admin::new(&self.conn, Isolation::ReadCommitted)?;
        let mut last: Option<i64> = None;
        for p in admin.partitions(topic)? {
            let (low, high) = admin.watermarks(topic, p)?;
            let mut until = high;
            let mut window = 256;
            while until > low {
                let from = (until - window).max(low);
                let reads = super::read_ranges(
                    &self.conn,
                    Isolation::ReadCommitted,
                    &[OffsetRange {
                        topic: topic.clone(),
                        partition: p,
                        from,
                        until,
                    }],
                    true,
                )?;
                let found = reads
                    .iter()
                    .flat_map(|r| r.records.iter().rev())
                    .find_map(|r| {
                        let h = r.headers.as_ref()?;
                        let header = |k: &str| {
                            h.iter()
                                .find(|(name, _)| name == k)
                                .and_then(|(_, v)| v.as_deref())
                        };
                        (header(QUERY_HEADER)? == self.id.as_bytes())
                            .then(|| {
                                std::str::from_utf8(header(BATCH_HEADER)?)
                                    .ok()?
                                    .parse()
                                    .ok()
                            })
                            .flatten()
                    });
                if let Some(b) = found {
                    last = last.max(Some(b));
                    break;
                }
                until = from;
                window = window.saturating_mul(4);
            }
        }
        Ok(last)
    }

    /// Produces `records` as batch `batch_id`: in one transaction, each with the batch's headers
    /// (exactly once), or flushed until every record is acknowledged (at least once).
    pub fn write_batch(&self, batch_id: i64, records: &[OutRecord]) -> Result<()> {
        match self.delivery {
            Delivery::AtLeastOnce => {
                self.send_all(records, None)?;
                self.flush()
            }
            Delivery::ExactlyOnce => {
                self.producer
                    .begin_transaction()
                    .map_err(|e| self.txn_error("cannot begin a transaction", e))?;
                let result = (|| {
                    self.send_all(records, Some(batch_id))?;
                    crate::testing::crash_point("sink_files_written");
                    self.producer
                        .commit_transaction(COMMIT_TIMEOUT)
                        .map_err(|e| self.txn_error("cannot commit the transaction", e))
                })();
                if let Err(e) = result {
                    // An abortable error: abort so the next attempt starts clean. A fatal
                    // one (fenced by a newer instance) leaves nothing to abort.
                    let _ = self.producer.abort_transaction(REQUEST_TIMEOUT * 3);
                    return Err(e);
                }
                Ok(())
            }
        }
    }

    fn send_all(&self, records: &[OutRecord], batch_id: Option<i64>) -> Result<()> {
        let batch = batch_id.map(|b| b.to_string());
        for r in records {
            let mut headers = OwnedHeaders::new_with_capacity(r.headers.len() + 2);
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: v.as_deref(),
                });
            }
            if let Some(b) = &batch {
                headers = headers
                    .insert(Header {
                        key: QUERY_HEADER,
                        value: Some(self.id.as_bytes()),
                    })
                    .insert(Header {
                        key: BATCH_HEADER,
                        value: Some(b.as_bytes()),
                    });
            }
            let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&r.topic);
            if let Some(k) = &r.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v.as_slice());
            }
            if let Some(p) = r.partition {
                rec = rec.partition(p);
            }
            if let Some(t) = r.timestamp_ms {
                rec = rec.timestamp(t);
            }
            if !r.headers.is_empty() || batch.is_some() {
                rec = rec.headers(headers);
            }
            loop {
                match self.producer.send(rec) {
                    Ok(()) => break,
                    Err((
                        KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        back,
                    )) => {
                        rec = back;
                        self.producer.poll(Duration::from_millis(50));
                    }
                    Err((e, _)) => {
                        return Err(self
                            .conn
                            .error(&format!("cannot produce to {}", r.topic), &e));
                    }
                }
            }
            self.check_deliveries()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.producer
            .flush(COMMIT_TIMEOUT)
            .map_err(|e| self.conn.error("cannot flush", &e))?;
        self.check_deliveries()
    }

    fn check_deliveries(&self) -> Result<()> {
        let failed = self
            .producer
            .context()
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match failed {
            Some(e) => Err(Error::Broker {
                message: format!(
                    "kafka at {}: a record was not delivered: {e}",
                    self.conn.bootstrap_servers
                ),
            }),
            None => Ok(()),
        }
    }

    fn txn_error(&self, what: &str, e: KafkaError) -> Error {
        // The reason a record failed, which the transaction's error only counts.
        let what = match self
            .producer
            .context()
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(first) => format!("{what} (a record failed: {first})"),
            None => what.to_string(),
        };
        let what = what.as_str();
        let fenced = matches!(&e, KafkaError::Transaction(t) if t.is_fatal());
        if fenced {
            Error::WrongState(format!(
                "kafka at {}: {what}: {e} (another instance of this query holds its \
                 transactional id, or the transaction timed out)",
                self.conn.bootstrap_servers
            ))
        } else {
            self.conn.error(what, &e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::options::Options;

    /// On librdkafka's mock cluster (which implements transactions): the next instance of a
    /// transactional id finds the last batch it committed.
    #[test]
    fn the_batch_marker_survives_a_new_producer() {
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("out", 1, 1).unwrap();
        let conn = Connection::from_options(&Options(
            [("bootstrap_servers".to_string(), mock.bootstrap_servers())]
                .into_iter()
                .collect(),
        ))
        .unwrap();
        let open = || {
            KafkaProducer::open(
                &conn,
                Delivery::ExactlyOnce,
                "tidemark-q1",
                "out",
                Duration::from_secs(60),
            )
            .unwrap()
        };
        let p = open();
        assert_eq!(p.last_committed_batch().unwrap(), None);
        let rec = OutRecord {
            topic: "out".into(),
            value: Some(b"v".to_vec()),
            ..OutRecord::default()
        };
        p.write_batch(0, std::slice::from_ref(&rec)).unwrap();
        p.write_batch(1, std::slice::from_ref(&rec)).unwrap();
        drop(p);
        let p = open();
        assert_eq!(p.last_committed_batch().unwrap(), Some(1));
        // Another query's records after ours do not hide ours.
        let other = KafkaProducer::open(
            &conn,
            Delivery::ExactlyOnce,
            "tidemark-q2",
            "out",
            Duration::from_secs(60),
        )
        .unwrap();
        other.write_batch(7, std::slice::from_ref(&rec)).unwrap();
        assert_eq!(other.last_committed_batch().unwrap(), Some(7));
        assert_eq!(p.last_committed_batch().unwrap(), Some(1));
    }
}
