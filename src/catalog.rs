//! The durable catalog: streams and sinks, as the user declared them.
//!
//! Stored as one JSON file, `<data dir>/catalog.json`, rewritten atomically (temp file,
//! fsync, rename, fsync of the directory) on every change. Only what the user wrote is
//! stored; everything derived (Arrow schemas, resolved source options) is rebuilt on load
//! by the same validation that `CREATE` runs, so the two can never disagree.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::format::{CORRUPT_RECORD, FileDecoder, FileFormat, ParseMode};
use crate::fsutil::write_atomic;
use crate::source::delta::{DEFAULT_MAX_FILES, DeltaSourceConfig};
use crate::source::file::FileSourceConfig;
use crate::source::nexmark::{NexmarkSourceConfig, NexmarkTable};
use crate::source::rate::{RateConfig, RateMicroBatchConfig};
use crate::source::table::{DEFAULT_SEGMENT_BYTES, TableConfig};
use crate::sql::options::{Options, Trigger};
use crate::sql::parser::{ColumnSpec, QueryKind, WatermarkSpec};
use crate::sql::types::sql_to_arrow;

/// The version of the catalog file's encoding.
const CATALOG_VERSION: u32 = 1;

/// A stream: a schema over data that keeps arriving.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamDef {
    pub name: String,
    pub columns: Vec<ColumnSpec>,
    pub watermark: Option<WatermarkSpec>,
    pub options: Options,
    /// Derived from the above on creation and on load.
    #[serde(skip)]
    pub source: Option<StreamSource>,
    /// Why the stream could not be loaded, when it could not: it is kept as declared
    /// (and in `catalog.json`), listed with this error, and mended by `DROP STREAM`.
    #[serde(skip)]
    pub broken: Option<Broken>,
}

/// Why a catalog object could not be loaded: the error, with its SQLSTATE, as `CREATE`
/// would have sent it. A broken object stays in the catalog and answers with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Broken {
    pub state: crate::error::SqlState,
    pub message: String,
}

impl Broken {
    pub fn of(e: &Error) -> Broken {
        Broken {
            state: e.sqlstate(),
            message: e.to_string(),
        }
    }

    /// The error a statement that uses the object gets.
    pub fn error(&self, kind: &'static str, name: &str) -> Error {
        Error::Broken {
            kind,
            name: name.to_string(),
            state: self.state,
            message: self.message.clone(),
        }
    }
}

/// Where a stream's rows come from, as its options configure it.
#[derive(Debug, Clone)]
pub enum StreamSource {
    /// `connector = 'file'`: a landing directory.
    File(Arc<FileSourceConfig>),
    /// `connector = 'table'`: rows sent with INSERT and COPY, kept in the stream's log.
    Table(TableConfig),
    /// `connector = 'rate'`: rows per second of wall time (spec §13.1).
    Rate(RateConfig),
    /// `connector = 'rate_micro_batch'`: a fixed number of rows per batch (spec §13.2).
    RateMicroBatch(RateMicroBatchConfig),
    /// `connector = 'delta'`: the files new versions of a Delta table add.
    Delta(DeltaSourceConfig),
    /// `connector = 'nexmark'`: the Nexmark benchmark's generated events.
    Nexmark(NexmarkSourceConfig),
    /// `connector = 'kafka'`: a Kafka topic's records.
    Kafka(Arc<crate::source::kafka::KafkaSourceConfig>),
}

impl StreamSource {
    pub fn connector(&self) -> &'static str {
        match self {
            StreamSource::File(_) => "file",
            StreamSource::Table(_) => "table",
            StreamSource::Rate(_) => "rate",
            StreamSource::RateMicroBatch(_) => "rate_micro_batch",
            StreamSource::Delta(_) => "delta",
            StreamSource::Nexmark(_) => "nexmark",
            StreamSource::Kafka(_) => "kafka",
        }
    }

    pub fn schema(&self) -> SchemaRef {
        match self {
            StreamSource::File(f) => f.schema(),
            StreamSource::Table(t) => t.schema.clone(),
            StreamSource::Rate(_) | StreamSource::RateMicroBatch(_) => {
                crate::source::rate::schema()
            }
            StreamSource::Delta(d) => d.schema.clone(),
            StreamSource::Nexmark(n) => n.table.schema(),
            StreamSource::Kafka(k) => k.schema.clone(),
        }
    }
}

