//! Waking a waiting query when records arrive: a consumer on its own thread, assigned to
//! the end of every partition a source reads, long-polls the brokers. Each record it is
//! sent bumps a `watch` channel (the `Source::arrivals` contract) and moves that partition
//! back to its end, so it is sent at most the first records of each burst (they are read
//! again, in order, by the batch). The query's trigger loop selects on the channel, so a
//! record written while the query idles starts a batch within one fetch round trip
//! instead of at its next poll.
//!
//! Dropping the [`Watcher`] waits for its thread, so that a stopped query holds no consumer:
//! `STOP SINK` returns once the query has let go of the brokers. (A consumer still fetching
//! a topic that is then deleted is also how tansu 0.6 crashed the process: it answers the
//! fetch of a topic it no longer has with a zero topic id and a leader, and librdkafka
//! 2.12's leader discovery looks that topic up by a NULL name.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};
use tokio::sync::watch;

use super::{Connection, Isolation};
use crate::error::Result;

/// How long one poll of the watching consumer waits, and so how soon it sees a stop or a
/// new set of partitions (a drop waits up to this, and the consumer's close, for it).
const POLL: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Shared {
    /// Partitions to watch from now on, when they changed.
    parts: Mutex<Option<Vec<(String, i32)>>>,
    stop: AtomicBool,
}

/// The watching thread of one source; dropping this stops it and waits for it to end.
pub struct Watcher {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watcher")
    }
}

impl Watcher {
    /// Starts the thread; it watches nothing until [`Watcher::watch`].
    pub fn start(conn: &Connection, isolation: Isolation, tx: watch::Sender<u64>) -> Result<Self> {
        let mut c = conn.config();
        c.set(
            "group.id",
            format!("tidemark-watch-{}", uuid::Uuid::new_v4()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", isolation.as_str())
        // The brokers answer a fetch as soon as a record is there, else after this.
        .set("fetch.wait.max.ms", "100")
        // No prefetching of what the batch reads anyway: one small fetch at a time.
        .set("queued.min.messages", "1")
        .set("fetch.message.max.bytes", "1024");
        let consumer: BaseConsumer = c
            .create()
            .map_err(|e| conn.error("cannot create a consumer", &e))?;
        let shared = Arc::new(Shared::default());
        let inner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kafka-watch".into())
            .spawn(move || run(&consumer, &inner, &tx))
            .map_err(|e| crate::error::Error::Internal(format!("kafka watcher thread: {e}")))?;
        Ok(Watcher {
            shared,
            thread: Some(thread),
        })
    }

    /// Watches these partitions (from their ends) instead of the previous ones.
    pub fn watch(&self, parts: Vec<(String, i32)>) {
        *self.shared.parts.lock().unwrap_or_else(|e| e.into_inner()) = Some(parts);
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let Some(thread) = self.thread.take() else {
            return;
        };
        // The thread ends within a poll and a consumer close. On a runtime's worker (a
        // query task ending), tokio moves the worker's other tasks elsewhere meanwhile.
        let join = move || {
            if thread.join().is_err() {
                tracing::error!("the kafka watcher thread panicked");
            }
        };
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(join),
            _ => join(),
        }
    }
}

fn run(consumer: &BaseConsumer, shared: &Shared, tx: &watch::Sender<u64>) {
    let mut assigned = false;
    while !shared.stop.load(Ordering::Relaxed) && !tx.is_closed() {
        let parts = shared
            .parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(parts) = parts {
            let mut tpl = TopicPartitionList::new();
            for (t, p) in &parts {
                let _ = tpl.add_partition_offset(t, *p, KOffset::End);
            }
            assigned = consumer.assign(&tpl).is_ok();
        }
        if !assigned {
            std::thread::sleep(POLL);
            continue;
        }
        let arrived = match consumer.poll(POLL) {
            Some(Ok(m)) => Some((m.topic().to_string(), m.partition())),
            // Brokers away: the query's own polling reports it; try again.
            Some(Err(e)) => {
                tracing::debug!(error = %e, "kafka watcher");
                std::thread::sleep(POLL);
                None
            }
            None => None,
        };
        if let Some((t, p)) = arrived {
            tx.send_modify(|n| *n = n.wrapping_add(1));
            let _ = consumer.seek(&t, p, KOffset::End, Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::options::Options;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    #[test]
    fn a_record_written_while_watching_bumps_the_channel() {
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("t", 2, 1).unwrap();
        let conn = Connection::from_options(&Options(
            [("bootstrap_servers".to_string(), mock.bootstrap_servers())]
                .into_iter()
                .collect(),
        ))
        .unwrap();
        let (tx, mut rx) = watch::channel(0u64);
        let w = Watcher::start(&conn, Isolation::ReadUncommitted, tx).unwrap();
        w.watch(vec![("t".into(), 0), ("t".into(), 1)]);
        let producer: BaseProducer = conn.config().create().unwrap();
        // Produced until seen: the first ones may land before the assignment.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !rx.has_changed().unwrap() {
            assert!(std::time::Instant::now() < deadline, "no wake-up");
            producer
                .send(BaseRecord::<(), str>::to("t").payload("x").partition(1))
                .unwrap();
            producer.flush(Duration::from_secs(10)).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(*rx.borrow_and_update() >= 1);
        // Dropped: the thread has ended, and so let go of the channel and closed its
        // consumer, by the time the drop returns.
        drop(w);
        assert!(rx.has_changed().is_err(), "the watcher kept running");
    }
}
