//! Postgres's `COPY ... FROM STDIN` data formats, `text` and `csv`, decoded into Arrow
//! batches of a table's schema, as Postgres reads them:
//!
//! - `text`: one row per line, fields split by the delimiter (tab), `\N` for NULL,
//!   backslash escapes (`\t`, `\n`, `\\`, `\123`, `\x41`, ...), `\.` alone ends the data;
//! - `csv`: RFC 4180 fields with the quote (`"`) and escape (the quote) characters, quoted
//!   fields may hold delimiters and newlines, an unquoted empty field is NULL, `HEADER`
//!   skips the first line.
//!
//! - `binary`: Postgres's binary tuples after the `PGCOPY` signature, each field's bytes in
//!   the binary form of its column's type (integers, floats, booleans, text, dates,
//!   timestamps, numerics), the trailer `-1` ends the data; the "line" of an error is the
//!   tuple's number.
//!
//! Data arrives in arbitrary chunks ([`CopyDecoder::feed`]); a row is decoded once its line
//! is complete. The first bad row (a field count that does not match, a value that does not
//! convert, a NULL in a NOT NULL column) is kept as the error, with its line number, and
//! the rest is ignored: the statement then appends nothing.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, StringBuilder, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::FormatOptions;

use crate::error::{Error, Result, SqlState};
pub use crate::sql::copy::{CopyFormat, CopyOptions};

/// Rows per decoded batch.
const BATCH_ROWS: usize = 16 * 1024;

/// Why a COPY row was refused, as the SQLSTATE Postgres sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyError {
    /// 22P04: the data is not in the format (field count, unterminated quote).
    Format,
    /// 22P02: a value that does not convert to its column's type.
    InvalidText,
    /// 22007: a value that is no date or time of its column's type.
    InvalidDatetime,
    /// 22003: a number out of its type's range.
    OutOfRange,
    /// 23502: a NULL in a NOT NULL column.
    NotNull,
    /// 22P03: binary data that is not its type's binary form.
    Binary,
}

fn bad(kind: CopyError, message: String, context: Option<String>) -> Error {
    let state = match kind {
        CopyError::Format => SqlState::BadCopyFileFormat,
        CopyError::InvalidText => SqlState::InvalidTextRepresentation,
        CopyError::InvalidDatetime => SqlState::InvalidDatetimeFormat,
        CopyError::OutOfRange => SqlState::NumericValueOutOfRange,
        CopyError::NotNull => SqlState::NotNullViolation,
        CopyError::Binary => SqlState::InvalidBinaryRepresentation,
    };
    Error::BadCopy {
        state,
        message,
        context,
    }
}

/// Decodes the data of one `COPY ... FROM STDIN`.
pub struct CopyDecoder {
    table: String,
    schema: SchemaRef,
    /// For each field of a line, its column in `schema`.
    columns: Vec<usize>,
    options: CopyOptions,
    builders: Vec<StringBuilder>,
    /// The line number of each buffered row.
    lines: Vec<u64>,
    batches: Vec<RecordBatch>,
    /// Bytes of an incomplete line.
    pending: Vec<u8>,
    /// Lines seen (the number of the last complete line).
    line: u64,
    /// Whether `pending` is inside a quoted CSV field.
    in_quotes: bool,
    /// The text format's end marker `\.` (binary: the trailer) was seen.
    ended: bool,
    /// Binary: the signature and header were read.
    header_done: bool,
    error: Option<Error>,
    rows: u64,
    /// Rows pushed by an `INSERT` (not COPY data): errors name the row, not a line.
    insert: bool,
}

