//! The console sink: logs every batch's rows (at-least-once: a replayed batch is logged
//! again), as Spark's console sink prints them.

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use super::{Sink, SinkCommit, WriteMode};
use crate::error::Result;
use crate::types::BatchId;

pub struct ConsoleSink {
    name: String,
}

impl ConsoleSink {
    pub fn new(name: &str) -> ConsoleSink {
        ConsoleSink {
            name: name.to_string(),
        }
    }
}

#[async_trait]
impl Sink for ConsoleSink {
    async fn add_batch(
        &self,
        _query_id: &str,
        batch: BatchId,
        rows: Vec<RecordBatch>,
        _mode: &WriteMode,
    ) -> Result<SinkCommit> {
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)?;
        tracing::info!(sink = %self.name, batch = batch.get(), "console sink\n{text}");
        Ok(SinkCommit::Committed {
            version: batch.get() as i64,
        })
    }

    fn describe(&self) -> String {
        "ConsoleSink".into()
    }
}
