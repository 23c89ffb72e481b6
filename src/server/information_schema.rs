//! `information_schema` as Postgres has it, for the clients that browse a database
//! through it (Grafana, Metabase, Superset, DBeaver, pgjdbc).
//!
//! DataFusion's own is unlike Postgres's: Arrow type names in `data_type` (`Int64`), no
//! `udt_name`, `is_identity` or `table_constraints`. This one takes its place as an
//! ordinary schema of the catalog (DataFusion's special case is switched off in
//! [`install`]) and answers with Postgres's columns and type names: `data_type = 'bigint'`
//! and `udt_name = 'int8'`, the same types `pg_attribute` and the wire's row descriptions
//! report. Streams, sinks and tables are `BASE TABLE`s; a materialized view is a `VIEW`
//! (Postgres leaves materialized views out of `information_schema`, which would hide
//! Tidemark's main product from the BI tools that read only it). A table's `PRIMARY KEY`
//! is in `table_constraints` and `key_column_usage`. `df_settings`, `routines` and
//! `parameters` are DataFusion's (its `SHOW FUNCTIONS` reads them).

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::information_schema::InformationSchemaProvider;
use datafusion::catalog::{CatalogProviderList, SchemaProvider, Session};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_postgres::arrow_pg::datatypes::field_into_pg_type;
use datafusion_postgres::pgwire::api::Type;

use crate::catalog::{Relation, RelationKind};
use crate::engine::Engine;

pub const SCHEMA: &str = "information_schema";

/// The tables this schema answers itself.
const OWN: [&str; 6] = [
    "tables",
    "columns",
    "schemata",
    "views",
    "table_constraints",
    "key_column_usage",
];

/// DataFusion's tables kept.
const DATAFUSION: [&str; 3] = ["df_settings", "routines", "parameters"];

/// Registers Postgres's `information_schema` in catalog `catalog` of the engine's
/// session, in place of DataFusion's.
pub fn install(engine: &Engine, catalog: &str) -> crate::error::Result<()> {
    let ctx: &SessionContext = engine.context();
    ctx.state_ref()
        .write()
        .config_mut()
        .options_mut()
        .catalog
        .information_schema = false;
    let list = ctx.state().catalog_list().clone();
    let cat = ctx
        .catalog(catalog)
        .ok_or_else(|| crate::error::Error::Internal(format!("no catalog {catalog}")))?;
    let schema = InformationSchema {
        source: Arc::new(Source {
            list: list.clone(),
            catalog: catalog.to_string(),
            engine: engine.handle(),
        }),
        datafusion: InformationSchemaProvider::new(list),
    };
    cat.register_schema(SCHEMA, Arc::new(schema))?;
    Ok(())
}

#[derive(Debug)]
struct InformationSchema {
    source: Arc<Source>,
    datafusion: InformationSchemaProvider,
}

#[async_trait]
impl SchemaProvider for InformationSchema {
    fn table_names(&self) -> Vec<String> {
        OWN.iter()
            .chain(&DATAFUSION)
            .map(|t| t.to_string())
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let name = name.to_ascii_lowercase();
        if let Some(view) = View::from_name(&name) {
            return Ok(Some(Arc::new(InfoTable {
                view,
                source: self.source.clone(),
            })));
        }
        if DATAFUSION.contains(&name.as_str()) {
            return self.datafusion.table(&name).await;
        }
        Ok(None)
    }

    fn table_exist(&self, name: &str) -> bool {
        let name = name.to_ascii_lowercase();
        OWN.contains(&name.as_str()) || DATAFUSION.contains(&name.as_str())
    }
}

/// Where the rows come from: the session's catalogs, and the engine for what each
/// relation is.
#[derive(Debug)]
struct Source {
    list: Arc<dyn CatalogProviderList>,
    catalog: String,
    engine: Weak<Engine>,
}

/// A relation as `information_schema` lists it.
struct Rel {
    schema: String,
    name: String,
    table_type: &'static str,
    fields: Vec<Arc<Field>>,
    /// What Tidemark knows of it, for `public`'s relations.
    tidemark: Option<Relation>,
}

impl Source {
    fn schemas(&self) -> Vec<String> {
        let mut names = self
            .list
            .catalog(&self.catalog)
            .map(|c| c.schema_names())
            .unwrap_or_default();
        names.sort();
        names
    }