impl CopyDecoder {
    /// `columns`: the column list of `COPY t (a, b)`, or `None` for every column in order.
    pub fn new(
        table: &str,
        schema: SchemaRef,
        columns: Option<&[String]>,
        options: CopyOptions,
    ) -> Result<CopyDecoder> {
        let columns = match columns {
            None => (0..schema.fields().len()).collect(),
            Some(names) => {
                let mut idx = Vec::with_capacity(names.len());
                for n in names {
                    let i = schema.index_of(n).map_err(|_| Error::UndefinedColumn {
                        column: n.clone(),
                        relation: table.to_string(),
                    })?;
                    if idx.contains(&i) {
                        return Err(Error::Syntax(format!(
                            "column \"{n}\" specified more than once"
                        )));
                    }
                    idx.push(i);
                }
                idx
            }
        };
        let builders = columns.iter().map(|_| StringBuilder::new()).collect();
        Ok(CopyDecoder {
            table: table.to_string(),
            schema,
            columns,
            options,
            builders,
            lines: Vec::new(),
            batches: Vec::new(),
            pending: Vec::new(),
            line: 0,
            in_quotes: false,
            ended: false,
            header_done: false,
            error: None,
            rows: 0,
            insert: false,
        })
    }

    /// A decoder of the rows of an `INSERT` whose values arrive as text (bound
    /// parameters): the same conversions, checks and SQLSTATEs as COPY's.
    pub fn for_insert(
        table: &str,
        schema: SchemaRef,
        columns: Option<&[String]>,
    ) -> Result<CopyDecoder> {
        let mut d = CopyDecoder::new(table, schema, columns, CopyOptions::text())?;
        d.insert = true;
        Ok(d)
    }

    /// One row of field texts (`None` is NULL), in the column order of [`CopyDecoder::new`].
    pub fn push_row(&mut self, fields: Vec<Option<String>>) {
        if self.error.is_some() {
            return;
        }
        self.line += 1;
        if fields.len() != self.columns.len() {
            return self.fail(
                CopyError::Format,
                format!(
                    "expected {} values, got {}",
                    self.columns.len(),
                    fields.len()
                ),
            );
        }
        self.append_fields(fields);
    }

    /// Buffers one row's fields (their count checked), flushing a full batch.
    fn append_fields(&mut self, fields: Vec<Option<String>>) {
        for (b, f) in self.builders.iter_mut().zip(fields) {
            match f {
                Some(v) => b.append_value(v),
                None => b.append_null(),
            }
        }
        self.lines.push(self.line);
        if self.lines.len() >= BATCH_ROWS {
            self.flush();
        }
    }

    /// The number of columns each line holds.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// Takes the next chunk of data.
    pub fn feed(&mut self, data: &[u8]) {
        if self.error.is_some() || self.ended {
            return;
        }
        if self.options.format == CopyFormat::Binary {
            return self.feed_binary(data);
        }
        let mut start = 0;
        for (i, &b) in data.iter().enumerate() {
            if self.options.format == CopyFormat::Csv && b == self.options.quote {
                self.in_quotes = !self.in_quotes;
            }
            if b == b'\n' && !self.in_quotes {
                self.pending.extend_from_slice(&data[start..i]);
                start = i + 1;
                let line = std::mem::take(&mut self.pending);
                self.line_done(&line);
                if self.error.is_some() || self.ended {
                    return;
                }
            }
        }
        self.pending.extend_from_slice(&data[start..]);
    }

    /// The end of the data: every row, in batches of the table's schema, or the first error.
    pub fn finish(mut self) -> Result<(u64, Vec<RecordBatch>)> {
        if self.options.format == CopyFormat::Binary {
            if self.error.is_none()
                && !self.ended
                && (!self.pending.is_empty() || !self.header_done)
            {
                self.line += 1;
                self.fail(CopyError::Format, "unexpected EOF in COPY data".into());
            }
        } else if !self.pending.is_empty() && self.error.is_none() && !self.ended {
            if self.in_quotes {
                self.line += 1;
                self.fail(
                    CopyError::Format,
                    "unterminated CSV quoted field".to_string(),
                );
            } else {
                let line = std::mem::take(&mut self.pending);
                self.line_done(&line);
            }
        }
        if self.error.is_none() {
            self.flush();
        }
        match self.error {
            Some(e) => Err(e),
            None => Ok((self.rows, self.batches)),
        }
    }

