//! Tidemark's own connection loop over pgwire's codec and handlers.
//!
//! pgwire's `process_socket` decodes each message straight from the socket's buffer; a
//! truncated `Bind` made its decoder read past the message (into the next one) and then
//! panic. Here every message is framed first: its length is checked against a cap before
//! anything is buffered ([`config::MAX_MESSAGE_BYTES`], Postgres's 10,000 bytes for a
//! startup packet), its body is checked field by field ([`check_message`], pure), and only
//! then is it cut off on its own and handed to pgwire's decoder, which cannot read past
//! it. A message that fails gets `FATAL 08P01` and a closed connection, as in Postgres.
//! A panic in a handler is caught: the client gets `XX000` and the connection is closed;
//! the server goes on.
//!
//! The loop owns the socket, so it is also where pushed messages go: the notifications of
//! `LISTEN` (`server::notify`), sent while the session is idle, without waiting for the
//! client.

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use datafusion_postgres::pgwire;
use futures::{FutureExt, Sink, SinkExt, StreamExt};
use pgwire::api::auth::StartupHandler;
use pgwire::api::cancel::CancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::store::{Entry, MemPortalStore, PortalStore};
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::response::{ReadyForQuery, TransactionStatus};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{MaybeTls, PgWireMessageServerCodec, negotiate_tls};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, Encoder, Framed, FramedParts};

use super::activity::Registered;
use super::{ExtStatement, Handlers};
use crate::config;

/// How long a client has to finish its startup, as pgwire allows.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Postgres's limit on a startup packet.
const MAX_STARTUP_BYTES: usize = 10_000;

/// Serves one client connection until it ends.
pub(super) async fn serve(socket: TcpStream, handlers: Arc<Handlers>) -> io::Result<()> {
    let startup = tokio::time::sleep(STARTUP_TIMEOUT);
    tokio::pin!(startup);
    let negotiated = tokio::select! {
        _ = &mut startup => return Ok(()),
        n = negotiate_tls::<ExtStatement>(socket, handlers.tls.clone()) => n?,
    };
    let Some(framed) = negotiated else {
        return Ok(());
    };
    let old = framed.into_parts();
    let mut parts = FramedParts::new(
        old.io,
        Codec {
            inner: old.codec,
            max_message: config::MAX_MESSAGE_BYTES,
        },
    );
    parts.read_buf = old.read_buf;
    parts.write_buf = old.write_buf;
    let mut conn = Conn {
        framed: Framed::from_parts(parts),
    };
    loop {
        let starting = matches!(
            conn.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let idle = matches!(conn.state(), PgWireConnectionState::ReadyForQuery)
            && matches!(conn.transaction_status(), TransactionStatus::Idle);
        let session = conn
            .session_extensions()
            .get::<Registered>()
            .map(|r| r.0.clone());
        let terminated = async {
            match &session {
                Some(session) => session.terminated().await,
                None => std::future::pending().await,
            }
        };
        // Notifications go out while the session is idle outside a transaction block.
        if idle && let Some(session) = &session {
            send_notifications(&mut conn, session).await?;
        }
        let arrived = async {
            match &session {
                Some(session) if idle => session.mailbox.arrived().await,
                _ => std::future::pending().await,
            }
        };
        let idle_limit = handlers.idle_session_timeout.filter(|_| idle);
        let next = tokio::select! {
            _ = &mut startup, if starting => return Ok(()),
            // Sent at the top of the loop; the wait for the client starts again.
            _ = arrived => continue,
            _ = terminated => return send_error(&mut conn, terminated_by_administrator(), false).await,
            m = async {
                match idle_limit {
                    Some(limit) => tokio::time::timeout(limit, conn.framed.next()).await.ok(),
                    None => Some(conn.framed.next().await),
                }
            } => match m {
                Some(m) => m,
                None => {
                    let info = ErrorInfo::new(
                        "FATAL".into(),
                        "57P05".into(),
                        "terminating connection due to idle-session timeout".into(),
                    );
                    return send_error(&mut conn, info, false).await;
                }
            },
        };
        let message = match next {
            None => return Ok(()),
            Some(Ok(m)) => m,
            Some(Err(PgWireError::IoError(_))) => return Ok(()),
            Some(Err(e)) => {
                // The stream cannot be read further: say why, then close.
                let mut info = ErrorInfo::from(e);
                info.severity = "FATAL".into();
                return send_error(&mut conn, info, false).await;
            }
        };
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            return Ok(());
        }
        if let PgWireFrontendMessage::CancelRequest(cancel) = message {
            handlers.cancel.on_cancel_request(cancel).await;
            return Ok(());
        }
        let extended = match conn.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        if let Some(session) = &session
            && let Some(statement) = statement_of(&conn, &message)
        {
            session.start(&statement);
            metrics::counter!("tidemark_statements_total").increment(1);
        }
        let outcome = AssertUnwindSafe(dispatch(&mut conn, &handlers, message))
            .catch_unwind()
            .await;
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(PgWireError::IoError(_))) => return Ok(()),
            Ok(Err(e)) => {
                let info = ErrorInfo::from(e);
                let fatal = info.is_fatal();
                send_error(&mut conn, info, extended).await?;
                if fatal {
                    return Ok(());
                }
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                tracing::error!(addr = %conn.socket_addr(), panic = what, "a statement panicked; closing its connection");
                let info = ErrorInfo::new(
                    "FATAL".into(),
                    "XX000".into(),
                    format!("internal error: {what}"),
                );
                return send_error(&mut conn, info, false).await;
            }
        }
        if session.as_ref().is_some_and(|s| s.terminating()) {
            return send_error(&mut conn, terminated_by_administrator(), false).await;
        }
        if let Some(session) = &session
            && matches!(conn.state(), PgWireConnectionState::ReadyForQuery)
        {
            session.rest(match conn.transaction_status() {
                TransactionStatus::Idle => "idle",
                TransactionStatus::Transaction => "idle in transaction",
                TransactionStatus::Error => "idle in transaction (aborted)",
            });
        }
    }
}

