//! Tidemark's corrections to datafusion-postgres's pg_catalog, where its answers would be
//! wrong for Tidemark's objects: a materialized view is relkind `m` in `pg_class` (psql's
//! `\dm`, SQLAlchemy's `get_materialized_view_names`) and has a row in `pg_matviews`.
//! `pg_settings` lists the settings `SHOW` answers. Every other table is
//! datafusion-postgres's, unchanged. Also the catalog functions it
//! lacks: `to_regtype` (psycopg's type lookup, which SQLAlchemy runs on connect), and what
//! SQLAlchemy's column reflection calls: `json_build_object`, `pg_get_serial_sequence`
//! (no column is serial: NULL) and `pg_collation_is_visible`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};

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

use crate::engine::Engine;
use crate::sink::view::ViewTable;

/// Puts the corrections in front of the `pg_catalog` schema of catalog `catalog`.
pub fn install(engine: &Engine, catalog: &str) -> crate::error::Result<()> {
    let ctx: &SessionContext = engine.context();
    let missing = || crate::error::Error::Internal(format!("no pg_catalog in {catalog}"));
    let cat = ctx.catalog(catalog).ok_or_else(missing)?;
    let inner = cat.schema("pg_catalog").ok_or_else(missing)?;
    let public = cat.schema("public").ok_or_else(missing)?;
    let relations = Arc::new(Relations::default());
    cat.register_schema(
        "pg_catalog",
        Arc::new(PgCatalog {
            inner,
            public,
            engine: engine.handle(),
            relations: relations.clone(),
        }),
    )?;
    ctx.register_udf(obj_description_udf(relations.clone()));
    ctx.register_udf(pg_table_is_visible_udf(relations.clone()));
    ctx.register_udf(to_regclass_udf(relations.clone()));
    ctx.register_udf(create_udf(
        "col_description",
        vec![DataType::Int64, DataType::Int64],
        DataType::Utf8,
        Volatility::Stable,
        // No column has a comment (there is no COMMENT ON yet).
        Arc::new(|_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))),
    ));
    ctx.register_udf(create_udf(
        "pg_is_other_temp_schema",
        vec![DataType::Int64],
        DataType::Boolean,
        Volatility::Stable,
        // Tidemark has no temporary schemas (dbt's catalog query asks).
        Arc::new(|args: &[ColumnarValue]| {
            Ok(match &args[0] {
                ColumnarValue::Scalar(s) => {
                    ColumnarValue::Scalar(ScalarValue::Boolean((!s.is_null()).then_some(false)))
                }
                ColumnarValue::Array(a) => ColumnarValue::Array(Arc::new(
                    (0..a.len())
                        .map(|i| a.is_valid(i).then_some(false))
                        .collect::<BooleanArray>(),
                )),
            })
        }),
    ));
    for udf in super::activity::signal_udfs(engine.handle()) {
        ctx.register_udf(udf);
    }
    ctx.register_udf(pg_size_pretty_udf());
    ctx.register_udf(regtype_names_udf());
    for name in ["pg_table_size", "pg_indexes_size"] {
        // Sizes of what Postgres stores in its heap; Tidemark's tables are Delta tables
        // and views, which `pg_relation_size` (datafusion-postgres's) answers as 0 too.
        ctx.register_udf(create_udf(
            name,
            vec![DataType::Int64],
            DataType::Int64,
            Volatility::Stable,
            Arc::new(|_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Int64(Some(0))))),
        ));
    }
    for udf in super::constraints::definition_udfs(relations.clone()) {
        ctx.register_udf(udf);
    }
    for (name, args) in [
        ("pg_get_viewdef", 1),
        ("pg_get_viewdef", 2),
        ("pg_get_function_result", 1),
        ("pg_get_function_arguments", 1),
    ] {
        // A view's definition is in pg_views / pg_matviews.
        // Functions' signatures: NULL (psql's `\df` lists user functions; there are none).
        let mut types = vec![DataType::Int64];
        types.extend(std::iter::repeat_n(DataType::Int64, args - 1));
        if name == "pg_get_viewdef" && args == 2 {
            types[1] = DataType::Boolean;
        }
        ctx.register_udf(create_udf(
            name,
            types,
            DataType::Utf8,
            Volatility::Stable,
            Arc::new(|_: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))),
        ));
    }
    for name in ["pg_type_is_visible", "pg_function_is_visible"] {
        ctx.register_udf(create_udf(
            name,
            vec![DataType::Int64],
            DataType::Boolean,
            Volatility::Stable,
            // Every type and function is in pg_catalog, which is always on the path.
            Arc::new(|_: &[ColumnarValue]| {
                Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
            }),
        ));
    }
    ctx.register_udf(to_regtype_udf());
    for udf in expression_udfs() {
        ctx.register_udf(udf);
    }
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