    /// Binary data: the header once, then every complete tuple; an incomplete one waits
    /// for the next chunk.
    fn feed_binary(&mut self, data: &[u8]) {
        const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
        self.pending.extend_from_slice(data);
        let buf = std::mem::take(&mut self.pending);
        let mut pos = 0;
        let be16 = |b: &[u8]| i16::from_be_bytes([b[0], b[1]]);
        let be32 = |b: &[u8]| i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if !self.header_done {
            if buf.len() < 19 {
                self.pending = buf;
                return;
            }
            if &buf[..11] != SIGNATURE {
                return self.fail(
                    CopyError::Format,
                    "COPY file signature not recognized".into(),
                );
            }
            if be32(&buf[11..15]) & (1 << 16) != 0 {
                return self.fail(
                    CopyError::Format,
                    "binary COPY with OIDs is not supported".into(),
                );
            }
            let ext = be32(&buf[15..19]).max(0) as usize;
            if buf.len() < 19 + ext {
                self.pending = buf;
                return;
            }
            pos = 19 + ext;
            self.header_done = true;
        }
        let width = self.columns.len();
        'tuples: loop {
            let start = pos;
            if buf.len() < pos + 2 {
                break;
            }
            let n = be16(&buf[pos..]);
            pos += 2;
            if n == -1 {
                self.ended = true;
                pos = buf.len();
                break;
            }
            self.line += 1;
            if n < 0 || n as usize != width {
                return self.fail(
                    CopyError::Format,
                    format!("row field count is {n}, expected {width}"),
                );
            }
            let mut fields: Vec<Option<&[u8]>> = Vec::with_capacity(width);
            for _ in 0..width {
                if buf.len() < pos + 4 {
                    self.line -= 1;
                    pos = start;
                    break 'tuples;
                }
                let len = be32(&buf[pos..]);
                pos += 4;
                if len == -1 {
                    fields.push(None);
                    continue;
                }
                if len < 0 {
                    return self.fail(CopyError::Format, format!("invalid field size {len}"));
                }
                let len = len as usize;
                if buf.len() < pos + len {
                    self.line -= 1;
                    pos = start;
                    break 'tuples;
                }
                fields.push(Some(&buf[pos..pos + len]));
                pos += len;
            }
            for (k, f) in fields.into_iter().enumerate() {
                match f {
                    None => self.builders[k].append_null(),
                    Some(bytes) => {
                        let field = self.schema.field(self.columns[k]);
                        match binary_to_text(field.data_type(), bytes) {
                            Ok(text) => self.builders[k].append_value(text),
                            Err(msg) => {
                                let name = field.name().clone();
                                return self.fail_at(CopyError::Binary, msg, Some(&name), None);
                            }
                        }
                    }
                }
            }
            self.lines.push(self.line);
            if self.lines.len() >= BATCH_ROWS {
                self.flush();
                if self.error.is_some() {
                    return;
                }
            }
        }
        self.pending = buf[pos..].to_vec();
    }

    fn fail(&mut self, kind: CopyError, message: String) {
        self.fail_at(kind, message, None, None);
    }

    /// The first error of the data. Postgres's message; where it was (`COPY t, line 2,
    /// column ts: "x"`) is the error's context (psql's `CONTEXT:` line). An INSERT's rows
    /// (the extended protocol's fast path) have no such context.
    fn fail_at(
        &mut self,
        kind: CopyError,
        message: String,
        column: Option<&str>,
        value: Option<&str>,
    ) {
        if self.error.is_none() {
            let context = (!self.insert).then(|| {
                let mut at = format!("COPY {}, line {}", self.table, self.line);
                if let Some(c) = column {
                    at.push_str(&format!(", column {c}"));
                    if let Some(v) = value {
                        at.push_str(&format!(": \"{v}\""));
                    }
                }
                at
            });
            self.error = Some(bad(kind, message, context));
        }
    }

    fn line_done(&mut self, raw: &[u8]) {
        self.line += 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if self.line == 1 && self.options.header {
            return;
        }
        if self.options.format == CopyFormat::Text && raw == b"\\." {
            self.ended = true;
            return;
        }
        let fields = match self.options.format {
            CopyFormat::Text => split_text(raw, self.options.delimiter, &self.options.null),
            CopyFormat::Csv => split_csv(raw, &self.options),
            CopyFormat::Binary => Err("binary data is not read by lines".to_string()),
        };
        let fields = match fields {
            Ok(f) => f,
            Err(msg) => return self.fail(CopyError::Format, msg),
        };
        if fields.len() != self.columns.len() {
            let msg = if fields.len() > self.columns.len() {
                "extra data after last expected column".to_string()
            } else {
                let missing = self.schema.field(self.columns[fields.len()]).name();
                format!("missing data for column \"{missing}\"")
            };
            return self.fail(CopyError::Format, msg);
        }
        self.append_fields(fields);
    }

    /// Converts the buffered rows into a batch of the table's types.
    fn flush(&mut self) {
        if self.lines.is_empty() {
            return;
        }
        let n = self.lines.len();
        let mut columns: Vec<ArrayRef> = self
            .schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), n))
            .collect();
        let options = CastOptions {
            safe: false,
            format_options: FormatOptions::default(),
        };
        let lines = std::mem::take(&mut self.lines);
        for (k, b) in self.builders.iter_mut().enumerate() {
            let text: ArrayRef = Arc::new(b.finish());
            let field = self.schema.field(self.columns[k]);
            let typed = if field.data_type() == &DataType::Utf8 {
                Ok(text.clone())
            } else {
                cast_with_options(&text, field.data_type(), &options)
            };
            match typed {
                Ok(a) => columns[self.columns[k]] = a,
                Err(_) => {
                    // Find the first value that does not convert, for its line.
                    let safe = cast_with_options(&text, field.data_type(), &CastOptions::default());
                    let strings = text
                        .as_any()
                        .downcast_ref::<datafusion::arrow::array::StringArray>();
                    let (row, value) = match (safe, strings) {
                        (Ok(s), Some(strings)) => (0..n)
                            .find(|&i| !strings.is_null(i) && s.is_null(i))
                            .map(|i| (i, strings.value(i).to_string()))
                            .unwrap_or((0, String::new())),
                        _ => (0, String::new()),
                    };
                    self.line = lines[row];
                    let ty = crate::sql::types::arrow_to_sql(field.data_type()).to_lowercase();
                    let (kind, msg) = if is_number(&value) && is_numeric(field.data_type()) {
                        (
                            CopyError::OutOfRange,
                            format!("value \"{value}\" is out of range for type {ty}"),
                        )
                    } else {
                        let kind = match field.data_type() {
                            DataType::Date32
                            | DataType::Date64
                            | DataType::Timestamp(_, _)
                            | DataType::Time32(_)
                            | DataType::Time64(_) => CopyError::InvalidDatetime,
                            _ => CopyError::InvalidText,
                        };
                        (
                            kind,
                            format!("invalid input syntax for type {ty}: \"{value}\""),
                        )
                    };
                    let name = field.name().clone();
                    return self.fail_at(kind, msg, Some(&name), Some(&value));
                }
            }
        }
        for (i, f) in self.schema.fields().iter().enumerate() {
            if !f.is_nullable() && columns[i].null_count() > 0 {
                let row = (0..n).find(|&r| columns[i].is_null(r)).unwrap_or(0);
                self.line = lines[row];
                let msg = format!(
                    "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                    f.name(),
                    self.table
                );
                return self.fail(CopyError::NotNull, msg);
            }
        }
        match RecordBatch::try_new(self.schema.clone(), columns) {
            Ok(b) => {
                self.rows += n as u64;
                self.batches.push(b);
            }
            Err(e) => self.fail(CopyError::InvalidText, e.to_string()),
        }
    }
}

