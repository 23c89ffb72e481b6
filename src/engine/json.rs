//! Spark's JSON functions, for queries that decode a Kafka value the Spark way:
//! `from_json(text, 'a INT, b STRING')` (the schema as Spark's DDL string) gives a struct,
//! and `to_json(struct)` its JSON text.
//!
//! As in Spark (3.0 and later, PERMISSIVE): a NULL text gives NULL; a text that is not a
//! JSON object of those fields gives a struct whose fields are all NULL; fields not in the
//! schema are ignored, missing ones are NULL.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StringArray, StructArray, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::{cast, concat, take};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema};
use datafusion::common::{exec_err, plan_err};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::scalar::ScalarValue;

/// `from_json(text, schema)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FromJson {
    signature: Signature,
}

impl Default for FromJson {
    fn default() -> Self {
        FromJson {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

/// The struct fields a `from_json` schema argument names.
fn schema_fields(arg: Option<&ScalarValue>) -> datafusion::error::Result<Fields> {
    let ddl = match arg {
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => s,
        _ => {
            return plan_err!(
                "from_json() takes the schema as a text literal, such as 'a INT, b STRING'"
            );
        }
    };
    let fields = crate::sql::types::parse_ddl_schema(ddl)
        .map_err(|e| DataFusionError::Plan(e.to_string()))?;
    Ok(fields
        .into_iter()
        .map(|(n, t)| Field::new(n, t, true))
        .collect())
}

impl ScalarUDFImpl for FromJson {
    fn name(&self) -> &str {
        "from_json"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        plan_err!("from_json() needs its schema argument")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> datafusion::error::Result<FieldRef> {
        let fields = schema_fields(args.scalar_arguments.get(1).copied().flatten())?;
        Ok(Arc::new(Field::new(
            self.name(),
            DataType::Struct(fields),
            true,
        )))
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let DataType::Struct(fields) = args.return_field.data_type().clone() else {
            return exec_err!("from_json(): not a struct");
        };
        let text = args.args[0].to_array(args.number_rows)?;
        let text = match text.data_type() {
            DataType::Utf8 => text,
            DataType::Null => {
                return Ok(ColumnarValue::Array(new_null_array(
                    &DataType::Struct(fields),
                    args.number_rows,
                )));
            }
            _ => cast(&text, &DataType::Utf8)?,
        };
        Ok(ColumnarValue::Array(Arc::new(decode(
            &fields,
            text.as_string::<i32>(),
        )?)))
    }
}

/// One struct row per text: decoded together when they all decode, else one by one.
fn decode(fields: &Fields, texts: &StringArray) -> datafusion::error::Result<StructArray> {
    let schema = Arc::new(Schema::new(fields.clone()));
    let one = |text: &[u8], rows: usize| -> Option<RecordBatch> {
        let mut d = datafusion::arrow::json::ReaderBuilder::new(schema.clone())
            .with_batch_size(rows.max(1) + 1)
            .with_coerce_primitive(true)
            .build_decoder()
            .ok()?;
        d.decode(text).ok()?;
        d.flush().ok()?.filter(|b| b.num_rows() == rows)
    };
    let valid: Vec<usize> = (0..texts.len()).filter(|&i| texts.is_valid(i)).collect();
    let mut joined = Vec::new();
    for &i in &valid {
        joined.extend(
            texts
                .value(i)
                .bytes()
                .map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
        );
        joined.push(b'\n');
    }
    // Rows that decode, then one all-NULL row for those that do not.
    let decoded: RecordBatch = match one(&joined, valid.len()) {
        Some(b) if !valid.is_empty() => b,
        _ => {
            let mut rows: Vec<RecordBatch> = Vec::with_capacity(valid.len());
            for &i in &valid {
                let line = texts.value(i);
                let is_object = line.trim_start().starts_with('{');
                match one(line.replace(['\n', '\r'], " ").as_bytes(), 1).filter(|_| is_object) {
                    Some(b) => rows.push(b),
                    None => rows.push(RecordBatch::new_empty(schema.clone())),
                }
            }
            let null_row = RecordBatch::try_new(
                schema.clone(),
                fields
                    .iter()
                    .map(|f| new_null_array(f.data_type(), 1))
                    .collect(),
            )?;
            let rows: Vec<RecordBatch> = rows
                .into_iter()
                .map(|b| {
                    if b.num_rows() == 1 {
                        b
                    } else {
                        null_row.clone()
                    }
                })
                .collect();
            if rows.is_empty() {
                RecordBatch::new_empty(schema.clone())
            } else {
                datafusion::arrow::compute::concat_batches(&schema, &rows)?
            }
        }
    };
    // A JSON text that is not an object (`1`, `[1]`) decodes to nothing in the fast path:
    // caught by the row count above. Now place the rows: NULL where the text was NULL.
    let mut next = 0u32;
    let idx: UInt32Array = (0..texts.len())
        .map(|i| {
            texts.is_valid(i).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    let columns: Vec<ArrayRef> = decoded
        .columns()
        .iter()
        .map(|c| {
            // `take` needs one row at least to take from.
            let c = if c.is_empty() {
                concat(&[c.as_ref(), new_null_array(c.data_type(), 1).as_ref()])?
            } else {
                c.clone()
            };
            take(c.as_ref(), &idx, None)
        })
        .collect::<std::result::Result<_, _>>()?;
    let nulls = datafusion::arrow::buffer::NullBuffer::from(
        (0..texts.len())
            .map(|i| texts.is_valid(i))
            .collect::<Vec<_>>(),
    );
    Ok(StructArray::try_new(fields.clone(), columns, Some(nulls))?)
}

/// `to_json(struct)`: the struct as a JSON object (NULL for a NULL struct).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ToJson {
    signature: Signature,
}

impl Default for ToJson {
    fn default() -> Self {
        ToJson {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for ToJson {
    fn name(&self) -> &str {
        "to_json"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> datafusion::error::Result<DataType> {
        match &args[0] {
            DataType::Struct(_) => Ok(DataType::Utf8),
            other => plan_err!(
                "to_json() takes a struct (named_struct('a', a, ...) or struct(a AS a, ...)), \
                 not {other}"
            ),
        }
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let value = args.args[0].to_array(args.number_rows)?;
        let s = value.as_struct();
        let batch = RecordBatch::from(s.clone());
        let mut buf = Vec::new();
        {
            let mut w = datafusion::arrow::json::LineDelimitedWriter::new(&mut buf);
            w.write(&batch)?;
            w.finish()?;
        }
        let mut lines = buf.split(|&b| b == b'\n');
        let out: StringArray = (0..s.len())
            .map(|i| {
                let line = lines.next().unwrap_or_default();
                s.is_valid(i)
                    .then(|| String::from_utf8_lossy(line).into_owned())
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// Registers `from_json` and `to_json` in a session.
pub fn register_udfs(ctx: &datafusion::prelude::SessionContext) {
    ctx.register_udf(ScalarUDF::new_from_impl(FromJson::default()));
    ctx.register_udf(ScalarUDF::new_from_impl(ToJson::default()));
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    async fn one(sql: &str) -> String {
        let ctx = SessionContext::new();
        super::register_udfs(&ctx);
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn from_json_decodes_and_keeps_bad_text_as_null_fields() {
        let out = one(
            "SELECT j['a'] AS a, j['b'] AS b, j IS NULL AS isnull FROM \
             (SELECT from_json(t, 'a INT, b STRING') AS j FROM (VALUES ('{\"a\": 1, \"b\": \"x\", \"c\": 9}'), ('not json'), (NULL), ('{\"b\": \"y\"}')) v(t))",
        )
        .await;
        let want = "\
+---+---+--------+
| a | b | isnull |
+---+---+--------+
| 1 | x | false  |
|   |   | false  |
|   |   | true   |
|   | y | false  |
+---+---+--------+";
        assert_eq!(out, want);
    }

    #[tokio::test]
    async fn to_json_writes_a_struct_as_an_object() {
        let out = one("SELECT to_json(named_struct('a', 1, 'b', 'x')) AS j").await;
        assert!(out.contains(r#"{"a":1,"b":"x"}"#), "{out}");
        let ctx = SessionContext::new();
        super::register_udfs(&ctx);
        let e = ctx.sql("SELECT to_json(1)").await.unwrap_err();
        assert!(e.to_string().contains("takes a struct"), "{e}");
        let e = ctx
            .sql("SELECT from_json('{}', 'a WHATEVER')")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("invalid schema"), "{e}");
    }
}