    async fn relations(&self) -> Result<Vec<Rel>> {
        let known = match self.engine.upgrade() {
            Some(e) => e.relations().await,
            None => Vec::new(),
        };
        let Some(cat) = self.list.catalog(&self.catalog) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for schema_name in self.schemas() {
            let Some(schema) = cat.schema(&schema_name) else {
                continue;
            };
            let mut names = schema.table_names();
            names.sort();
            for name in names {
                let Some(table) = schema.table(&name).await? else {
                    continue;
                };
                let tidemark = (schema_name == "public")
                    .then(|| known.iter().find(|r| r.name == name).cloned())
                    .flatten();
                let table_type = match (&tidemark, schema_name.as_str(), table.table_type()) {
                    (Some(r), ..) if r.kind == RelationKind::MaterializedView => "VIEW",
                    (Some(_), ..) => "BASE TABLE",
                    (None, SCHEMA, _) => "VIEW",
                    (None, _, TableType::View) => "VIEW",
                    (None, _, TableType::Temporary) => "LOCAL TEMPORARY",
                    (None, _, TableType::Base) => "BASE TABLE",
                };
                out.push(Rel {
                    schema: schema_name.clone(),
                    name,
                    table_type,
                    fields: table.schema().fields().iter().cloned().collect(),
                    tidemark,
                });
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy)]
enum View {
    Tables,
    Columns,
    Schemata,
    Views,
    TableConstraints,
    KeyColumnUsage,
}

impl View {
    fn from_name(name: &str) -> Option<View> {
        Some(match name {
            "tables" => View::Tables,
            "columns" => View::Columns,
            "schemata" => View::Schemata,
            "views" => View::Views,
            "table_constraints" => View::TableConstraints,
            "key_column_usage" => View::KeyColumnUsage,
            _ => return None,
        })
    }

    /// The columns, in Postgres 17's order. Integers are `cardinal_number` (int4);
    /// everything else is text.
    fn schema(self) -> SchemaRef {
        let (text, int): (&[&str], &[&str]) = match self {
            View::Tables => (
                &[
                    "table_catalog",
                    "table_schema",
                    "table_name",
                    "table_type",
                    "self_referencing_column_name",
                    "reference_generation",
                    "user_defined_type_catalog",
                    "user_defined_type_schema",
                    "user_defined_type_name",
                    "is_insertable_into",
                    "is_typed",
                    "commit_action",
                ],
                &[],
            ),
            View::Columns => (
                &[
                    "table_catalog",
                    "table_schema",
                    "table_name",
                    "column_name",
                    "ordinal_position",
                    "column_default",
                    "is_nullable",
                    "data_type",
                    "character_maximum_length",
                    "character_octet_length",
                    "numeric_precision",
                    "numeric_precision_radix",
                    "numeric_scale",
                    "datetime_precision",
                    "interval_type",
                    "interval_precision",
                    "character_set_catalog",
                    "character_set_schema",
                    "character_set_name",
                    "collation_catalog",
                    "collation_schema",
                    "collation_name",
                    "domain_catalog",
                    "domain_schema",
                    "domain_name",
                    "udt_catalog",
                    "udt_schema",
                    "udt_name",
                    "scope_catalog",
                    "scope_schema",
                    "scope_name",
                    "maximum_cardinality",
                    "dtd_identifier",
                    "is_self_referencing",
                    "is_identity",
                    "identity_generation",
                    "identity_start",
                    "identity_increment",
                    "identity_maximum",
                    "identity_minimum",
                    "identity_cycle",
                    "is_generated",
                    "generation_expression",
                    "is_updatable",
                ],
                &[
                    "ordinal_position",
                    "character_maximum_length",
                    "character_octet_length",
                    "numeric_precision",
                    "numeric_precision_radix",
                    "numeric_scale",
                    "datetime_precision",
                    "interval_precision",
                    "maximum_cardinality",
                ],
            ),
            View::Schemata => (
                &[
                    "catalog_name",
                    "schema_name",
                    "schema_owner",
                    "default_character_set_catalog",
                    "default_character_set_schema",
                    "default_character_set_name",
                    "sql_path",
                ],
                &[],
            ),
            View::Views => (
                &[
                    "table_catalog",
                    "table_schema",
                    "table_name",
                    "view_definition",
                    "check_option",
                    "is_updatable",
                    "is_insertable_into",
                    "is_trigger_updatable",
                    "is_trigger_deletable",
                    "is_trigger_insertable_into",
                ],
                &[],
            ),
            View::TableConstraints => (
                &[
                    "constraint_catalog",
                    "constraint_schema",
                    "constraint_name",
                    "table_catalog",
                    "table_schema",
                    "table_name",
                    "constraint_type",
                    "is_deferrable",
                    "initially_deferred",
                    "enforced",
                    "nulls_distinct",
                ],
                &[],
            ),
            View::KeyColumnUsage => (
                &[
                    "constraint_catalog",
                    "constraint_schema",
                    "constraint_name",
                    "table_catalog",
                    "table_schema",
                    "table_name",
                    "column_name",
                    "ordinal_position",
                    "position_in_unique_constraint",
                ],
                &["ordinal_position", "position_in_unique_constraint"],
            ),
        };
        Arc::new(Schema::new(
            text.iter()
                .map(|name| {
                    let ty = if int.contains(name) {
                        DataType::Int32
                    } else {
                        DataType::Utf8
                    };
                    Field::new(*name, ty, true)
                })
                .collect::<Vec<_>>(),
        ))
    }
}

/// One of [`View`]'s tables, read afresh at each scan.
#[derive(Debug)]
struct InfoTable {
    view: View,
    source: Arc<Source>,
}

#[async_trait]
impl TableProvider for InfoTable {
    fn schema(&self) -> SchemaRef {
        self.view.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = self.view.schema();
        let rows = match self.view {
            View::Schemata => schemata(&self.source.catalog, &self.source.schemas()),
            view => rows(view, &self.source.catalog, &self.source.relations().await?),
        };
        let batch = to_batch(&schema, rows)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            schema,
            projection.cloned(),
        )?)
    }
}