/// One field of binary COPY data as the text its column's cast reads (the values are then
/// converted, checked and reported like text and CSV data).
pub fn binary_to_text(ty: &DataType, b: &[u8]) -> std::result::Result<String, String> {
    let wrong = |what: &str| {
        format!(
            "incorrect binary data format for {what} ({} bytes)",
            b.len()
        )
    };
    let int = |b: &[u8]| -> std::result::Result<i64, String> {
        Ok(match b.len() {
            2 => i16::from_be_bytes([b[0], b[1]]) as i64,
            4 => i32::from_be_bytes([b[0], b[1], b[2], b[3]]) as i64,
            8 => i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            _ => return Err(wrong("an integer")),
        })
    };
    // Postgres counts days and microseconds from 2000-01-01.
    const EPOCH_2000_DAYS: i64 = 10_957;
    match ty {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            Ok(int(b)?.to_string())
        }
        DataType::Float32 | DataType::Float64 => match b.len() {
            4 => Ok(f32::from_be_bytes([b[0], b[1], b[2], b[3]]).to_string()),
            8 => Ok(
                f64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]).to_string(),
            ),
            _ => Err(wrong("a float")),
        },
        DataType::Boolean => match b {
            [0] => Ok("false".into()),
            [1] => Ok("true".into()),
            _ => Err(wrong("a boolean")),
        },
        DataType::Utf8 => String::from_utf8(b.to_vec())
            .map_err(|_| "invalid byte sequence for encoding \"UTF8\"".to_string()),
        DataType::Date32 => {
            if b.len() != 4 {
                return Err(wrong("a date"));
            }
            let days = int(b)? + EPOCH_2000_DAYS;
            chrono::DateTime::from_timestamp(days * 86_400, 0)
                .map(|d| d.format("%Y-%m-%d").to_string())
                .ok_or_else(|| "date out of range".to_string())
        }
        DataType::Timestamp(_, tz) => {
            if b.len() != 8 {
                return Err(wrong("a timestamp"));
            }
            let us = int(b)?
                .checked_add(EPOCH_2000_DAYS * 86_400_000_000)
                .ok_or_else(|| "timestamp out of range".to_string())?;
            let t = chrono::DateTime::from_timestamp_micros(us)
                .ok_or_else(|| "timestamp out of range".to_string())?;
            let text = t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.6f").to_string();
            Ok(if tz.is_some() { text + "+00:00" } else { text })
        }
        DataType::Decimal128(..) => numeric_text(b),
        other => Err(format!(
            "binary COPY into a {} column is not supported",
            crate::sql::types::arrow_to_sql(other)
        )),
    }
}