/// Sends the session's waiting notifications (`LISTEN`) as `NotificationResponse`s.
async fn send_notifications(conn: &mut Conn, session: &super::activity::Session) -> io::Result<()> {
    let waiting = session.mailbox.take();
    if waiting.is_empty() {
        return Ok(());
    }
    for n in waiting {
        conn.feed(PgWireBackendMessage::NotificationResponse(
            pgwire::messages::response::NotificationResponse::new(n.pid, n.channel, n.payload),
        ))
        .await?;
    }
    conn.flush().await
}

/// Why a connection `pg_terminate_backend` ended is closing.
fn terminated_by_administrator() -> ErrorInfo {
    ErrorInfo::new(
        "FATAL".into(),
        "57P01".into(),
        "terminating connection due to administrator command".into(),
    )
}

/// The statement a `Query` or `Execute` runs, for `pg_stat_activity`.
fn statement_of(conn: &Conn, message: &PgWireFrontendMessage) -> Option<String> {
    match message {
        PgWireFrontendMessage::Query(q) => Some(q.query.clone()),
        PgWireFrontendMessage::Execute(e) => {
            let name = e.name.as_deref().unwrap_or("");
            match conn.portal_store().get_portal(name) {
                Some(Entry::Value(portal)) => Some(portal.statement.statement.0.clone()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Hands one message to its handler, by the connection's state (pgwire's dispatch).
async fn dispatch(
    conn: &mut Conn,
    handlers: &Handlers,
    message: PgWireFrontendMessage,
) -> PgWireResult<()> {
    use PgWireFrontendMessage as M;
    let service = handlers.service.as_ref();
    match conn.state() {
        PgWireConnectionState::AwaitingSslRequest
        | PgWireConnectionState::AwaitingStartup
        | PgWireConnectionState::AuthenticationInProgress => {
            handlers.startup.on_startup(conn, message).await
        }
        // After an error in the extended protocol, messages up to the Sync are dropped.
        PgWireConnectionState::AwaitingSync => {
            if let M::Sync(sync) = message {
                service.on_sync(conn, sync).await?;
                conn.set_state(PgWireConnectionState::ReadyForQuery);
            }
            Ok(())
        }
        PgWireConnectionState::CopyInProgress(extended) => match message {
            M::CopyData(data) => service.on_copy_data(conn, data).await,
            M::CopyDone(done) => {
                let result = service.on_copy_done(conn, done).await;
                if extended {
                    // The client ends an extended COPY with a Sync, which answers it.
                    if result.is_ok() {
                        conn.set_state(PgWireConnectionState::AwaitingSync);
                    }
                    return result;
                }
                conn.set_state(PgWireConnectionState::ReadyForQuery);
                result?;
                let status = conn.transaction_status();
                conn.send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                    status,
                )))
                .await?;
                Ok(())
            }
            M::CopyFail(fail) => {
                let error = service.on_copy_fail(conn, fail).await;
                if !extended {
                    conn.set_state(PgWireConnectionState::ReadyForQuery);
                }
                Err(error)
            }
            // Postgres ignores them during COPY: clients pipeline a Sync after the Execute.
            M::Flush(_) | M::Sync(_) => Ok(()),
            _ => Err(protocol_violation("unexpected message type during COPY")),
        },
        _ => match message {
            M::Query(query) => service.on_query(conn, query).await,
            M::Parse(parse) => service.on_parse(conn, parse).await,
            M::Bind(bind) => service.on_bind(conn, bind).await,
            M::Execute(execute) => service.on_execute(conn, execute).await,
            M::Describe(describe) => service.on_describe(conn, describe).await,
            M::Flush(flush) => service.on_flush(conn, flush).await,
            M::Sync(sync) => service.on_sync(conn, sync).await,
            M::Close(close) => service.on_close(conn, close).await,
            M::CopyData(_) | M::CopyDone(_) | M::CopyFail(_) => Ok(()),
            _ => Err(protocol_violation("unexpected message")),
        },
    }
}

/// Sends an ErrorResponse, then ReadyForQuery (or waits for the Sync of an extended
/// exchange); a FATAL error closes the connection.
async fn send_error(conn: &mut Conn, info: ErrorInfo, extended: bool) -> io::Result<()> {
    let fatal = info.is_fatal();
    metrics::counter!("tidemark_errors_total", "sqlstate" => info.code.clone()).increment(1);
    conn.feed(PgWireBackendMessage::ErrorResponse(info.into()))
        .await?;
    if fatal {
        conn.flush().await?;
        return conn.close().await;
    }
    let status = conn.transaction_status().to_error_state();
    conn.set_transaction_status(status);
    if extended {
        conn.set_state(PgWireConnectionState::AwaitingSync);
    } else {
        conn.set_state(PgWireConnectionState::ReadyForQuery);
        conn.feed(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
            status,
        )))
        .await?;
    }
    conn.flush().await
}