/// Options of a table stream.
/// The options reference of `docs/sql.md`, rendered from the option tables (a test keeps
/// the page equal to it).
pub fn options_markdown() -> String {
    render_options(&option_tables())
}

/// The option tables of the Kafka connectors, as docs/kafka.md lists them.
pub fn kafka_options_markdown() -> String {
    render_options(&[&crate::source::kafka::OPTIONS, &crate::sink::kafka::OPTIONS])
}

fn render_options(tables: &[&crate::sql::options::OptionTable]) -> String {
    let mut out = String::new();
    for t in tables {
        let title = if t.object == "sink" && t.connector == "kafka" {
            "`kafka` sinks".to_string()
        } else if t.object == "sink" {
            "Sinks (delta, parquet, json, csv, console, noop)".to_string()
        } else if t.object == "table" {
            "Tables".to_string()
        } else if t.connector.is_empty() {
            "Materialized views".to_string()
        } else {
            format!("`{}` streams", t.connector)
        };
        out.push_str(&format!(
            "\n#### {title}\n\n| option | type | default | |\n| --- | --- | --- | --- |\n"
        ));
        for o in t.options {
            let default = match (o.required, o.default) {
                (true, _) => "required".to_string(),
                (false, Some(d)) => format!("`{d}`"),
                (false, None) => "—".to_string(),
            };
            let alter = if o.alterable && t.connector.is_empty() {
                " `ALTER MATERIALIZED VIEW` can change it."
            } else if o.alterable {
                " `ALTER SINK` can change it."
            } else {
                ""
            };
            out.push_str(&format!(
                "| `{}` | {} | {default} | {}.{alter} |\n",
                o.name,
                o.ty.describe().replace('|', "\\|"),
                o.doc
            ));
        }
    }
    out
}

/// The options a sink or a materialized view takes.
pub fn option_table(kind: QueryKind) -> &'static crate::sql::options::OptionTable {
    match kind {
        QueryKind::Sink => &crate::sink::SINK_OPTIONS,
        QueryKind::MaterializedView => &crate::sink::VIEW_OPTIONS,
    }
}

/// Every connector's option table, streams then sinks: `SHOW OPTIONS`, `tidemark.options`
/// and the docs list these.
pub fn option_tables() -> [&'static crate::sql::options::OptionTable; 11] {
    [
        &crate::source::file::OPTIONS,
        &crate::source::table::OPTIONS,
        &crate::source::delta::OPTIONS,
        &crate::source::rate::RATE_OPTIONS,
        &crate::source::rate::RATE_MICRO_BATCH_OPTIONS,
        &crate::source::nexmark::OPTIONS,
        &crate::source::kafka::OPTIONS,
        &crate::sink::SINK_OPTIONS,
        &crate::sink::kafka::OPTIONS,
        &crate::sink::VIEW_OPTIONS,
        &crate::sink::TABLE_OPTIONS,
    ]
}

