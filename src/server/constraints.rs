//! Primary keys in `pg_constraint` and `pg_index`, as Postgres keeps them: a table's
//! `PRIMARY KEY` is a constraint `<table>_pkey` (`contype = 'p'`) backed by an index of the
//! same name (`indisprimary`), whose `indkey` lists the key's column numbers. SQLAlchemy's
//! `get_pk_constraint` and DBeaver read them there.
//!
//! Tidemark's key is informational, as Delta's is (NOT NULL, not unique), so the index is
//! not `indisunique`. The rows are datafusion-postgres's, plus one per table key; the
//! constraint's schema is the oid `pg_namespace` gives `public`. The index also has its
//! own `pg_class` row (relkind `i`, access method btree, [`index_class_rows`]), so a join
//! of `pg_index` to `pg_class` on `indexrelid` finds it (DBeaver's index list, psql's
//! `\d`).

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int16Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};

use super::catalog::{Patch, PgClass, Relations, batch_by_name, collect_all, oid_of_name};
use super::rewrite::quote_ident;
use crate::engine::Engine;

/// One table's primary key.
#[derive(Debug, Clone, PartialEq)]
struct PrimaryKey {
    table_oid: i32,
    /// `<table>_pkey`, the constraint's and its index's name.
    name: String,
    /// The key's columns, by their numbers (`attnum`, from 1).
    columns: Vec<i16>,
}

/// The name Postgres gives a table's primary key and its index.
pub(super) fn key_name(table: &str) -> String {
    format!("{table}_pkey")
}

/// The oid of the index named `name`: in `pg_class` and `pg_index.indexrelid` alike.
fn index_oid(name: &str) -> i32 {
    oid_of_name(&format!("index {name}"))
}

/// The oid of the constraint named `name`.
fn constraint_oid(name: &str) -> i32 {
    oid_of_name(&format!("constraint {name}"))
}

/// `pg_class` rows in `schema`'s columns for the indexes of these keys: each `(table,
/// number of key columns)`, in schema `namespace`.
pub(super) fn index_class_rows(
    schema: &datafusion::arrow::datatypes::SchemaRef,
    keys: &[(String, usize)],
    namespace: i32,
) -> Result<RecordBatch> {
    let n = keys.len();
    let names: Vec<String> = keys.iter().map(|(t, _)| key_name(t)).collect();
    let int = |v: i32| -> ArrayRef { Arc::new(Int32Array::from(vec![v; n])) };
    let text = |v: &str| -> ArrayRef { Arc::new(StringArray::from(vec![v; n])) };
    let flag = |b: bool| -> ArrayRef { Arc::new(BooleanArray::from(vec![b; n])) };
    batch_by_name(schema, n, |column| {
        Some(match column {
            "oid" | "relfilenode" => Arc::new(Int32Array::from_iter_values(
                names.iter().map(|name| index_oid(name)),
            )),
            "relname" => Arc::new(StringArray::from_iter_values(names.iter())),
            "relnamespace" => int(namespace),
            "relkind" => text("i"),
            // btree, pg_am's oid for it.
            "relam" => int(403),
            "relnatts" => Arc::new(Int16Array::from_iter_values(
                keys.iter().map(|(_, columns)| *columns as i16),
            )),
            "relpersistence" => text("p"),
            "relreplident" => text("n"),
            "reltype" | "reloftype" | "reltablespace" | "reltoastrelid" => int(0),
            "relhasindex"
            | "relisshared"
            | "relhasrules"
            | "relhastriggers"
            | "relhassubclass"
            | "relrowsecurity"
            | "relforcerowsecurity"
            | "relispartition" => flag(false),
            "relispopulated" => flag(true),
            _ => return None,
        })
    })
}

impl PrimaryKey {
    fn constraint_oid(&self) -> i32 {
        constraint_oid(&self.name)
    }

    fn index_oid(&self) -> i32 {
        index_oid(&self.name)
    }

