//! The noop sink (Spark's `format("noop")`): runs the query and drops its rows. For
//! benchmarks: everything but the write is measured. Nothing to replay, so every batch is
//! "committed".

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use super::{BatchInfo, Sink, SinkCommit};
use crate::error::Result;

pub struct NoopSink;

#[async_trait]
impl Sink for NoopSink {
    async fn add_batch(
        &self,
        batch: &BatchInfo<'_>,
        _rows: Vec<RecordBatch>,
    ) -> Result<SinkCommit> {
        Ok(SinkCommit::Committed {
            version: batch.id.get() as i64,
        })
    }

    fn describe(&self) -> String {
        "NoopSink".into()
    }
}
