//! Tidemark's corrections to datafusion-postgres's pg_catalog, where its answers would be
//! wrong for Tidemark's objects: a materialized view is relkind `m` in `pg_class` (psql's
//! `\dm`, SQLAlchemy's `get_materialized_view_names`) and has a row in `pg_matviews`.
//! Every other table is datafusion-postgres's, unchanged.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{SchemaProvider, Session};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::{MemTable, TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::sink::view::ViewTable;

/// Puts the corrections in front of the `pg_catalog` schema of catalog `catalog`.
pub fn install(ctx: &SessionContext, catalog: &str) -> crate::error::Result<()> {
    let missing = || crate::error::Error::Internal(format!("no pg_catalog in {catalog}"));
    let cat = ctx.catalog(catalog).ok_or_else(missing)?;
    let inner = cat.schema("pg_catalog").ok_or_else(missing)?;
    let public = cat.schema("public").ok_or_else(missing)?;
    cat.register_schema("pg_catalog", Arc::new(PgCatalog { inner, public }))?;
    Ok(())
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
            _ => self.inner.table(name).await,
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
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