fn protocol_violation(message: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".into(),
        "08P01".into(),
        message.into(),
    )))
}

/// pgwire's server codec behind a check of each whole message.
struct Codec {
    inner: PgWireMessageServerCodec<ExtStatement>,
    max_message: usize,
}

impl Decoder for Codec {
    type Item = PgWireFrontendMessage;
    type Error = PgWireError;

    fn decode(&mut self, src: &mut BytesMut) -> PgWireResult<Option<PgWireFrontendMessage>> {
        let startup = matches!(
            self.inner.client_info.state,
            PgWireConnectionState::AwaitingSslRequest | PgWireConnectionState::AwaitingStartup
        );
        // A startup packet has no type byte; every later message has one.
        let offset = usize::from(!startup);
        if src.len() < offset + 4 {
            return Ok(None);
        }
        let declared = (&src[offset..offset + 4]).get_i32();
        let limit = if startup {
            MAX_STARTUP_BYTES
        } else {
            self.max_message
        };
        let len = match usize::try_from(declared) {
            Ok(n) if (4..=limit).contains(&n) => n,
            _ => {
                return Err(protocol_violation(&format!(
                    "invalid message length {declared} (at most {limit} bytes are accepted)"
                )));
            }
        };
        if src.len() < offset + len {
            src.reserve(offset + len - src.len());
            return Ok(None);
        }
        let body = &src[offset + 4..offset + len];
        let checked = if startup {
            check_startup(body)
        } else {
            check_message(src[0], body)
        };
        checked.map_err(|m| protocol_violation(&m))?;
        let mut frame = src.split_to(offset + len);
        match self.inner.decode(&mut frame)? {
            Some(message) => Ok(Some(message)),
            None => Err(protocol_violation("incomplete message")),
        }
    }
}