impl StreamDef {
    /// Validates a declaration and derives its source configuration.
    pub fn try_new(
        name: String,
        mut columns: Vec<ColumnSpec>,
        watermark: Option<WatermarkSpec>,
        options: Options,
        check_path: bool,
    ) -> Result<StreamDef> {
        for c in &mut columns {
            c.data_type = sql_to_arrow(&c.sql_type)?;
        }
        // Without a connector: a landing directory if a path is given, else rows sent over
        // the wire.
        let default = if options.get("path").is_some() || options.get("format").is_some() {
            "file"
        } else {
            "table"
        };
        let connector = options.get("connector").unwrap_or(default).to_string();
        match connector.as_str() {
            "file" => {}
            "table" => return Self::table(name, columns, watermark, options),
            c @ ("rate" | "rate_micro_batch") => {
                return Self::rate(c, name, columns, watermark, options);
            }
            "delta" => return Self::delta(name, columns, watermark, options),
            "nexmark" => return Self::nexmark(name, columns, watermark, options),
            "kafka" => return Self::kafka(name, columns, watermark, options),
            other => {
                return Err(Error::Unsupported {
                    message: format!("connector \"{other}\" is not supported for streams"),
                    hint: Some(
                        "Use connector = 'file', 'table', 'delta', 'kafka', 'rate', \
                         'rate_micro_batch' or 'nexmark'."
                            .into(),
                    ),
                });
            }
        }
        if let Some(c) = columns.iter().find(|c| c.not_null) {
            return Err(Error::unsupported(format!(
                "NOT NULL is not supported in file streams (column \"{}\"): Spark reads every \
                 file field as nullable",
                c.name
            )));
        }
        options.check(&crate::source::file::OPTIONS)?;
        let format = match options.get("format") {
            None => {
                return Err(Error::InvalidOption {
                    message: "missing required option \"format\" for a file stream".into(),
                    hint: Some("Add format = 'json', 'csv', 'parquet' or 'text'.".into()),
                });
            }
            Some(f) => FileFormat::parse(f, &options)?,
        };
        if !matches!(format, FileFormat::Csv { .. })
            && (options.get("header").is_some() || options.get("delimiter").is_some())
        {
            return Err(Error::invalid_option(
                "options \"header\" and \"delimiter\" apply only to format 'csv'",
            ));
        }
        let path = required_path(&options, "a file stream", "/directory/where/files/land")?;
        if check_path && !path.is_dir() {
            return Err(Error::InvalidOption {
                message: format!("path \"{}\" is not a directory", path.display()),
                hint: Some("Create the landing directory before the stream.".into()),
            });
        }
        let max_files_per_trigger = options.positive_int("max_files_per_trigger")?;
        let read_ahead = options.bool("read_ahead")?.unwrap_or(true);
        let mode = match options.get("mode") {
            Some(m) if matches!(format, FileFormat::Json | FileFormat::Csv { .. }) => {
                ParseMode::parse(m)?
            }
            Some(_) => {
                return Err(Error::invalid_option(
                    "option \"mode\" applies only to formats 'json' and 'csv'",
                ));
            }
            None => ParseMode::default(),
        };

        if matches!(format, FileFormat::Text) {
            if columns.is_empty() {
                columns.push(ColumnSpec {
                    name: "value".into(),
                    sql_type: "TEXT".into(),
                    data_type: DataType::Utf8,
                    not_null: false,
                });
            } else if columns.len() != 1 || columns[0].data_type != DataType::Utf8 {
                return Err(Error::invalid_option(
                    "a 'text' stream has exactly one TEXT column (one row per line)",
                ));
            }
        }
        check_columns(&name, &columns, watermark.as_ref())?;
        // Spark makes every file-source field nullable (spec §10.1).
        let schema = schema_of(&columns, |_| true);
        if let Some(c) = columns.iter().find(|c| c.name == CORRUPT_RECORD)
            && c.data_type != DataType::Utf8
        {
            return Err(Error::invalid_option(format!(
                "column \"{CORRUPT_RECORD}\" receives malformed records and must be TEXT"
            )));
        }
        let source = FileSourceConfig {
            path,
            decoder: FileDecoder {
                format,
                mode,
                schema,
            },
            max_files_per_trigger,
            read_ahead,
        };
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(StreamSource::File(Arc::new(source))),
            broken: None,
        })
    }

    /// A stream fed over the wire (`connector = 'table'`).
    fn table(
        name: String,
        columns: Vec<ColumnSpec>,
        watermark: Option<WatermarkSpec>,
        options: Options,
    ) -> Result<StreamDef> {
        options.check(&crate::source::table::OPTIONS)?;
        check_columns(&name, &columns, watermark.as_ref())?;
        let schema = schema_of(&columns, |c| !c.not_null);
        let retention = options
            .get("retention")
            .map(crate::sql::options::parse_duration)
            .transpose()?;
        let segment_bytes = options
            .positive_int("segment_bytes")?
            .unwrap_or(DEFAULT_SEGMENT_BYTES);
        let config = TableConfig {
            schema,
            max_rows_per_trigger: options.positive_int("max_rows_per_trigger")?,
            retention,
            segment_bytes,
        };
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(StreamSource::Table(config)),
            broken: None,
        })
    }

    /// A rate source: fixed columns `timestamp`, `value` (spec §13).
    fn rate(
        connector: &str,
        name: String,
        columns: Vec<ColumnSpec>,
        watermark: Option<WatermarkSpec>,
        options: Options,
    ) -> Result<StreamDef> {
        let fixed = vec![
            ColumnSpec {
                name: "timestamp".into(),
                sql_type: "TIMESTAMP".into(),
                data_type: sql_to_arrow("TIMESTAMP")?,
                not_null: false,
            },
            ColumnSpec {
                name: "value".into(),
                sql_type: "BIGINT".into(),
                data_type: DataType::Int64,
                not_null: false,
            },
        ];
        // The catalog stores the fixed columns it derived: a reload passes them back.
        if !columns.is_empty() && !same_columns(&columns, &fixed) {
            return Err(Error::InvalidOption {
                message: format!("a {connector} stream has the fixed columns timestamp and value"),
                hint: Some(format!(
                    "Leave the column list out: CREATE STREAM {name} WITH (connector = '{connector}', ...)."
                )),
            });
        }
        let columns = fixed;
        if let Some(wm) = &watermark {
            check_watermark(&columns, wm)?;
        }
        let partitions = options
            .positive_int("num_partitions")?
            .map_or(crate::config::parallelism() as i64, |n| n as i64);
        let source =
            if connector == "rate" {
                options.check(&crate::source::rate::RATE_OPTIONS)?;
                let ramp_up = options
                    .get("ramp_up_time")
                    .map(crate::sql::options::parse_duration)
                    .transpose()?
                    .map_or(0, |d| d.as_secs() as i64);
                StreamSource::Rate(RateConfig {
                    rows_per_second: options.positive_int("rows_per_second")?.unwrap_or(1) as i64,
                    ramp_up_secs: ramp_up,
                    num_partitions: partitions,
                })
            } else {
                options.check(&crate::source::rate::RATE_MICRO_BATCH_OPTIONS)?;
                let rows = options.positive_int("rows_per_batch")?.ok_or_else(|| {
                    Error::InvalidOption {
                    message:
                        "missing required option \"rows_per_batch\" for a rate_micro_batch stream"
                            .into(),
                    hint: Some("Add rows_per_batch = N.".into()),
                }
                })?;
                StreamSource::RateMicroBatch(RateMicroBatchConfig {
                    rows_per_batch: rows as i64,
                    num_partitions: partitions,
                    start_timestamp_ms: options.non_negative_int("start_timestamp")?.unwrap_or(0)
                        as i64,
                    advance_ms_per_batch: options
                        .non_negative_int("advance_millis_per_batch")?
                        .unwrap_or(1000) as i64,
                })
            };
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(source),
            broken: None,
        })
    }

    /// A Nexmark stream: the fixed columns of its table.
    fn nexmark(
        name: String,
        columns: Vec<ColumnSpec>,
        watermark: Option<WatermarkSpec>,
        options: Options,
    ) -> Result<StreamDef> {
        options.check(&crate::source::nexmark::OPTIONS)?;
        let table = NexmarkTable::parse(options.get("table").unwrap_or("bid"))?;
        let fixed = table
            .columns()
            .iter()
            .map(|(c, ty)| {
                Ok(ColumnSpec {
                    name: (*c).into(),
                    sql_type: (*ty).into(),
                    data_type: sql_to_arrow(ty)?,
                    not_null: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // The catalog stores the fixed columns it derived: a reload passes them back.
        if !columns.is_empty() && !same_columns(&columns, &fixed) {
            return Err(Error::InvalidOption {
                message: format!(
                    "a nexmark stream has the fixed columns of its table ({})",
                    table.name()
                ),
                hint: Some(format!(
                    "Leave the column list out: CREATE STREAM {name} WITH (connector = 'nexmark', ...)."
                )),
            });
        }
        let columns = fixed;
        if let Some(wm) = &watermark {
            check_watermark(&columns, wm)?;
        }
        let config = NexmarkSourceConfig {
            table,
            events_per_batch: options
                .positive_int("events_per_batch")?
                .unwrap_or(1_000_000),
            max_events: options.positive_int("max_events")?,
            event_rate: options.positive_int("event_rate")?.unwrap_or(100_000),
            base_time_ms: options
                .non_negative_int("base_time")?
                .unwrap_or(1_436_918_400_000),
        };
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(StreamSource::Nexmark(config)),
            broken: None,
        })
    }

    /// A Kafka stream: Spark's Kafka columns, or the declared ones (the value decoded into
    /// them) followed by the Kafka columns.
    fn kafka(
        name: String,
        columns: Vec<ColumnSpec>,
        watermark: Option<WatermarkSpec>,
        options: Options,
    ) -> Result<StreamDef> {
        let (columns, config) =
            crate::source::kafka::KafkaSourceConfig::declare(columns, &options)?;
        check_columns(&name, &columns, watermark.as_ref())?;
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(StreamSource::Kafka(Arc::new(config))),
            broken: None,
        })
    }

    /// A Delta stream. `columns` are the table's (the engine reads them from the table
    /// when the stream is created; the catalog keeps them).
    fn delta(
        name: String,
        columns: Vec<ColumnSpec>,
        watermark: Option<WatermarkSpec>,
        options: Options,
    ) -> Result<StreamDef> {
        options.check(&crate::source::delta::OPTIONS)?;
        let path = delta_path(&options)?;
        check_columns(&name, &columns, watermark.as_ref())?;
        let schema = schema_of(&columns, |_| true);
        let config = DeltaSourceConfig {
            path,
            schema,
            starting_version: options.non_negative_int("starting_version")?,
            max_files_per_trigger: options
                .positive_int("max_files_per_trigger")?
                .unwrap_or(DEFAULT_MAX_FILES),
            ignore_deletes: options.bool("ignore_deletes")?.unwrap_or(false),
        };
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(StreamSource::Delta(config)),
            broken: None,
        })
    }

    /// Where this stream's rows come from; a broken stream's error.
    pub fn source(&self) -> Result<&StreamSource> {
        match (&self.source, &self.broken) {
            (Some(s), _) => Ok(s),
            (None, Some(b)) => Err(b.error("stream", &self.name)),
            (None, None) => Err(Error::Internal(format!(
                "stream \"{}\" has no source",
                self.name
            ))),
        }
    }

    /// The connector named in the options (or the one a stream without one gets).
    pub fn connector(&self) -> &str {
        match &self.source {
            Some(s) => s.connector(),
            None => self.options.get("connector").unwrap_or("table"),
        }
    }

    /// The stream's columns: the source's, or for a broken stream the declared ones that
    /// have a type.
    pub fn schema(&self) -> SchemaRef {
        match &self.source {
            Some(s) => s.schema(),
            None => Arc::new(Schema::new(
                self.columns
                    .iter()
                    .filter_map(|c| {
                        sql_to_arrow(&c.sql_type)
                            .ok()
                            .map(|t| Field::new(&c.name, t, true))
                    })
                    .collect::<Vec<_>>(),
            )),
        }
    }
}

