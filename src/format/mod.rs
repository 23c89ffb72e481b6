//! File formats: decoding JSON, CSV, Parquet and text files into Arrow batches of a
//! declared schema, with Spark's handling of malformed records (`mode`), and the
//! `_spark_metadata` manifest of file sinks ([`manifest`]).
//!
//! A leaf below sources and sinks: the file source reads landing files through
//! [`FileDecoder`], a file sink writes these formats and its read side decodes them back.

pub mod avro;
pub mod copy;
pub mod json;
pub mod manifest;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringBuilder, new_null_array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sql::options::Options;

/// Rows per Arrow batch when decoding files.
const BATCH_SIZE: usize = 8192;

/// The format of the files in a landing directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileFormat {
    /// One JSON object per line.
    Json,
    Csv {
        header: bool,
        delimiter: u8,
    },
    Parquet,
    /// One row per line, in the single column `value`.
    Text,
}

impl FileFormat {
    /// Parses the `format` option (with `header` and `delimiter` for CSV).
    pub fn parse(name: &str, options: &Options) -> Result<FileFormat> {
        match name.to_ascii_lowercase().as_str() {
            "json" => Ok(FileFormat::Json),
            "csv" => {
                let header = options.bool("header")?.unwrap_or(false);
                let delimiter = match options.get("delimiter") {
                    None => b',',
                    Some(d) if d.len() == 1 && d.is_ascii() => d.as_bytes()[0],
                    Some("\\t") => b'\t',
                    Some(d) => {
                        return Err(Error::invalid_option(format!(
                            "option \"delimiter\" must be one ASCII character, got \"{d}\""
                        )));
                    }
                };
                Ok(FileFormat::Csv { header, delimiter })
            }
            "parquet" => Ok(FileFormat::Parquet),
            "text" => Ok(FileFormat::Text),
            other => Err(Error::InvalidOption {
                message: format!("format \"{other}\" is not supported"),
                hint: Some("Use 'json', 'csv', 'parquet' or 'text'.".into()),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            FileFormat::Json => "json",
            FileFormat::Csv { .. } => "csv",
            FileFormat::Parquet => "parquet",
            FileFormat::Text => "text",
        }
    }
}

/// What to do with a JSON or CSV record that does not parse (Spark's `mode` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParseMode {
    /// Keep the row with every field NULL and the raw line in `_corrupt_record`, if the
    /// stream declares that column.
    #[default]
    Permissive,
    /// Drop the row (and count it).
    DropMalformed,
    /// Fail the query, naming the file and line.
    FailFast,
}

impl ParseMode {
    pub fn parse(s: &str) -> Result<ParseMode> {
        match s.to_ascii_uppercase().as_str() {
            "PERMISSIVE" => Ok(ParseMode::Permissive),
            "DROPMALFORMED" => Ok(ParseMode::DropMalformed),
            "FAILFAST" => Ok(ParseMode::FailFast),
            _ => Err(Error::InvalidOption {
                message: format!("invalid mode \"{s}\""),
                hint: Some("mode is 'PERMISSIVE', 'DROPMALFORMED' or 'FAILFAST'.".into()),
            }),
        }
    }
}

/// The column that receives the raw text of a malformed record in PERMISSIVE mode.
pub const CORRUPT_RECORD: &str = "_corrupt_record";

/// Lines decoded together on the slow path; a group that fails is retried line by line.
const LINE_GROUP: usize = 1024;

/// A JSON or CSV file is cut into pieces decoded on several threads only if each piece
/// holds at least this many bytes; below that a thread costs more than it saves.
const MIN_PIECE_BYTES: u64 = 4 << 20;
/// The largest JSON file decoded from memory in one piece (with the fast path); a larger
/// one read on one thread is streamed through arrow-json, so memory stays bounded.
const MAX_WHOLE_JSON: u64 = 256 << 20;

/// The largest file buffer kept for a later file (see [`with_text_buffer`]).
const KEPT_TEXT_BUFFER: usize = 64 << 20;

/// The most bytes of file buffers kept for later files, all together.
const KEPT_TEXT_BYTES: usize = 128 << 20;

/// File buffers kept for later files, shared by every thread (the blocking pool runs
/// reads on many threads, a few files each): at most `limit` buffers of at most
/// [`KEPT_TEXT_BUFFER`] bytes, [`KEPT_TEXT_BYTES`] in all.
struct TextBuffers {
    kept: std::sync::Mutex<Vec<Vec<u8>>>,
    limit: std::sync::OnceLock<usize>,
}

impl TextBuffers {
    const fn new() -> TextBuffers {
        TextBuffers {
            kept: std::sync::Mutex::new(Vec::new()),
            limit: std::sync::OnceLock::new(),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// As many as files are decoded at once: a batch's own reads and the read-ahead's,
    /// each as many at a time as there are cores.
    fn limit(&self) -> usize {
        *self.limit.get_or_init(|| 2 * crate::config::parallelism())
    }

    /// An empty buffer of at least `want` bytes' capacity: the smallest kept one that is
    /// large enough, or a new one an eighth larger, so that a later file a little longer
    /// still fits in it.
    fn take(&self, want: usize) -> Vec<u8> {
        let kept = {
            let mut kept = self.kept();
            let fits = kept
                .iter()
                .enumerate()
                .filter(|(_, t)| t.capacity() >= want)
                .min_by_key(|(_, t)| t.capacity())
                .map(|(i, _)| i);
            fits.map(|i| kept.swap_remove(i))
        };
        // Kept buffers are empty: `give` clears them.
        kept.unwrap_or_else(|| Vec::with_capacity(want.saturating_add(want / 8)))
    }

    /// Keeps `text` for a later file, in place of the smallest kept buffer when there are
    /// already as many as the limit and it is larger.
    fn give(&self, mut text: Vec<u8>) {
        if text.capacity() > KEPT_TEXT_BUFFER {
            return;
        }
        text.clear();
        let limit = self.limit();
        let dropped = {
            let mut kept = self.kept();
            let bytes: usize = kept.iter().map(|t| t.capacity()).sum();
            if kept.len() < limit && bytes + text.capacity() <= KEPT_TEXT_BYTES {
                kept.push(text);
                None
            } else {
                match kept.iter_mut().min_by_key(|t| t.capacity()) {
                    Some(smallest)
                        if smallest.capacity() < text.capacity()
                            && bytes - smallest.capacity() + text.capacity() <= KEPT_TEXT_BYTES =>
                    {
                        Some(std::mem::replace(smallest, text))
                    }
                    _ => Some(text),
                }
            }
        };
        // Freed outside the lock.
        drop(dropped);
    }
}

static TEXT_BUFFERS: TextBuffers = TextBuffers::new();

/// Runs `read` with an empty buffer of at least `len` bytes' capacity, kept in
/// [`TEXT_BUFFERS`] for later files, so that reading a file costs the copy from the page
/// cache and not also the page faults and zeroing of fresh memory. Nothing decoded refers
/// to the buffer (the decoders copy what they keep).
fn with_text_buffer<T>(len: u64, read: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    // `read_to_end` reads past the end to see it: one spare byte spares a regrow.
    let mut text = TEXT_BUFFERS.take(len.saturating_add(1));
    let out = read(&mut text);
    TEXT_BUFFERS.give(text);
    out
}

/// What reading one file gave.
#[derive(Debug, Default)]
pub struct FileRead {
    pub batches: Vec<RecordBatch>,
    /// Records that did not parse (kept as NULL rows in PERMISSIVE mode, dropped in
    /// DROPMALFORMED).
    pub malformed: u64,
    /// The records that did not parse, in file order (kept whatever the mode, for
    /// `malformed_rows = 'table'`).
    pub rejected: Vec<Rejected>,
    /// The file was gone when the batch read it.
    pub missing: bool,
}

/// A record that did not parse: where it was, its text and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// 1-based, counting every line of the file (a CSV header and blank lines too).
    pub line: u64,
    /// The line without its line end; bytes that are not UTF-8 replaced by U+FFFD.
    pub text: String,
    /// The decoder's reason.
    pub error: String,
}

/// How to decode a file: its format, the schema it is read into, what to do with
/// malformed records.
#[derive(Debug, Clone)]
pub struct FileDecoder {
    pub format: FileFormat,
    /// JSON and CSV: what to do with malformed records.
    pub mode: ParseMode,
    /// The declared schema; every field nullable.
    pub schema: SchemaRef,
}

impl FileDecoder {
    /// Reads one file into batches of the declared schema. A file that vanished since it
    /// was listed reads as empty (`missing`); one that cannot be read is an error.
    pub fn read(&self, file: &Path) -> Result<FileRead> {
        self.read_on(file, 1)
    }

