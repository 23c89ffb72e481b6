//! Avro values: single Avro datums (a Kafka record's value) decoded into Arrow, with the
//! schema given inline as Spark's `from_avro` takes it, and malformed values handled per
//! [`ParseMode`] like JSON and CSV records. The only module that uses `arrow-avro`.
//!
//! arrow-avro's streaming decoder reads single-object-encoded datums (`C3 01`, the writer
//! schema's 8-byte Rabin fingerprint, the body). A value here is a bare body (Spark's
//! `from_avro` input, and what Avro's own `BinaryEncoder` writes) or a body behind
//! Confluent's 5-byte header (`avro_framing = 'confluent'`); either way it is given the
//! single-object prefix of the inline schema before it is decoded.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, SchemaStore};
use datafusion::arrow::array::{ArrayRef, RecordBatch, new_null_array};
use datafusion::arrow::compute::{can_cast_types, cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{FileRead, ParseMode, Rejected};
use crate::error::{Error, Result};

/// How a value frames its Avro body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The body alone (Spark's `from_avro`, Avro's `BinaryEncoder`).
    Raw,
    /// Confluent's wire format: a zero byte, the 4-byte schema id, the body. The id is not
    /// looked up: the body is read with the inline schema.
    Confluent,
}

impl Framing {
    pub fn parse(s: &str) -> Result<Framing> {
        match s.to_ascii_lowercase().as_str() {
            "raw" => Ok(Framing::Raw),
            "confluent" => Ok(Framing::Confluent),
            _ => Err(Error::InvalidOption {
                message: format!("invalid avro_framing \"{s}\""),
                hint: Some("avro_framing is 'raw' or 'confluent'.".into()),
            }),
        }
    }
}

/// Decodes Avro values of one schema into a stream's columns.
#[derive(Debug, Clone)]
pub struct AvroDecoder {
    store: SchemaStore,
    /// The single-object prefix of the schema: `C3 01` and its Rabin fingerprint.
    prefix: [u8; 10],
    framing: Framing,
    pub mode: ParseMode,
    /// The stream's columns (every field nullable), each cast from the datum's field at
    /// the same place in `from`.
    pub schema: SchemaRef,
    from: Vec<usize>,
}