/// A cell: text or an integer.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Text(String),
    Int(i32),
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}

impl From<i32> for Cell {
    fn from(v: i32) -> Cell {
        Cell::Int(v)
    }
}

impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Cell {
        v.map_or(Cell::Null, Into::into)
    }
}

fn to_batch(schema: &SchemaRef, rows: Vec<Vec<Cell>>) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| -> ArrayRef {
            let cells = rows.iter().map(|r| r.get(i).unwrap_or(&Cell::Null));
            if f.data_type() == &DataType::Int32 {
                Arc::new(Int32Array::from_iter(cells.map(|c| match c {
                    Cell::Int(v) => Some(*v),
                    _ => None,
                })))
            } else {
                Arc::new(StringArray::from_iter(cells.map(|c| match c {
                    Cell::Text(t) => Some(t.as_str()),
                    _ => None,
                })))
            }
        })
        .collect();
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

fn yes_no(b: bool) -> Cell {
    Cell::from(if b { "YES" } else { "NO" })
}

fn schemata(catalog: &str, schemas: &[String]) -> Vec<Vec<Cell>> {
    schemas
        .iter()
        .map(|s| {
            let mut row: Vec<Cell> = vec![catalog.into(), s.as_str().into(), "postgres".into()];
            row.resize(7, Cell::Null);
            row
        })
        .collect()
}

/// The rows of every view but `schemata`, from the relations.
fn rows(view: View, catalog: &str, rels: &[Rel]) -> Vec<Vec<Cell>> {
    let mut out = Vec::new();
    for r in rels {
        let head = || -> Vec<Cell> {
            vec![
                catalog.into(),
                r.schema.as_str().into(),
                r.name.as_str().into(),
            ]
        };
        let insertable = r.tidemark.as_ref().is_some_and(|t| t.insertable);
        match view {
            View::Tables => {
                let mut row = head();
                row.push(r.table_type.into());
                row.resize(9, Cell::Null);
                row.extend([yes_no(insertable), "NO".into(), Cell::Null]);
                out.push(row);
            }
            View::Columns => {
                for (i, f) in r.fields.iter().enumerate() {
                    let mut row = head();
                    row.extend(column(catalog, i + 1, f, insertable));
                    out.push(row);
                }
            }
            View::Views if r.table_type == "VIEW" => {
                let definition = r.tidemark.as_ref().and_then(|t| t.definition.clone());
                let mut row = head();
                row.extend([
                    Cell::from(definition),
                    "NONE".into(),
                    "NO".into(),
                    "NO".into(),
                    "NO".into(),
                    "NO".into(),
                    "NO".into(),
                ]);
                out.push(row);
            }
            View::TableConstraints | View::KeyColumnUsage => {
                let Some(t) = r.tidemark.as_ref().filter(|t| !t.primary_key.is_empty()) else {
                    continue;
                };
                let constraint = format!("{}_pkey", r.name);
                let lead = || -> Vec<Cell> {
                    vec![
                        catalog.into(),
                        r.schema.as_str().into(),
                        constraint.as_str().into(),
                    ]
                };
                if matches!(view, View::TableConstraints) {
                    let mut row = lead();
                    row.extend(head());
                    row.extend(["PRIMARY KEY", "NO", "NO", "YES"].map(Cell::from));
                    // nulls_distinct is for UNIQUE constraints only.
                    row.push(Cell::Null);
                    out.push(row);
                } else {
                    for (i, c) in t.primary_key.iter().enumerate() {
                        let mut row = lead();
                        row.extend(head());
                        row.extend([Cell::from(c.as_str()), Cell::Int(i as i32 + 1), Cell::Null]);
                        out.push(row);
                    }
                }
            }
            View::Views | View::Schemata => {}
        }
    }
    out
}