    /// [`FileDecoder::read`] on up to `threads` threads: a large JSON or CSV file is cut
    /// at line ends into pieces decoded in parallel (as Spark splits such files into
    /// partitions), giving the same rows in the same order as a decode in one piece.
    pub fn read_on(&self, file: &Path, threads: usize) -> Result<FileRead> {
        self.read_with(file, threads, MIN_PIECE_BYTES)
    }

    /// [`FileDecoder::read_on`], cutting only pieces of at least `min_piece` bytes.
    fn read_with(&self, file: &Path, threads: usize, min_piece: u64) -> Result<FileRead> {
        let f = match File::open(file) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(file = %file.display(), "file vanished before it was read; skipped");
                return Ok(FileRead {
                    missing: true,
                    ..FileRead::default()
                });
            }
            Err(e) => return Err(Error::io(format!("cannot read {}", file.display()), e)),
        };
        let with_file = |e: datafusion::arrow::error::ArrowError| {
            Error::BadInput(format!("cannot read {}: {e}", file.display()))
        };
        let schema = self.schema.clone();
        let batches = match &self.format {
            FileFormat::Json | FileFormat::Csv { .. } => {
                let len = f.metadata().map_or(0, |m| m.len());
                let pieces = usize::try_from(len / min_piece.max(1))
                    .unwrap_or(usize::MAX)
                    .min(threads);
                // JSON is decoded from the whole text in memory (the fast path needs it), read
                // in one go into a buffer of the file's size: no copies through a reader's
                // buffer, no regrowing. CSV in one piece, and a JSON file too large to hold,
                // are streamed.
                let whole_json = matches!(self.format, FileFormat::Json) && len <= MAX_WHOLE_JSON;
                if pieces > 1 || whole_json {
                    return with_text_buffer(len, |text| {
                        std::io::Read::read_to_end(&mut &f, text)
                            .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
                        let in_pieces = if pieces > 1 {
                            self.read_pieces(text, pieces)
                        } else {
                            None
                        };
                        let batches = match in_pieces {
                            Some(batches) => Ok(batches),
                            None => self.read_whole(text, true),
                        };
                        match batches {
                            Ok(batches) => Ok(FileRead {
                                batches,
                                ..FileRead::default()
                            }),
                            Err(_) => self.read_records(&text[..], &file_place(file)),
                        }
                    });
                }
                // Streamed in one pass. Any error: again, record by record.
                if let Ok(batches) = self.read_streamed(BufReader::with_capacity(1 << 20, f)) {
                    return Ok(FileRead {
                        batches,
                        ..FileRead::default()
                    });
                }
                let f = match File::open(file) {
                    Ok(f) => f,
                    Err(e) => return Err(Error::io(format!("cannot read {}", file.display()), e)),
                };
                return self.read_records(BufReader::with_capacity(1 << 20, f), &file_place(file));
            }
            FileFormat::Parquet => {
                let builder = ParquetRecordBatchReaderBuilder::try_new(f)
                    .map_err(|e| Error::BadInput(format!("cannot read {}: {e}", file.display())))?;
                let reader = builder
                    .with_batch_size(BATCH_SIZE)
                    .build()
                    .map_err(|e| Error::BadInput(format!("cannot read {}: {e}", file.display())))?;
                let mut out = Vec::new();
                for b in reader {
                    out.push(conform(&b.map_err(with_file)?, &schema).map_err(with_file)?);
                }
                out
            }
            FileFormat::Text => {
                let mut out = Vec::new();
                let mut builder = StringBuilder::new();
                let mut n = 0;
                let mut reader = BufReader::with_capacity(1 << 20, f);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    let read = reader
                        .read_until(b'\n', &mut line)
                        .map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
                    if read == 0 {
                        break;
                    }
                    while matches!(line.last(), Some(b'\n' | b'\r')) {
                        line.pop();
                    }
                    builder.append_value(String::from_utf8_lossy(&line));
                    n += 1;
                    if n == BATCH_SIZE {
                        out.push(RecordBatch::try_new(
                            schema.clone(),
                            vec![Arc::new(builder.finish())],
                        )?);
                        n = 0;
                    }
                }
                if n > 0 {
                    out.push(RecordBatch::try_new(
                        schema.clone(),
                        vec![Arc::new(builder.finish())],
                    )?);
                }
                out
            }
        };
        Ok(FileRead {
            batches,
            ..FileRead::default()
        })
    }

    /// Records given as text, one per line (a Kafka stream's values), decoded like a file's
    /// lines: malformed ones as the mode says, each placed by `place(line)` in errors.
    pub fn read_text(&self, text: &[u8], place: &dyn Fn(u64) -> String) -> Result<FileRead> {
        if !matches!(self.format, FileFormat::Json | FileFormat::Csv { .. }) {
            return Err(Error::Internal("not a record format".into()));
        }
        if let Ok(batches) = self.read_whole(text, false) {
            return Ok(FileRead {
                batches,
                ..FileRead::default()
            });
        }
        self.read_records(text, place)
    }

    /// The declared schema without `_corrupt_record`: what the records hold.
    fn data_schema(&self) -> SchemaRef {
        Arc::new(Schema::new(
            self.schema
                .fields()
                .iter()
                .filter(|f| f.name() != CORRUPT_RECORD)
                .cloned()
                .collect::<Vec<_>>(),
        ))
    }

    /// JSON or CSV text cut at line ends into `pieces` parts of about equal size, each
    /// decoded on its own thread. `None` when a part fails (a malformed record, or a JSON
    /// value that spans a cut and so leaves one part truncated and the next one not
    /// starting at a value) or when the text cannot be cut (CSV with quotes, whose quoted
    /// fields may hold line ends): the caller decodes it in one piece.
    fn read_pieces(&self, text: &[u8], pieces: usize) -> Option<Vec<RecordBatch>> {
        let body = match &self.format {
            FileFormat::Json => text,
            FileFormat::Csv { .. } if text.contains(&b'"') => return None,
            FileFormat::Csv { header: false, .. } => text,
            FileFormat::Csv { header: true, .. } => {
                let end = text.iter().position(|&b| b == b'\n')?;
                &text[end + 1..]
            }
            _ => return None,
        };
        let cuts = line_cuts(body, pieces);
        std::thread::scope(|s| {
            let parts: Vec<_> = cuts
                .windows(2)
                .map(|w| {
                    let part = &body[w[0]..w[1]];
                    s.spawn(move || self.read_whole(part, false))
                })
                .collect();
            let mut out = Vec::new();
            for part in parts {
                out.extend(part.join().ok()?.ok()?);
            }
            Some(out)
        })
    }

    /// JSON or CSV text in one pass; any malformed record fails it. `header_line`: a CSV
    /// header line (if the format has one) opens the text; false for a piece after the
    /// first.
    fn read_whole(&self, text: &[u8], header_line: bool) -> Result<Vec<RecordBatch>> {
        let FileFormat::Json = &self.format else {
            return self.read_streamed_from(text, header_line);
        };
        let data_schema = self.data_schema();
        // The fast path; it declines what arrow-json should decide (json.rs).
        let fast = json::enabled()
            .then(|| json::FlatJson::new(&data_schema))
            .flatten()
            .and_then(|d| d.decode(text, BATCH_SIZE));
        let batches = match fast {
            Some(batches) => batches,
            None => datafusion::arrow::json::ReaderBuilder::new(data_schema)
                .with_batch_size(BATCH_SIZE)
                .with_coerce_primitive(true)
                .build(text)?
                .collect::<std::result::Result<_, _>>()?,
        };
        self.with_corrupt_column(batches)
    }

    /// A whole JSON or CSV file from `input` in one pass, streamed (arrow-json or
    /// arrow-csv alone); any malformed record fails it.
    fn read_streamed(&self, input: impl BufRead) -> Result<Vec<RecordBatch>> {
        self.read_streamed_from(input, true)
    }

    /// [`FileDecoder::read_streamed`]; `header_line` as in [`FileDecoder::read_whole`].
    fn read_streamed_from(
        &self,
        input: impl BufRead,
        header_line: bool,
    ) -> Result<Vec<RecordBatch>> {
        let batches = match &self.format {
            FileFormat::Json => datafusion::arrow::json::ReaderBuilder::new(self.data_schema())
                .with_batch_size(BATCH_SIZE)
                .with_coerce_primitive(true)
                .build(input)?
                .collect::<std::result::Result<_, _>>()?,
            FileFormat::Csv { header, delimiter } => {
                datafusion::arrow::csv::ReaderBuilder::new(self.data_schema())
                    .with_header(*header && header_line)
                    .with_delimiter(*delimiter)
                    .with_batch_size(BATCH_SIZE)
                    .build(input)?
                    .collect::<std::result::Result<_, _>>()?
            }
            _ => return Err(Error::Internal("not a record format".into())),
        };
        self.with_corrupt_column(batches)
    }

    /// The records' batches in the declared schema: `_corrupt_record`, if declared, null.
    fn with_corrupt_column(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let corrupt_idx = self.schema.index_of(CORRUPT_RECORD).ok();
        batches
            .into_iter()
            .map(|b| {
                let mut cols = b.columns().to_vec();
                if let Some(i) = corrupt_idx {
                    cols.insert(i, new_null_array(&DataType::Utf8, b.num_rows()));
                }
                Ok(RecordBatch::try_new(self.schema.clone(), cols)?)
            })
            .collect()
    }

    /// Decodes JSON or CSV text (whole lines) with a fresh decoder.
    fn decode(
        &self,
        schema: &SchemaRef,
        text: &[u8],
        rows: usize,
    ) -> std::result::Result<Option<RecordBatch>, datafusion::arrow::error::ArrowError> {
        let batch_size = rows.max(1) + 1;
        match &self.format {
            FileFormat::Json => {
                let mut d = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
                    .with_batch_size(batch_size)
                    .with_coerce_primitive(true)
                    .build_decoder()?;
                d.decode(text)?;
                d.flush()
            }
            FileFormat::Csv { delimiter, .. } => {
                let mut d = datafusion::arrow::csv::ReaderBuilder::new(schema.clone())
                    .with_header(false)
                    .with_delimiter(*delimiter)
                    .with_batch_size(batch_size)
                    .build_decoder();
                let mut rest = text;
                while !rest.is_empty() {
                    let n = d.decode(rest)?;
                    if n == 0 {
                        break;
                    }
                    rest = &rest[n..];
                }
                d.decode(&[])?;
                d.flush()
            }
            _ => Ok(None),
        }
    }

    /// The fields of a malformed record that parse on their own, as Spark keeps them in
    /// PERMISSIVE mode: a JSON object's members that fit their columns, a CSV line's
    /// fields that fit theirs (a short line leaves the last columns NULL, extra fields are
    /// ignored). `None` when the text is not a JSON object or a CSV record at all.
    fn partial(&self, schema: &SchemaRef, text: &[u8]) -> Option<RecordBatch> {
        let values: Vec<Option<Vec<u8>>> = match &self.format {
            FileFormat::Json => {
                let serde_json::Value::Object(members) =
                    serde_json::from_slice::<serde_json::Value>(text).ok()?
                else {
                    return None;
                };
                schema
                    .fields()
                    .iter()
                    .map(|f| {
                        members.get(f.name()).map(|v| {
                            serde_json::to_vec(&serde_json::json!({ f.name(): v }))
                                .unwrap_or_default()
                        })
                    })
                    .collect()
            }
            FileFormat::Csv { delimiter, .. } => {
                let mut reader = csv::ReaderBuilder::new()
                    .has_headers(false)
                    .flexible(true)
                    .delimiter(*delimiter)
                    .from_reader(text);
                let record = reader.byte_records().next()?.ok()?;
                (0..schema.fields().len())
                    .map(|i| {
                        record.get(i).map(|field| {
                            let mut w = csv::WriterBuilder::new()
                                .delimiter(*delimiter)
                                .from_writer(Vec::new());
                            let _ = w.write_record([field]);
                            w.into_inner().unwrap_or_default()
                        })
                    })
                    .collect()
            }
            _ => return None,
        };
        let columns = schema
            .fields()
            .iter()
            .zip(values)
            .map(|(f, value)| {
                let one = Arc::new(Schema::new(vec![f.as_ref().clone().with_nullable(true)]));
                value
                    .and_then(|v| self.decode(&one, &v, 1).ok().flatten())
                    .filter(|b| b.num_rows() == 1)
                    .map(|b| b.column(0).clone())
                    .unwrap_or_else(|| new_null_array(f.data_type(), 1))
            })
            .collect();
        RecordBatch::try_new(schema.clone(), columns).ok()
    }

    /// JSON or CSV records, one per line, with malformed ones handled per [`ParseMode`].
    /// Groups of lines are decoded together; a group that fails is decoded line by line to
    /// find the bad records.
    fn read_records(
        &self,
        mut reader: impl BufRead,
        place: &dyn Fn(u64) -> String,
    ) -> Result<FileRead> {
        let data_schema = self.data_schema();
        let corrupt_idx = self.schema.index_of(CORRUPT_RECORD).ok();
        let skip_header = matches!(self.format, FileFormat::Csv { header: true, .. });
        let mut out = FileRead::default();
        // Decoded rows, and the raw text of malformed ones, in file order.
        let mut parts: Vec<Part> = Vec::new();
        let mut group: Vec<u8> = Vec::new();
        let mut group_lines: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        let mut line = Vec::new();
        let mut line_no = 0usize;
        loop {
            line.clear();
            let read = reader
                .read_until(b'\n', &mut line)
                .map_err(|e| Error::io(format!("reading {}", place(0)), e))?;
            if read > 0 {
                line_no += 1;
                if skip_header && line_no == 1 {
                    continue;
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let start = group.len();
                group.extend_from_slice(&line);
                group_lines.push((line_no, start..group.len()));
            }
            if group_lines.len() == LINE_GROUP || (read == 0 && !group_lines.is_empty()) {
                match self.decode(&data_schema, &group, group_lines.len()) {
                    Ok(Some(b)) if b.num_rows() == group_lines.len() => parts.push(Part::Rows(b)),
                    _ => {
                        for (n, range) in &group_lines {
                            let text = &group[range.clone()];
                            match self.decode(&data_schema, text, 1) {
                                Ok(Some(b)) if b.num_rows() == 1 => parts.push(Part::Rows(b)),
                                result => {
                                    let reason = match result {
                                        Err(e) => without_chunk_line(&e.to_string()),
                                        Ok(_) => "not one record".to_string(),
                                    };
                                    out.malformed += 1;
                                    let raw = String::from_utf8_lossy(text)
                                        .trim_end_matches(['\n', '\r'])
                                        .to_string();
                                    match self.mode {
                                        ParseMode::FailFast => {
                                            return Err(Error::BadInput(format!(
                                                "malformed {} record in {}: {reason}",
                                                self.format.name(),
                                                place(*n as u64)
                                            )));
                                        }
                                        ParseMode::DropMalformed => {}
                                        ParseMode::Permissive => parts.push(Part::Corrupt(
                                            raw.clone(),
                                            self.partial(&data_schema, text),
                                        )),
                                    }
                                    out.rejected.push(Rejected {
                                        line: *n as u64,
                                        text: raw,
                                        error: reason,
                                    });
                                }
                            }
                        }
                    }
                }
                group.clear();
                group_lines.clear();
            }
            if read == 0 {
                break;
            }
        }
        if out.malformed > 0 {
            tracing::warn!(
                place = %place(0),
                malformed = out.malformed,
                mode = ?self.mode,
                "malformed records"
            );
        }
        out.batches = assemble(&self.schema, &data_schema, corrupt_idx, parts)?;
        Ok(out)
    }
}

