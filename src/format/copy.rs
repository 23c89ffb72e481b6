//! Postgres's `COPY ... FROM STDIN` data formats, `text` and `csv`, decoded into Arrow
//! batches of a table's schema, as Postgres reads them:
//!
//! - `text`: one row per line, fields split by the delimiter (tab), `\N` for NULL,
//!   backslash escapes (`\t`, `\n`, `\\`, `\123`, `\x41`, ...), `\.` alone ends the data;
//! - `csv`: RFC 4180 fields with the quote (`"`) and escape (the quote) characters, quoted
//!   fields may hold delimiters and newlines, an unquoted empty field is NULL, `HEADER`
//!   skips the first line.
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
    /// 22003: a number out of its type's range.
    OutOfRange,
    /// 23502: a NULL in a NOT NULL column.
    NotNull,
}

fn bad(kind: CopyError, message: String) -> Error {
    let state = match kind {
        CopyError::Format => SqlState::BadCopyFileFormat,
        CopyError::InvalidText => SqlState::InvalidTextRepresentation,
        CopyError::OutOfRange => SqlState::NumericValueOutOfRange,
        CopyError::NotNull => SqlState::NotNullViolation,
    };
    Error::BadCopy { state, message }
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
    /// The text format's end marker `\.` was seen.
    ended: bool,
    error: Option<Error>,
    rows: u64,
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
            error: None,
            rows: 0,
        })
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
        if !self.pending.is_empty() && self.error.is_none() && !self.ended {
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

    fn fail(&mut self, kind: CopyError, message: String) {
        if self.error.is_none() {
            self.error = Some(bad(
                kind,
                format!("{message} (COPY {}, line {})", self.table, self.line),
            ));
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
                        (
                            CopyError::InvalidText,
                            format!("invalid input syntax for type {ty}: \"{value}\""),
                        )
                    };
                    let msg = format!("{msg}, column {}", field.name());
                    return self.fail(kind, msg);
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
        (e.sqlstate().code().to_string(), e.to_string())
    }

    #[test]
    fn bad_rows_are_refused_with_their_line_and_postgres_sqlstate() {
        let ok = "1\t2026-06-10 10:00:00\tx\n";
        let cases = [
            (format!("{ok}2\tnot a time\tx\n"), "22P02", "line 2"),
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
}