/// `pg_get_expr(expr, relation [, pretty])`: the expression's text, NULL for none (as
/// Postgres answers a relation without defaults, partition bounds or index predicates:
/// datafusion-postgres answered `''`); `pg_get_partkeydef(oid)`: NULL, no relation here is
/// partitioned.
fn expression_udfs() -> Vec<ScalarUDF> {
    use datafusion::logical_expr::TypeSignature;
    [
        (
            "pg_get_expr",
            vec![TypeSignature::Any(2), TypeSignature::Any(3)],
        ),
        ("pg_get_partkeydef", vec![TypeSignature::Any(1)]),
    ]
    .into_iter()
    .map(|(name, arities)| {
        ScalarUDF::new_from_impl(ExpressionText {
            name,
            signature: Signature::one_of(arities, Volatility::Stable),
        })
    })
    .collect()
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ExpressionText {
    name: &'static str,
    signature: Signature,
}

impl ScalarUDFImpl for ExpressionText {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        if self.name == "pg_get_partkeydef" {
            return Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)));
        }
        let text = datafusion::arrow::compute::cast(&args.args[0].to_array(n)?, &DataType::Utf8)?;
        // datafusion-postgres's catalogs hold '' where Postgres has no expression.
        let text: StringArray = text
            .as_string::<i32>()
            .iter()
            .map(|t| t.filter(|t| !t.is_empty()))
            .collect();
        Ok(ColumnarValue::Array(Arc::new(text)))
    }
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

/// `pg_size_pretty(bigint)`: a size as Postgres prints it (`10 kB`, `1234 bytes`): the
/// unit steps up while the value is at least 10 units, rounding half away from zero.
fn pg_size_pretty_udf() -> ScalarUDF {
    create_udf(
        "pg_size_pretty",
        vec![DataType::Int64],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let a = args[0].to_array(1)?;
            let a = datafusion::arrow::compute::cast(&a, &DataType::Int64)?;
            let out: StringArray = a
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .iter()
                .map(|v| v.map(size_pretty))
                .collect();
            Ok(match &args[0] {
                ColumnarValue::Scalar(_) => {
                    ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
                }
                ColumnarValue::Array(_) => ColumnarValue::Array(Arc::new(out)),
            })
        }),
    )
}

/// Postgres's `pg_size_pretty` for a bigint: bytes up to 10 kB - 1 (exactly, below
/// 10240), then kB, MB, GB, TB, PB, each shown while the value is below 10 of the next.
pub fn size_pretty(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["kB", "MB", "GB", "TB", "PB"];
    if bytes.unsigned_abs() < 10 * 1024 {
        return format!("{bytes} bytes");
    }
    // Postgres halves, rounds half away from zero, at each step (size >> 9, then +1 >> 1).
    let half_round = |v: i64| if v < 0 { -((-v + 1) / 2) } else { (v + 1) / 2 };
    let mut size = bytes >> 9;
    for (i, unit) in UNITS.iter().enumerate() {
        let rounded = half_round(size);
        if rounded.unsigned_abs() < 10 * 1024 || i == UNITS.len() - 1 {
            return format!("{rounded} {unit}");
        }
        size >>= 10;
    }
    unreachable!("the last unit returns")
}

/// What `pg_class` scans learn of relations, for the functions and tables that need it
/// without reading `pg_class` themselves: each relation's oid by schema and name
/// (`to_regclass`), the comments `obj_description` and `pg_description` give (a line on
/// what each stream, sink, table and view is), and the oids datafusion-postgres gave the
/// system catalogs that Tidemark reports as Postgres's (`pg_attribute.attrelid`). Kept
/// current by every scan of `pg_class`.
#[derive(Debug, Default)]
pub(super) struct Relations {
    index: std::sync::RwLock<RelationIndex>,
}

#[derive(Debug, Default)]
struct RelationIndex {
    comments: HashMap<i32, String>,
    by_name: HashMap<(String, String), i32>,
    /// datafusion-postgres's oid of a system catalog, to Postgres's.
    renumbered: HashMap<i32, i32>,
    /// Primary keys by the oid of their constraint and by that of their index.
    keys: HashMap<i32, super::constraints::KeyDef>,
    /// Schemas' comments by oid (Postgres's line on `public`).
    namespace_comments: HashMap<i32, String>,
}

