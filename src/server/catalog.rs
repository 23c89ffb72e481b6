//! Tidemark's corrections to datafusion-postgres's pg_catalog, where its answers would be
//! wrong for Tidemark's objects: a materialized view is relkind `m` in `pg_class` (psql's
//! `\dm`, SQLAlchemy's `get_materialized_view_names`) and has a row in `pg_matviews`.
//! `pg_settings` lists the settings `SHOW` answers. Every other table is
//! datafusion-postgres's, unchanged. Also the catalog functions it
//! lacks: `to_regtype` (psycopg's type lookup, which SQLAlchemy runs on connect), and what
//! SQLAlchemy's column reflection calls: `json_build_object`, `pg_get_serial_sequence`
//! (no column is serial: NULL) and `pg_collation_is_visible`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int32Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{SchemaProvider, Session};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{MemTable, TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
    create_udf,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion::scalar::ScalarValue;
use datafusion_postgres::pgwire::api::Type;

use crate::sink::view::ViewTable;

/// Puts the corrections in front of the `pg_catalog` schema of catalog `catalog`.
pub fn install(ctx: &SessionContext, catalog: &str) -> crate::error::Result<()> {
    let missing = || crate::error::Error::Internal(format!("no pg_catalog in {catalog}"));
    let cat = ctx.catalog(catalog).ok_or_else(missing)?;
    let inner = cat.schema("pg_catalog").ok_or_else(missing)?;
    let public = cat.schema("public").ok_or_else(missing)?;
    cat.register_schema("pg_catalog", Arc::new(PgCatalog { inner, public }))?;
    ctx.register_udf(to_regtype_udf());
    ctx.register_udf(ScalarUDF::new_from_impl(JsonBuildObject::new()));
    ctx.register_udf(create_udf(
        "pg_get_serial_sequence",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(|_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))),
    ));
    ctx.register_udf(create_udf(
        "pg_collation_is_visible",
        vec![DataType::Int32],
        DataType::Boolean,
        Volatility::Stable,
        Arc::new(|_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))),
    ));
    Ok(())
}

/// The oid of a built-in type by the names Postgres accepts for it: its `typname`
/// (`int4`, `_int4`), an SQL alias (`integer`, `double precision`), `pg_catalog.`-qualified,
/// an array as `name[]`; `None` for any other name (as `to_regtype` answers NULL).
pub fn type_oid(name: &str) -> Option<i32> {
    static BY_NAME: LazyLock<HashMap<String, u32>> = LazyLock::new(|| {
        // Every type postgres-types knows, which are Postgres's built-in ones.
        (0..20_000u32)
            .filter_map(Type::from_oid)
            .map(|t| (t.name().to_string(), t.oid()))
            .collect()
    });
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name);
    let (base, array) = match name.strip_suffix("[]") {
        Some(b) => (b.trim_end(), true),
        None => (name, false),
    };
    let base = match base {
        "integer" | "int" => "int4",
        "bigint" => "int8",
        "smallint" => "int2",
        "real" => "float4",
        "double precision" | "float" => "float8",
        "boolean" => "bool",
        "character varying" => "varchar",
        "character" | "char" if array => "bpchar",
        "character" => "bpchar",
        "decimal" => "numeric",
        "timestamp without time zone" => "timestamp",
        "timestamp with time zone" => "timestamptz",
        "time without time zone" => "time",
        "time with time zone" => "timetz",
        other => other,
    };
    let key = if array {
        format!("_{base}")
    } else {
        base.to_string()
    };
    BY_NAME.get(&key).and_then(|&oid| i32::try_from(oid).ok())
}

/// `json_build_object(key, value, ...)`: a JSON object as text, keys as text, values as
/// JSON scalars (numbers, booleans, strings, null), as Postgres builds it.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonBuildObject {
    signature: Signature,
}

