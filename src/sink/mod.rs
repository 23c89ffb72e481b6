//! Sinks: where a streaming query's rows go.
//!
//! Every sink implements [`Sink`]: `add_batch` writes one micro-batch and is idempotent per
//! batch id (a batch replayed after a crash is skipped when the sink already holds it), and
//! the sink's output can be read back as a table. Connector names are parsed once, into
//! [`SinkConnector`]; nothing else matches them as strings.

pub mod console;
pub mod delta;
pub mod file;
pub mod kafka;
pub mod noop;
pub mod view;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::datasource::TableProvider;

use crate::error::{Error, Result};
use crate::sql::options::{OptionSpec, OptionTable, OptionType, Options};
use crate::types::BatchId;

/// Options every streaming query takes, sink or materialized view.
const TRIGGER: OptionSpec = OptionSpec::new(
    "trigger",
    OptionType::Trigger,
    Some("default"),
    "When micro-batches run: default, processing_time <interval>, available_now, once",
)
.alterable();
const CHECKPOINT_LOCATION: OptionSpec = OptionSpec::new(
    "checkpoint_location",
    OptionType::Path,
    Some("<data dir>/checkpoints/<name>"),
    "The checkpoint directory",
);
const WATERMARK: OptionSpec = OptionSpec::new(
    "watermark",
    OptionType::Watermark,
    None,
    "The event-time watermark, overriding the streams' WATERMARK FOR",
);
const STATE_PARTITIONS: OptionSpec = OptionSpec::new(
    "state_partitions",
    OptionType::PositiveInt,
    Some("4"),
    "Partitions of the state store; fixed once the checkpoint exists",
);
const STATE_STORE: OptionSpec = OptionSpec::new(
    "state_store",
    OptionType::OneOf(&["memory", "rocksdb"]),
    Some("memory"),
    "Where the operators' state lives, and the rows of a view kept by its group key (see \"Views \
     larger than memory\"); fixed once the checkpoint exists",
);
const DEDUPLICATE: OptionSpec = OptionSpec::new(
    "deduplicate",
    OptionType::OneOf(&["first", "within_watermark"]),
    Some("first"),
    "How SELECT DISTINCT [ON] deduplicates: first, a key's first row forever (or until the \
     watermark passes its event time, when that is a key); within_watermark, duplicates \
     within the watermark delay of the first row; fixed once the checkpoint exists",
);
const MULTIPLE_WATERMARK_POLICY: OptionSpec = OptionSpec::new(
    "multiple_watermark_policy",
    OptionType::OneOf(&["min", "max"]),
    Some("min"),
    "How the watermarks of several streams make the query's: min, the slowest stream's; \
     max, the fastest's (Spark's spark.sql.streaming.multipleWatermarkPolicy); fixed once the \
     checkpoint exists",
);
const MAX_FILES_PER_TRIGGER: OptionSpec = OptionSpec::new(
    "max_files_per_trigger",
    OptionType::PositiveInt,
    None,
    "Overrides the file or Delta streams' own limit",
)
.alterable();
const MAX_ROWS_PER_TRIGGER: OptionSpec = OptionSpec::new(
    "max_rows_per_trigger",
    OptionType::PositiveInt,
    None,
    "Overrides the table streams' own limit",
)
.alterable();
const MAX_OFFSETS_PER_TRIGGER: OptionSpec = OptionSpec::new(
    "max_offsets_per_trigger",
    OptionType::PositiveInt,
    None,
    "Overrides the Kafka streams' own limit",
)
.alterable();

const LATE_ROWS: OptionSpec = OptionSpec::new(
    "late_rows",
    OptionType::OneOf(&["drop", "table"]),
    Some("drop"),
    "Rows dropped by the watermark (and rows set aside by max_event_time_skew): drop, \
     counted only; table, also written to the table <name>_late_rows with the batch id, \
     the operator, the reason, the watermark, the event time and the row as JSON",
);
const MALFORMED_ROWS: OptionSpec = OptionSpec::new(
    "malformed_rows",
    OptionType::OneOf(&["drop", "table"]),
    Some("drop"),
    "Input records that did not parse (JSON or CSV file and Kafka streams; kept as NULL \
     rows or dropped as the stream's mode says): drop, counted only; table, also written to \
     the table <name>_malformed_rows with the batch id, the stream, the file (a Kafka \
     record's topic-partition), the line number (its offset), the raw line and the reason",
);
const MAX_EVENT_TIME_SKEW: OptionSpec = OptionSpec::new(
    "max_event_time_skew",
    OptionType::Duration,
    None,
    "Rows whose event time is further ahead of their batch's processing time than this are \
     set aside: they do not move the watermark nor reach the query (counted as \
     numSkewedRows, written to the late-rows table with late_rows = 'table')",
);

