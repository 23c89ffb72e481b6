//! The console sink: logs every batch's rows (at-least-once: a replayed batch is logged
//! again), as Spark's console sink prints them.

use async_trait::async_trait;
use datafusion::arrow::record_batch::RecordBatch;

use super::{BatchInfo, Sink, SinkCommit};
use crate::error::Result;

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
    async fn add_batch(&self, batch: &BatchInfo<'_>, rows: Vec<RecordBatch>) -> Result<SinkCommit> {
        let batch = batch.id;
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