    /// `conkey`'s text, an `int2[]`: `{1,2}`.
    fn conkey(&self) -> String {
        let numbers: Vec<String> = self.columns.iter().map(|c| c.to_string()).collect();
        format!("{{{}}}", numbers.join(","))
    }

    /// `indkey`'s text, an `int2vector`: `1 2`.
    fn indkey(&self) -> String {
        let numbers: Vec<String> = self.columns.iter().map(|c| c.to_string()).collect();
        numbers.join(" ")
    }
}

/// Where the keys come from: the engine's relations, their columns, `pg_class`'s oids.
#[derive(Debug)]
pub struct Keys {
    pub engine: Weak<Engine>,
    pub public: Arc<dyn SchemaProvider>,
    pub class: Arc<PgClass>,
    pub relations: Arc<Relations>,
    /// `pg_namespace`, for the oid of `public` (`connamespace`).
    pub namespaces: Arc<dyn TableProvider>,
}

impl Keys {
    /// The oid `pg_namespace` gives schema `public`.
    async fn public_namespace(&self, state: &dyn Session) -> Result<Option<i32>> {
        use datafusion::arrow::array::AsArray;
        let schema = self.namespaces.schema();
        let (Ok(oid), Ok(name)) = (schema.index_of("oid"), schema.index_of("nspname")) else {
            return Ok(None);
        };
        for batch in collect_all(&self.namespaces, state).await? {
            let oids = datafusion::arrow::compute::cast(batch.column(oid), &DataType::Int32)?;
            let names = datafusion::arrow::compute::cast(batch.column(name), &DataType::Utf8)?;
            let (oids, names) = (
                oids.as_primitive::<datafusion::arrow::datatypes::Int32Type>(),
                names.as_string::<i32>(),
            );
            if let Some(i) = (0..batch.num_rows()).find(|&i| names.value(i) == "public") {
                return Ok(Some(oids.value(i)));
            }
        }
        Ok(None)
    }

    async fn primary_keys(&self, state: &dyn Session) -> Result<Vec<PrimaryKey>> {
        // A pg_class scan refreshes the relations' oids.
        self.class.batches(state).await?;
        let Some(engine) = self.engine.upgrade() else {
            return Ok(vec![]);
        };
        let mut keys = Vec::new();
        for relation in engine.relations().await {
            if relation.primary_key.is_empty() {
                continue;
            }
            let (Some(table_oid), Some(table)) = (
                self.relations.public_oid(&relation.name),
                self.public.table(&relation.name).await?,
            ) else {
                continue;
            };
            let schema = table.schema();
            let columns: Option<Vec<i16>> = relation
                .primary_key
                .iter()
                .map(|c| {
                    schema
                        .index_of(c)
                        .ok()
                        .and_then(|i| i16::try_from(i + 1).ok())
                })
                .collect();
            if let Some(columns) = columns {
                keys.push(PrimaryKey {
                    table_oid,
                    name: key_name(&relation.name),
                    columns,
                });
            }
        }
        Ok(keys)
    }
}

/// `pg_constraint` with a `p` row per table key.
#[derive(Debug)]
pub struct PgConstraint {
    pub inner: Arc<dyn TableProvider>,
    pub keys: Keys,
}

#[async_trait]
impl Patch for PgConstraint {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let keys = self.keys.primary_keys(state).await?;
        let public = self.keys.public_namespace(state).await?;
        let mut batches = collect_all(&self.inner, state).await?;
        let n = keys.len();
        let int = |f: &dyn Fn(&PrimaryKey) -> i32| -> ArrayRef {
            Arc::new(Int32Array::from_iter_values(keys.iter().map(f)))
        };
        let text = |f: &dyn Fn(&PrimaryKey) -> String| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(keys.iter().map(f)))
        };
        let flag = |b: bool| -> ArrayRef { Arc::new(BooleanArray::from(vec![b; n])) };
        batches.push(batch_by_name(&self.inner.schema(), n, |name| {
            Some(match name {
                "oid" => int(&|k| k.constraint_oid()),
                "conname" => text(&|k| k.name.clone()),
                "connamespace" => Arc::new(Int32Array::from(vec![public; n])),
                "contype" => text(&|_| "p".into()),
                "condeferrable" | "condeferred" | "connoinherit" => flag(false),
                "convalidated" | "conislocal" => flag(true),
                "conrelid" => int(&|k| k.table_oid),
                "contypid" | "conparentid" | "confrelid" => int(&|_| 0),
                "conindid" => int(&|k| k.index_oid()),
                "coninhcount" => Arc::new(Int16Array::from(vec![0i16; n])),
                "conkey" => text(&|k| k.conkey()),
                _ => return None,
            })
        })?);
        Ok(batches)
    }
}