/// Where a file's record is, for errors: `file line n` (line 0: the file itself).
fn file_place(file: &Path) -> impl Fn(u64) -> String + '_ {
    move |n| match n {
        0 => file.display().to_string(),
        n => format!("{} line {n}", file.display()),
    }
}

/// A decoder's error without the line number it gives (` at line 0`), which counts lines
/// of the text it was given, not of the file.
fn without_chunk_line(error: &str) -> String {
    if let Some(at) = error.find(" at line ") {
        let rest = &error[at + " at line ".len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            return format!("{}{}", &error[..at], &rest[digits..]);
        }
    }
    error.to_string()
}

/// Where text is cut into `pieces` parts of about equal size: `0`, then after the first
/// line end at or past each `len * i / pieces`, then `len`; no part is empty.
fn line_cuts(text: &[u8], pieces: usize) -> Vec<usize> {
    let mut cuts = vec![0];
    for i in 1..pieces {
        let from = (text.len() * i / pieces).max(*cuts.last().unwrap_or(&0));
        match text[from..].iter().position(|&b| b == b'\n') {
            Some(n) if from + n + 1 < text.len() => cuts.push(from + n + 1),
            _ => break,
        }
    }
    cuts.push(text.len());
    cuts.dedup();
    cuts
}

/// Lists the files a [`FilesTable`] reads at each scan.
pub type FileLister = Box<dyn Fn() -> Result<Vec<PathBuf>> + Send + Sync>;

