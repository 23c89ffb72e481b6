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
use crate::fsutil::write_atomic;
use crate::source::file::{CORRUPT_RECORD, FileFormat, FileSourceConfig, ParseMode};
use crate::sql::options::{Options, Trigger};
use crate::sql::parser::{ColumnSpec, WatermarkSpec};
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
    pub source: Option<Arc<FileSourceConfig>>,
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
        let connector = options.get("connector").unwrap_or("file");
        if connector != "file" {
            return Err(Error::Unsupported {
                message: format!("connector \"{connector}\" is not supported for streams"),
                hint: Some("Use connector = 'file'.".into()),
            });
        }
        options.check_known(
            "a file stream",
            &[
                "connector",
                "format",
                "path",
                "max_files_per_trigger",
                "header",
                "delimiter",
                "mode",
            ],
        )?;
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
        let path = options.get("path").ok_or_else(|| Error::InvalidOption {
            message: "missing required option \"path\" for a file stream".into(),
            hint: Some("Add path = '/directory/where/files/land'.".into()),
        })?;
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(Error::invalid_option(format!(
                "path \"{}\" must be absolute",
                path.display()
            )));
        }
        if check_path && !path.is_dir() {
            return Err(Error::InvalidOption {
                message: format!("path \"{}\" is not a directory", path.display()),
                hint: Some("Create the landing directory before the stream.".into()),
            });
        }
        let max_files_per_trigger = options.positive_int("max_files_per_trigger")?;
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
                });
            } else if columns.len() != 1 || columns[0].data_type != DataType::Utf8 {
                return Err(Error::invalid_option(
                    "a 'text' stream has exactly one TEXT column (one row per line)",
                ));
            }
        }
        if columns.is_empty() {
            return Err(Error::InvalidOption {
                message: format!("stream \"{name}\" needs an explicit schema"),
                hint: Some("List the columns: CREATE STREAM s (col type, ...) WITH (...).".into()),
            });
        }
        let mut seen = std::collections::HashSet::new();
        for c in &columns {
            if !seen.insert(c.name.clone()) {
                return Err(Error::DuplicateObject {
                    kind: "column",
                    name: c.name.clone(),
                });
            }
        }
        if let Some(wm) = &watermark {
            check_watermark(&columns, wm)?;
        }
        // Spark makes every file-source field nullable (spec §10.1).
        let schema: SchemaRef = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(&c.name, c.data_type.clone(), true))
                .collect::<Vec<_>>(),
        ));
        if let Some(c) = columns.iter().find(|c| c.name == CORRUPT_RECORD)
            && c.data_type != DataType::Utf8
        {
            return Err(Error::invalid_option(format!(
                "column \"{CORRUPT_RECORD}\" receives malformed records and must be TEXT"
            )));
        }
        let source = FileSourceConfig {
            path,
            format,
            mode,
            max_files_per_trigger,
            schema,
        };
        Ok(StreamDef {
            name,
            columns,
            watermark,
            options,
            source: Some(Arc::new(source)),
        })
    }

    /// The file source of this stream.
    pub fn source(&self) -> Arc<FileSourceConfig> {
        // Set by `try_new`, the only constructor; `load` goes through it too.
        self.source
            .clone()
            .expect("stream source is derived on load")
    }

    pub fn schema(&self) -> SchemaRef {
        self.source().schema.clone()
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
    pub name: String,
    /// The `AS` query, as DataFusion SQL.
    pub query: String,
    /// The options as written.
    pub options: Options,
    /// The stream the query reads.
    pub stream: String,
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
}

impl SinkDef {
    /// `delta`, `parquet`, `json`, `csv` or `console`.
    pub fn connector(&self) -> &str {
        self.options.get("connector").unwrap_or("delta")
    }
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
        // A landing directory removed while the server was down must not stop startup: the
        // stream is kept and its sinks fail with a clear error when they list it.
        let mut streams = Vec::with_capacity(cat.streams.len());
        for s in cat.streams {
            streams.push(StreamDef::try_new(
                s.name,
                s.columns,
                s.watermark,
                s.options,
                false,
            )?);
        }
        cat.streams = streams;
        Ok(cat)
    }

    /// Writes the catalog durably.
    pub fn save(&self, data_dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Internal(format!("encoding catalog: {e}")))?;
        write_atomic(&Catalog::file(data_dir), text.as_bytes())
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
}
