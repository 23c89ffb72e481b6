//! A sink as Spark runs it: a streaming read per stream (registered as a temporary view of
//! the stream's name, with its watermark), the query as Spark SQL, and the write (format,
//! output mode, trigger, path, checkpoint). Pure: from the catalog's definitions to a
//! [`SparkPlan`], which prints as a PySpark program.
//!
//! What Spark cannot run is refused here, with SQLSTATE 0A000 and a reason that names it:
//! materialized views and table streams (their rows live in this process), MERGE and Kafka
//! sinks, Tidemark's own options (side tables, the skew guard, deduplication modes).

use std::fmt::Write as _;

use datafusion::arrow::datatypes::DataType;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::catalog::{SinkDef, StreamDef, StreamSource};
use crate::error::{Error, Result};
use crate::format::{FileFormat, ParseMode};
use crate::sink::SinkConnector;
use crate::sink::file::SinkFormat;
use crate::sql::options::{Trigger, format_duration};
use crate::sql::parser::{QueryKind, parse_watermark_option};
use crate::state::StoreKind;

/// Sink options that translate (or do not change what Spark computes).
const TRANSLATED_OPTIONS: &[&str] = &[
    "connector",
    "path",
    "checkpoint_location",
    "trigger",
    "output_mode",
    "watermark",
    "state_partitions",
    "state_store",
    "multiple_watermark_policy",
    "max_files_per_trigger",
    "engine",
    "spark_remote",
];

/// One stream as Spark reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct SparkRead {
    /// The temporary view the query reads: the stream's name.
    pub view: String,
    /// `spark.readStream.format(...)`.
    pub format: String,
    /// The schema, in Spark's DDL, for the formats that take one.
    pub schema: Option<String>,
    pub options: Vec<(String, String)>,
    /// `.load(path)`.
    pub path: Option<String>,
    /// `withWatermark(column, delay)`.
    pub watermark: Option<(String, String)>,
}

/// `DataStreamWriter.trigger(...)`.
#[derive(Debug, Clone, PartialEq)]
pub enum SparkTrigger {
    /// No trigger call: Spark's default, the next batch as soon as the last one ends.
    Default,
    ProcessingTime(String),
    AvailableNow,
    Once,
}

/// The write of the query's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct SparkWrite {
    pub query_name: String,
    pub format: String,
    pub output_mode: String,
    pub trigger: SparkTrigger,
    /// Where a file or Delta sink writes.
    pub path: Option<String>,
    pub checkpoint: String,
}

/// What Spark runs for a sink.
#[derive(Debug, Clone, PartialEq)]
pub struct SparkPlan {
    /// Session settings, set before anything runs.
    pub conf: Vec<(String, String)>,
    pub reads: Vec<SparkRead>,
    /// The query, as Spark SQL over the reads' views.
    pub sql: String,
    pub write: SparkWrite,
}

fn refuse(what: impl std::fmt::Display) -> Error {
    Error::Unsupported {
        message: format!("Spark cannot run this sink: {what}"),
        hint: Some("Keep the sink in Tidemark, or change what the message names.".into()),
    }
}