/// A column's row from `column_name` on.
fn column(catalog: &str, position: usize, field: &Arc<Field>, updatable: bool) -> Vec<Cell> {
    let ty = PgColumnType::of(field);
    let mut row: Vec<Cell> = vec![
        field.name().as_str().into(),
        Cell::Int(position as i32),
        Cell::Null,
        yes_no(field.is_nullable()),
        ty.data_type.into(),
        Cell::Null,
        ty.octet_length.into(),
        ty.precision.into(),
        ty.radix.into(),
        ty.scale.into(),
        ty.datetime_precision.into(),
    ];
    // interval_type .. domain_name
    row.resize(row.len() + 11, Cell::Null);
    row.extend([
        Cell::from(catalog),
        "pg_catalog".into(),
        ty.udt_name.into(),
        Cell::Null,
        Cell::Null,
        Cell::Null,
        Cell::Null,
        Cell::from(position.to_string()),
        "NO".into(),
        "NO".into(),
    ]);
    // identity_generation .. identity_cycle
    row.resize(row.len() + 5, Cell::Null);
    row.push("NO".into());
    row.extend(["NEVER".into(), Cell::Null, yes_no(updatable)]);
    row
}

/// How Postgres's `information_schema.columns` describes a column's type.
#[derive(Debug, Clone, PartialEq)]
pub struct PgColumnType {
    /// `data_type`: the SQL name (`bigint`, `timestamp with time zone`, `ARRAY`).
    pub data_type: String,
    /// `udt_name`: the `pg_type` name (`int8`, `timestamptz`, `_int8`).
    pub udt_name: String,
    pub precision: Option<i32>,
    pub radix: Option<i32>,
    pub scale: Option<i32>,
    pub datetime_precision: Option<i32>,
    pub octet_length: Option<i32>,
}

impl PgColumnType {
    /// The Postgres type the wire reports for `field` (the one `pg_attribute` has),
    /// described.
    pub fn of(field: &Arc<Field>) -> PgColumnType {
        let pg = field_into_pg_type(field).unwrap_or(Type::TEXT);
        let udt_name = pg.name().to_string();
        // Postgres names every array type `_element`.
        let data_type = if udt_name.starts_with('_') {
            "ARRAY".to_string()
        } else {
            sql_type_name(&pg)
        };
        let mut t = PgColumnType {
            data_type,
            udt_name,
            precision: None,
            radix: None,
            scale: None,
            datetime_precision: None,
            octet_length: None,
        };
        let int = |bits| (Some(bits), Some(2), Some(0));
        (t.precision, t.radix, t.scale) = match pg {
            Type::INT2 => int(16),
            Type::INT4 => int(32),
            Type::INT8 => int(64),
            Type::FLOAT4 => (Some(24), Some(2), None),
            Type::FLOAT8 => (Some(53), Some(2), None),
            Type::NUMERIC => match field.data_type() {
                DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
                    (Some(i32::from(*p)), Some(10), Some(i32::from(*s)))
                }
                _ => (None, Some(10), None),
            },
            _ => (None, None, None),
        };
        t.datetime_precision = match (pg.clone(), field.data_type()) {
            (Type::DATE, _) => Some(0),
            (_, DataType::Timestamp(unit, _) | DataType::Time32(unit) | DataType::Time64(unit)) => {
                Some(match unit {
                    TimeUnit::Second => 0,
                    TimeUnit::Millisecond => 3,
                    TimeUnit::Microsecond | TimeUnit::Nanosecond => 6,
                })
            }
            (Type::INTERVAL, _) => Some(6),
            _ => None,
        };
        if matches!(pg, Type::TEXT | Type::VARCHAR | Type::BPCHAR) {
            // Postgres's answer for a type without a length: the largest value, 1 GB.
            t.octet_length = Some(1_073_741_824);
        }
        t
    }
}