/// The Arrow schema of declared columns, each field's nullability given by `nullable`.
/// Whether two column lists name the same columns with the same types.
fn same_columns(a: &[ColumnSpec], b: &[ColumnSpec]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.not_null == y.not_null
                && sql_to_arrow(&x.sql_type).ok() == sql_to_arrow(&y.sql_type).ok()
        })
}

fn schema_of(columns: &[ColumnSpec], nullable: impl Fn(&ColumnSpec) -> bool) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.clone(), nullable(c)))
            .collect::<Vec<_>>(),
    ))
}

/// The `path` of a Delta stream: required, absolute.
pub fn delta_path(options: &Options) -> Result<PathBuf> {
    required_path(options, "a delta stream", "/the/delta/table")
}

/// A required, absolute `path` option of `what`.
fn required_path(options: &Options, what: &str, example: &str) -> Result<PathBuf> {
    let path = options.get("path").ok_or_else(|| Error::InvalidOption {
        message: format!("missing required option \"path\" for {what}"),
        hint: Some(format!("Add path = '{example}'.")),
    })?;
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(Error::invalid_option(format!(
            "path \"{}\" must be absolute",
            path.display()
        )));
    }
    Ok(path)
}

/// A declared schema: not empty, distinct names, a watermark on one of its timestamps.
fn check_columns(name: &str, columns: &[ColumnSpec], wm: Option<&WatermarkSpec>) -> Result<()> {
    if columns.is_empty() {
        return Err(Error::InvalidOption {
            message: format!("stream \"{name}\" needs an explicit schema"),
            hint: Some("List the columns: CREATE STREAM s (col type, ...) [WITH (...)].".into()),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for c in columns {
        if !seen.insert(c.name.clone()) {
            return Err(Error::DuplicateObject {
                kind: "column",
                name: c.name.clone(),
            });
        }
    }
    match wm {
        Some(wm) => check_watermark(columns, wm),
        None => Ok(()),
    }
}

/// Checks that a watermark names a `TIMESTAMP` column of `columns`.
pub fn check_watermark(columns: &[ColumnSpec], wm: &WatermarkSpec) -> Result<()> {
    let col = columns
        .iter()
        .find(|c| c.name == wm.column)
        .ok_or_else(|| Error::UndefinedObject {
            kind: "column",
            name: wm.column.clone(),
        })?;
    if !matches!(col.data_type, DataType::Timestamp(..)) {
        return Err(Error::invalid_option(format!(
            "watermark column \"{}\" must be a TIMESTAMP, not {}",
            wm.column, col.sql_type
        )));
    }
    Ok(())
}

/// What the user last asked of a sink, kept across restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkState {
    /// Runs, and resumes after a restart.
    Running,
    /// Stopped by `STOP SINK`; stays stopped until `START SINK`.
    Stopped,
    /// An `available_now` or `once` run that completed; stays so until `START SINK`.
    Finished,
    /// Failed; the error is kept. `START SINK` retries from the checkpoint.
    Failed,
}

impl SinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            SinkState::Running => "running",
            SinkState::Stopped => "stopped",
            SinkState::Finished => "finished",
            SinkState::Failed => "failed",
        }
    }
}