impl Encoder<PgWireBackendMessage> for Codec {
    type Error = io::Error;

    fn encode(&mut self, item: PgWireBackendMessage, dst: &mut BytesMut) -> io::Result<()> {
        self.inner.encode(item, dst)
    }
}

/// The protocol codes a startup packet may carry: protocol 3.x, or a cancel request.
const CANCEL_REQUEST_CODE: u32 = 80_877_102;

/// Checks a startup packet's body: a protocol version 3.x followed by `name\0value\0`
/// pairs and a final `\0`, or a cancel request (process id and key).
pub(crate) fn check_startup(body: &[u8]) -> Result<(), String> {
    let mut r = Reader(body);
    let code = r.u32()?;
    if code == CANCEL_REQUEST_CODE {
        return if r.0.len() >= 8 {
            Ok(())
        } else {
            Err("invalid cancel request".into())
        };
    }
    if code >> 16 != 3 {
        return Err(format!(
            "unsupported frontend protocol {}.{}: server supports 3.0 to 3.2",
            code >> 16,
            code & 0xffff
        ));
    }
    loop {
        let name = r.cstr()?;
        if name.is_empty() {
            break;
        }
        r.cstr()?;
    }
    r.end()
}

/// Checks the body of a frontend message of type `tag` field by field, as Postgres's
/// `pq_getmsg*` calls do: every count fits, every string ends, nothing is left over.
pub(crate) fn check_message(tag: u8, body: &[u8]) -> Result<(), String> {
    let mut r = Reader(body);
    match tag {
        b'Q' | b'f' => {
            r.cstr()?;
        }
        b'P' => {
            r.cstr()?;
            r.cstr()?;
            let n = r.count()?;
            r.take(n * 4)?;
        }
        b'B' => {
            r.cstr()?;
            r.cstr()?;
            let formats = r.count()?;
            for _ in 0..formats {
                r.format()?;
            }
            let params = r.count()?;
            if formats > 1 && formats != params {
                return Err(format!(
                    "bind message has {formats} parameter formats but {params} parameters"
                ));
            }
            for _ in 0..params {
                let len = r.i32()?;
                if len >= 0 {
                    r.take(len as usize)?;
                } else if len != -1 {
                    return Err(format!("invalid parameter length {len}"));
                }
            }
            let results = r.count()?;
            for _ in 0..results {
                r.format()?;
            }
        }
        b'E' => {
            r.cstr()?;
            r.i32()?;
        }
        b'D' | b'C' => {
            let target = r.take(1)?[0];
            if target != b'S' && target != b'P' {
                return Err(format!(
                    "invalid {} message subtype {target}",
                    if tag == b'D' { "DESCRIBE" } else { "CLOSE" }
                ));
            }
            r.cstr()?;
        }
        b'S' | b'H' | b'X' | b'c' => {}
        // Data, and the password family, whose shape depends on the authentication.
        b'd' | b'p' => return Ok(()),
        _ => return Err(format!("invalid frontend message type {tag}")),
    }
    r.end()
}

/// Reads a message body as Postgres's `pq_getmsg*` do, failing instead of reading past it.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("insufficient data left in message".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn i32(&mut self) -> Result<i32, String> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(self.i32()? as u32)
    }

    /// A count of the 16-bit kind Postgres reads (`pq_getmsgint(msg, 2)`), never negative.
    fn count(&mut self) -> Result<usize, String> {
        let b = self.take(2)?;
        let n = i16::from_be_bytes([b[0], b[1]]);
        usize::try_from(n).map_err(|_| format!("invalid count {n}"))
    }

    fn format(&mut self) -> Result<(), String> {
        let b = self.take(2)?;
        match i16::from_be_bytes([b[0], b[1]]) {
            0 | 1 => Ok(()),
            f => Err(format!("unsupported format code: {f}")),
        }
    }

    fn cstr(&mut self) -> Result<&'a [u8], String> {
        let end = self
            .0
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| "invalid string in message".to_string())?;
        let s = &self.0[..end];
        self.0 = &self.0[end + 1..];
        Ok(s)
    }

    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err("invalid message format".into())
        }
    }
}

