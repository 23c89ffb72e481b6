//! Stopping a running statement: a cancel request (psql's Ctrl-C, a driver's cancel) or the
//! session's `statement_timeout`. Both answer 57014, as in Postgres.
//!
//! Only what is safe to abandon half-way is raced against them: planning and sending a
//! query's rows, and waiting in `FLUSH`. A statement that changes the catalog or a table
//! runs to its end (Postgres would roll it back; Tidemark's statements take effect as they
//! go, so stopping one half-way could leave half a change).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion_postgres::pgwire;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt};
use pgwire::api::ClientInfo;
use pgwire::api::ConnectionHandle;
use pgwire::api::results::{QueryResponse, Response};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;

/// Why a statement was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    Cancel,
    Timeout,
}

impl Interruption {
    pub fn error(self) -> PgWireError {
        let message = match self {
            Interruption::Cancel => "canceling statement due to user request",
            Interruption::Timeout => "canceling statement due to statement timeout",
        };
        PgWireError::UserError(Box::new(ErrorInfo::new(
            "ERROR".into(),
            "57014".into(),
            message.into(),
        )))
    }
}

/// A connection's handle for cancel requests, kept under Tidemark's own type: pgwire
/// races a whole statement against the handle it finds under its own type, and would drop a
/// DDL statement half-way.
pub struct CancelHandle(pub Arc<ConnectionHandle>);

/// Resolves when the statement now starting is to stop; never, if nothing stops it.
pub type Stop = Shared<BoxFuture<'static, Interruption>>;

/// The session's `statement_timeout`, as datafusion-postgres's `SET` stores it.
pub fn statement_timeout<C: ClientInfo + ?Sized>(client: &C) -> Option<Duration> {
    client
        .metadata()
        .get("statement_timeout_ms")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// Starts watching for what stops the statement `client` is starting. A cancel request
/// that came before this is for an earlier statement, and is not seen.
pub async fn watch<C: ClientInfo + ?Sized>(client: &C) -> Stop {
    let handle = client.session_extensions().get::<CancelHandle>();
    let cancelled = match handle {
        Some(handle) => {
            let request = handle.0.start_query().await;
            async move {
                // The sender is dropped when the next statement starts: not a cancel.
                if request.await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            .boxed()
        }
        None => std::future::pending().boxed(),
    };
    let timeout = statement_timeout(client);
    async move {
        let timed_out = async {
            match timeout {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancelled => Interruption::Cancel,
            _ = timed_out => Interruption::Timeout,
        }
    }
    .boxed()
    .shared()
}

/// `rows`, ended by an error when `stop` resolves first.
pub fn rows_until<S>(rows: S, stop: Stop) -> impl Stream<Item = PgWireResult<DataRow>> + Send
where
    S: Stream<Item = PgWireResult<DataRow>> + Send,
{
    let fired = Arc::new(Mutex::new(None::<Interruption>));
    let record = fired.clone();
    let stopped = async move {
        let why = stop.await;
        *record.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    };
    rows.take_until(stopped).chain(
        futures::stream::once(async move {
            fired
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .map(|why| Err(why.error()))
        })
        .filter_map(std::future::ready),
    )
}

/// A response whose rows stop when `stop` resolves.
pub fn response_until(response: Response, stop: Stop) -> Response {
    match response {
        Response::Query(q) => {
            let QueryResponse {
                command_tag,
                row_schema,
                data_rows,
                ..
            } = q;
            let mut stopped = QueryResponse::new(row_schema, rows_until(data_rows, stop));
            stopped.command_tag = command_tag;
            Response::Query(stopped)
        }
        other => other,
    }
}

/// Runs `work`, or stops at `stop` with its 57014.
pub async fn race<T>(work: impl Future<Output = PgWireResult<T>>, stop: Stop) -> PgWireResult<T> {
    tokio::select! {
        out = work => out,
        why = stop => Err(why.error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(i: i64) -> PgWireResult<DataRow> {
        Ok(DataRow::new(bytes::BytesMut::from(&i.to_be_bytes()[..]), 1))
    }

    #[tokio::test]
    async fn rows_end_with_57014_when_stopped_and_pass_through_otherwise() {
        let never: Stop = std::future::pending().boxed().shared();
        let all: Vec<_> = rows_until(futures::stream::iter((0..3).map(row)), never)
            .collect()
            .await;
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|r| r.is_ok()));

        let now: Stop = async { Interruption::Cancel }.boxed().shared();
        let endless = futures::stream::pending::<PgWireResult<DataRow>>();
        let got: Vec<_> = rows_until(endless, now).collect().await;
        let [Err(PgWireError::UserError(info))] = got.as_slice() else {
            panic!("expected one error");
        };
        assert_eq!(info.code, "57014");
        assert_eq!(info.message, "canceling statement due to user request");
    }
}