/// Files as a DataFusion table: every scan lists them again and decodes them all.
pub struct FilesTable {
    decoder: Arc<FileDecoder>,
    list: Arc<FileLister>,
}

impl std::fmt::Debug for FilesTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilesTable")
            .field("format", &self.decoder.format)
            .finish()
    }
}

impl FilesTable {
    pub fn new(decoder: FileDecoder, list: FileLister) -> FilesTable {
        FilesTable {
            decoder: Arc::new(decoder),
            list: Arc::new(list),
        }
    }
}

#[async_trait::async_trait]
impl datafusion::datasource::TableProvider for FilesTable {
    fn schema(&self) -> SchemaRef {
        self.decoder.schema.clone()
    }

    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        _filters: &[datafusion::logical_expr::Expr],
        _limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        use datafusion::error::DataFusionError;
        let decoder = self.decoder.clone();
        let list = self.list.clone();
        let batches = tokio::task::spawn_blocking(move || -> Result<Vec<RecordBatch>> {
            let mut out = Vec::new();
            for f in list()? {
                out.extend(decoder.read(&f)?.batches);
            }
            Ok(out)
        })
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?
        .map_err(|e: Error| DataFusionError::External(Box::new(e)))?;
        Ok(
            datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
                &[batches],
                self.decoder.schema.clone(),
                projection.cloned(),
            )?,
        )
    }
}