/// A sink: a query run incrementally into a Delta table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkDef {
    /// A sink or a materialized view (catalogs written before views hold sinks only).
    #[serde(default, skip_serializing_if = "QueryKind::is_sink")]
    pub kind: QueryKind,
    pub name: String,
    /// The `AS` query, as DataFusion SQL.
    pub query: String,
    /// The options as written.
    pub options: Options,
    /// The streams the query reads, in the order its plan numbers its sources. Catalogs
    /// written before several streams per sink have one `stream`.
    #[serde(alias = "stream", deserialize_with = "one_or_many")]
    pub streams: Vec<String>,
    /// Where the Delta table lives.
    pub path: PathBuf,
    /// The checkpoint directory.
    pub checkpoint: PathBuf,
    pub trigger: Trigger,
    pub output_mode: String,
    pub state: SinkState,
    /// The last failure, if the sink failed.
    #[serde(default)]
    pub error: Option<String>,
    /// Whether `checkpoint` is the default location, owned by Tidemark (dropped with the sink).
    #[serde(default)]
    pub owns_checkpoint: bool,
    /// Partitions of the state store; fixed once the checkpoint exists.
    #[serde(default = "default_state_partitions")]
    pub state_partitions: usize,
    /// Where the state lives; fixed once the checkpoint exists.
    #[serde(default)]
    pub state_store: crate::state::StoreKind,
    /// A MERGE sink's MERGE: `query` is its `USING` query, run over each micro-batch as
    /// a static table, and `path` the target table's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<crate::sql::merge::MergeSpec>,
    /// The tables (`CREATE TABLE`) the query joins with, read as of each batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<String>,
}

