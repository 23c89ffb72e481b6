//! Sinks: where a streaming query's rows go.
//!
//! Every sink implements [`Sink`]: `add_batch` writes one micro-batch and is idempotent per
//! batch id (a batch replayed after a crash is skipped when the sink already holds it), and
//! the sink's output can be read back as a table. Connector names are parsed once, into
//! [`SinkConnector`]; nothing else matches them as strings.

pub mod console;
pub mod delta;
pub mod file;
pub mod noop;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::TableProvider;

use crate::error::{Error, Result};
use crate::sql::options::{OptionSpec, OptionTable, OptionType, Options};
use crate::types::BatchId;

/// The options of a sink, whatever its connector.
pub const SINK_OPTIONS: OptionTable = OptionTable {
    object: "sink",
    connector: "delta | parquet | json | csv | console | noop",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&["delta", "parquet", "json", "csv", "console", "noop"]),
            Some("delta"),
            "Where the rows go",
        ),
        OptionSpec::new(
            "path",
            OptionType::Path,
            Some("<data dir>/tables/<name>"),
            "The table's directory (a console or noop sink has none)",
        ),
        OptionSpec::new(
            "trigger",
            OptionType::Trigger,
            Some("default"),
            "When micro-batches run: default, processing_time <interval>, available_now, once",
        )
        .alterable(),
        OptionSpec::new(
            "output_mode",
            OptionType::OneOf(&["append", "update", "complete"]),
            Some("append"),
            "What each batch writes (Spark's output modes)",
        ),
        OptionSpec::new(
            "checkpoint_location",
            OptionType::Path,
            Some("<data dir>/checkpoints/<name>"),
            "The checkpoint directory",
        ),
        OptionSpec::new(
            "watermark",
            OptionType::Watermark,
            None,
            "The event-time watermark, overriding the streams' WATERMARK FOR",
        ),
        OptionSpec::new(
            "state_partitions",
            OptionType::PositiveInt,
            Some("4"),
            "Partitions of the state store; fixed once the checkpoint exists",
        ),
        OptionSpec::new(
            "state_store",
            OptionType::OneOf(&["memory", "rocksdb"]),
            Some("memory"),
            "Where the state lives; fixed once the checkpoint exists",
        ),
        OptionSpec::new(
            "max_files_per_trigger",
            OptionType::PositiveInt,
            None,
            "Overrides the file or Delta streams' own limit",
        )
        .alterable(),
        OptionSpec::new(
            "max_rows_per_trigger",
            OptionType::PositiveInt,
            None,
            "Overrides the table streams' own limit",
        )
        .alterable(),
        OptionSpec::new(
            "auto_compact",
            OptionType::NonNegativeInt,
            Some("50"),
            "Delta sinks: compact the table's small files once it has this many more files \
             than after the last compaction; 0 turns it off",
        )
        .alterable(),
    ],
};

/// `auto_compact`'s default: Delta's `autoCompact.minNumFiles`.
pub const DEFAULT_AUTO_COMPACT: u64 = 50;
pub use file::SinkFormat;

/// How a batch's rows go into the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteMode {
    /// Add the rows (append mode).
    Append,
    /// Replace the sink's rows with these (complete mode).
    Overwrite,
    /// Upsert by these key columns (update mode).
    Merge { keys: Vec<String> },
}

impl WriteMode {
    /// Spark's name of the output mode this write serves.
    pub fn spark_name(&self) -> &'static str {
        match self {
            WriteMode::Append => "Append",
            WriteMode::Overwrite => "Complete",
            WriteMode::Merge { .. } => "Update",
        }
    }

    /// `append`, `overwrite`, `merge on (k, ...)`: as `EXPLAIN` shows it.
    pub fn describe(&self) -> String {
        match self {
            WriteMode::Append => "append".into(),
            WriteMode::Overwrite => "overwrite".into(),
            WriteMode::Merge { keys } => format!("merge on ({})", keys.join(", ")),
        }
    }
}

/// What [`Sink::add_batch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkCommit {
    /// The batch was committed (as this table version, for Delta; the batch id otherwise).
    Committed { version: i64 },
    /// The sink already holds this batch (a replay after a crash); nothing was written.
    AlreadyCommitted,
}