/// Decoded rows, or a malformed record's raw text and the fields of it that parsed.
enum Part {
    Rows(RecordBatch),
    Corrupt(String, Option<RecordBatch>),
}

/// Batches of the declared schema from decoded parts: a malformed record is a row of the
/// fields that parsed (NULLs elsewhere) with its text in `_corrupt_record` (when declared).
fn assemble(
    schema: &SchemaRef,
    data_schema: &SchemaRef,
    corrupt_idx: Option<usize>,
    parts: Vec<Part>,
) -> Result<Vec<RecordBatch>> {
    let mut out = Vec::new();
    let mut run: Vec<RecordBatch> = Vec::new();
    let mut corrupt: Vec<Option<String>> = Vec::new();
    let flush = |run: &mut Vec<RecordBatch>,
                 corrupt: &mut Vec<Option<String>>,
                 out: &mut Vec<RecordBatch>|
     -> Result<()> {
        if run.is_empty() {
            return Ok(());
        }
        let data = datafusion::arrow::compute::concat_batches(data_schema, run.iter())?;
        run.clear();
        let mut cols = data.columns().to_vec();
        if let Some(i) = corrupt_idx {
            let texts = std::mem::take(corrupt);
            cols.insert(
                i,
                Arc::new(datafusion::arrow::array::StringArray::from(texts)),
            );
        }
        corrupt.clear();
        out.push(RecordBatch::try_new(schema.clone(), cols)?);
        Ok(())
    };
    for part in parts {
        match part {
            Part::Rows(b) => {
                corrupt.extend(std::iter::repeat_n(None, b.num_rows()));
                run.push(b);
            }
            Part::Corrupt(text, fields) => {
                let row = match fields {
                    Some(row) => row,
                    None => {
                        let nulls = data_schema
                            .fields()
                            .iter()
                            .map(|f| new_null_array(f.data_type(), 1))
                            .collect();
                        RecordBatch::try_new(data_schema.clone(), nulls)?
                    }
                };
                run.push(row);
                corrupt.push(Some(text));
            }
        }
        if run.len() >= 64 {
            flush(&mut run, &mut corrupt, &mut out)?;
        }
    }
    flush(&mut run, &mut corrupt, &mut out)?;
    Ok(out)
}