impl Relations {
    fn set(&self, index: RelationIndex) {
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = index;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, RelationIndex> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The oids of relations in schemas off the search path (not `pg_catalog`, `public`).
    fn off_search_path(&self) -> std::collections::HashSet<i32> {
        self.read()
            .by_name
            .iter()
            .filter(|((schema, _), _)| schema != "pg_catalog" && schema != "public")
            .map(|(_, oid)| *oid)
            .collect()
    }

    /// The oid of a relation of schema `public`.
    pub(super) fn public_oid(&self, name: &str) -> Option<i32> {
        self.read()
            .by_name
            .get(&("public".to_string(), name.to_string()))
            .copied()
    }

    /// The primary key whose constraint or index has this oid.
    pub(super) fn key(&self, oid: i32) -> Option<super::constraints::KeyDef> {
        self.read().keys.get(&oid).cloned()
    }

    fn comment(&self, oid: i32) -> Option<String> {
        self.read().comments.get(&oid).cloned()
    }

    /// Every comment `pg_description` adds: `(classoid, objoid, text)`.
    fn comments(&self) -> Vec<(i32, i32, String)> {
        let index = self.read();
        let relations = index
            .comments
            .iter()
            .map(|(k, v)| (PG_CLASS_OID, *k, v.clone()));
        let schemas = index
            .namespace_comments
            .iter()
            .map(|(k, v)| (PG_NAMESPACE_OID, *k, v.clone()));
        let mut all: Vec<_> = relations.chain(schemas).collect();
        all.sort();
        all
    }

    fn namespace_comment(&self, oid: i32) -> Option<String> {
        self.read().namespace_comments.get(&oid).cloned()
    }

    /// The oid of a relation named as `regclass` input: `name` or `schema.name`, quoted
    /// or not; an unqualified name is looked up in `pg_catalog`, then `public` (Postgres's
    /// search path).
    fn oid_of(&self, text: &str) -> Option<i32> {
        let parts = parse_qualified(text)?;
        let index = self.read();
        match parts.as_slice() {
            [name] => super::rewrite::system_catalog_oid(name)
                .or_else(|| {
                    index
                        .by_name
                        .get(&("pg_catalog".into(), name.clone()))
                        .copied()
                })
                .or_else(|| index.by_name.get(&("public".into(), name.clone())).copied()),
            [schema, name] => index.by_name.get(&(schema.clone(), name.clone())).copied(),
            _ => None,
        }
    }
}

/// `a.b` / `"A".b` / `a` as its parts, unquoted (quoted parts keep their case, others
/// fold to lower case); `None` when the text is not a qualified name.
fn parse_qualified(text: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = text.trim().chars().peekable();
    loop {
        let mut part = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    '"' => break,
                    c => part.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                part.extend(c.to_lowercase());
                chars.next();
            }
            if part.is_empty() {
                return None;
            }
        }
        parts.push(part);
        match chars.next() {
            None => return Some(parts),
            Some('.') => {}
            Some(_) => return None,
        }
    }
}

/// `to_regclass(text)`: the relation's oid ([`Relations::oid_of`]), NULL when there is no
/// such relation.
fn to_regclass_udf(relations: Arc<Relations>) -> ScalarUDF {
    create_udf(
        "to_regclass",
        vec![DataType::Utf8],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(move |args: &[ColumnarValue]| {
            let a = args[0].to_array(1)?;
            let a = datafusion::arrow::compute::cast(&a, &DataType::Utf8)?;
            let oids: Int32Array = a
                .as_string::<i32>()
                .iter()
                .map(|t| t.and_then(|t| relations.oid_of(t)))
                .collect();
            Ok(match &args[0] {
                ColumnarValue::Scalar(_) => {
                    ColumnarValue::Scalar(ScalarValue::try_from_array(&oids, 0)?)
                }
                ColumnarValue::Array(_) => ColumnarValue::Array(Arc::new(oids)),
            })
        }),
    )
}

/// `pg_table_is_visible(oid)`: whether the relation's schema is on the search path
/// (`pg_catalog`, `public`), as Postgres answers it; `tidemark.*` and
/// `information_schema.*` are not (psql's `\dt`, SQLAlchemy's `reflect()`). An oid of no
/// relation is visible, as datafusion-postgres answered.
fn pg_table_is_visible_udf(relations: Arc<Relations>) -> ScalarUDF {
    create_udf(
        "pg_table_is_visible",
        vec![DataType::Int64],
        DataType::Boolean,
        Volatility::Stable,
        Arc::new(move |args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let oids = datafusion::arrow::compute::cast(&arrays[0], &DataType::Int64)?;
            let hidden = relations.off_search_path();
            let visible: BooleanArray = oids
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .iter()
                .map(|o| o.map(|o| i32::try_from(o).map_or(true, |o| !hidden.contains(&o))))
                .collect();
            let visible: ArrayRef = Arc::new(visible);
            Ok(
                if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
                    ColumnarValue::Scalar(ScalarValue::try_from_array(&visible, 0)?)
                } else {
                    ColumnarValue::Array(visible)
                },
            )
        }),
    )
}

/// `obj_description(oid [, catalog])`: a relation's or a schema's comment
/// ([`Relations`]); NULL for every other object.
fn obj_description_udf(relations: Arc<Relations>) -> ScalarUDF {
    ScalarUDF::new_from_impl(ObjDescription {
        relations,
        signature: Signature::one_of(
            vec![
                datafusion::logical_expr::TypeSignature::Exact(vec![DataType::Int64]),
                datafusion::logical_expr::TypeSignature::Exact(vec![
                    DataType::Int64,
                    DataType::Utf8,
                ]),
            ],
            Volatility::Stable,
        ),
    })
}

#[derive(Debug)]
struct ObjDescription {
    relations: Arc<Relations>,
    signature: Signature,
}

impl PartialEq for ObjDescription {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.relations, &other.relations)
    }
}

impl Eq for ObjDescription {}

impl std::hash::Hash for ObjDescription {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "obj_description".hash(state);
    }
}