impl SinkDef {
    /// The sink's connector (`delta` by default); a view's store.
    pub fn connector(&self) -> Result<crate::sink::SinkConnector> {
        match self.kind {
            QueryKind::MaterializedView => Ok(crate::sink::SinkConnector::View),
            QueryKind::Sink if self.merge.is_some() => Ok(crate::sink::SinkConnector::DeltaMerge),
            QueryKind::Sink => {
                crate::sink::SinkConnector::parse(self.options.get("connector").unwrap_or("delta"))
            }
        }
    }

    /// Whether the query runs on Spark (`engine = 'spark'`) rather than in this process.
    pub fn runs_on_spark(&self) -> bool {
        self.options
            .get("engine")
            .is_some_and(|e| e.eq_ignore_ascii_case("spark"))
    }

    /// The options this kind of query takes.
    pub fn option_table(&self) -> &'static crate::sql::options::OptionTable {
        option_table(self.kind)
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// `state_partitions` when the sink does not say.
pub const DEFAULT_STATE_PARTITIONS: usize = 4;

fn default_state_partitions() -> usize {
    DEFAULT_STATE_PARTITIONS
}

/// Everything the catalog file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Catalog {
    pub version: u32,
    pub streams: Vec<StreamDef>,
    pub sinks: Vec<SinkDef>,
    /// Tables made with `CREATE TABLE` (catalogs written before tables have none).
    #[serde(default)]
    pub tables: Vec<TableDef>,
    /// Roles made with `CREATE ROLE`, their passwords hashed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<crate::auth::RoleDef>,
    /// Plain views (`CREATE VIEW`), in the order they were made, each as its statement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub views: Vec<ViewDef>,
}

/// A plain view: its name and the `CREATE [OR REPLACE] VIEW` statement that made it, which
/// DataFusion plans again when the server starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewDef {
    pub name: String,
    pub sql: String,
}