/// `pg_index` with an `indisprimary` row per table key.
#[derive(Debug)]
pub struct PgIndex {
    pub inner: Arc<dyn TableProvider>,
    pub keys: Keys,
}

#[async_trait]
impl Patch for PgIndex {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let keys = self.keys.primary_keys(state).await?;
        let mut batches = collect_all(&self.inner, state).await?;
        let n = keys.len();
        let count: ArrayRef = Arc::new(Int16Array::from_iter_values(
            keys.iter().map(|k| k.columns.len() as i16),
        ));
        let flag = |b: bool| -> ArrayRef { Arc::new(BooleanArray::from(vec![b; n])) };
        batches.push(batch_by_name(&self.inner.schema(), n, |name| {
            Some(match name {
                "indexrelid" => Arc::new(Int32Array::from_iter_values(
                    keys.iter().map(|k| k.index_oid()),
                )),
                "indrelid" => Arc::new(Int32Array::from_iter_values(
                    keys.iter().map(|k| k.table_oid),
                )),
                "indnatts" | "indnkeyatts" => count.clone(),
                // Informational, as Delta's keys are: not enforced unique.
                "indisunique"
                | "indnullsnotdistinct"
                | "indisexclusion"
                | "indisclustered"
                | "indcheckxmin"
                | "indisreplident" => flag(false),
                "indisprimary" | "indimmediate" | "indisvalid" | "indisready" | "indislive" => {
                    flag(true)
                }
                "indkey" => Arc::new(StringArray::from_iter_values(
                    keys.iter().map(|k| k.indkey()),
                )),
                _ => return None,
            })
        })?);
        Ok(batches)
    }
}

/// A primary key as the definition functions spell it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct KeyDef {
    pub table: String,
    pub columns: Vec<String>,
}

impl KeyDef {
    pub(super) fn constraint_oid(&self) -> i32 {
        constraint_oid(&key_name(&self.table))
    }

    pub(super) fn index_oid(&self) -> i32 {
        index_oid(&key_name(&self.table))
    }

    fn column_list(&self) -> String {
        let quoted: Vec<String> = self.columns.iter().map(|c| quote_ident(c)).collect();
        quoted.join(", ")
    }

    /// `pg_get_constraintdef`: `PRIMARY KEY (id)`.
    fn constraint_definition(&self) -> String {
        format!("PRIMARY KEY ({})", self.column_list())
    }

    /// `pg_get_indexdef(oid)`, or with a column number its column's name. Not `UNIQUE`:
    /// the key is informational (module docs).
    fn index_definition(&self, column: i64) -> Option<String> {
        match column {
            0 => Some(format!(
                "CREATE INDEX {} ON public.{} USING btree ({})",
                quote_ident(&key_name(&self.table)),
                quote_ident(&self.table),
                self.column_list()
            )),
            n => usize::try_from(n - 1)
                .ok()
                .and_then(|i| self.columns.get(i))
                .map(|c| quote_ident(c)),
        }
    }
}