/// Projects and casts a Parquet batch to the declared schema: columns by name
/// (case-insensitively as a fallback), missing columns as nulls.
fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let src = batch.schema();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let idx = src.index_of(field.name()).ok().or_else(|| {
            src.fields()
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(field.name()))
        });
        columns.push(match idx {
            Some(i) => cast(batch.column(i), field.data_type())?,
            None => new_null_array(field.data_type(), batch.num_rows()),
        });
    }
    RecordBatch::try_new(schema.clone(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
            Field::new("n", DataType::Int64, true),
        ]))
    }

    fn config(format: FileFormat, mode: ParseMode, corrupt: bool) -> FileDecoder {
        let mut fields: Vec<Field> = schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if corrupt {
            fields.push(Field::new(CORRUPT_RECORD, DataType::Utf8, true));
        }
        FileDecoder {
            format,
            mode,
            schema: Arc::new(Schema::new(fields)),
        }
    }

    /// `(page, n, corrupt)` of every row.
    fn rows(read: &FileRead) -> Vec<(Option<String>, Option<i64>, Option<String>)> {
        use datafusion::arrow::array::{Array, AsArray};
        use datafusion::arrow::datatypes::Int64Type;
        let mut out = Vec::new();
        for b in &read.batches {
            let page = b.column(0).as_string::<i32>();
            let n = b.column(2).as_primitive::<Int64Type>();
            let corrupt = b
                .schema()
                .index_of(CORRUPT_RECORD)
                .ok()
                .map(|i| b.column(i).as_string::<i32>().clone());
            for i in 0..b.num_rows() {
                out.push((
                    (!page.is_null(i)).then(|| page.value(i).to_string()),
                    (!n.is_null(i)).then(|| n.value(i)),
                    corrupt
                        .as_ref()
                        .and_then(|c| (!c.is_null(i)).then(|| c.value(i).to_string())),
                ));
            }
        }
        out
    }

    /// Good, a type mismatch, broken JSON, non-UTF-8 bytes, a blank line, good.
    const BAD_JSON: &[u8] = b"{\"page\":\"/a\",\"n\":1}\n{\"page\":\"/b\",\"n\":\"many\"}\n{\"page\":\n{\"page\":\"\xff\xfe\",\"n\":3}\n\n{\"page\":\"/c\",\"n\":4}\n";

    #[test]
    fn decoder_errors_lose_their_chunk_line() {
        assert_eq!(
            without_chunk_line(
                "Parser error: Error while parsing value 'x' as type 'Int64' for column 1 at line 0. Row data: '[/b,x]'"
            ),
            "Parser error: Error while parsing value 'x' as type 'Int64' for column 1. Row data: '[/b,x]'"
        );
        assert_eq!(without_chunk_line("at line end"), "at line end");
    }

    /// Files read one after another share the kept buffers: each gives its own rows,
    /// whether it is shorter or longer than the one before (and a malformed one is read
    /// again record by record from the same buffer).
    #[test]
    fn files_read_one_after_another_share_the_kept_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let line = |i: usize| format!("{{\"page\":\"/p{i}\",\"n\":{i}}}\n");
        let long: String = (0..5000).map(line).collect();
        let files = [
            ("long.json", long.clone().into_bytes()),
            ("short.json", line(7).into_bytes()),
            (
                "bad.json",
                b"{\"page\":\"/a\",\"n\":1}\n{\"n\":\"many\"}\n{\"page\":\n{\"n\":4}\n".to_vec(),
            ),
            ("long2.json", format!("{long}{}", line(5000)).into_bytes()),
        ];
        let decoder = config(FileFormat::Json, ParseMode::Permissive, false);
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::write(&path, &text).unwrap();
            let got = rows(&decoder.read(&path).unwrap());
            // An independent reading: line by line with serde_json.
            let want: Vec<Option<i64>> = String::from_utf8_lossy(&text)
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v.get("n")?.as_i64())
                })
                .collect();
            assert_eq!(got.iter().map(|r| r.1).collect::<Vec<_>>(), want, "{name}");
        }
    }

    /// A buffer given back is taken again for a file a little longer than the one it was
    /// made for, by another thread too; a file too large for every kept buffer gets a new
    /// one; and no more than the limit are kept, the largest ones.
    #[test]
    fn kept_text_buffers_are_reused_across_threads_and_bounded() {
        let buffers = TextBuffers::new();
        let _ = buffers.limit.set(2);
        let first = buffers.take(1000);
        assert!(first.capacity() >= 1125, "{}", first.capacity());
        let at = first.as_ptr();
        buffers.give(first);
        let again = std::thread::scope(|s| s.spawn(|| buffers.take(1100)).join().unwrap());
        assert_eq!(again.as_ptr(), at, "the kept buffer is reused");
        assert!(again.is_empty());
        let larger = buffers.take(5000);
        assert_ne!(larger.as_ptr(), at);
        let small = buffers.take(10);
        buffers.give(again);
        buffers.give(larger);
        buffers.give(small);
        let mut kept: Vec<usize> = buffers.kept().iter().map(|t| t.capacity()).collect();
        kept.sort();
        assert_eq!(kept.len(), 2);
        assert!(kept[0] >= 1125 && kept[1] >= 5000, "{kept:?}");
        // A buffer over the size kept is freed.
        buffers.give(Vec::with_capacity(KEPT_TEXT_BUFFER + 1));
        let kept: Vec<usize> = buffers.kept().iter().map(|t| t.capacity()).collect();
        assert!(kept.iter().all(|&c| c <= KEPT_TEXT_BUFFER), "{kept:?}");
        // So is one that would take the kept buffers over their total, below the limit.
        let buffers = TextBuffers::new();
        let _ = buffers.limit.set(4);
        for _ in 0..3 {
            buffers.give(Vec::with_capacity(KEPT_TEXT_BUFFER));
        }
        let kept: Vec<usize> = buffers.kept().iter().map(|t| t.capacity()).collect();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept.iter().sum::<usize>() <= KEPT_TEXT_BYTES, "{kept:?}");
    }

    #[test]
    fn malformed_json_per_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.json");
        std::fs::write(&file, BAD_JSON).unwrap();
        let s = |x: &str| Some(x.to_string());

        let read = config(FileFormat::Json, ParseMode::Permissive, true)
            .read(&file)
            .unwrap();
        assert_eq!(read.malformed, 3);
        let got = rows(&read);
        assert_eq!(got.len(), 5, "{got:?}");
        assert_eq!(got[0], (s("/a"), Some(1), None));
        assert_eq!(got[1], (s("/b"), None, s(r#"{"page":"/b","n":"many"}"#)));
        assert_eq!(got[2], (None, None, s(r#"{"page":"#)));
        assert_eq!(got[3].0, None);
        assert!(got[3].2.as_deref().unwrap().contains("\u{fffd}"), "{got:?}");
        assert_eq!(got[4], (s("/c"), Some(4), None));

        // Without _corrupt_record, PERMISSIVE keeps the rows too.
        let read = config(FileFormat::Json, ParseMode::Permissive, false)
            .read(&file)
            .unwrap();
        assert_eq!((read.malformed, rows(&read).len()), (3, 5));

        let read = config(FileFormat::Json, ParseMode::DropMalformed, true)
            .read(&file)
            .unwrap();
        assert_eq!(read.malformed, 3);
        assert_eq!(
            rows(&read),
            vec![(s("/a"), Some(1), None), (s("/c"), Some(4), None)]
        );
        // Whatever the mode, each one with its line in the file, its text and the reason.
        let lines: Vec<(u64, &str)> = read
            .rejected
            .iter()
            .map(|r| (r.line, r.text.as_str()))
            .collect();
        assert_eq!(
            lines,
            vec![
                (2, r#"{"page":"/b","n":"many"}"#),
                (3, r#"{"page":"#),
                (4, "{\"page\":\"\u{fffd}\u{fffd}\",\"n\":3}")
            ]
        );
        assert!(
            read.rejected[0].error.contains("many"),
            "{:?}",
            read.rejected
        );

        let e = config(FileFormat::Json, ParseMode::FailFast, false)
            .read(&file)
            .unwrap_err();
        assert_eq!(e.sqlstate().code(), "22P02");
        let msg = e.to_string();
        assert!(msg.contains("bad.json line 2"), "{msg}");
    }

    /// What Spark keeps of malformed records in PERMISSIVE mode. Expected rows are PySpark
    /// 4.3.0's for the same lines: `spark.read.format(f).schema("page STRING, n BIGINT,
    /// _corrupt_record STRING").option("mode", "PERMISSIVE")` (CSV with header = true).
    #[test]
    fn permissive_keeps_the_fields_that_parse_like_spark() {
        use datafusion::arrow::array::{Array, AsArray};
        use datafusion::arrow::datatypes::Int64Type;
        let dir = tempfile::tempdir().unwrap();
        let s = |x: &str| Some(x.to_string());
        let json = dir.path().join("p.json");
        std::fs::write(
            &json,
            concat!(
                "{\"page\":\"/b\",\"n\":\"many\"}\n",
                "{\"page\":7,\"n\":5}\n",
                "{\"n\":6}\n",
                "[1,2]\n",
                "\"str\"\n",
                "{\"page\":\"/e\",\"n\":9999999999999999999999}\n",
                "{\"page\":\"/f\",\"n\":null,\"extra\":{\"x\":1}}\n",
            ),
        )
        .unwrap();
        let read = config(FileFormat::Json, ParseMode::Permissive, true)
            .read(&json)
            .unwrap();
        assert_eq!(
            rows(&read),
            vec![
                (s("/b"), None, s(r#"{"page":"/b","n":"many"}"#)),
                (s("7"), Some(5), None),
                (None, Some(6), None),
                (None, None, s("[1,2]")),
                (None, None, s(r#""str""#)),
                (
                    s("/e"),
                    None,
                    s(r#"{"page":"/e","n":9999999999999999999999}"#)
                ),
                (s("/f"), None, None),
            ]
        );
        assert_eq!(read.malformed, 4);

        let csv_file = dir.path().join("p.csv");
        std::fs::write(&csv_file, "page,n\n/a,1\n/b,many\n/c\n/d,4,extra\n/e,5\n").unwrap();
        let mut cfg = config(
            FileFormat::Csv {
                header: true,
                delimiter: b',',
            },
            ParseMode::Permissive,
            true,
        );
        // This test's schema without event_time: (page, n, _corrupt_record).
        cfg.schema = Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
            Field::new(CORRUPT_RECORD, DataType::Utf8, true),
        ]));
        let read = cfg.read(&csv_file).unwrap();
        let got: Vec<_> = read
            .batches
            .iter()
            .flat_map(|b| {
                let page = b.column(0).as_string::<i32>().clone();
                let n = b.column(1).as_primitive::<Int64Type>().clone();
                let c = b.column(2).as_string::<i32>().clone();
                (0..b.num_rows()).map(move |i| {
                    (
                        (!page.is_null(i)).then(|| page.value(i).to_string()),
                        (!n.is_null(i)).then(|| n.value(i)),
                        (!c.is_null(i)).then(|| c.value(i).to_string()),
                    )
                })
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (s("/a"), Some(1), None),
                (s("/b"), None, s("/b,many")),
                (s("/c"), None, s("/c")),
                (s("/d"), Some(4), s("/d,4,extra")),
                (s("/e"), Some(5), None),
            ]
        );
        assert_eq!(read.malformed, 3);
    }

    #[test]
    fn malformed_csv_with_header_per_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.csv");
        std::fs::write(
            &file,
            "page,event_time,n\n/a,2026-06-10T10:00:00,1\n/b,2026-06-10T10:00:00,lots\n/c,,3,extra\n/d,2026-06-10T10:00:00,4\n",
        )
        .unwrap();
        let csv = FileFormat::Csv {
            header: true,
            delimiter: b',',
        };
        let read = config(csv.clone(), ParseMode::DropMalformed, false)
            .read(&file)
            .unwrap();
        assert_eq!(read.malformed, 2);
        let pages: Vec<_> = rows(&read).into_iter().map(|r| r.0.unwrap()).collect();
        assert_eq!(pages, vec!["/a", "/d"]);
        let read = config(csv.clone(), ParseMode::Permissive, true)
            .read(&file)
            .unwrap();
        assert_eq!(
            rows(&read)[1].2.as_deref(),
            Some("/b,2026-06-10T10:00:00,lots")
        );
        let e = config(csv, ParseMode::FailFast, false)
            .read(&file)
            .unwrap_err();
        assert!(e.to_string().contains("bad.csv line 3"), "{e}");
    }

    #[test]
    fn empty_vanished_and_huge_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(FileFormat::Json, ParseMode::FailFast, false);
        let empty = dir.path().join("empty.json");
        std::fs::write(&empty, "").unwrap();
        let read = cfg.read(&empty).unwrap();
        assert_eq!(
            (read.malformed, rows(&read).len(), read.missing),
            (0, 0, false)
        );

        let read = cfg.read(&dir.path().join("gone.json")).unwrap();
        assert!(read.missing);
        assert!(read.batches.is_empty());

        // One 100 MB line: a 100 MB string value.
        let big = dir.path().join("big.json");
        let mut text = Vec::with_capacity(100 << 20);
        text.extend_from_slice(b"{\"page\":\"");
        text.resize(100 << 20, b'x');
        text.extend_from_slice(b"\",\"n\":7}\n{\"page\":\"/after\",\"n\":8}\n");
        std::fs::write(&big, &text).unwrap();
        let read = cfg.read(&big).unwrap();
        let got = rows(&read);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.as_ref().map(String::len), Some((100 << 20) - 9));
        assert_eq!(got[1], (Some("/after".into()), Some(8), None));
    }

    /// JSON lines of several shapes: member order, missing fields, escapes, blank lines.
    fn json_lines(n: usize) -> Vec<u8> {
        let mut text = Vec::new();
        for i in 0..n {
            let line = match i % 4 {
                0 => format!("{{\"page\":\"/p{i}\",\"n\":{i}}}\n"),
                1 => format!("{{\"n\":{i},\"page\":\"a\\\"q\\n{i}\"}}\r\n"),
                2 => format!("{{\"page\":\"/p{i}\"}}\n\n"),
                _ => format!("  {{\"event_time\":\"2026-01-01T00:00:00\",\"n\":{i}}}\n"),
            };
            text.extend_from_slice(line.as_bytes());
        }
        text
    }

    #[test]
    fn line_cuts_fall_after_line_ends_and_leave_no_part_empty() {
        let text = json_lines(101);
        for pieces in 1..12 {
            let cuts = line_cuts(&text, pieces);
            assert_eq!((cuts[0], *cuts.last().unwrap()), (0, text.len()));
            assert!(
                cuts.len() <= pieces + 1 && cuts.len() >= 2,
                "{pieces}: {cuts:?}"
            );
            for w in cuts.windows(2) {
                assert!(w[0] < w[1], "{cuts:?}");
                assert!(w[0] == 0 || text[w[0] - 1] == b'\n', "{cuts:?}");
            }
        }
        assert_eq!(line_cuts(b"{}", 4), vec![0, 2]);
        assert_eq!(line_cuts(b"", 4), vec![0]);
    }

    #[test]
    fn a_file_decoded_in_pieces_gives_the_rows_of_one_piece() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("many.json");
        std::fs::write(&file, json_lines(5000)).unwrap();
        let cfg = config(FileFormat::Json, ParseMode::FailFast, true);
        let whole = rows(&cfg.read(&file).unwrap());
        assert_eq!(whole.len(), 5000);
        // A JSON file too large to hold in memory is streamed through arrow-json alone.
        let streamed = FileRead {
            batches: cfg
                .read_streamed(&std::fs::read(&file).unwrap()[..])
                .unwrap(),
            ..FileRead::default()
        };
        assert_eq!(rows(&streamed), whole);
        for threads in [2, 3, 7] {
            let pieces = cfg.read_pieces(&std::fs::read(&file).unwrap(), threads);
            assert!(pieces.is_some(), "{threads}");
            let read = cfg.read_with(&file, threads, 1).unwrap();
            assert_eq!(rows(&read), whole, "{threads}");
        }

        // CSV with a header: only the first piece skips it.
        let csv = dir.path().join("many.csv");
        let mut text = b"page,event_time,n\n".to_vec();
        for i in 0..3000 {
            text.extend_from_slice(format!("/p{i},2026-01-01T00:00:0{},{i}\n", i % 10).as_bytes());
        }
        std::fs::write(&csv, &text).unwrap();
        let format = FileFormat::Csv {
            header: true,
            delimiter: b',',
        };
        let cfg = config(format, ParseMode::FailFast, false);
        let whole = rows(&cfg.read(&csv).unwrap());
        assert_eq!(whole.len(), 3000);
        assert!(cfg.read_pieces(&text, 3).is_some());
        assert_eq!(rows(&cfg.read_with(&csv, 3, 1).unwrap()), whole);
    }

    #[test]
    fn a_file_that_cannot_be_cut_is_decoded_in_one_piece() {
        let dir = tempfile::tempdir().unwrap();
        // A JSON object over several lines: any cut inside it truncates one piece.
        let file = dir.path().join("pretty.json");
        let mut text = json_lines(40);
        text.extend_from_slice(b"{\n\"page\":\n\"/pretty\",\n\"n\":\n9\n}\n");
        text.extend_from_slice(&json_lines(40));
        std::fs::write(&file, &text).unwrap();
        let cfg = config(FileFormat::Json, ParseMode::FailFast, false);
        let whole = rows(&cfg.read(&file).unwrap());
        assert_eq!(whole.len(), 81);
        assert!(whole.contains(&(Some("/pretty".into()), Some(9), None)));
        assert!(cfg.read_pieces(&text, 200).is_none());
        assert_eq!(rows(&cfg.read_with(&file, 200, 1).unwrap()), whole);

        // Malformed records: the pieces fail, the record-by-record path decides.
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, BAD_JSON).unwrap();
        let cfg = config(FileFormat::Json, ParseMode::Permissive, true);
        let one = cfg.read(&bad).unwrap();
        let split = cfg.read_with(&bad, 4, 1).unwrap();
        assert_eq!((split.malformed, rows(&split)), (one.malformed, rows(&one)));
        let cfg = config(FileFormat::Json, ParseMode::FailFast, true);
        assert!(cfg.read_with(&bad, 4, 1).is_err());

        // CSV with a quoted line end is never cut.
        let csv = dir.path().join("quoted.csv");
        let text = b"/a,,1\n\"/b\nc\",,2\n/d,,3\n/e,,4\n".to_vec();
        std::fs::write(&csv, &text).unwrap();
        let format = FileFormat::Csv {
            header: false,
            delimiter: b',',
        };
        let cfg = config(format, ParseMode::FailFast, false);
        assert!(cfg.read_pieces(&text, 4).is_none());
        assert_eq!(
            rows(&cfg.read_with(&csv, 4, 1).unwrap()),
            rows(&cfg.read(&csv).unwrap())
        );
    }
}
