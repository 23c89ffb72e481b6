//! `LISTEN`, `UNLISTEN` and `NOTIFY`, as Postgres has them, and the streaming queries'
//! listener events delivered through them.
//!
//! Each session has a [`Mailbox`]: the channels it listens to and the notifications not
//! yet sent. `NOTIFY` (and every listener event, on `tidemark_events` and
//! `tidemark_events_<query>`) puts a notification in the mailbox of every session that
//! listens to its channel; the connection loop (`server::conn`) sends them as
//! `NotificationResponse`s when its session is idle outside a transaction block, at once,
//! without waiting for the client's next message, or after the statement under way.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::engine::progress::{ListenerEvent, NOTIFY_PAYLOAD_LIMIT, Registry};
use crate::error::Error;

/// The channel every listener event goes to; each also goes to `<this>_<query name>`.
pub const EVENTS_CHANNEL: &str = "tidemark_events";

/// One notification: who sent it (the backend pid; 0 for Tidemark's own events), on
/// which channel, with what payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub pid: i32,
    pub channel: String,
    pub payload: String,
}

/// A session's channels and its notifications not yet sent.
#[derive(Debug, Default)]
pub struct Mailbox {
    channels: Mutex<BTreeSet<String>>,
    inbox: Mutex<VecDeque<Notification>>,
    arrived: Notify,
}

impl Mailbox {
    pub fn listen(&self, channel: &str) {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(channel.to_string());
    }

    /// Stops listening to `channel`, or to every channel.
    pub fn unlisten(&self, channel: Option<&str>) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        match channel {
            Some(c) => {
                channels.remove(c);
            }
            None => channels.clear(),
        }
    }

    #[cfg(test)]
    fn channels(&self) -> Vec<String> {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn listens(&self, channel: &str) -> bool {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(channel)
    }

    fn deliver(&self, n: Notification) {
        self.inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(n);
        // Kept as a permit if the connection is not waiting now.
        self.arrived.notify_one();
    }

    /// The notifications not yet sent, oldest first.
    pub fn take(&self) -> Vec<Notification> {
        self.inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect()
    }

    /// Resolves when a notification may be waiting.
    pub async fn arrived(&self) {
        self.arrived.notified().await
    }
}

/// Checks a `NOTIFY` payload as Postgres does: shorter than 8000 bytes.
pub fn check_payload(payload: &str) -> Result<(), Error> {
    if payload.len() > NOTIFY_PAYLOAD_LIMIT {
        return Err(Error::invalid_option("payload string too long"));
    }
    Ok(())
}

/// Sends a notification to every session listening to `channel` (the sender too, if it
/// listens, as in Postgres).
pub fn notify(pid: i32, channel: &str, payload: &str) {
    for session in super::activity::sessions() {
        if session.mailbox.listens(channel) {
            session.mailbox.deliver(Notification {
                pid,
                channel: channel.to_string(),
                payload: payload.to_string(),
            });
        }
    }
}

/// `pg_notify(channel, payload, sender pid)` (the wire's rewrite adds the pid): `NOTIFY`
/// as a function, its channel taken as written (not folded). Returns an empty text, as
/// Postgres's `void` prints.
pub fn pg_notify_udf() -> datafusion::logical_expr::ScalarUDF {
    use datafusion::arrow::array::{Array, AsArray, StringArray};
    use datafusion::arrow::datatypes::{DataType, Int64Type};
    use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
    create_udf(
        "pg_notify",
        vec![DataType::Utf8, DataType::Utf8, DataType::Int64],
        DataType::Utf8,
        Volatility::Volatile,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let cast = |i: usize, t: &DataType| datafusion::arrow::compute::cast(&arrays[i], t);
            let channels = cast(0, &DataType::Utf8)?;
            let payloads = cast(1, &DataType::Utf8)?;
            let pids = cast(2, &DataType::Int64)?;
            let (channels, payloads) = (channels.as_string::<i32>(), payloads.as_string::<i32>());
            let pids = pids.as_primitive::<Int64Type>();
            for i in 0..channels.len() {
                if channels.is_null(i) || channels.value(i).is_empty() {
                    return Err(datafusion::error::DataFusionError::External(Box::new(
                        Error::invalid_option("channel name cannot be empty"),
                    )));
                }
                let payload = if payloads.is_null(i) {
                    ""
                } else {
                    payloads.value(i)
                };
                check_payload(payload)
                    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
                let pid = if pids.is_null(i) {
                    0
                } else {
                    pids.value(i) as i32
                };
                notify(pid, channels.value(i), payload);
            }
            Ok(ColumnarValue::Array(Arc::new(StringArray::from(vec![
                Some("");
                channels.len()
            ]))))
        }),
    )
}

/// The channel of one query's events: `tidemark_events_<name>`, cut to Postgres's 63
/// bytes as a `LISTEN` of that name would be.
pub fn query_channel(name: &str) -> String {
    let mut channel = format!("{EVENTS_CHANNEL}_{name}");
    if channel.len() > 63 {
        let mut end = 63;
        while !channel.is_char_boundary(end) {
            end -= 1;
        }
        channel.truncate(end);
    }
    channel
}

/// Delivers the engine's listener events until the registry goes away.
pub fn forward_events(registry: &Arc<Registry>) -> tokio::task::JoinHandle<()> {
    let mut events = registry.events();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match events.recv().await {
                Ok(event) => deliver_event(&event),
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "listener events came faster than they could be delivered"
                    )
                }
                Err(RecvError::Closed) => return,
            }
        }
    })
}

fn deliver_event(event: &ListenerEvent) {
    let payload = event.payload();
    notify(0, EVENTS_CHANNEL, &payload);
    notify(0, &query_channel(event.name()), &payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mailbox_keeps_what_arrives_for_its_channels() {
        let m = Mailbox::default();
        m.listen("a");
        m.listen("b");
        assert!(m.listens("a") && !m.listens("c"));
        m.deliver(Notification {
            pid: 1,
            channel: "a".into(),
            payload: "x".into(),
        });
        assert_eq!(m.take().len(), 1);
        assert!(m.take().is_empty());
        m.unlisten(Some("a"));
        assert_eq!(m.channels(), vec!["b".to_string()]);
        m.unlisten(None);
        assert!(m.channels().is_empty());
    }

    #[test]
    fn payloads_stop_short_of_8000_bytes() {
        assert!(check_payload(&"x".repeat(7999)).is_ok());
        let e = check_payload(&"x".repeat(8000)).unwrap_err();
        assert_eq!(e.sqlstate().code(), "22023");
    }

    #[test]
    fn query_channels_are_cut_as_postgres_cuts_names() {
        assert_eq!(query_channel("clicks"), "tidemark_events_clicks");
        assert_eq!(query_channel(&"q".repeat(100)).len(), 63);
    }
}