/// A table made with `CREATE TABLE`: a Delta table, read and changed by ordinary
/// statements, the target of MERGE sinks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableDef {
    pub name: String,
    /// The Delta table's directory.
    pub path: PathBuf,
    /// The `PRIMARY KEY` columns (informational, as in Delta: NOT NULL, not unique).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub primary_key: Vec<String>,
    /// The options as written.
    pub options: Options,
    /// Whether `path` is the default location, in the data directory: only then does
    /// `DROP TABLE ... PURGE` delete it.
    #[serde(default)]
    pub owns_path: bool,
}

/// What kind of relation a catalog object is to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelationKind {
    Stream,
    Sink,
    Table,
    MaterializedView,
}

/// A relation as clients' catalog queries describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    pub name: String,
    pub kind: RelationKind,
    /// Whether `INSERT` and `COPY FROM STDIN` take rows: a table stream or a table.
    pub insertable: bool,
    /// The `PRIMARY KEY` columns, in order (tables only).
    pub primary_key: Vec<String>,
    /// What it is, in a line: `pg_description`'s comment.
    pub description: String,
    /// A materialized view's query.
    pub definition: Option<String>,
    /// The connector (a stream's or a sink's), `delta` for a table, `view` for a view.
    pub connector: String,
    /// Why it could not be loaded, if it could not (`tidemark.relations` shows it).
    pub broken: Option<Broken>,
}

impl Catalog {
    fn file(data_dir: &Path) -> PathBuf {
        data_dir.join("catalog.json")
    }