impl JsonBuildObject {
    fn new() -> JsonBuildObject {
        JsonBuildObject {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for JsonBuildObject {
    fn name(&self) -> &str {
        "json_build_object"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if !args.args.len().is_multiple_of(2) {
            return Err(datafusion::error::DataFusionError::Plan(
                "argument list must have even number of elements".into(),
            ));
        }
        let n = args.number_rows;
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(n))
            .collect::<Result<Vec<_>>>()?;
        let mut out = Vec::with_capacity(n);
        for row in 0..n {
            let mut object = serde_json::Map::new();
            for pair in arrays.chunks(2) {
                let key = ScalarValue::try_from_array(&pair[0], row)?;
                if key.is_null() {
                    return Err(datafusion::error::DataFusionError::Execution(
                        "null value not allowed for object key".into(),
                    ));
                }
                let key = match key {
                    ScalarValue::Utf8(Some(k))
                    | ScalarValue::LargeUtf8(Some(k))
                    | ScalarValue::Utf8View(Some(k)) => k,
                    other => other.to_string(),
                };
                let value = ScalarValue::try_from_array(&pair[1], row)?;
                object.insert(key, json_value(&value));
            }
            out.push(serde_json::Value::Object(object).to_string());
        }
        Ok(ColumnarValue::Array(Arc::new(StringArray::from(out))))
    }
}

fn json_value(v: &ScalarValue) -> serde_json::Value {
    use serde_json::Value;
    if v.is_null() {
        return Value::Null;
    }
    match v {
        ScalarValue::Boolean(Some(b)) => Value::Bool(*b),
        ScalarValue::Int8(Some(x)) => (*x).into(),
        ScalarValue::Int16(Some(x)) => (*x).into(),
        ScalarValue::Int32(Some(x)) => (*x).into(),
        ScalarValue::Int64(Some(x)) => (*x).into(),
        ScalarValue::UInt8(Some(x)) => (*x).into(),
        ScalarValue::UInt16(Some(x)) => (*x).into(),
        ScalarValue::UInt32(Some(x)) => (*x).into(),
        ScalarValue::UInt64(Some(x)) => (*x).into(),
        ScalarValue::Float32(Some(x)) => serde_json::Number::from_f64(f64::from(*x))
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ScalarValue::Float64(Some(x)) => serde_json::Number::from_f64(*x)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Value::String(s.clone()),
        other => Value::String(other.to_string()),
    }
}

/// `to_regtype(text)`: the type's oid, NULL when there is no such type.
fn to_regtype_udf() -> ScalarUDF {
    create_udf(
        "to_regtype",
        vec![DataType::Utf8],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(|args: &[ColumnarValue]| {
            let lookup = |v: Option<&str>| v.and_then(type_oid);
            Ok(match &args[0] {
                ColumnarValue::Scalar(v) => {
                    let text = match v {
                        ScalarValue::Utf8(s)
                        | ScalarValue::LargeUtf8(s)
                        | ScalarValue::Utf8View(s) => s.as_deref(),
                        _ => None,
                    };
                    ColumnarValue::Scalar(ScalarValue::Int32(lookup(text)))
                }
                ColumnarValue::Array(a) => {
                    let a = datafusion::arrow::compute::cast(a, &DataType::Utf8)?;
                    let oids: Int32Array = a.as_string::<i32>().iter().map(lookup).collect();
                    ColumnarValue::Array(Arc::new(oids))
                }
            })
        }),
    )
}

#[derive(Debug)]
struct PgCatalog {
    inner: Arc<dyn SchemaProvider>,
    /// Where streams, sinks and views are.
    public: Arc<dyn SchemaProvider>,
}

/// The materialized views of `public`: name and definition.
async fn views(public: &Arc<dyn SchemaProvider>) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in public.table_names() {
        if let Some(t) = public.table(&name).await?
            && let Some(v) = t.downcast_ref::<ViewTable>()
        {
            out.push((name, v.definition().to_string()));
        }
    }
    out.sort();
    Ok(out)
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        match name.to_ascii_lowercase().as_str() {
            "pg_class" => Ok(self.inner.table(name).await?.map(|inner| {
                Arc::new(PgClass {
                    inner,
                    public: self.public.clone(),
                }) as Arc<dyn TableProvider>
            })),
            "pg_matviews" => Ok(Some(Arc::new(pg_matviews(&views(&self.public).await?)?))),
            "pg_settings" => Ok(Some(Arc::new(pg_settings()?))),
            _ => self.inner.table(name).await,
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

/// `pg_settings`: the settings `SHOW` answers ([`crate::config::PG_SETTINGS`]), with the
/// server's values (datafusion-postgres's has one row). DBeaver reads
/// `standard_conforming_strings` here, pgcli `unix_socket_directories`.
fn pg_settings() -> Result<MemTable> {
    let text = |name: &str| Field::new(name, DataType::Utf8, true);
    let schema = Arc::new(Schema::new(vec![
        text("name"),
        text("setting"),
        text("unit"),
        text("category"),
        text("short_desc"),
        text("extra_desc"),
        text("context"),
        text("vartype"),
        text("source"),
        text("min_val"),
        text("max_val"),
        text("enumvals"),
        text("boot_val"),
        text("reset_val"),
        text("sourcefile"),
        Field::new("sourceline", DataType::Int32, true),
        Field::new("pending_restart", DataType::Boolean, true),
    ]));
    let all = crate::config::PG_SETTINGS;
    let n = all.len();
    let column = |f: &dyn Fn(&crate::config::PgSetting) -> Option<&str>| {
        Arc::new(StringArray::from_iter(all.iter().map(f))) as ArrayRef
    };
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            column(&|s| Some(s.name)),
            column(&|s| Some(s.value)),
            column(&|_| None),
            column(&|_| Some("Client Connection Defaults")),
            column(&|s| Some(s.description)),
            column(&|_| None),
            column(&|_| Some("user")),
            column(&|s| Some(vartype(s))),
            column(&|_| Some("default")),
            column(&|_| None),
            column(&|_| None),
            column(&|_| None),
            column(&|s| Some(s.value)),
            column(&|s| Some(s.value)),
            column(&|_| None),
            Arc::new(Int32Array::from(vec![None; n])),
            Arc::new(BooleanArray::from(vec![false; n])),
        ],
    )?;
    MemTable::try_new(schema, vec![vec![batch]])
}

/// A setting's `vartype` as Postgres names it, from its value.
fn vartype(s: &crate::config::PgSetting) -> &'static str {
    if matches!(s.value, "on" | "off") {
        "bool"
    } else if !s.value.is_empty() && s.value.bytes().all(|b| b.is_ascii_digit()) {
        "integer"
    } else {
        "string"
    }
}