/// The plan of sink `def` over `streams` (the streams its query reads, in order).
pub fn translate(def: &SinkDef, streams: &[&StreamDef]) -> Result<SparkPlan> {
    if def.kind == QueryKind::MaterializedView {
        return Err(refuse(format!(
            "\"{}\" is a materialized view, whose rows live in Tidemark",
            def.name
        )));
    }
    let format = match def.connector()? {
        SinkConnector::Delta => "delta",
        SinkConnector::File(SinkFormat::Parquet) => "parquet",
        SinkConnector::File(SinkFormat::Json) => "json",
        SinkConnector::File(SinkFormat::Csv) => "csv",
        SinkConnector::Console => "console",
        SinkConnector::Noop => "noop",
        SinkConnector::DeltaMerge => {
            return Err(refuse(
                "a MERGE sink (Tidemark runs its MERGE over each batch; Spark would need \
                 foreachBatch)",
            ));
        }
        SinkConnector::Kafka => return Err(refuse("a kafka sink (not translated yet)")),
        SinkConnector::View => return Err(refuse("a materialized view's store")),
    };
    if let Some((k, v)) = def
        .options
        .0
        .iter()
        .find(|(k, _)| !TRANSLATED_OPTIONS.contains(&k.as_str()))
    {
        return Err(refuse(format!(
            "option {k} = '{v}' is Tidemark's own; Spark has no equivalent"
        )));
    }
    if let Some(t) = def.tables.first() {
        return Err(refuse(format!(
            "the query joins the table \"{t}\" (not translated yet)"
        )));
    }
    let mut conf = vec![
        // Tidemark plans in UTC.
        ("spark.sql.session.timeZone".to_string(), "UTC".to_string()),
        (
            "spark.sql.shuffle.partitions".to_string(),
            def.state_partitions.to_string(),
        ),
    ];
    if let Some(p) = def.options.get("multiple_watermark_policy") {
        conf.push((
            "spark.sql.streaming.multipleWatermarkPolicy".into(),
            p.to_ascii_lowercase(),
        ));
    }
    if def.state_store == StoreKind::Rocksdb {
        conf.push((
            "spark.sql.streaming.stateStore.providerClass".into(),
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider".into(),
        ));
    }
    let sink_wm = def
        .options
        .get("watermark")
        .map(parse_watermark_option)
        .transpose()?;
    let max_files = def.options.get("max_files_per_trigger");
    let reads = streams
        .iter()
        .map(|s| {
            let wm = match &sink_wm {
                Some(w) if s.schema().field_with_name(&w.column).is_ok() => Some(w.clone()),
                _ => s.watermark.clone(),
            };
            let mut read = stream_read(s, max_files)?;
            read.watermark = wm.map(|w| (w.column.clone(), format_duration(w.delay())));
            Ok(read)
        })
        .collect::<Result<Vec<_>>>()?;
    let trigger = match def.trigger {
        Trigger::Default => SparkTrigger::Default,
        Trigger::ProcessingTime(d) => SparkTrigger::ProcessingTime(format_duration(d)),
        Trigger::AvailableNow => SparkTrigger::AvailableNow,
        Trigger::Once => SparkTrigger::Once,
    };
    let path = matches!(format, "delta" | "parquet" | "json" | "csv")
        .then(|| def.path.display().to_string());
    Ok(SparkPlan {
        conf,
        reads,
        sql: spark_sql(&def.query)?,
        write: SparkWrite {
            query_name: def.name.clone(),
            format: format.to_string(),
            output_mode: def.output_mode.to_ascii_lowercase(),
            trigger,
            path,
            // Beside Tidemark's own checkpoint, never in it: Spark's state is not Tidemark's.
            checkpoint: format!("{}-spark", def.checkpoint.display()),
        },
    })
}

/// How Spark reads stream `s`.
fn stream_read(s: &StreamDef, sink_max_files: Option<&str>) -> Result<SparkRead> {
    let named = |what: &str| refuse(format!("stream \"{}\" is {what}", s.name));
    let source = s
        .source
        .as_ref()
        .ok_or_else(|| named("not loaded (it is broken)"))?;
    let mut read = SparkRead {
        view: s.name.clone(),
        format: String::new(),
        schema: None,
        options: Vec::new(),
        path: None,
        watermark: None,
    };
    let mut opt = |k: &str, v: String| read.options.push((k.to_string(), v));
    match source {
        StreamSource::File(f) => {
            let (format, mode) = match &f.decoder.format {
                FileFormat::Json => ("json", true),
                FileFormat::Csv { header, delimiter } => {
                    opt("header", header.to_string());
                    opt("sep", (*delimiter as char).to_string());
                    ("csv", true)
                }
                FileFormat::Parquet => ("parquet", false),
                FileFormat::Text => ("text", false),
            };
            if mode {
                opt(
                    "mode",
                    match f.decoder.mode {
                        ParseMode::Permissive => "PERMISSIVE",
                        ParseMode::DropMalformed => "DROPMALFORMED",
                        ParseMode::FailFast => "FAILFAST",
                    }
                    .to_string(),
                );
            }
            if let Some(n) = sink_max_files
                .map(str::to_string)
                .or(f.max_files_per_trigger.map(|n| n.to_string()))
            {
                opt("maxFilesPerTrigger", n);
            }
            read.format = format.to_string();
            if format != "text" {
                read.schema = Some(ddl(s)?);
            }
            read.path = Some(f.path.display().to_string());
        }
        StreamSource::Delta(d) => {
            opt(
                "maxFilesPerTrigger",
                sink_max_files
                    .map(str::to_string)
                    .unwrap_or(d.max_files_per_trigger.to_string()),
            );
            if let Some(v) = d.starting_version {
                opt("startingVersion", v.to_string());
            }
            if d.ignore_deletes {
                opt("ignoreDeletes", "true".into());
            }
            read.format = "delta".into();
            read.path = Some(d.path.display().to_string());
        }
        StreamSource::Rate(r) => {
            opt("rowsPerSecond", r.rows_per_second.to_string());
            opt("rampUpTime", format!("{}s", r.ramp_up_secs));
            opt("numPartitions", r.num_partitions.to_string());
            read.format = "rate".into();
        }
        StreamSource::RateMicroBatch(r) => {
            opt("rowsPerBatch", r.rows_per_batch.to_string());
            opt("numPartitions", r.num_partitions.to_string());
            opt("startTimestamp", r.start_timestamp_ms.to_string());
            opt("advanceMillisPerBatch", r.advance_ms_per_batch.to_string());
            read.format = "rate-micro-batch".into();
        }
        StreamSource::Table(_) => {
            return Err(named(
                "a table stream: its rows are sent to Tidemark with INSERT and COPY",
            ));
        }
        StreamSource::Nexmark(_) => return Err(named("Tidemark's Nexmark generator")),
        StreamSource::Kafka(_) => return Err(named("a kafka stream (not translated yet)")),
    }
    Ok(read)
}

