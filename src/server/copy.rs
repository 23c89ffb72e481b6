//! `COPY stream FROM STDIN` on the wire: the `CopyInResponse`, then `CopyData` messages
//! fed to a [`CopyDecoder`], then, at `CopyDone`, the whole statement appended to the
//! stream's log in one durable write. A bad row, or a `CopyFail` from the client, appends
//! nothing. The copy in progress lives in the connection's session extensions.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion_postgres::pgwire;
use futures::{Sink, SinkExt};
use pgwire::api::ClientInfo;
use pgwire::api::copy::CopyHandler;
use pgwire::api::results::{CopyResponse, Response, Tag};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};

use super::{TidemarkService, to_pg_error};
use crate::engine::Engine;
use crate::error::Error;
use crate::format::copy::{CopyDecoder, CopyFormat};
use crate::source::table::TableLog;
use crate::sql::copy::CopyFrom;

/// A copy in progress on one connection.
struct CopyIn {
    log: Arc<TableLog>,
    decoder: CopyDecoder,
}

/// The connection's copy slot.
#[derive(Default)]
struct CopySlot(Mutex<Option<CopyIn>>);

fn slot<C: ClientInfo>(client: &C) -> Arc<CopySlot> {
    client
        .session_extensions()
        .get_or_insert_with(CopySlot::default)
}

/// Starts a `COPY ... FROM STDIN`: checks the target, answers `CopyInResponse`.
pub fn start<C: ClientInfo>(engine: &Engine, client: &C, copy: CopyFrom) -> PgWireResult<Response> {
    let log = engine
        .copy_target(&copy.table)
        .map_err(|e| to_pg_error(&e))?;
    let decoder = CopyDecoder::new(
        &copy.table,
        log.schema(),
        copy.columns.as_deref(),
        copy.options.clone(),
    )
    .map_err(|e| to_pg_error(&e))?;
    let width = decoder.width();
    *slot(client).0.lock().unwrap_or_else(|e| e.into_inner()) = Some(CopyIn { log, decoder });
    // Text and CSV are both textual copies (format 0); binary is format 1.
    let format = match copy.options.format {
        CopyFormat::Text | CopyFormat::Csv => 0,
        CopyFormat::Binary => 1,
    };
    Ok(Response::CopyIn(CopyResponse::new(
        format,
        width,
        futures::stream::empty(),
    )))
}

fn no_copy() -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "08P01".into(),
        "COPY data without a COPY in progress".into(),
    )))
}

#[async_trait]
impl CopyHandler for TidemarkService {
    async fn on_copy_data<C>(&self, client: &mut C, data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client);
        let mut guard = slot.0.lock().unwrap_or_else(|e| e.into_inner());
        let copy = guard.as_mut().ok_or_else(no_copy)?;
        copy.decoder.feed(&data.data);
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let copy = slot(client)
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(no_copy)?;
        let (rows, batches) = copy.decoder.finish().map_err(|e| to_pg_error(&e))?;
        copy.log
            .append(batches)
            .await
            .map_err(|e| to_pg_error(&e))?;
        let tag = Tag::new("COPY").with_rows(rows as usize);
        client
            .send(PgWireBackendMessage::CommandComplete(tag.into()))
            .await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        slot(client)
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        to_pg_error(&Error::QueryCanceled(format!(
            "COPY from stdin failed: {}",
            fail.message
        )))
    }
}