/// The micro-batch sink contract (Spark's `Sink.addBatch`).
#[async_trait]
pub trait Sink: Send + Sync {
    /// Writes batch `batch` of query `query_id`, unless the sink already holds it. The rows
    /// have the sink's schema. Must be atomic: after a crash the sink holds the batch wholly
    /// or not at all.
    async fn add_batch(
        &self,
        query_id: &str,
        batch: BatchId,
        rows: Vec<RecordBatch>,
        mode: &WriteMode,
    ) -> Result<SinkCommit>;

    /// For progress reports and `EXPLAIN`: `DeltaSink[/path]`.
    fn describe(&self) -> String;
}

/// A sink connector, parsed from the `connector` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkConnector {
    Delta,
    File(SinkFormat),
    Console,
    /// Drops the rows (Spark's `noop` format), for benchmarks.
    Noop,
}

impl SinkConnector {
    /// The connectors a sink may name.
    pub const NAMES: &'static str = "'delta', 'parquet', 'json', 'csv', 'console' or 'noop'";

    pub fn parse(name: &str) -> Result<SinkConnector> {
        match name {
            "delta" => Ok(SinkConnector::Delta),
            "console" => Ok(SinkConnector::Console),
            "noop" => Ok(SinkConnector::Noop),
            other => match SinkFormat::from_connector(other) {
                Some(f) => Ok(SinkConnector::File(f)),
                None => Err(Error::Unsupported {
                    message: format!("sink connector \"{other}\" is not supported yet"),
                    hint: Some(format!("Use connector = {}.", Self::NAMES)),
                }),
            },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SinkConnector::Delta => "delta",
            SinkConnector::Console => "console",
            SinkConnector::Noop => "noop",
            SinkConnector::File(f) => f.name(),
        }
    }

    /// Whether the sink only appends (file sinks: Spark refuses update and complete).
    pub fn append_only(self) -> bool {
        matches!(self, SinkConnector::File(_))
    }

    /// Whether the sink has a folder or table at `path`.
    pub fn has_path(self) -> bool {
        !matches!(self, SinkConnector::Console | SinkConnector::Noop)
    }

    /// Creates (or checks) what the sink writes into: the Delta table with `schema`, the
    /// file sink's folder. Used by `CREATE SINK` before anything runs.
    pub async fn prepare(self, name: &str, path: &Path, schema: &SchemaRef) -> Result<()> {
        match self {
            SinkConnector::Delta => delta::ensure_table(path, name, schema).await,
            SinkConnector::File(f) => file::FileSink::new(path, f, schema.clone()).map(|_| ()),
            SinkConnector::Console | SinkConnector::Noop => Ok(()),
        }
    }

    /// Opens the sink a query writes to; `options` are the sink's, as written.
    pub async fn open(
        self,
        name: &str,
        path: &Path,
        schema: &SchemaRef,
        options: &Options,
    ) -> Result<Box<dyn Sink>> {
        Ok(match self {
            SinkConnector::Delta => {
                let auto_compact = options
                    .non_negative_int("auto_compact")?
                    .unwrap_or(DEFAULT_AUTO_COMPACT);
                let sink = delta::DeltaSink::new(path, schema.clone(), auto_compact)?;
                sink.ensure_table(name, schema).await?;
                Box::new(sink)
            }
            SinkConnector::File(f) => Box::new(file::FileSink::new(path, f, schema.clone())?),
            SinkConnector::Console => Box::new(console::ConsoleSink::new(name)),
            SinkConnector::Noop => Box::new(noop::NoopSink),
        })
    }

    /// `OPTIMIZE`: compacts the sink's table (Delta sinks only), see [`delta::optimize`].
    pub async fn optimize(
        self,
        name: &str,
        path: &Path,
        zorder: &[String],
    ) -> Result<delta::CompactionReport> {
        match self {
            SinkConnector::Delta => delta::optimize(path, zorder).await,
            other => Err(Error::unsupported(format!(
                "OPTIMIZE compacts Delta tables; sink \"{name}\" is a {} sink",
                other.name()
            ))),
        }
    }

    /// The sink's output as a table, if it has one (a console sink has none).
    pub async fn read_table(
        self,
        path: &Path,
        schema: &SchemaRef,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(match self {
            SinkConnector::Delta => Some(Arc::new(delta::DeltaReadTable::try_new(path).await?)),
            SinkConnector::File(f) => Some(Arc::new(file::read_table(path, f, schema.clone()))),
            SinkConnector::Console | SinkConnector::Noop => None,
        })
    }
}