/// One client connection: the framed socket and pgwire's per-connection state (in the
/// codec, as pgwire keeps it).
struct Conn {
    framed: Framed<MaybeTls, Codec>,
}

impl Conn {
    fn client(&self) -> &pgwire::api::DefaultClient<ExtStatement> {
        &self.framed.codec().inner.client_info
    }

    fn client_mut(&mut self) -> &mut pgwire::api::DefaultClient<ExtStatement> {
        &mut self.framed.codec_mut().inner.client_info
    }
}

impl ClientInfo for Conn {
    fn socket_addr(&self) -> std::net::SocketAddr {
        self.client().socket_addr()
    }

    fn is_secure(&self) -> bool {
        self.client().is_secure()
    }

    fn protocol_version(&self) -> pgwire::messages::ProtocolVersion {
        self.client().protocol_version()
    }

    fn set_protocol_version(&mut self, version: pgwire::messages::ProtocolVersion) {
        self.client_mut().set_protocol_version(version)
    }

    fn pid_and_secret_key(&self) -> (i32, pgwire::messages::startup::SecretKey) {
        self.client().pid_and_secret_key()
    }

    fn set_pid_and_secret_key(&mut self, pid: i32, key: pgwire::messages::startup::SecretKey) {
        self.client_mut().set_pid_and_secret_key(pid, key)
    }

    fn state(&self) -> PgWireConnectionState {
        self.client().state()
    }

    fn set_state(&mut self, state: PgWireConnectionState) {
        self.client_mut().set_state(state)
    }

    fn transaction_status(&self) -> pgwire::messages::response::TransactionStatus {
        self.client().transaction_status()
    }

    fn set_transaction_status(&mut self, status: pgwire::messages::response::TransactionStatus) {
        self.client_mut().set_transaction_status(status)
    }

    fn metadata(&self) -> &std::collections::HashMap<String, String> {
        self.client().metadata()
    }

    fn metadata_mut(&mut self) -> &mut std::collections::HashMap<String, String> {
        self.client_mut().metadata_mut()
    }

    fn session_extensions(&self) -> &pgwire::api::SessionExtensions {
        self.client().session_extensions()
    }

    fn sni_server_name(&self) -> Option<&str> {
        self.client().sni_server_name()
    }

    fn client_certificates<'a>(
        &self,
    ) -> Option<&[pgwire::tokio::tokio_rustls::rustls::pki_types::CertificateDer<'a>]> {
        match self.framed.get_ref() {
            MaybeTls::Tls(tls) => tls.get_ref().1.peer_certificates(),
            _ => None,
        }
    }
}

impl ClientPortalStore for Conn {
    type PortalStore = MemPortalStore<ExtStatement>;

    fn portal_store(&self) -> &Self::PortalStore {
        self.client().portal_store()
    }
}

impl Sink<PgWireBackendMessage> for Conn {
    type Error = io::Error;

    fn poll_ready(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.framed.poll_ready_unpin(cx)
    }

    fn start_send(
        mut self: std::pin::Pin<&mut Self>,
        item: PgWireBackendMessage,
    ) -> io::Result<()> {
        self.framed.start_send_unpin(item)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.framed.poll_flush_unpin(cx)
    }