impl AvroDecoder {
    /// A decoder of `schema_json` (an Avro record schema) into `declared` columns, matched
    /// to the record's fields by name (exactly, else ignoring case); with none declared,
    /// into the record's fields, those of types a stream column can hold.
    pub fn new(
        schema_json: &str,
        framing: Framing,
        mode: ParseMode,
        declared: &[(String, DataType)],
    ) -> Result<AvroDecoder> {
        let bad_schema = |e: &dyn std::fmt::Display| Error::InvalidOption {
            message: format!("invalid avro_schema: {e}"),
            hint: Some(
                "Give the writer's schema as Avro JSON: '{\"type\": \"record\", \"name\": \
                 \"r\", \"fields\": [{\"name\": \"a\", \"type\": \"int\"}]}'."
                    .into(),
            ),
        };
        let is_record = serde_json::from_str::<serde_json::Value>(schema_json)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str().map(str::to_string)))
            .is_some_and(|t| t == "record");
        if !is_record {
            return Err(bad_schema(&"not JSON of an Avro record schema"));
        }
        let mut store = SchemaStore::new();
        let fingerprint = store
            .register(AvroSchema::new(schema_json.to_string()))
            .map_err(|e| bad_schema(&e))?;
        let Fingerprint::Rabin(fp) = fingerprint else {
            return Err(Error::Internal("avro: not a Rabin fingerprint".into()));
        };
        let mut prefix = [0u8; 10];
        prefix[..2].copy_from_slice(&[0xC3, 0x01]);
        prefix[2..].copy_from_slice(&fp.to_le_bytes());
        let mut me = AvroDecoder {
            store,
            prefix,
            framing,
            mode,
            schema: Arc::new(Schema::empty()),
            from: Vec::new(),
        };
        let datum = catch_unwind(AssertUnwindSafe(|| me.decoder(1)))
            .map_err(|_| bad_schema(&"the schema reader failed"))?
            .map_err(|e| bad_schema(&e))?
            .schema();
        let mut fields = Vec::new();
        if declared.is_empty() {
            for (i, f) in datum.fields().iter().enumerate() {
                let to = column_type(f.data_type()).ok_or_else(|| Error::Unsupported {
                    message: format!(
                        "avro field \"{}\" has type {}, which a stream column cannot hold",
                        f.name(),
                        f.data_type()
                    ),
                    hint: Some(
                        "Declare the stream's columns: the fields of those names are read \
                         and the others skipped."
                            .into(),
                    ),
                })?;
                fields.push(Field::new(f.name(), to, true));
                me.from.push(i);
            }
        } else {
            for (name, to) in declared {
                let names = datum.fields().iter().map(|f| f.name().as_str());
                let i = names
                    .clone()
                    .position(|n| n == name)
                    .or_else(|| names.clone().position(|n| n.eq_ignore_ascii_case(name)))
                    .ok_or_else(|| {
                        Error::invalid_option(format!(
                            "column \"{name}\" is not a field of avro_schema (its fields: {})",
                            names.collect::<Vec<_>>().join(", ")
                        ))
                    })?;
                let from = datum.field(i).data_type();
                if !can_cast_types(from, to) {
                    return Err(Error::invalid_option(format!(
                        "column \"{name}\" cannot hold avro field \"{}\" of type {from}",
                        datum.field(i).name()
                    )));
                }
                fields.push(Field::new(name, to.clone(), true));
                me.from.push(i);
            }
        }
        me.schema = Arc::new(Schema::new(fields));
        Ok(me)
    }

    fn decoder(&self, rows: usize) -> std::result::Result<Decoder, String> {
        ReaderBuilder::new()
            .with_batch_size(rows.max(1))
            .with_writer_schema_store(self.store.clone())
            .build_decoder()
            .map_err(|e| e.to_string())
    }

    /// The body of a value, or why it has none.
    fn body<'a>(&self, value: &'a [u8]) -> std::result::Result<&'a [u8], String> {
        match self.framing {
            Framing::Raw => Ok(value),
            Framing::Confluent if value.len() >= 5 && value[0] == 0 => Ok(&value[5..]),
            Framing::Confluent => Err(
                "not in Confluent's wire format (a zero byte and a 4-byte schema id first)".into(),
            ),
        }
    }

    /// Feeds one body to `d`: it must be exactly one datum.
    fn feed(&self, d: &mut Decoder, body: &[u8]) -> std::result::Result<(), String> {
        let mut frame = Vec::with_capacity(self.prefix.len() + body.len());
        frame.extend_from_slice(&self.prefix);
        frame.extend_from_slice(body);
        let before = d.capacity();
        let used = catch_unwind(AssertUnwindSafe(|| d.decode(&frame)))
            .map_err(|_| "the avro decoder failed on it".to_string())?
            .map_err(|e| e.to_string())?;
        if d.capacity() + 1 != before {
            return Err("truncated: not a whole datum of the schema".into());
        }
        if used != frame.len() {
            return Err(format!(
                "{} bytes after the datum",
                frame.len().saturating_sub(used)
            ));
        }
        Ok(())
    }

    /// The stream's columns of decoded datums.
    fn project(&self, datums: &RecordBatch) -> std::result::Result<RecordBatch, String> {
        let cols = self
            .from
            .iter()
            .zip(self.schema.fields())
            .map(|(&i, f)| cast(datums.column(i), f.data_type()))
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()
            .map_err(|e| e.to_string())?;
        RecordBatch::try_new(self.schema.clone(), cols).map_err(|e| e.to_string())
    }

    /// Every value decoded at once; `None` if any one does not decode.
    fn decode_all(&self, values: &[&[u8]]) -> Option<RecordBatch> {
        let mut d = self.decoder(values.len()).ok()?;
        for v in values {
            self.feed(&mut d, self.body(v).ok()?).ok()?;
        }
        let datums = catch_unwind(AssertUnwindSafe(|| d.flush())).ok()?.ok()??;
        (datums.num_rows() == values.len())
            .then(|| self.project(&datums).ok())
            .flatten()
    }

    /// One value decoded with `d` (rebuilt after a failure).
    fn decode_one(
        &self,
        d: &mut Option<Decoder>,
        value: &[u8],
    ) -> std::result::Result<RecordBatch, String> {
        let body = self.body(value)?;
        let mut dec = match d.take() {
            Some(dec) => dec,
            None => self.decoder(1)?,
        };
        self.feed(&mut dec, body)?;
        let datums = catch_unwind(AssertUnwindSafe(|| dec.flush()))
            .map_err(|_| "the avro decoder failed on it".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or("no datum")?;
        *d = Some(dec);
        self.project(&datums)
    }

    /// Values decoded into the stream's columns: one row per value, a malformed one as the
    /// mode says (PERMISSIVE: a row of NULLs), each placed by `place(n)` (1-based) in errors.
    pub fn decode(&self, values: &[&[u8]], place: &dyn Fn(u64) -> String) -> Result<FileRead> {
        if values.is_empty() {
            return Ok(FileRead::default());
        }
        if let Some(batch) = self.decode_all(values) {
            return Ok(FileRead {
                batches: vec![batch],
                ..FileRead::default()
            });
        }
        let mut out = FileRead::default();
        let mut rows = Vec::with_capacity(values.len());
        let mut d = None;
        for (i, v) in values.iter().enumerate() {
            match self.decode_one(&mut d, v) {
                Ok(b) => rows.push(b),
                Err(reason) => {
                    let n = i as u64 + 1;
                    if self.mode == ParseMode::FailFast {
                        return Err(Error::BadInput(format!(
                            "malformed avro record in {}: {reason}",
                            place(n)
                        )));
                    }
                    out.malformed += 1;
                    if self.mode == ParseMode::Permissive {
                        let nulls = self
                            .schema
                            .fields()
                            .iter()
                            .map(|f| new_null_array(f.data_type(), 1))
                            .collect();
                        rows.push(RecordBatch::try_new(self.schema.clone(), nulls)?);
                    }
                    out.rejected.push(Rejected {
                        line: n,
                        text: bytea_text(v),
                        error: reason,
                    });
                }
            }
        }
        tracing::warn!(place = %place(0), malformed = out.malformed, mode = ?self.mode, "malformed avro records");
        out.batches = vec![concat_batches(&self.schema, &rows)?];
        Ok(out)
    }
}