/// `pg_get_indexdef(oid [, column, pretty])` and `pg_get_constraintdef(oid [, pretty])`
/// for the primary keys [`Relations`] knows; NULL for any other oid.
pub(super) fn definition_udfs(relations: Arc<Relations>) -> Vec<ScalarUDF> {
    [Definition::Index, Definition::Constraint]
        .into_iter()
        .map(|of| {
            let arities = match of {
                Definition::Index => vec![1, 3],
                Definition::Constraint => vec![1, 2],
            };
            ScalarUDF::new_from_impl(DefinitionUdf {
                of,
                relations: relations.clone(),
                signature: Signature::one_of(
                    arities.into_iter().map(TypeSignature::Any).collect(),
                    Volatility::Stable,
                ),
            })
        })
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Definition {
    Index,
    Constraint,
}

#[derive(Debug)]
struct DefinitionUdf {
    of: Definition,
    relations: Arc<Relations>,
    signature: Signature,
}

impl PartialEq for DefinitionUdf {
    fn eq(&self, other: &Self) -> bool {
        self.of == other.of && Arc::ptr_eq(&self.relations, &other.relations)
    }
}

impl Eq for DefinitionUdf {}

impl std::hash::Hash for DefinitionUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.of.hash(state);
    }
}

impl ScalarUDFImpl for DefinitionUdf {
    fn name(&self) -> &str {
        match self.of {
            Definition::Index => "pg_get_indexdef",
            Definition::Constraint => "pg_get_constraintdef",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use datafusion::arrow::array::{Array, AsArray};
        use datafusion::arrow::datatypes::Int64Type;
        let n = args.number_rows;
        let int64 = |i: usize| -> Result<Option<ArrayRef>> {
            match args.args.get(i) {
                Some(a) => Ok(Some(datafusion::arrow::compute::cast(
                    &a.to_array(n)?,
                    &DataType::Int64,
                )?)),
                None => Ok(None),
            }
        };
        let oids = int64(0)?.unwrap_or_else(|| Arc::new(Int64Array::new_null(n)));
        let columns = match self.of {
            Definition::Index => int64(1)?,
            Definition::Constraint => None,
        };
        let oids = oids.as_primitive::<Int64Type>();
        let out: StringArray = (0..n)
            .map(|i| {
                let oid = i32::try_from(oids.value(i))
                    .ok()
                    .filter(|_| oids.is_valid(i))?;
                let key = self.relations.key(oid)?;
                match self.of {
                    Definition::Constraint => {
                        (oid == key.constraint_oid()).then(|| key.constraint_definition())
                    }
                    Definition::Index => {
                        let column = match &columns {
                            Some(c) => {
                                let c = c.as_primitive::<Int64Type>();
                                c.is_valid(i).then(|| c.value(i))?
                            }
                            None => 0,
                        };
                        (oid == key.index_oid())
                            .then(|| key.index_definition(column))
                            .flatten()
                    }
                }
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_spells_its_columns_as_postgres_does() {
        let key = PrimaryKey {
            table_oid: 16390,
            name: "orders_pkey".into(),
            columns: vec![1, 3],
        };
        assert_eq!(key.conkey(), "{1,3}");
        assert_eq!(key.indkey(), "1 3");
        assert_ne!(key.constraint_oid(), key.index_oid());
    }

    #[test]
    fn definitions_read_as_postgres_prints_them() {
        let key = KeyDef {
            table: "Orders".into(),
            columns: vec!["id".into(), "Line No".into()],
        };
        assert_eq!(
            key.constraint_definition(),
            r#"PRIMARY KEY (id, "Line No")"#
        );
        assert_eq!(
            key.index_definition(0).unwrap(),
            r#"CREATE INDEX "Orders_pkey" ON public."Orders" USING btree (id, "Line No")"#
        );
        assert_eq!(key.index_definition(2).as_deref(), Some(r#""Line No""#));
        assert_eq!(key.index_definition(3), None);
        assert_eq!(key.index_definition(-1), None);
        // The same oids as the rows of pg_constraint and pg_index.
        let row = PrimaryKey {
            table_oid: 1,
            name: key_name("Orders"),
            columns: vec![1, 2],
        };
        assert_eq!(key.constraint_oid(), row.constraint_oid());
        assert_eq!(key.index_oid(), row.index_oid());
    }
}