    fn poll_close(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.framed.poll_close_unpin(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(params: &[Option<&[u8]>], formats: &[i16]) -> Vec<u8> {
        let mut b = b"\0\0".to_vec();
        b.extend((formats.len() as i16).to_be_bytes());
        for f in formats {
            b.extend(f.to_be_bytes());
        }
        b.extend((params.len() as i16).to_be_bytes());
        for p in params {
            match p {
                Some(v) => {
                    b.extend((v.len() as i32).to_be_bytes());
                    b.extend(*v);
                }
                None => b.extend((-1i32).to_be_bytes()),
            }
        }
        b.extend(0i16.to_be_bytes());
        b
    }

    #[test]
    fn a_well_formed_bind_passes_and_every_truncation_of_it_fails() {
        let good = bind(&[Some(b"42"), None, Some(b"")], &[0]);
        assert_eq!(check_message(b'B', &good), Ok(()));
        for cut in 0..good.len() {
            assert!(
                check_message(b'B', &good[..cut]).is_err(),
                "a Bind cut to {cut} bytes was accepted"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            check_message(b'B', &long),
            Err("invalid message format".into())
        );
    }

    #[test]
    fn counts_and_lengths_that_do_not_fit_are_refused() {
        // Two formats for three parameters.
        let b = bind(&[None, None, None], &[0, 1]);
        assert!(
            check_message(b'B', &b)
                .unwrap_err()
                .contains("2 parameter formats")
        );
        // A parameter longer than the message.
        let mut b = b"\0\0\0\0\0\x01".to_vec();
        b.extend(1000i32.to_be_bytes());
        b.extend(b"abc");
        assert_eq!(
            check_message(b'B', &b),
            Err("insufficient data left in message".into())
        );
        // A negative count, a bad format code, a negative length other than -1.
        assert!(check_message(b'P', b"\0q\0\xff\xff").is_err());
        assert!(check_message(b'B', &bind(&[None], &[7])).is_err());
        let mut b = b"\0\0\0\0\0\x01".to_vec();
        b.extend((-2i32).to_be_bytes());
        b.extend(0i16.to_be_bytes());
        assert!(check_message(b'B', &b).is_err());
    }

    #[test]
    fn each_message_type_is_checked_to_its_end() {
        assert_eq!(check_message(b'Q', b"SELECT 1\0"), Ok(()));
        assert!(check_message(b'Q', b"SELECT 1").is_err());
        assert!(check_message(b'Q', b"SELECT 1\0x").is_err());
        assert_eq!(
            check_message(b'P', b"s\0SELECT $1\0\0\x01\0\0\0\x17"),
            Ok(())
        );
        assert!(check_message(b'P', b"s\0SELECT $1\0\0\x01\0\0").is_err());
        assert_eq!(check_message(b'E', b"\0\0\0\0\0"), Ok(()));
        assert!(check_message(b'E', b"\0\0\0").is_err());
        assert_eq!(check_message(b'D', b"Sname\0"), Ok(()));
        assert!(check_message(b'D', b"Xname\0").is_err());
        assert!(check_message(b'C', b"").is_err());
        assert_eq!(check_message(b'S', b""), Ok(()));
        assert!(check_message(b'S', b"x").is_err());
        assert_eq!(check_message(b'd', b"anything"), Ok(()));
        assert!(
            check_message(b'F', b"")
                .unwrap_err()
                .contains("invalid frontend message type 70")
        );
    }

    #[test]
    fn startup_packets_are_protocol_3_with_ended_pairs() {
        let mut ok = 196_608u32.to_be_bytes().to_vec();
        ok.extend(b"user\0tidemark\0database\0db\0\0");
        assert_eq!(check_startup(&ok), Ok(()));
        assert!(check_startup(&ok[..ok.len() - 1]).is_err());
        let mut v2 = 131_072u32.to_be_bytes().to_vec();
        v2.extend(b"\0");
        assert!(
            check_startup(&v2)
                .unwrap_err()
                .contains("unsupported frontend protocol 2.0")
        );
        let mut cancel = CANCEL_REQUEST_CODE.to_be_bytes().to_vec();
        cancel.extend([0u8; 8]);
        assert_eq!(check_startup(&cancel), Ok(()));
        assert!(check_startup(&cancel[..8]).is_err());
    }

    #[test]
    fn the_codec_refuses_a_huge_declared_length_before_buffering_it() {
        let client = pgwire::api::DefaultClient::new("127.0.0.1:1".parse().unwrap(), false);
        let mut codec = Codec {
            inner: PgWireMessageServerCodec::new(client),
            max_message: 1 << 20,
        };
        codec.inner.client_info.state = PgWireConnectionState::ReadyForQuery;
        let mut buf = BytesMut::from(&b"Q\x40\0\0\0SELECT"[..]);
        let e = codec.decode(&mut buf).unwrap_err();
        assert!(ErrorInfo::from(e).code == "08P01");
        // Two messages in one buffer: a truncated Bind does not read into the next one.
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"B\0\0\0\x08\0\0\0\x05");
        buf.extend_from_slice(b"S\0\0\0\x04");
        let e = codec.decode(&mut buf).unwrap_err();
        assert!(ErrorInfo::from(e).message.contains("insufficient data"));
    }
}