/// Postgres's binary `numeric`: digit count, weight (of the first base-10000 digit), sign,
/// display scale, then the base-10000 digits.
fn numeric_text(b: &[u8]) -> std::result::Result<String, String> {
    let bad = || "incorrect binary data format for a numeric".to_string();
    if b.len() < 8 {
        return Err(bad());
    }
    let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let ndigits = u16_at(0) as usize;
    let weight = i16::from_be_bytes([b[2], b[3]]) as i64;
    let sign = u16_at(4);
    let dscale = u16_at(6) as usize;
    if b.len() != 8 + 2 * ndigits {
        return Err(bad());
    }
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Ok("NaN".into()),
        _ => return Err(bad()),
    }
    let digit = |i: i64| -> u16 {
        if i < 0 || i as usize >= ndigits {
            0
        } else {
            u16_at(8 + 2 * i as usize)
        }
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    if weight < 0 {
        out.push('0');
    } else {
        for p in 0..=weight {
            if p == 0 {
                out.push_str(&digit(p).to_string());
            } else {
                out.push_str(&format!("{:04}", digit(p)));
            }
        }
    }
    if dscale > 0 {
        let mut frac = String::new();
        for p in 1..=dscale.div_ceil(4) as i64 {
            frac.push_str(&format!("{:04}", digit(weight + p)));
        }
        frac.truncate(dscale);
        out.push('.');
        out.push_str(&frac);
    }
    Ok(out)
}

fn is_numeric(t: &DataType) -> bool {
    t.is_integer() || t.is_floating() || matches!(t, DataType::Decimal128(..))
}

fn is_number(s: &str) -> bool {
    let s = s.trim();
    !s.is_empty() && s.parse::<f64>().is_ok()
}