impl ScalarUDFImpl for ObjDescription {
    fn name(&self) -> &str {
        "obj_description"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let oids = args.args[0].to_array(n)?;
        let oids = datafusion::arrow::compute::cast(&oids, &DataType::Int32)?;
        let catalogs = match args.args.get(1) {
            Some(c) => Some(datafusion::arrow::compute::cast(
                &c.to_array(n)?,
                &DataType::Utf8,
            )?),
            None => None,
        };
        let out: StringArray = (0..n)
            .map(|i| {
                let oids = oids.as_primitive::<datafusion::arrow::datatypes::Int32Type>();
                if oids.is_null(i) {
                    return None;
                }
                let catalog = match catalogs.as_ref() {
                    None => Some("pg_class"),
                    Some(c) => {
                        let c = c.as_string::<i32>();
                        c.is_valid(i).then(|| c.value(i))
                    }
                };
                match catalog {
                    Some("pg_class") => self.relations.comment(oids.value(i)),
                    Some("pg_namespace") => self.relations.namespace_comment(oids.value(i)),
                    _ => None,
                }
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[derive(Debug)]
struct PgCatalog {
    inner: Arc<dyn SchemaProvider>,
    /// Where streams, sinks and views are.
    public: Arc<dyn SchemaProvider>,
    engine: Weak<Engine>,
    relations: Arc<Relations>,
}

/// The tables of `public` whose provider is a `T`, with `definition` of each, by name.
async fn views_of<T: TableProvider>(
    public: &Arc<dyn SchemaProvider>,
    definition: impl Fn(&T) -> String,
) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for name in public.table_names() {
        if let Some(t) = public.table(&name).await?
            && let Some(v) = t.downcast_ref::<T>()
        {
            out.push((name, definition(v)));
        }
    }
    out.sort();
    Ok(out)
}

/// The materialized views of `public`: name and definition.
async fn views(public: &Arc<dyn SchemaProvider>) -> Result<Vec<(String, String)>> {
    views_of::<ViewTable>(public, |v| v.definition().to_string()).await
}

/// The plain views (`CREATE VIEW`) in `public`, with their definitions, by name.
async fn plain_views(public: &Arc<dyn SchemaProvider>) -> Result<Vec<(String, String)>> {
    views_of::<datafusion::catalog::view::ViewTable>(public, |v| {
        v.definition().map(|d| view_query(d)).unwrap_or_default()
    })
    .await
}

/// The query of a `CREATE VIEW` statement's text (DataFusion keeps the statement), as
/// Postgres's `pg_views.definition` gives it: ` SELECT ...;`.
fn view_query(statement: &str) -> String {
    use datafusion::sql::sqlparser::ast::Statement;
    let parsed = datafusion::sql::sqlparser::parser::Parser::parse_sql(
        &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
        statement,
    );
    match parsed.as_deref() {
        Ok([Statement::CreateView(v)]) => format!(" {};", v.query),
        _ => statement.to_string(),
    }
}

impl PgCatalog {
    async fn pg_class(&self) -> Result<Option<Arc<PgClass>>> {
        let (Some(inner), Some(namespaces)) = (
            self.inner.table("pg_class").await?,
            self.inner.table("pg_namespace").await?,
        ) else {
            return Ok(None);
        };
        Ok(Some(Arc::new(PgClass {
            inner,
            namespaces,
            public: self.public.clone(),
            engine: self.engine.clone(),
            relations: self.relations.clone(),
        })))
    }
}

/// A `pg_catalog` table datafusion-postgres makes, with Tidemark's corrections: the rows
/// are `batches` of `inner`'s, computed at each scan.
#[async_trait]
pub(super) trait Patch: std::fmt::Debug + Send + Sync + 'static {
    fn inner(&self) -> &Arc<dyn TableProvider>;

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>>;
}

/// A [`Patch`] as a table.
#[derive(Debug)]
pub(super) struct Patched<P>(pub(super) Arc<P>);

#[async_trait]
impl<P: Patch> TableProvider for Patched<P> {
    fn schema(&self) -> SchemaRef {
        self.0.inner().schema()
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
        let batches = self.0.batches(state).await?;
        Ok(MemorySourceConfig::try_new_exec(
            &[batches],
            self.schema(),
            projection.cloned(),
        )?)
    }
}

/// Every batch of `table`, unfiltered.
pub(super) async fn collect_all(
    table: &Arc<dyn TableProvider>,
    state: &dyn Session,
) -> Result<Vec<RecordBatch>> {
    let plan = table.scan(state, None, &[], None).await?;
    datafusion::physical_plan::collect(plan, state.task_ctx()).await
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        let mut names = self.inner.table_names();
        names.extend(["pg_user".to_string(), "pg_stat_activity".to_string()]);
        names
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        match name.to_ascii_lowercase().as_str() {
            "pg_class" => Ok(self
                .pg_class()
                .await?
                .map(|c| Arc::new(Patched(c)) as Arc<dyn TableProvider>)),
            "pg_description" | "pg_attribute" => {
                let (Some(class), Some(inner)) =
                    (self.pg_class().await?, self.inner.table(name).await?)
                else {
                    return Ok(None);
                };
                let relations = self.relations.clone();
                Ok(Some(if name.eq_ignore_ascii_case("pg_description") {
                    Arc::new(Patched(Arc::new(PgDescription {
                        inner,
                        class,
                        relations,
                    })))
                } else {
                    Arc::new(Patched(Arc::new(PgAttribute {
                        inner,
                        class,
                        relations,
                    })))
                }))
            }
            "pg_stat_user_tables" => {
                let (Some(class), Some(inner)) =
                    (self.pg_class().await?, self.inner.table(name).await?)
                else {
                    return Ok(None);
                };
                Ok(Some(Arc::new(Patched(Arc::new(PgStatUserTables {
                    inner,
                    class,
                    public: self.public.clone(),
                    relations: self.relations.clone(),
                })))))
            }
            "pg_database" => Ok(self.inner.table(name).await?.map(|inner| {
                Arc::new(Patched(Arc::new(PgDatabase { inner }))) as Arc<dyn TableProvider>
            })),
            "pg_matviews" => Ok(Some(Arc::new(pg_matviews(&views(&self.public).await?)?))),
            "pg_views" => Ok(Some(Arc::new(pg_views(&plain_views(&self.public).await?)?))),
            "pg_settings" => Ok(Some(Arc::new(pg_settings()?))),
            "pg_roles" | "pg_authid" | "pg_user" => {
                let (Some(roles), Some(predefined)) = (
                    self.inner.table("pg_roles").await?,
                    self.inner.table("pg_authid").await?,
                ) else {
                    return Ok(None);
                };
                let table = |inner| {
                    Arc::new(super::roles_catalog::PgRoles {
                        inner,
                        predefined: predefined.clone(),
                        engine: self.engine.clone(),
                        show_password: !name.eq_ignore_ascii_case("pg_authid"),
                    })
                };
                Ok(Some(match name.to_ascii_lowercase().as_str() {
                    "pg_user" => Arc::new(super::roles_catalog::PgUser {
                        roles: table(roles),
                    }),
                    "pg_roles" => Arc::new(Patched(table(roles))),
                    _ => Arc::new(Patched(table(predefined.clone()))),
                }))
            }
            "pg_constraint" | "pg_index" => {
                let (Some(inner), Some(class), Some(namespaces)) = (
                    self.inner.table(name).await?,
                    self.pg_class().await?,
                    self.inner.table("pg_namespace").await?,
                ) else {
                    return Ok(None);
                };
                let keys = super::constraints::Keys {
                    engine: self.engine.clone(),
                    public: self.public.clone(),
                    class,
                    relations: self.relations.clone(),
                    namespaces,
                };
                Ok(Some(if name.eq_ignore_ascii_case("pg_index") {
                    Arc::new(Patched(Arc::new(super::constraints::PgIndex {
                        inner,
                        keys,
                    })))
                } else {
                    Arc::new(Patched(Arc::new(super::constraints::PgConstraint {
                        inner,
                        keys,
                    })))
                }))
            }
            "pg_auth_members" => {
                let (Some(inner), Some(predefined)) = (
                    self.inner.table(name).await?,
                    self.inner.table("pg_authid").await?,
                ) else {
                    return Ok(None);
                };
                Ok(Some(Arc::new(Patched(Arc::new(
                    super::roles_catalog::PgAuthMembers {
                        inner,
                        predefined,
                        engine: self.engine.clone(),
                    },
                )))))
            }
            "pg_stat_activity" => Ok(Some(Arc::new(super::roles_catalog::pg_stat_activity()?))),
            _ => self.inner.table(name).await,
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
            || ["pg_user", "pg_stat_activity"]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// A batch of `n` rows in `schema`'s columns, each from `column(name)` when it answers
/// (cast to the column's type), otherwise NULL (or, where the column allows none, the
/// type's zero: `''`, 0, false).
pub(super) fn batch_by_name(
    schema: &SchemaRef,
    n: usize,
    column: impl Fn(&str) -> Option<ArrayRef>,
) -> Result<RecordBatch> {
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let array = match column(field.name()) {
            Some(a) if a.data_type() == field.data_type() => a,
            Some(a) => datafusion::arrow::compute::cast(&a, field.data_type())?,
            None if !field.is_nullable() => {
                ScalarValue::new_default(field.data_type())?.to_array_of_size(n)?
            }
            None => datafusion::arrow::array::new_null_array(field.data_type(), n),
        };
        columns.push(array);
    }
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// `regtype_names(oids)`: the names of the types in a list of oids as `pg_proc` holds one
/// (`"25 23"`, `"[25,23]"`, `"{25,23}"`), as Postgres shows `oids::regtype[]`; an oid of no
/// known type is its number, as `regtype` prints it.
fn regtype_names_udf() -> ScalarUDF {
    use datafusion::arrow::array::{ListBuilder, StringBuilder};
    create_udf(
        "regtype_names",
        vec![DataType::Utf8],
        DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let text = datafusion::arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
            let text = text.as_string::<i32>();
            let mut out = ListBuilder::new(StringBuilder::new());
            for i in 0..text.len() {
                if text.is_null(i) {
                    out.append(false);
                    continue;
                }
                for oid in text
                    .value(i)
                    .split(|c: char| !c.is_ascii_digit())
                    .filter(|s| !s.is_empty())
                {
                    let name = oid
                        .parse::<u32>()
                        .ok()
                        .and_then(Type::from_oid)
                        .map(|t| super::information_schema::sql_type_name(&t))
                        .unwrap_or_else(|| oid.to_string());
                    out.values().append_value(name);
                }
                out.append(true);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    )
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

/// A nullable text column.
fn text(v: Vec<Option<String>>) -> ArrayRef {
    Arc::new(StringArray::from(v))
}

/// A table of `views` in `public` owned by the bootstrap superuser, as every relation is
/// (`pg_class.relowner`): the columns `schemaname`, `<kind>name` and `<kind>owner`, then
/// `rest`, then the `definition` `definition` gives.
fn views_table(
    kind: &str,
    views: &[(String, String)],
    rest: Vec<(Field, ArrayRef)>,
    definition: impl Fn(&str) -> String,
) -> Result<MemTable> {
    let n = views.len();
    let mut fields = vec![
        Field::new("schemaname", DataType::Utf8, true),
        Field::new(format!("{kind}name"), DataType::Utf8, true),
        Field::new(format!("{kind}owner"), DataType::Utf8, true),
    ];
    let mut columns = vec![
        text(vec![Some("public".into()); n]),
        text(views.iter().map(|(name, _)| Some(name.clone())).collect()),
        text(vec![Some("postgres".into()); n]),
    ];
    for (field, column) in rest {
        fields.push(field);
        columns.push(column);
    }
    fields.push(Field::new("definition", DataType::Utf8, true));
    columns.push(text(
        views.iter().map(|(_, d)| Some(definition(d))).collect(),
    ));
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    MemTable::try_new(schema, vec![vec![batch]])
}

/// `pg_matviews`, as Postgres has it.
fn pg_matviews(views: &[(String, String)]) -> Result<MemTable> {
    let n = views.len();
    let flag = |name: &str| {
        let column = Arc::new(BooleanArray::from(vec![true; n])) as ArrayRef;
        (Field::new(name, DataType::Boolean, true), column)
    };
    let rest = vec![
        (
            Field::new("tablespace", DataType::Utf8, true),
            text(vec![None; n]),
        ),
        // The group key is indexed: lookups on it do not scan.
        flag("hasindexes"),
        flag("ispopulated"),
    ];
    views_table("matview", views, rest, |d| format!(" {d};"))
}

/// `pg_views`: the plain views in `public` (datafusion-postgres's is empty).
fn pg_views(views: &[(String, String)]) -> Result<MemTable> {
    views_table("view", views, Vec::new(), str::to_string)
}

/// datafusion-postgres's `pg_class` with relkind `m` for materialized views. Each scan
/// also refreshes the relations' comments ([`Relations`]).
#[derive(Debug)]
pub(super) struct PgClass {
    inner: Arc<dyn TableProvider>,
    namespaces: Arc<dyn TableProvider>,
    public: Arc<dyn SchemaProvider>,
    engine: Weak<Engine>,
    relations: Arc<Relations>,
}

impl PgClass {
    /// `pg_class`'s rows, patched, after refreshing [`Relations`]: a materialized view is
    /// relkind `m`, and a system catalog has Postgres's oid (the one `pg_type.typrelid`,
    /// `pg_constraint.conrelid` and `'pg_class'::regclass` give).
    pub(super) async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let schema = self.inner.schema();
        let batches = collect_all(&self.inner, state).await?;
        let views: Vec<String> = views(&self.public)
            .await?
            .into_iter()
            .map(|v| v.0)
            .collect();
        let (Ok(name_idx), Ok(kind_idx), Ok(oid_idx), Ok(ns_idx)) = (
            schema.index_of("relname"),
            schema.index_of("relkind"),
            schema.index_of("oid"),
            schema.index_of("relnamespace"),
        ) else {
            return Ok(batches);
        };
        let namespaces = self.namespace_names(state).await?;
        let relations = match self.engine.upgrade() {
            Some(e) => e.relations().await,
            None => Vec::new(),
        };
        let mut index = RelationIndex::default();
        let mut patched = Vec::with_capacity(batches.len());
        for b in batches {
            let (Some(names), Some(kinds), Some(oids), Some(nss)) = (
                b.column(name_idx).as_string_opt::<i32>(),
                b.column(kind_idx).as_string_opt::<i32>(),
                b.column(oid_idx)
                    .as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>(),
                b.column(ns_idx)
                    .as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>(),
            ) else {
                patched.push(b);
                continue;
            };
            let mut new_oids = Vec::with_capacity(b.num_rows());
            for i in 0..b.num_rows() {
                if names.is_null(i) || oids.is_null(i) || nss.is_null(i) {
                    new_oids.push((!oids.is_null(i)).then(|| oids.value(i)));
                    continue;
                }
                let (name, mut oid) = (names.value(i), oids.value(i));
                let ns = namespaces.get(&nss.value(i)).map(String::as_str);
                if ns == Some("pg_catalog")
                    && let Some(real) = super::rewrite::system_catalog_oid(name)
                {
                    index.renumbered.insert(oid, real);
                    oid = real;
                }
                if ns == Some("public")
                    && let Some(r) = relations.iter().find(|r| r.name == name)
                {
                    index.comments.insert(oid, r.description.clone());
                }
                if let Some(ns) = ns {
                    index
                        .by_name
                        .insert((ns.to_string(), name.to_string()), oid);
                }
                new_oids.push(Some(oid));
            }
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
            cols[oid_idx] = Arc::new(Int32Array::from(new_oids));
            if let Ok(has_index) = schema.index_of("relhasindex") {
                // A table with a primary key has its index (below).
                let keyed: BooleanArray = (0..b.num_rows())
                    .map(|i| {
                        let keyed = !names.is_null(i)
                            && namespaces.get(&nss.value(i)).map(String::as_str) == Some("public")
                            && keyed(&relations, names.value(i));
                        Some(
                            keyed
                                || b.column(has_index)
                                    .as_boolean_opt()
                                    .is_some_and(|v| v.value(i)),
                        )
                    })
                    .collect();
                cols[has_index] = Arc::new(keyed);
            }
            patched.push(RecordBatch::try_new(b.schema(), cols)?);
        }
        // Each primary key's index, in the schema of its table.
        let public = namespaces
            .iter()
            .find(|(_, n)| *n == "public")
            .map(|(oid, _)| *oid);
        if let Some(public) = public {
            index
                .namespace_comments
                .insert(public, "standard public schema".into());
        }
        if let Some(public) = public {
            let keys: Vec<(String, usize)> = relations
                .iter()
                .filter(|r| {
                    !r.primary_key.is_empty()
                        && index
                            .by_name
                            .contains_key(&("public".to_string(), r.name.clone()))
                })
                .map(|r| (r.name.clone(), r.primary_key.len()))
                .collect();
            if !keys.is_empty() {
                patched.push(super::constraints::index_class_rows(
                    &schema, &keys, public,
                )?);
            }
        }
        for r in relations.iter().filter(|r| !r.primary_key.is_empty()) {
            if index
                .by_name
                .contains_key(&("public".to_string(), r.name.clone()))
            {
                let key = super::constraints::KeyDef {
                    table: r.name.clone(),
                    columns: r.primary_key.clone(),
                };
                index.keys.insert(key.constraint_oid(), key.clone());
                index.keys.insert(key.index_oid(), key);
            }
        }
        self.relations.set(index);
        Ok(patched)
    }

    /// Each schema's name by oid.
    async fn namespace_names(&self, state: &dyn Session) -> Result<HashMap<i32, String>> {
        let mut out = HashMap::new();
        for b in collect_all(&self.namespaces, state).await? {
            let (Ok(oid_idx), Ok(name_idx)) =
                (b.schema().index_of("oid"), b.schema().index_of("nspname"))
            else {
                break;
            };
            let (Some(oids), Some(names)) = (
                b.column(oid_idx)
                    .as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>(),
                b.column(name_idx).as_string_opt::<i32>(),
            ) else {
                break;
            };
            for i in 0..b.num_rows() {
                if !names.is_null(i) && !oids.is_null(i) {
                    out.insert(oids.value(i), names.value(i).to_string());
                }
            }
        }
        Ok(out)
    }
}

/// datafusion-postgres's `pg_attribute`, with the system catalogs' `attrelid` renumbered
/// as `pg_class` numbers them ([`PgClass::batches`]).
#[derive(Debug)]
struct PgAttribute {
    inner: Arc<dyn TableProvider>,
    class: Arc<PgClass>,
    relations: Arc<Relations>,
}

#[async_trait]
impl Patch for PgAttribute {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let schema = self.inner.schema();
        self.class.batches(state).await?;
        let mut batches = collect_all(&self.inner, state).await?;
        if let Ok(idx) = schema.index_of("attrelid") {
            let renumbered = self.relations.read().renumbered.clone();
            for b in &mut batches {
                let Some(rel) = b
                    .column(idx)
                    .as_primitive_opt::<datafusion::arrow::datatypes::Int32Type>()
                else {
                    continue;
                };
                let rel: Int32Array = rel
                    .iter()
                    .map(|o| o.map(|o| renumbered.get(&o).copied().unwrap_or(o)))
                    .collect();
                let mut cols = b.columns().to_vec();
                cols[idx] = Arc::new(rel);
                *b = RecordBatch::try_new(b.schema(), cols)?;
            }
        }
        Ok(batches)
    }
}

#[async_trait]
impl Patch for PgClass {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        PgClass::batches(self, state).await
    }
}

/// datafusion-postgres's `pg_description` (its built-in functions' descriptions) and a
/// row for each relation that has a comment ([`Relations`]), `classoid` `pg_class`, and
/// Postgres's comment on schema `public`, `classoid` `pg_namespace`.
#[derive(Debug)]
struct PgDescription {
    inner: Arc<dyn TableProvider>,
    class: Arc<PgClass>,
    relations: Arc<Relations>,
}

/// Postgres's oid of `pg_class`, the `classoid` of a relation's comment.
const PG_CLASS_OID: i32 = 1259;
/// Postgres's oid of `pg_namespace`, the `classoid` of a schema's comment.
const PG_NAMESPACE_OID: i32 = 2615;

#[async_trait]
impl Patch for PgDescription {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let schema = self.inner.schema();
        // Refreshes the comments.
        self.class.batches(state).await?;
        let mut batches = collect_all(&self.inner, state).await?;
        let comments = self.relations.comments();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| -> Result<ArrayRef> {
                Ok(match f.name().as_str() {
                    "objoid" => {
                        Arc::new(Int32Array::from_iter_values(comments.iter().map(|c| c.1)))
                    }
                    "classoid" => {
                        Arc::new(Int32Array::from_iter_values(comments.iter().map(|c| c.0)))
                    }
                    "objsubid" => Arc::new(Int32Array::from(vec![0; comments.len()])),
                    "description" => Arc::new(StringArray::from_iter_values(
                        comments.iter().map(|c| c.2.as_str()),
                    )),
                    _ => datafusion::arrow::array::new_null_array(f.data_type(), comments.len()),
                })
            })
            .collect::<Result<_>>()?;
        let columns = columns
            .into_iter()
            .zip(schema.fields())
            .map(|(c, f)| datafusion::arrow::compute::cast(&c, f.data_type()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
        Ok(batches)
    }
}

/// `pg_stat_user_tables`: a row per relation of schema `public` (datafusion-postgres's is
/// empty), `relid` joining `pg_class.oid`. `n_live_tup` (Metabase's row estimate) is a
/// materialized view's row count, or what a relation's statistics know; a Delta table's or
/// a stream's is not counted (0, as Postgres shows before its statistics are gathered).
/// The scan and vacuum counters are 0, their times NULL: Tidemark keeps no such counts.
#[derive(Debug)]
struct PgStatUserTables {
    inner: Arc<dyn TableProvider>,
    class: Arc<PgClass>,
    public: Arc<dyn SchemaProvider>,
    relations: Arc<Relations>,
}

#[async_trait]
impl Patch for PgStatUserTables {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        // Refreshes the relations' oids.
        self.class.batches(state).await?;
        let mut rows: Vec<(i32, String, i64)> = Vec::new();
        let mut names = self.public.table_names();
        names.sort();
        for name in names {
            let (Some(oid), Some(table)) = (
                self.relations.public_oid(&name),
                self.public.table(&name).await?,
            ) else {
                continue;
            };
            let live = match table.downcast_ref::<ViewTable>() {
                Some(view) => Some(view.snapshot().num_rows()),
                None => table
                    .statistics()
                    .and_then(|s| s.num_rows.get_value().copied()),
            };
            let live = live.map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX));
            rows.push((oid, name, live));
        }
        let n = rows.len();
        let batch = batch_by_name(&self.inner.schema(), n, |column| {
            Some(match column {
                "relid" => Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
                "schemaname" => Arc::new(StringArray::from(vec!["public"; n])),
                "relname" => Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r.1.as_str()),
                )),
                "n_live_tup" => Arc::new(datafusion::arrow::array::Int64Array::from_iter_values(
                    rows.iter().map(|r| r.2),
                )),
                _ => return None,
            })
        })?;
        Ok(vec![batch])
    }
}