/// `pg_matviews`, as Postgres has it.
fn pg_matviews(views: &[(String, String)]) -> Result<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("schemaname", DataType::Utf8, true),
        Field::new("matviewname", DataType::Utf8, true),
        Field::new("matviewowner", DataType::Utf8, true),
        Field::new("tablespace", DataType::Utf8, true),
        Field::new("hasindexes", DataType::Boolean, true),
        Field::new("ispopulated", DataType::Boolean, true),
        Field::new("definition", DataType::Utf8, true),
    ]));
    let n = views.len();
    let text = |v: Vec<Option<String>>| Arc::new(StringArray::from(v)) as ArrayRef;
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            text(vec![Some("public".into()); n]),
            text(views.iter().map(|(name, _)| Some(name.clone())).collect()),
            text(vec![Some("postgres".into()); n]),
            text(vec![None; n]),
            // The group key is indexed: lookups on it do not scan.
            Arc::new(BooleanArray::from(vec![true; n])),
            Arc::new(BooleanArray::from(vec![true; n])),
            text(views.iter().map(|(_, d)| Some(format!(" {d};"))).collect()),
        ],
    )?;
    MemTable::try_new(schema, vec![vec![batch]])
}

/// datafusion-postgres's `pg_class` with relkind `m` for materialized views.
#[derive(Debug)]
struct PgClass {
    inner: Arc<dyn TableProvider>,
    public: Arc<dyn SchemaProvider>,
}

#[async_trait]
impl TableProvider for PgClass {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = self.inner.schema();
        let plan = self.inner.scan(state, None, &[], None).await?;
        let batches = datafusion::physical_plan::collect(plan, state.task_ctx()).await?;
        let views: Vec<String> = views(&self.public)
            .await?
            .into_iter()
            .map(|v| v.0)
            .collect();
        let (Ok(name_idx), Ok(kind_idx)) = (schema.index_of("relname"), schema.index_of("relkind"))
        else {
            return Ok(MemorySourceConfig::try_new_exec(
                &[batches],
                schema,
                projection.cloned(),
            )?);
        };
        let mut patched = Vec::with_capacity(batches.len());
        for b in batches {
            let (Some(names), Some(kinds)) = (
                b.column(name_idx).as_string_opt::<i32>(),
                b.column(kind_idx).as_string_opt::<i32>(),
            ) else {
                patched.push(b);
                continue;
            };
            let kinds: StringArray = (0..b.num_rows())
                .map(|i| {
                    if !names.is_null(i) && views.iter().any(|v| v == names.value(i)) {
                        Some("m")
                    } else if kinds.is_null(i) {
                        None
                    } else {
                        Some(kinds.value(i))
                    }
                })
                .collect();
            let mut cols = b.columns().to_vec();
            cols[kind_idx] = Arc::new(kinds);
            patched.push(RecordBatch::try_new(b.schema(), cols)?);
        }
        Ok(MemorySourceConfig::try_new_exec(
            &[patched],
            schema,
            projection.cloned(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_resolve_as_postgres_resolves_them() {
        let oid = |t: Type| Some(t.oid() as i32);
        for (name, want) in [
            ("int4", oid(Type::INT4)),
            ("integer", oid(Type::INT4)),
            ("INTEGER", oid(Type::INT4)),
            ("pg_catalog.text", oid(Type::TEXT)),
            ("double precision", oid(Type::FLOAT8)),
            ("timestamp with time zone", oid(Type::TIMESTAMPTZ)),
            ("character varying", oid(Type::VARCHAR)),
            ("int4[]", oid(Type::INT4_ARRAY)),
            ("_int4", oid(Type::INT4_ARRAY)),
            ("text[]", oid(Type::TEXT_ARRAY)),
            ("jsonb", oid(Type::JSONB)),
            ("hstore", None),
            ("no such type", None),
        ] {
            assert_eq!(type_oid(name), want, "{name}");
        }
    }

    #[tokio::test]
    async fn json_build_object_builds_postgres_objects() {
        let ctx = SessionContext::new();
        ctx.register_udf(ScalarUDF::new_from_impl(JsonBuildObject::new()));
        let batches = ctx
            .sql("SELECT json_build_object('a', 1, 'b', 'x', 'c', NULL, 'd', true, 'e', 1.5)")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = batches[0].column(0).as_string::<i32>().value(0).to_string();
        let got: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            got,
            serde_json::json!({"a": 1, "b": "x", "c": null, "d": true, "e": 1.5})
        );
        assert!(
            ctx.sql("SELECT json_build_object('a')")
                .await
                .unwrap()
                .collect()
                .await
                .is_err()
        );
    }
}