/// Splits a text-format line into fields, undoing backslash escapes.
fn split_text(
    line: &[u8],
    delimiter: u8,
    null: &str,
) -> std::result::Result<Vec<Option<String>>, String> {
    let mut out = Vec::new();
    let mut field = Vec::new();
    let mut raw_field_start = 0;
    let mut i = 0;
    let finish = |field: &mut Vec<u8>,
                  raw: &[u8],
                  out: &mut Vec<Option<String>>|
     -> std::result::Result<(), String> {
        if raw == null.as_bytes() {
            out.push(None);
        } else {
            out.push(Some(String::from_utf8(std::mem::take(field)).map_err(
                |_| "invalid byte sequence for encoding \"UTF8\"".to_string(),
            )?));
        }
        field.clear();
        Ok(())
    };
    while i < line.len() {
        let b = line[i];
        if b == delimiter {
            finish(&mut field, &line[raw_field_start..i], &mut out)?;
            raw_field_start = i + 1;
            i += 1;
            continue;
        }
        if b == b'\\' && i + 1 < line.len() {
            let c = line[i + 1];
            i += 2;
            match c {
                b'n' => field.push(b'\n'),
                b't' => field.push(b'\t'),
                b'r' => field.push(b'\r'),
                b'b' => field.push(8),
                b'f' => field.push(12),
                b'v' => field.push(11),
                b'0'..=b'7' => {
                    let mut v = u32::from(c - b'0');
                    let mut k = 0;
                    while k < 2 && i < line.len() && (b'0'..=b'7').contains(&line[i]) {
                        v = v * 8 + u32::from(line[i] - b'0');
                        i += 1;
                        k += 1;
                    }
                    field.push(v as u8);
                }
                b'x' if i < line.len() && line[i].is_ascii_hexdigit() => {
                    let mut v = 0u32;
                    let mut k = 0;
                    while k < 2 && i < line.len() && line[i].is_ascii_hexdigit() {
                        v = v * 16 + (line[i] as char).to_digit(16).unwrap_or(0);
                        i += 1;
                        k += 1;
                    }
                    field.push(v as u8);
                }
                other => field.push(other),
            }
            continue;
        }
        field.push(b);
        i += 1;
    }
    finish(&mut field, &line[raw_field_start..], &mut out)?;
    Ok(out)
}