/// `pg_database`: one database per name clients are connected with, and `postgres`.
/// Tidemark has one database and answers to any name; each name a client uses is listed,
/// so the database a client connected to is the one `\l` and `pg_database` show (and
/// `current_database()` answers, [`super::rewrite`]). The columns are the `postgres`
/// row's of datafusion-postgres's table.
#[derive(Debug)]
struct PgDatabase {
    inner: Arc<dyn TableProvider>,
}

#[async_trait]
impl Patch for PgDatabase {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let schema = self.inner.schema();
        let batches = collect_all(&self.inner, state).await?;
        let all = datafusion::arrow::compute::concat_batches(&schema, &batches)?;
        let names = super::activity::databases_in_use();
        let (Ok(oid_idx), Ok(name_idx)) = (schema.index_of("oid"), schema.index_of("datname"))
        else {
            return Ok(vec![all]);
        };
        let template = (0..all.num_rows())
            .find(|&i| {
                all.column(name_idx)
                    .as_string_opt::<i32>()
                    .is_some_and(|n| n.value(i) == "postgres")
            })
            .unwrap_or(0);
        if all.num_rows() == 0 {
            return Ok(vec![all]);
        }
        let indices =
            datafusion::arrow::array::UInt32Array::from(vec![template as u32; names.len()]);
        let mut columns: Vec<ArrayRef> = all
            .columns()
            .iter()
            .map(|c| datafusion::arrow::compute::take(c, &indices, None))
            .collect::<std::result::Result<_, _>>()?;
        columns[oid_idx] = Arc::new(Int32Array::from_iter_values(
            names.iter().map(|n| database_oid(n)),
        ));
        columns[name_idx] = Arc::new(StringArray::from_iter_values(names.iter()));
        Ok(vec![RecordBatch::try_new(schema.clone(), columns)?])
    }
}