/// The stream's columns as Spark's DDL: `` `a` INT, `b` STRING ``.
fn ddl(s: &StreamDef) -> Result<String> {
    let schema = s.schema();
    let cols = schema
        .fields()
        .iter()
        .map(|f| {
            let t = spark_type(f.data_type()).ok_or_else(|| {
                refuse(format!(
                    "column \"{}\" of stream \"{}\" has type {}, which has no Spark type here",
                    f.name(),
                    s.name,
                    f.data_type()
                ))
            })?;
            Ok(format!("{} {t}", backquote(f.name())))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(cols.join(", "))
}

/// The Spark SQL type of a stream column's Arrow type.
fn spark_type(dt: &DataType) -> Option<String> {
    Some(match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "STRING".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Date32 => "DATE".into(),
        // Tidemark's timestamps are UTC, and the session's time zone is set to UTC.
        DataType::Timestamp(..) => "TIMESTAMP".into(),
        DataType::Binary | DataType::LargeBinary => "BINARY".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p}, {s})"),
        _ => return None,
    })
}

fn backquote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The query in Spark's SQL: identifiers quoted with double quotes (Postgres) get back
/// quotes, and string literals Spark's backslash escapes. The rest is the same text:
/// `window(col, '5 minutes')` and `window.start` are Spark's own, `::` casts are Spark 4's.
pub fn spark_sql(query: &str) -> Result<String> {
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, query)
        .tokenize()
        .map_err(|e| Error::InvalidOption {
            message: format!("the query does not tokenize: {e}"),
            hint: None,
        })?;
    let mut out = String::with_capacity(query.len());
    for (i, t) in tokens.iter().enumerate() {
        let called = tokens[i + 1..]
            .iter()
            .find(|t| !matches!(t, Token::Whitespace(_)))
            .is_some_and(|t| *t == Token::LParen);
        if let Token::Word(w) = t
            && w.quote_style.is_none()
            && called
        {
            let spark_form = match w.value.to_ascii_lowercase().as_str() {
                "tumble" => Some("window(ts, size)"),
                "hop" => Some("window(ts, size, slide)"),
                "session" => Some("session_window(ts, gap)"),
                _ => None,
            };
            if let Some(form) = spark_form {
                return Err(refuse(format!(
                    "{}(...) is not Spark SQL; write {form}",
                    w.value.to_ascii_uppercase()
                )));
            }
        }
        let t = t.clone();
        match t {
            Token::Word(w) if w.quote_style == Some('"') => out.push_str(&backquote(&w.value)),
            Token::SingleQuotedString(s) => {
                let _ = write!(out, "'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"));
            }
            Token::EscapedStringLiteral(_)
            | Token::DollarQuotedString(_)
            | Token::NationalStringLiteral(_) => {
                return Err(refuse(format!(
                    "the string literal {t} (Postgres syntax Spark SQL lacks)"
                )));
            }
            other => out.push_str(&other.to_string()),
        }
    }
    Ok(out.trim().trim_end_matches(';').trim_end().to_string())
}