/// Splits one CSV record (which may span lines) into fields. An unquoted field equal to
/// the NULL string is NULL; a quoted one never is.
fn split_csv(record: &[u8], o: &CopyOptions) -> std::result::Result<Vec<Option<String>>, String> {
    let mut out = Vec::new();
    let mut field = Vec::new();
    let mut quoted = false;
    let mut in_quotes = false;
    let mut i = 0;
    let push = |field: &mut Vec<u8>,
                quoted: bool,
                out: &mut Vec<Option<String>>|
     -> std::result::Result<(), String> {
        let text = String::from_utf8(std::mem::take(field))
            .map_err(|_| "invalid byte sequence for encoding \"UTF8\"".to_string())?;
        out.push(if !quoted && text == o.null {
            None
        } else {
            Some(text)
        });
        Ok(())
    };
    while i < record.len() {
        let b = record[i];
        if in_quotes {
            if b == o.escape && o.escape != o.quote && i + 1 < record.len() {
                field.push(record[i + 1]);
                i += 2;
                continue;
            }
            if b == o.quote {
                if o.escape == o.quote && record.get(i + 1) == Some(&o.quote) {
                    field.push(o.quote);
                    i += 2;
                    continue;
                }
                in_quotes = false;
                i += 1;
                continue;
            }
            field.push(b);
        } else if b == o.quote {
            in_quotes = true;
            quoted = true;
        } else if b == o.delimiter {
            push(&mut field, quoted, &mut out)?;
            quoted = false;
        } else {
            field.push(b);
        }
        i += 1;
    }
    if in_quotes {
        return Err("unterminated CSV quoted field".into());
    }
    push(&mut field, quoted, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema, TimeUnit};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("note", DataType::Utf8, true),
        ]))
    }

    fn decode(options: CopyOptions, chunks: &[&str]) -> Result<(u64, Vec<RecordBatch>)> {
        let mut d = CopyDecoder::new("events", schema(), None, options).unwrap();
        for c in chunks {
            d.feed(c.as_bytes());
        }
        d.finish()
    }

    fn notes(batches: &[RecordBatch]) -> Vec<Option<String>> {
        batches
            .iter()
            .flat_map(|b| {
                let c = b.column(2).as_string::<i32>();
                (0..c.len())
                    .map(|i| (!c.is_null(i)).then(|| c.value(i).to_string()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn text_format_with_escapes_nulls_and_the_end_marker() {
        // Split in the middle of a line and of an escape.
        let (rows, b) = decode(
            CopyOptions::text(),
            &[
                "1\t2026-06-10 10:00:00\ta\\tb\n2\t\\N\t\\",
                "N\n3\t2026-06-10 10:02:00\tx\\\\y \\101\\x42\n\\.\n4\tignored\tafter end\n",
            ],
        )
        .unwrap();
        assert_eq!(rows, 3);
        assert_eq!(
            notes(&b),
            vec![Some("a\tb".into()), None, Some("x\\y AB".into())]
        );
        let ids: &Int64Array = b[0].column(0).as_primitive::<Int64Type>();
        assert_eq!(ids.values().to_vec(), vec![1, 2, 3]);
        assert!(b[0].column(1).is_null(1));
    }

    #[test]
    fn csv_with_header_quotes_newlines_and_nulls() {
        let (rows, b) = decode(
            CopyOptions {
                header: true,
                ..CopyOptions::csv()
            },
            &[
                "id,ts,note\n1,2026-06-10 10:00:00,\"a, \"\"quoted\"\"\nline\"\n",
                "2,,\n3,2026-06-10 10:00:00,\"\"\r\n",
            ],
        )
        .unwrap();
        assert_eq!(rows, 3);
        assert_eq!(
            notes(&b),
            vec![
                Some("a, \"quoted\"\nline".into()),
                None,
                Some(String::new())
            ]
        );
    }

    fn error_of(options: CopyOptions, data: &str) -> (String, String) {
        let e = decode(options, &[data]).unwrap_err();
        let context = e.context().unwrap_or_default();
        (e.sqlstate().code().to_string(), format!("{e} | {context}"))
    }

    #[test]
    fn bad_rows_are_refused_with_their_line_and_postgres_sqlstate() {
        let ok = "1\t2026-06-10 10:00:00\tx\n";
        let cases = [
            (
                format!("{ok}2\tnot a time\tx\n"),
                "22007",
                "| COPY events, line 2, column ts: \"not a time\"",
            ),
            (
                format!("{ok}{ok}x\t2026-06-10 10:00:00\tx\n"),
                "22P02",
                "line 3",
            ),
            (
                format!("{ok}99999999999999999999\t\\N\tx\n"),
                "22003",
                "line 2",
            ),
            (format!("{ok}\\N\t\\N\tx\n"), "23502", "line 2"),
            (
                format!("{ok}1\t\\N\n"),
                "22P04",
                "missing data for column \"note\"",
            ),
            (format!("{ok}1\t\\N\tx\textra\n"), "22P04", "extra data"),
        ];
        for (data, code, text) in cases {
            let (c, msg) = error_of(CopyOptions::text(), &data);
            assert_eq!(c, code, "{data:?}: {msg}");
            assert!(msg.contains(text), "{msg} should contain {text}");
        }
        let (c, msg) = error_of(CopyOptions::csv(), "1,,\"open\n");
        assert_eq!(c, "22P04", "{msg}");
    }

    #[test]
    fn a_column_list_fills_the_others_with_null() {
        let cols = vec!["note".to_string(), "id".to_string()];
        let mut d = CopyDecoder::new("events", schema(), Some(&cols), CopyOptions::csv()).unwrap();
        d.feed(b"hello,7\n");
        let (rows, b) = d.finish().unwrap();
        assert_eq!(rows, 1);
        assert_eq!(b[0].column(0).as_primitive::<Int64Type>().value(0), 7);
        assert!(b[0].column(1).is_null(0));
        assert_eq!(notes(&b), vec![Some("hello".into())]);
        let e = CopyDecoder::new(
            "events",
            schema(),
            Some(&["nope".to_string()]),
            CopyOptions::csv(),
        )
        .err()
        .unwrap();
        assert_eq!(e.sqlstate().code(), "42703");
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Both texts are PostgreSQL 15's `COPY (...) TO STDOUT` of the same two rows, binary
    /// and text: decoding either gives the same batch.
    #[test]
    fn binary_format_decodes_as_postgres_wrote_it() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i2", DataType::Int16, true),
            Field::new("i4", DataType::Int32, true),
            Field::new("i8", DataType::Int64, true),
            Field::new("f4", DataType::Float32, true),
            Field::new("f8", DataType::Float64, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("t", DataType::Utf8, true),
            Field::new("d", DataType::Date32, true),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new(
                "tz",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("n", DataType::Decimal128(10, 2), true),
        ]));
        let binary = hex(
            "5047434f50590aff0d0a000000000000000000000b0000000200010000000400000002000000080000\
             000000000003000000043fc0000000000008400200000000000000000001010000000668c3a96c6c6f\
             00000004000025b9000000080002f6e2134aaa40000000080002f6e21348c8000000000c0002000000\
             000002000c0d48000bffffffff00000004fffffffe00000008ffffffff4d2fa200ffffffff00000008\
             bfe00000000000000000000100ffffffff00000004ffffffff00000008fffca2fec4c82000ffffffff\
             0000000a0001ffff400000020064ffff",
        );
        let text = "1\t2\t3\t1.5\t2.25\tt\th\u{e9}llo\t2026-06-10\t2026-06-10 10:00:00.123456\t\
                    2026-06-10 10:00:00+00\t12.34\n\
                    \\N\t-2\t-3000000000\t\\N\t-0.5\tf\t\\N\t1999-12-31\t1970-01-01 00:00:00\t\
                    \\N\t-0.01\n";
        let mut from_text =
            CopyDecoder::new("all", schema.clone(), None, CopyOptions::text()).unwrap();
        from_text.feed(text.as_bytes());
        let (n, want) = from_text.finish().unwrap();
        assert_eq!(n, 2);
        let mut options = CopyOptions::text();
        options.format = CopyFormat::Binary;
        // Fed in 7-byte chunks: tuples and fields split across chunks.
        let mut d = CopyDecoder::new("all", schema.clone(), None, options.clone()).unwrap();
        for chunk in binary.chunks(7) {
            d.feed(chunk);
        }
        let (rows, got) = d.finish().unwrap();
        assert_eq!(rows, 2);
        assert_eq!(got, want);

        // A truncated stream, a wrong field count, a bad value: errors with the tuple number.
        let mut d = CopyDecoder::new("all", schema.clone(), None, options.clone()).unwrap();
        d.feed(&binary[..binary.len() - 10]);
        let e = d.finish().unwrap_err();
        assert_eq!(e.sqlstate(), SqlState::BadCopyFileFormat, "{e}");
        let mut d = CopyDecoder::new(
            "all",
            schema.clone(),
            Some(&["i2".to_string()]),
            options.clone(),
        )
        .unwrap();
        d.feed(&binary);
        let e = d.finish().unwrap_err();
        let e = format!("{e} | {}", e.context().unwrap_or_default());
        assert!(
            e.contains("row field count is 11, expected 1") && e.contains("line 1"),
            "{e}"
        );
        let mut bad = binary.clone();
        bad[71] = 0x05; // the boolean of row 1
        let mut d = CopyDecoder::new("all", schema, None, options).unwrap();
        d.feed(&bad);
        let e = d.finish().unwrap_err();
        assert_eq!(e.sqlstate(), SqlState::InvalidBinaryRepresentation, "{e}");
    }

    /// Encodings from PostgreSQL 15's `numeric_send`.
    #[test]
    fn binary_numerics_as_postgres_sends_them() {
        for (bytes, text) in [
            ("0002000000000002007b1194", "123.45"),
            ("0001ffff00000003000a", "0.001"),
            ("0003000140000001000100001388", "-10000.5"),
            ("0000000000000000", "0"),
            (
                "0006000300000006000c0d801ed204d200000064",
                "12345678901234.000001",
            ),
            ("00000000c0000000", "NaN"),
        ] {
            assert_eq!(numeric_text(&hex(bytes)).unwrap(), text, "{bytes}");
        }
        assert!(numeric_text(&hex("0002000000")).is_err());
    }
}