/// A database's oid: Postgres's 5 for `postgres`, otherwise one derived from the name
/// (stable across restarts, above the range Postgres reserves for its own objects).
pub(super) fn database_oid(name: &str) -> i32 {
    if name == "postgres" {
        return 5;
    }
    oid_of_name(name)
}

/// An oid derived from a name: stable across restarts, above the range Postgres reserves
/// for its own objects.
/// Whether the relation called `name` has a primary key.
fn keyed(relations: &[crate::catalog::Relation], name: &str) -> bool {
    relations
        .iter()
        .any(|r| r.name == name && !r.primary_key.is_empty())
}

pub(super) fn oid_of_name(name: &str) -> i32 {
    // FNV-1a
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    1_000_000 + (h % 1_000_000_000) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PostgreSQL's own answers (Debian's 15, `psql -c "SELECT pg_size_pretty(n::bigint)"`;
    /// tests/it/catalog.rs asks a live server the same).
    #[test]
    fn sizes_print_as_postgres_prints_them() {
        for (n, want) in [
            (0, "0 bytes"),
            (10239, "10239 bytes"),
            (10240, "10 kB"),
            (1234567, "1206 kB"),
            (10_485_760, "10 MB"),
            (123_456_789_012, "115 GB"),
            (-10240, "-10 kB"),
        ] {
            assert_eq!(size_pretty(n), want, "{n}");
        }
    }

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
