//! The noop sink (Spark's `format("noop")`): runs the query and drops its rows. For
//! benchmarks: everything but the write is measured. Nothing to replay, so every batch is
//! "committed".

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use super::{Sink, SinkCommit, WriteMode};
use crate::error::Result;
use crate::types::BatchId;

pub struct NoopSink;

#[async_trait]
impl Sink for NoopSink {
    async fn add_batch(
        &self,
        _query_id: &str,
        batch: BatchId,
        _rows: Vec<RecordBatch>,
        _mode: &WriteMode,
    ) -> Result<SinkCommit> {
        Ok(SinkCommit::Committed {
            version: batch.get() as i64,
        })
    }

    fn describe(&self) -> String {
        "NoopSink".into()
    }
}