/// The options of a sink, whatever its connector.
pub const SINK_OPTIONS: OptionTable = OptionTable {
    object: "sink",
    connector: "delta | parquet | json | csv | console | noop",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&[
                "delta", "parquet", "json", "csv", "console", "noop", "kafka",
            ]),
            Some("delta"),
            "Where the rows go (kafka sinks take the options of their own table)",
        ),
        OptionSpec::new(
            "path",
            OptionType::Path,
            Some("<data dir>/tables/<name>"),
            "The table's directory (a console or noop sink has none)",
        ),
        TRIGGER,
        OptionSpec::new(
            "output_mode",
            OptionType::OneOf(&["append", "update", "complete"]),
            Some("append"),
            "What each batch writes (Spark's output modes)",
        ),
        CHECKPOINT_LOCATION,
        WATERMARK,
        MULTIPLE_WATERMARK_POLICY,
        STATE_PARTITIONS,
        STATE_STORE,
        DEDUPLICATE,
        LATE_ROWS,
        MALFORMED_ROWS,
        MAX_EVENT_TIME_SKEW,
        MAX_FILES_PER_TRIGGER,
        MAX_ROWS_PER_TRIGGER,
        MAX_OFFSETS_PER_TRIGGER,
        OptionSpec::new(
            "engine",
            OptionType::OneOf(&["tidemark", "spark"]),
            Some("tidemark"),
            "Where the query runs: in this process, or on a Spark cluster through Spark \
             Connect (docs/scale-out.md); ALTER moves a stopped local sink to Spark",
        )
        .alterable(),
        OptionSpec::new(
            "from",
            OptionType::OneOf(&["checkpoint", "beginning"]),
            Some("checkpoint"),
            "ALTER ... SET (engine = 'spark') only: where the query starts on Spark, where \
             the local checkpoint stopped, or over every input again (the sink's output is \
             rebuilt)",
        )
        .alterable(),
        OptionSpec::new(
            "spark_remote",
            OptionType::Text,
            Some("the server's --spark-remote"),
            "engine = 'spark': the Spark Connect endpoint, sc://host:port",
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

/// The options of a materialized view.
pub const VIEW_OPTIONS: OptionTable = OptionTable {
    object: "materialized view",
    connector: "",
    options: &[
        TRIGGER,
        OptionSpec::new(
            "output_mode",
            OptionType::OneOf(&["append", "update", "complete"]),
            Some("update"),
            "What the view holds: update, every group's latest row; append, the rows the \
             watermark has made final; complete, the whole result of the last batch",
        ),
        CHECKPOINT_LOCATION,
        WATERMARK,
        MULTIPLE_WATERMARK_POLICY,
        STATE_PARTITIONS,
        STATE_STORE,
        DEDUPLICATE,
        LATE_ROWS,
        MALFORMED_ROWS,
        MAX_EVENT_TIME_SKEW,
        MAX_FILES_PER_TRIGGER,
        MAX_ROWS_PER_TRIGGER,
        MAX_OFFSETS_PER_TRIGGER,
        OptionSpec::new(
            "retention",
            OptionType::Duration,
            None,
            "Removes a row once its window ended (or, without aggregation, its event time \
             passed) this long before the watermark; fixed once the view exists",
        ),
    ],
};

/// The options of a table (`CREATE TABLE`).
pub const TABLE_OPTIONS: OptionTable = OptionTable {
    object: "table",
    connector: "delta",
    options: &[
        OptionSpec::new(
            "connector",
            OptionType::OneOf(&["delta"]),
            Some("delta"),
            "What the table is: a Delta table",
        ),
        OptionSpec::new(
            "path",
            OptionType::Path,
            Some("<data dir>/tables/<name>"),
            "The Delta table's directory; an existing table there is registered",
        ),
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

/// Where a row of a query's output says when it is final (used by a view's `retention`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowTime {
    /// A window's end: the `field` of the struct column `column` (the `window` itself), or
    /// the column (`window.end`), plus `plus_us` (a window's size, when only `window.start`
    /// is selected). A row is final once the watermark reaches it.
    WindowEnd {
        column: String,
        field: Option<String>,
        plus_us: i64,
    },
    /// The watermarked column itself: a row is final once the watermark passes it.
    EventTime { column: String },
}

impl RowTime {
    pub fn column(&self) -> &str {
        match self {
            RowTime::WindowEnd { column, .. } | RowTime::EventTime { column } => column,
        }
    }
}

/// What a query writes, as a sink opens for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryOutput {
    pub schema: SchemaRef,
    pub mode: WriteMode,
    /// The columns that identify a row (the group key, when every key is selected), if the
    /// query aggregates.
    pub keys: Option<Vec<String>>,
    /// The column that tells when a row is final, if there is one.
    pub time: Option<RowTime>,
}

impl QueryOutput {
    /// Rows with no key and no time, added as they come.
    pub fn append(schema: SchemaRef) -> QueryOutput {
        QueryOutput {
            schema,
            mode: WriteMode::Append,
            keys: None,
            time: None,
        }
    }
}

/// The micro-batch [`Sink::add_batch`] writes.
#[derive(Debug, Clone, Copy)]
pub struct BatchInfo<'a> {
    pub query_id: &'a str,
    pub id: BatchId,
    /// The watermark the batch ran with (ms).
    pub watermark_ms: i64,
    pub mode: &'a WriteMode,
}