/// The stream column type of an Avro field's Arrow type, if a stream column can hold it.
fn column_type(dt: &DataType) -> Option<DataType> {
    Some(match dt {
        DataType::Boolean
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Date32
        | DataType::Decimal128(..) => dt.clone(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => DataType::Binary,
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp(_, Some(_)) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        }
        // An enum.
        DataType::Dictionary(_, v) if matches!(v.as_ref(), DataType::Utf8) => DataType::Utf8,
        _ => return None,
    })
}

/// Bytes as Postgres prints a bytea: `\x` and hex.
fn bytea_text(v: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * v.len());
    s.push_str("\\x");
    for b in v {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_avro::writer::WriterBuilder;
    use arrow_avro::writer::format::AvroBinaryFormat;
    use datafusion::arrow::array::{Int32Array, Int64Array, StringArray};

    const SCHEMA: &str = r#"{"type": "record", "name": "click", "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": ["null", "string"]},
        {"name": "kind", "type": {"type": "enum", "name": "k", "symbols": ["A", "B"]}}
    ]}"#;

    /// One row's datum, written by arrow-avro's writer (a separate code path from the
    /// reader under test).
    fn datum(id: i64, page: Option<&str>) -> Vec<u8> {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("page", DataType::Utf8, true),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema.clone()),
            vec![
                Arc::new(Int64Array::from(vec![id])),
                Arc::new(StringArray::from(vec![page])),
            ],
        )
        .unwrap();
        let mut e = WriterBuilder::new(schema)
            .build_encoder::<AvroBinaryFormat>()
            .unwrap();
        e.encode(&batch).unwrap();
        let mut out = e.flush().row(0).unwrap().to_vec();
        out.push(2); // the enum: symbol B (index 1, zigzag)
        out
    }

    fn place(n: u64) -> String {
        format!("value {n}")
    }

    #[test]
    fn datums_decode_into_declared_columns_by_name() {
        let d = AvroDecoder::new(
            SCHEMA,
            Framing::Raw,
            ParseMode::Permissive,
            &[
                ("kind".into(), DataType::Utf8),
                ("ID".into(), DataType::Int32),
            ],
        )
        .unwrap();
        let (a, b) = (datum(7, Some("home")), datum(-3, None));
        let read = d.decode(&[&a, &b], &place).unwrap();
        assert_eq!(read.malformed, 0);
        let batch = &read.batches[0];
        assert_eq!(batch.schema().field(1).name(), "ID");
        let kind = batch.column(0).as_any().downcast_ref::<StringArray>();
        assert_eq!(kind.unwrap().iter().collect::<Vec<_>>(), [Some("B"); 2]);
        let id = batch.column(1).as_any().downcast_ref::<Int32Array>();
        assert_eq!(id.unwrap().values().to_vec(), vec![7, -3]);
    }

    #[test]
    fn without_declared_columns_the_records_fields_are_the_columns() {
        let d = AvroDecoder::new(SCHEMA, Framing::Raw, ParseMode::Permissive, &[]).unwrap();
        let cols: Vec<_> = d
            .schema
            .fields()
            .iter()
            .map(|f| (f.name().as_str(), f.data_type().clone()))
            .collect();
        assert_eq!(
            cols,
            [
                ("id", DataType::Int64),
                ("page", DataType::Utf8),
                ("kind", DataType::Utf8)
            ]
        );
        let logical = r#"{"type": "record", "name": "r", "fields": [
            {"name": "d", "type": {"type": "int", "logicalType": "date"}},
            {"name": "m", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
            {"name": "f", "type": {"type": "fixed", "name": "f4", "size": 4}},
            {"name": "lt", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
            {"name": "tm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "b", "type": ["null", "boolean"]},
            {"name": "x", "type": "float"}]}"#;
        let d = AvroDecoder::new(logical, Framing::Raw, ParseMode::Permissive, &[]).unwrap();
        let types: Vec<String> = d
            .schema
            .fields()
            .iter()
            .map(|f| crate::sql::types::arrow_to_sql(f.data_type()))
            .collect();
        assert_eq!(
            types,
            [
                "date",
                "numeric(9,2)",
                "bytea",
                "timestamp",
                "timestamptz",
                "boolean",
                "real"
            ]
        );
    }

    #[test]
    fn malformed_values_follow_the_mode() {
        let good = datum(1, Some("a"));
        let mut trailing = datum(2, Some("b"));
        trailing.push(0);
        let truncated = &good[..good.len() - 2];
        let values: Vec<&[u8]> = vec![&good, &trailing, truncated, &good];
        let decoder = |mode| {
            AvroDecoder::new(
                SCHEMA,
                Framing::Raw,
                mode,
                &[("id".into(), DataType::Int64)],
            )
            .unwrap()
        };
        let read = decoder(ParseMode::Permissive)
            .decode(&values, &place)
            .unwrap();
        assert_eq!(read.malformed, 2);
        let ids = read.batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .iter()
            .collect::<Vec<_>>();
        assert_eq!(ids, [Some(1), None, None, Some(1)]);
        assert_eq!(
            read.rejected.iter().map(|r| r.line).collect::<Vec<_>>(),
            [2, 3]
        );
        assert!(
            read.rejected[0].text.starts_with("\\x04"),
            "{:?}",
            read.rejected
        );
        assert!(read.rejected[0].error.contains("after the datum"));
        let read = decoder(ParseMode::DropMalformed)
            .decode(&values, &place)
            .unwrap();
        assert_eq!(read.batches[0].num_rows(), 2);
        let err = decoder(ParseMode::FailFast)
            .decode(&values, &place)
            .unwrap_err();
        assert!(err.to_string().contains("value 2"), "{err}");
    }

    #[test]
    fn confluent_framing_skips_the_header() {
        let d = AvroDecoder::new(
            SCHEMA,
            Framing::Confluent,
            ParseMode::Permissive,
            &[("page".into(), DataType::Utf8)],
        )
        .unwrap();
        let mut framed = vec![0, 0, 0, 0, 42];
        framed.extend(datum(5, Some("x")));
        let bare = datum(5, Some("x"));
        let read = d.decode(&[&framed, &bare], &place).unwrap();
        assert_eq!(read.malformed, 1);
        assert!(read.rejected[0].error.contains("Confluent"));
    }

    #[test]
    fn bad_schemas_and_columns_are_refused() {
        let err = |schema: &str, cols: &[(String, DataType)]| {
            AvroDecoder::new(schema, Framing::Raw, ParseMode::Permissive, cols)
                .unwrap_err()
                .to_string()
        };
        assert!(err("{not json", &[]).contains("invalid avro_schema"));
        assert!(err("\"long\"", &[]).contains("not JSON of an Avro record"));
        assert!(
            err(
                r#"{"type": "record", "name": "r", "fields": [{"name": "a", "type": "nope"}]}"#,
                &[]
            )
            .contains("invalid avro_schema")
        );
        assert!(err(SCHEMA, &[("nope".into(), DataType::Int64)]).contains("its fields: id, page"));
        assert!(
            err(
                SCHEMA,
                &[(
                    "id".into(),
                    DataType::Interval(datafusion::arrow::datatypes::IntervalUnit::MonthDayNano)
                )]
            )
            .contains("cannot hold")
        );
        let nested = r#"{"type": "record", "name": "r", "fields": [
            {"name": "xs", "type": {"type": "array", "items": "int"}}]}"#;
        assert!(err(nested, &[]).contains("\"xs\""));
    }
}