/// The name `information_schema` and `format_type` give a type (an array's is its
/// element's with `[]`).
pub(super) fn sql_type_name(t: &Type) -> String {
    if let postgres_types::Kind::Array(element) = t.kind() {
        return format!("{}[]", sql_type_name(element));
    }
    match *t {
        Type::BOOL => "boolean",
        Type::INT2 => "smallint",
        Type::INT4 => "integer",
        Type::INT8 => "bigint",
        Type::FLOAT4 => "real",
        Type::FLOAT8 => "double precision",
        Type::VARCHAR => "character varying",
        Type::BPCHAR => "character",
        Type::CHAR => "\"char\"",
        Type::TIME => "time without time zone",
        Type::TIMETZ => "time with time zone",
        Type::TIMESTAMP => "timestamp without time zone",
        Type::TIMESTAMPTZ => "timestamp with time zone",
        Type::RECORD => "record",
        _ => return t.name().to_string(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(ty: DataType) -> (String, String, Option<i32>, Option<i32>, Option<i32>) {
        let t = PgColumnType::of(&Arc::new(Field::new("c", ty, true)));
        (
            t.data_type,
            t.udt_name,
            t.precision,
            t.scale,
            t.datetime_precision,
        )
    }

    /// Each row is what Postgres 17's `information_schema.columns` answers for a column of
    /// the Postgres type the wire reports for that Arrow type (`data_type`, `udt_name`,
    /// `numeric_precision`, `numeric_scale`, `datetime_precision`).
    #[test]
    fn column_types_read_as_postgres_describes_them() {
        let s = |x: &str| x.to_string();
        for (arrow, want) in [
            (
                DataType::Int64,
                (s("bigint"), s("int8"), Some(64), Some(0), None),
            ),
            (
                DataType::Int32,
                (s("integer"), s("int4"), Some(32), Some(0), None),
            ),
            (
                DataType::Int16,
                (s("smallint"), s("int2"), Some(16), Some(0), None),
            ),
            (
                DataType::Float64,
                (s("double precision"), s("float8"), Some(53), None, None),
            ),
            (
                DataType::Float32,
                (s("real"), s("float4"), Some(24), None, None),
            ),
            (DataType::Utf8View, (s("text"), s("text"), None, None, None)),
            (
                DataType::Boolean,
                (s("boolean"), s("bool"), None, None, None),
            ),
            (
                DataType::Date32,
                (s("date"), s("date"), None, None, Some(0)),
            ),
            (
                DataType::Decimal128(10, 2),
                (s("numeric"), s("numeric"), Some(10), Some(2), None),
            ),
            (
                DataType::Timestamp(TimeUnit::Microsecond, None),
                (
                    s("timestamp without time zone"),
                    s("timestamp"),
                    None,
                    None,
                    Some(6),
                ),
            ),
            (
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                (
                    s("timestamp with time zone"),
                    s("timestamptz"),
                    None,
                    None,
                    Some(3),
                ),
            ),
            (
                DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))),
                (s("ARRAY"), s("_int8"), None, None, None),
            ),
        ] {
            assert_eq!(described(arrow.clone()), want, "{arrow}");
        }
    }

    #[test]
    fn a_primary_key_is_a_constraint_and_its_columns() {
        let rel = Rel {
            schema: "public".into(),
            name: "dims".into(),
            table_type: "BASE TABLE",
            fields: vec![
                Arc::new(Field::new("id", DataType::Int64, false)),
                Arc::new(Field::new("name", DataType::Utf8, true)),
            ],
            tidemark: Some(Relation {
                name: "dims".into(),
                kind: RelationKind::Table,
                insertable: true,
                primary_key: vec!["id".into()],
                description: String::new(),
                definition: None,
                connector: "delta".into(),
                broken: None,
            }),
        };
        let tc = rows(View::TableConstraints, "db", std::slice::from_ref(&rel));
        assert_eq!(tc.len(), 1);
        assert_eq!(tc[0].len(), View::TableConstraints.schema().fields().len());
        assert_eq!(tc[0][2], Cell::from("dims_pkey"));
        assert_eq!(tc[0][6], Cell::from("PRIMARY KEY"));
        let kcu = rows(View::KeyColumnUsage, "db", std::slice::from_ref(&rel));
        assert_eq!(kcu.len(), 1);
        assert_eq!(kcu[0][6], Cell::from("id"));
        assert_eq!(kcu[0][7], Cell::Int(1));
        for view in [View::Tables, View::Columns, View::Views] {
            for row in rows(view, "db", std::slice::from_ref(&rel)) {
                assert_eq!(row.len(), view.schema().fields().len(), "{view:?}");
            }
        }
        let cols = rows(View::Columns, "db", std::slice::from_ref(&rel));
        assert_eq!(cols[0][6], Cell::from("NO"), "id is NOT NULL");
        assert_eq!(cols[1][6], Cell::from("YES"));
        assert_eq!(cols[0][27], Cell::from("int8"));
        assert_eq!(
            rows(View::Tables, "db", std::slice::from_ref(&rel))[0][9],
            Cell::from("YES")
        );
    }
}
