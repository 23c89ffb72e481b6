//! Sources: where a streaming query's rows come from.
//!
//! Every source implements [`Source`], the micro-batch contract of Spark's `Source` with
//! admission control: the trigger loop asks for the latest offset under a read limit, writes
//! it to `offsets/N`, then reads the rows of `(start, end]` as a stream of Arrow batches.
//! Offsets are the source's own JSON, stored as is in `offsets/N`; the loop only compares
//! them. A source that keeps a log of its own (the file source) keeps it in the checkpoint
//! directory it is given (`sources/<i>/`).

pub mod delta;
pub mod file;
pub mod kafka;
pub mod nexmark;
pub mod rate;
pub mod table;

use std::collections::BTreeMap;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::BoxStream;
use tokio::sync::watch;

use crate::error::Result;

/// A source's offset, in the JSON form `offsets/N` stores.
pub type Offset = serde_json::Value;

/// The rows of a batch, as they are read.
pub type BatchStream = BoxStream<'static, Result<RecordBatch>>;

/// One stream of batches from a stream of reads, each giving several batches (a file, a log
/// frame): the reads' order is kept, and a failed read ends the stream with its error.
pub fn flatten_reads<S>(reads: S) -> BatchStream
where
    S: futures::Stream<Item = Result<Vec<RecordBatch>>> + Send + 'static,
{
    use futures::StreamExt;
    reads
        .map(|r| match r {
            Ok(batches) => futures::stream::iter(batches.into_iter().map(Ok)).boxed(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .flatten()
        .boxed()
}

/// An input record that did not parse, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedRecord {
    /// The file (or other place) it was read from.
    pub path: String,
    pub record: crate::format::Rejected,
}

/// When some of a batch's rows arrived (their file landed; their `INSERT` or `COPY` was
/// acknowledged), for the end-to-end latency of the progress report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Milliseconds since the epoch.
    pub at_ms: i64,
    pub rows: u64,
}

/// What a source holds that no batch has read yet, after the batch being planned. `None`:
/// the source cannot tell (a file's rows are known only once it is read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    pub files: Option<u64>,
    pub rows: Option<u64>,
    pub bytes: Option<u64>,
}

impl Backlog {
    /// As a progress report's source metrics: Spark's `numFilesOutstanding` and
    /// `numBytesOutstanding` (Delta's source), and `numRowsOutstanding`.
    pub fn metrics(&self) -> impl Iterator<Item = (String, String)> {
        [
            ("numFilesOutstanding", self.files),
            ("numBytesOutstanding", self.bytes),
            ("numRowsOutstanding", self.rows),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?.to_string())))
    }
}

/// How much one batch may take (Spark's `ReadLimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadLimit {
    /// Everything available (`trigger = 'once'`).
    AllAvailable,
    /// The source's own limit: `max_files_per_trigger`, `max_rows_per_trigger`.
    Default,
}

/// The micro-batch source contract.
#[async_trait]
pub trait Source: Send + Sync {
    /// The rows' schema.
    fn schema(&self) -> SchemaRef;

    /// For progress reports and `EXPLAIN`: `FileStreamSource[file:/path]`.
    fn describe(&self) -> String;

    /// Whether the source can fix an end for `available_now`; if not, `available_now`
    /// runs as `once` (Spark's fallback for the `rate` source).
    fn supports_available_now(&self) -> bool {
        true
    }

    /// Fixes what an `available_now` run reads: the offset available now (Spark's
    /// `prepareForTriggerAvailableNow`). Later `latest_offset` calls never go past it.
    async fn prepare_available_now(&mut self) -> Result<()> {
        Ok(())
    }

    /// The newest offset a batch starting after `start` may read up to, under `limit`.
    /// `None` while the source has no data at all; equal to `start` when nothing is new.
    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: ReadLimit,
    ) -> Result<Option<Offset>>;

    /// The rows of `(start, end]`. Reading the same range again gives the same rows.
    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream>;

    /// Counters of the last read, for the progress report's source `metrics`.
    fn metrics(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// The records of the last read that did not parse, once its stream is drained (for
    /// `malformed_rows = 'table'`); a second call gives none. Only sources that decode
    /// text have any.
    fn take_malformed(&self) -> Vec<MalformedRecord> {
        Vec::new()
    }

    /// When the rows of the last read arrived, once its stream is drained; a second call
    /// gives none. Sources whose rows are made, not landed (`rate`, `nexmark`), have none.
    fn take_arrivals(&self) -> Vec<Arrival> {
        Vec::new()
    }

    /// What is left to read after `end`, the end of the batch being planned (as of the last
    /// `latest_offset`).
    fn backlog(&self, _end: Option<&Offset>) -> Backlog {
        Backlog::default()
    }

    /// Whether the last `latest_offset` stopped short of what the source held because of
    /// its read limit (`max_files_per_trigger`, `max_rows_per_trigger`). `FLUSH` waits for
    /// a batch that held nothing back. A source without a read limit never does.
    fn held_back(&self) -> bool {
        false
    }

    /// The newest offset available, whatever the read limit: Spark's `latestOffset` of a
    /// progress report (`reportLatestOffset`). `None` where Spark reports `null` (files).
    fn reported_latest(&self) -> Option<Offset> {
        None
    }

    /// The query has committed everything up to `end`: what only it needed may go.
    async fn commit(&mut self, _end: &Offset) -> Result<()> {
        Ok(())
    }

    /// Changes when new data arrives, so a waiting trigger runs at once. `None`: the loop
    /// polls.
    fn arrivals(&self) -> Option<watch::Receiver<u64>> {
        None
    }
}