    /// Loads the catalog of a data directory, or an empty one.
    pub fn load(data_dir: &Path) -> Result<Catalog> {
        let file = Catalog::file(data_dir);
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Catalog {
                    version: CATALOG_VERSION,
                    ..Default::default()
                });
            }
            Err(e) => return Err(Error::io(format!("reading {}", file.display()), e)),
        };
        let mut cat: Catalog = serde_json::from_str(&text)
            .map_err(|e| Error::Internal(format!("corrupt catalog {}: {e}", file.display())))?;
        if cat.version != CATALOG_VERSION {
            return Err(Error::Internal(format!(
                "catalog {} has version {}, this build reads version {CATALOG_VERSION}",
                file.display(),
                cat.version
            )));
        }
        // A stream that no longer validates (a landing directory removed while the server
        // was down, a catalog written by another build) must not stop startup: it is kept
        // as declared, marked broken, and its sinks fail with its error.
        let mut streams = Vec::with_capacity(cat.streams.len());
        for s in cat.streams {
            let kept = s.clone();
            match StreamDef::try_new(s.name, s.columns, s.watermark, s.options, false) {
                Ok(def) => streams.push(def),
                Err(e) => {
                    tracing::error!(stream = %kept.name, error = %e, "stream could not be loaded; it is kept, marked broken");
                    streams.push(StreamDef {
                        broken: Some(Broken::of(&e)),
                        source: None,
                        ..kept
                    });
                }
            }
        }
        cat.streams = streams;
        Ok(cat)
    }

    /// Writes the catalog durably.
    pub fn save(&self, data_dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Internal(format!("encoding catalog: {e}")))?;
        let file = Catalog::file(data_dir);
        write_atomic(&file, text.as_bytes())?;
        // It holds connection secrets (a Kafka stream's sasl_password): the server's user only.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::io(format!("cannot restrict {}", file.display()), e))?;
        }
        Ok(())
    }

    pub fn stream(&self, name: &str) -> Option<&StreamDef> {
        self.streams.iter().find(|s| s.name == name)
    }

    pub fn sink(&self, name: &str) -> Option<&SinkDef> {
        self.sinks.iter().find(|s| s.name == name)
    }

    pub fn sink_mut(&mut self, name: &str) -> Option<&mut SinkDef> {
        self.sinks.iter_mut().find(|s| s.name == name)
    }

    pub fn table(&self, name: &str) -> Option<&TableDef> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Every relation the catalog defines, as clients' catalog queries describe it
    /// (`information_schema`, `pg_description`), by name.
    pub fn relations(&self) -> Vec<Relation> {
        let mut out: Vec<Relation> = self
            .streams
            .iter()
            .map(|s| Relation {
                name: s.name.clone(),
                kind: RelationKind::Stream,
                insertable: matches!(s.source(), Ok(StreamSource::Table(_))),
                primary_key: Vec::new(),
                description: format!("stream (connector = '{}')", s.connector()),
                definition: None,
                connector: s.connector().to_string(),
                broken: s.broken.clone(),
            })
            .chain(self.tables.iter().map(|t| Relation {
                name: t.name.clone(),
                kind: RelationKind::Table,
                insertable: true,
                primary_key: t.primary_key.clone(),
                description: format!("table (Delta, {})", t.path.display()),
                definition: None,
                connector: "delta".into(),
                broken: None,
            }))
            .chain(self.sinks.iter().map(|s| {
                let view = s.kind == QueryKind::MaterializedView;
                let connector = s.options.get("connector").unwrap_or("delta");
                Relation {
                    name: s.name.clone(),
                    kind: if view {
                        RelationKind::MaterializedView
                    } else {
                        RelationKind::Sink
                    },
                    insertable: false,
                    primary_key: Vec::new(),
                    description: if view {
                        format!("materialized view ({} mode) AS {}", s.output_mode, s.query)
                    } else if s.merge.is_some() {
                        format!("sink (MERGE into {})", s.path.display())
                    } else {
                        format!(
                            "sink (connector = '{connector}', {} mode) AS {}",
                            s.output_mode, s.query
                        )
                    },
                    definition: view.then(|| s.query.clone()),
                    connector: if view {
                        "view".into()
                    } else if s.merge.is_some() {
                        "delta_merge".into()
                    } else {
                        connector.to_string()
                    },
                    broken: None,
                }
            }))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The definitions of the tables a sink joins with.
    pub fn tables_of(&self, sink: &SinkDef) -> Result<Vec<TableDef>> {
        sink.tables
            .iter()
            .map(|n| {
                self.table(n)
                    .cloned()
                    .ok_or_else(|| Error::UndefinedObject {
                        kind: "table",
                        name: n.clone(),
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_list_every_option_as_the_tables_say() {
        let kafka = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/kafka.md"))
            .expect("docs/kafka.md");
        let section = kafka
            .split_once("<!-- kafka options: begin (rendered from the option tables) -->\n")
            .and_then(|(_, rest)| rest.split_once("<!-- kafka options: end -->"))
            .map(|(s, _)| s)
            .expect("docs/kafka.md has the options section");
        assert_eq!(
            section,
            kafka_options_markdown(),
            "docs/kafka.md's options section differs from the option tables; paste this in:\n{}",
            kafka_options_markdown()
        );
        let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sql.md"))
            .expect("docs/sql.md");
        let begin = "<!-- options: begin (rendered from the option tables) -->\n";
        let end = "<!-- options: end -->";
        let section = page
            .split_once(begin)
            .and_then(|(_, rest)| rest.split_once(end))
            .map(|(s, _)| s)
            .expect("docs/sql.md has the options section");
        assert_eq!(
            section,
            options_markdown(),
            "docs/sql.md's options section differs from the option tables; paste this in:\n{}",
            options_markdown()
        );
    }

    #[test]
    fn every_option_has_one_entry_and_a_doc() {
        for t in option_tables() {
            let mut names = t.names();
            names.sort();
            names.dedup();
            assert_eq!(
                names.len(),
                t.options.len(),
                "{} lists an option twice",
                t.what()
            );
            assert!(t.options.iter().all(|o| !o.doc.is_empty()));
            assert!(
                t.options
                    .iter()
                    .all(|o| !(o.required && o.default.is_some()))
            );
        }
    }

    #[test]
    fn options_are_checked_against_their_table() {
        let opts = |pairs: &[(&str, &str)]| {
            Options::try_from_pairs(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .unwrap()
        };
        let sink = &crate::sink::SINK_OPTIONS;
        assert!(
            opts(&[("trigger", "once"), ("state_partitions", "8")])
                .check(sink)
                .is_ok()
        );
        let e = opts(&[("colour", "red")])
            .check(sink)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown option \"colour\" for a sink"), "{e}");
        let e = opts(&[("state_partitions", "0")])
            .check(sink)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a positive integer"), "{e}");
        let e = opts(&[("output_mode", "sometimes")])
            .check(sink)
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid output_mode \"sometimes\""), "{e}");
        assert!(opts(&[("output_mode", "UPDATE")]).check(sink).is_ok());
        let e = opts(&[("path", "rel/dir")])
            .check(sink)
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be absolute"), "{e}");
        let file = &crate::source::file::OPTIONS;
        let e = opts(&[("delimiter", ";;")])
            .check(file)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one ASCII character"), "{e}");
        let e = crate::source::rate::RATE_MICRO_BATCH_OPTIONS
            .check_required(&opts(&[("connector", "rate_micro_batch")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing required option \"rows_per_batch\""),
            "{e}"
        );
    }
}
