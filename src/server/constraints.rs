//! Primary keys in `pg_constraint` and `pg_index`, as Postgres keeps them: a table's
//! `PRIMARY KEY` is a constraint `<table>_pkey` (`contype = 'p'`) backed by an index of the
//! same name (`indisprimary`), whose `indkey` lists the key's column numbers. SQLAlchemy's
//! `get_pk_constraint` and DBeaver read them there.
//!
//! Tidemark's key is informational, as Delta's is (NOT NULL, not unique), so the index is
//! not `indisunique`. The rows are datafusion-postgres's, plus one per table key; the
//! constraint's schema is the oid `pg_namespace` gives `public`. The index has no
//! `pg_class` row of its own (yet): a join of `pg_index` to `pg_class` on `indexrelid`
//! finds nothing (DBeaver's index list).

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int16Array, Int32Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::error::Result;

use super::catalog::{Patch, PgClass, Relations, batch_by_name, collect_all, oid_of_name};
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

impl PrimaryKey {
    fn constraint_oid(&self) -> i32 {
        oid_of_name(&format!("constraint {}", self.name))
    }

    fn index_oid(&self) -> i32 {
        oid_of_name(&format!("index {}", self.name))
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
                    name: format!("{}_pkey", relation.name),
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
}