/// A Python string literal.
fn py(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl SparkPlan {
    /// The plan as a PySpark program: what Tidemark sends a Spark Connect server, written
    /// for `spark-submit` (or `python3` with pyspark installed).
    pub fn pyspark(&self) -> String {
        let mut p = String::new();
        let w = &self.write;
        let _ = writeln!(
            p,
            "# Sink \"{}\" as a Spark Structured Streaming query, made by Tidemark \
             (tidemark export-spark).",
            w.query_name
        );
        p.push_str("# Run it with spark-submit, or with python3 where pyspark is installed.\n");
        p.push_str("from pyspark.sql import SparkSession\n\n");
        p.push_str("spark = (\n    SparkSession.builder.appName(");
        p.push_str(&py(&format!("tidemark-{}", w.query_name)));
        p.push_str(")\n");
        for (k, v) in &self.conf {
            let _ = writeln!(p, "    .config({}, {})", py(k), py(v));
        }
        p.push_str("    .getOrCreate()\n)\n");
        for r in &self.reads {
            let _ = write!(p, "\ndf = spark.readStream.format({})", py(&r.format));
            if let Some(s) = &r.schema {
                let _ = write!(p, ".schema({})", py(s));
            }
            for (k, v) in &r.options {
                let _ = write!(p, ".option({}, {})", py(k), py(v));
            }
            match &r.path {
                Some(path) => {
                    let _ = writeln!(p, ".load({})", py(path));
                }
                None => p.push_str(".load()\n"),
            }
            if let Some((col, delay)) = &r.watermark {
                let _ = writeln!(p, "df = df.withWatermark({}, {})", py(col), py(delay));
            }
            let _ = writeln!(p, "df.createOrReplaceTempView({})", py(&r.view));
        }
        let _ = writeln!(p, "\nrows = spark.sql({})", py(&self.sql));
        p.push_str("writer = (\n    rows.writeStream");
        let _ = write!(
            p,
            ".queryName({}).format({}).outputMode({})",
            py(&w.query_name),
            py(&w.format),
            py(&w.output_mode)
        );
        let _ = write!(
            p,
            "\n    .option(\"checkpointLocation\", {})",
            py(&w.checkpoint)
        );
        if let Some(path) = &w.path {
            let _ = write!(p, "\n    .option(\"path\", {})", py(path));
        }
        match &w.trigger {
            SparkTrigger::Default => {}
            SparkTrigger::ProcessingTime(d) => {
                let _ = write!(p, "\n    .trigger(processingTime={})", py(d));
            }
            SparkTrigger::AvailableNow => p.push_str("\n    .trigger(availableNow=True)"),
            SparkTrigger::Once => p.push_str("\n    .trigger(once=True)"),
        }
        p.push_str("\n)\nquery = writer.start()\nquery.awaitTermination()\n");
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn double_quoted_identifiers_become_backquoted_and_literals_spark_escaped() {
        assert_eq!(
            spark_sql(
                "SELECT \"offset\", window.start, 'it''s' AS s FROM t GROUP BY window(ts, '5 \
                 minutes');"
            )
            .unwrap(),
            "SELECT `offset`, window.start, 'it\\'s' AS s FROM t GROUP BY window(ts, '5 \
             minutes')"
        );
        assert!(
            spark_sql("SELECT count(*) FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)")
                .unwrap_err()
                .to_string()
                .contains("write window(ts, size)")
        );
        assert!(
            spark_sql("SELECT $$x$$")
                .unwrap_err()
                .to_string()
                .contains("Postgres syntax")
        );
    }

    #[test]
    fn python_strings_escape_what_python_needs() {
        assert_eq!(py("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
    }

    #[test]
    fn stream_types_have_spark_names() {
        assert_eq!(
            spark_type(&DataType::Decimal128(10, 2)).as_deref(),
            Some("DECIMAL(10, 2)")
        );
        assert_eq!(
            spark_type(&DataType::Timestamp(
                datafusion::arrow::datatypes::TimeUnit::Microsecond,
                None
            ))
            .as_deref(),
            Some("TIMESTAMP")
        );
        assert_eq!(
            spark_type(&DataType::Interval(
                datafusion::arrow::datatypes::IntervalUnit::MonthDayNano
            )),
            None
        );
    }
}