impl<'a> BatchInfo<'a> {
    /// Batch `id` of `query_id`, at watermark 0.
    pub fn new(query_id: &'a str, id: BatchId, mode: &'a WriteMode) -> BatchInfo<'a> {
        BatchInfo {
            query_id,
            id,
            watermark_ms: 0,
            mode,
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
    /// Writes batch `batch.id` of query `batch.query_id`, unless the sink already holds it.
    /// The rows have the sink's schema. Must be atomic: after a crash the sink holds the batch wholly
    /// or not at all.
    async fn add_batch(&self, batch: &BatchInfo<'_>, rows: Vec<RecordBatch>) -> Result<SinkCommit>;

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
    /// A materialized view's store ([`view`]); never named by a `connector` option.
    View,
    /// A MERGE sink ([`delta::merge::MergeSink`]): `CREATE SINK ... AS MERGE INTO`.
    DeltaMerge,
    /// A Kafka topic ([`kafka::KafkaSink`]).
    Kafka,
}

impl SinkConnector {
    /// The connectors a sink may name.
    pub const NAMES: &'static str =
        "'delta', 'kafka', 'parquet', 'json', 'csv', 'console' or 'noop'";

    pub fn parse(name: &str) -> Result<SinkConnector> {
        match name {
            "delta" => Ok(SinkConnector::Delta),
            "console" => Ok(SinkConnector::Console),
            "noop" => Ok(SinkConnector::Noop),
            "kafka" => Ok(SinkConnector::Kafka),
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
            SinkConnector::View => "view",
            SinkConnector::DeltaMerge => "delta",
            SinkConnector::Kafka => "kafka",
            SinkConnector::File(f) => f.name(),
        }
    }

    /// Whether the sink only appends (file sinks: Spark refuses update and complete).
    pub fn append_only(self) -> bool {
        matches!(self, SinkConnector::File(_))
    }

    /// Whether the sink has a folder or table at `path`.
    pub fn has_path(self) -> bool {
        !matches!(
            self,
            SinkConnector::Console | SinkConnector::Noop | SinkConnector::Kafka
        )
    }

    /// The options a sink of this connector takes.
    pub fn option_table(self) -> &'static OptionTable {
        match self {
            SinkConnector::Kafka => &kafka::OPTIONS,
            SinkConnector::View => &VIEW_OPTIONS,
            _ => &SINK_OPTIONS,
        }
    }

    /// Creates (or checks) what the sink writes into: the Delta table with `schema`, the
    /// file sink's folder. Used by `CREATE SINK` before anything runs.
    pub async fn prepare(self, name: &str, path: &Path, schema: &SchemaRef) -> Result<()> {
        match self {
            SinkConnector::Delta => delta::ensure_table(path, name, schema).await,
            SinkConnector::File(f) => file::FileSink::new(path, f, schema.clone()).map(|_| ()),
            SinkConnector::View => crate::fsutil::create_dir_all(path),
            // The target exists (a table) or is made from the source's columns.
            SinkConnector::DeltaMerge => {
                if delta::merge::existing_schema(path).await?.is_none() {
                    delta::ensure_table(path, name, schema).await?;
                }
                Ok(())
            }
            SinkConnector::Console | SinkConnector::Noop | SinkConnector::Kafka => Ok(()),
        }
    }

    /// Opens the sink a query writes to; `options` are the sink's, as written, `output`
    /// what the query writes.
    pub async fn open(
        self,
        name: &str,
        path: &Path,
        output: &QueryOutput,
        options: &Options,
        merge: Option<&crate::sql::merge::MergeSpec>,
    ) -> Result<Box<dyn Sink>> {
        let schema = &output.schema;
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
            SinkConnector::Kafka => Box::new(kafka::KafkaSink::new(kafka::KafkaSinkConfig::new(
                options, output,
            )?)),
            SinkConnector::View => {
                Box::new(view::ViewSink::new(view::open(path, output, options)?))
            }
            SinkConnector::DeltaMerge => {
                let spec = merge.ok_or_else(|| {
                    Error::Internal(format!("MERGE sink \"{name}\" has no MERGE"))
                })?;
                Box::new(delta::merge::MergeSink::new(
                    path,
                    spec.clone(),
                    schema.clone(),
                ))
            }
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
            SinkConnector::Delta | SinkConnector::DeltaMerge => delta::optimize(path, zorder).await,
            other => Err(Error::unsupported(format!(
                "OPTIMIZE compacts Delta tables; sink \"{name}\" is a {} sink",
                other.name()
            ))),
        }
    }

    /// The sink's output as a table, if it has one (a console sink has none; a view's
    /// table is a [`view::ViewTable`], made with its definition).
    pub async fn read_table(
        self,
        path: &Path,
        schema: &SchemaRef,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        Ok(match self {
            SinkConnector::View => None,
            SinkConnector::Delta | SinkConnector::DeltaMerge => {
                Some(Arc::new(delta::DeltaReadTable::try_new(path).await?))
            }
            SinkConnector::File(f) => Some(Arc::new(file::read_table(path, f, schema.clone()))),
            SinkConnector::Console | SinkConnector::Noop | SinkConnector::Kafka => None,
        })
    }
}
