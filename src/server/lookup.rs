//! Key lookups in materialized views, answered without planning.
//!
//! A dashboard or a service reads a view one key at a time: `SELECT views FROM page_views
//! WHERE window_start = $1 AND window_end = $2 AND page = $3`. Through DataFusion such a
//! query costs its optimizer and physical planner every time (about 0.7 ms here), where
//! reading the row costs microseconds. A query of exactly this shape is answered from the
//! view directly:
//! - a projection of plain columns (renamed or not) of one view, under
//! - a filter that is a conjunction of `column = value`, one for each of the view's key
//!   columns and nothing else, each value of its column's own type (a parameter's value
//!   once bound, or a literal),
//!
//! and the view kept by key ([`ViewTable::key_columns`]). The row comes from
//! [`ViewTable::get`], the same read a planned scan makes through the key, so the answer
//! is the one planning would give. Anything else (another shape, a value of another type
//! that DataFusion would coerce, a float key whose `=` this path would have to re-create)
//! is left to DataFusion.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::TableProvider;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Expr, LogicalPlan, Operator};
use datafusion::scalar::ScalarValue;

use crate::error::{Error, Result};
use crate::sink::view::ViewTable;

/// A key lookup found in a query's plan.
pub struct Lookup {
    view: Arc<dyn TableProvider>,
    /// The key's values, in the view's key-column order.
    key: Vec<ScalarValue>,
    /// Each output column's index in the view's rows.
    projection: Vec<usize>,
    /// The query's output columns (names as the query gives them).
    pub schema: SchemaRef,
}

fn view_of(p: &Arc<dyn TableProvider>) -> Option<&ViewTable> {
    p.downcast_ref::<ViewTable>()
}

/// The column `e` is, by name, with or without an alias.
fn column_name(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(&c.name),
        Expr::Alias(a) => column_name(&a.expr),
        _ => None,
    }
}

impl Lookup {
    /// The lookup `plan` is, if it is one (see the module's comment). `plan` has no
    /// parameters left: they are bound first.
    pub fn analyze(plan: &LogicalPlan) -> Option<Lookup> {
        let LogicalPlan::Projection(projection) = plan else {
            return None;
        };
        let LogicalPlan::Filter(filter) = projection.input.as_ref() else {
            return None;
        };
        let scan = match filter.input.as_ref() {
            LogicalPlan::SubqueryAlias(a) => match a.input.as_ref() {
                LogicalPlan::TableScan(s) => s,
                _ => return None,
            },
            LogicalPlan::TableScan(s) => s,
            _ => return None,
        };
        if !scan.filters.is_empty() || scan.fetch.is_some() || scan.projection.is_some() {
            return None;
        }
        let provider = source_as_provider(&scan.source).ok()?;
        let view = view_of(&provider)?;
        let columns = view.key_columns()?;
        let schema = view.schema();
        let mut key: Vec<Option<ScalarValue>> = vec![None; columns.len()];
        for conjunct in split_conjunction(&filter.predicate) {
            let Expr::BinaryExpr(b) = conjunct else {
                return None;
            };
            if b.op != Operator::Eq {
                return None;
            }
            let (name, value) = match (b.left.as_ref(), b.right.as_ref()) {
                (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => {
                    (&c.name, v)
                }
                _ => return None,
            };
            let index = schema.index_of(name).ok()?;
            let j = columns.iter().position(|&k| k == index)?;
            let ty = schema.field(index).data_type();
            // A float's `=` is DataFusion's to define; a NULL of any type matches nothing.
            if matches!(
                ty,
                DataType::Float16 | DataType::Float32 | DataType::Float64
            ) || (value.data_type() != *ty && !value.is_null())
                || key[j].is_some()
            {
                return None;
            }
            key[j] = Some(if value.is_null() {
                ScalarValue::try_from(ty).ok()?
            } else {
                value.clone()
            });
        }
        let key = key.into_iter().collect::<Option<Vec<_>>>()?;
        let projection = projection
            .expr
            .iter()
            .map(|e| schema.index_of(column_name(e)?).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(Lookup {
            view: provider,
            key,
            projection,
            schema: Arc::new(plan.schema().as_arrow().clone()),
        })
    }

    /// Reads the row; `None` if the view cannot answer by key after all (it is not loaded
    /// yet): then the query is planned.
    pub async fn run(self) -> Result<Option<RecordBatch>> {
        let on_disk = view_of(&self.view).is_some_and(ViewTable::on_disk);
        let Lookup {
            view,
            key,
            projection,
            schema,
        } = self;
        let read = move || -> Result<Option<RecordBatch>> {
            let view = view_of(&view).ok_or_else(|| Error::Internal("not a view".into()))?;
            let Some(found) = view.get(&key)? else {
                return Ok(None);
            };
            let rows = datafusion::arrow::compute::concat_batches(&view.schema(), &found)?;
            let columns = projection.iter().map(|&i| rows.column(i).clone()).collect();
            Ok(Some(RecordBatch::try_new(schema, columns)?))
        };
        if on_disk {
            tokio::task::spawn_blocking(read)
                .await
                .map_err(|e| Error::Internal(format!("view lookup: {e}")))?
        } else {
            read()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::prelude::SessionContext;

    use crate::sink::view;
    use crate::sink::{QueryOutput, WriteMode};
    use crate::sql::options::Options;
    use crate::types::BatchId;

    /// A view keyed by `page` (text) holding three pages, and one keyed by a float, in a
    /// session; the directory must outlive the session.
    async fn session(dir: &std::path::Path) -> SessionContext {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("page", DataType::Utf8, true),
            Field::new("views", DataType::Int64, true),
            Field::new("score", DataType::Float64, true),
        ]));
        let ctx = SessionContext::new();
        for (name, key) in [("v", "page"), ("by_score", "score")] {
            let output = QueryOutput {
                schema: schema.clone(),
                mode: WriteMode::Merge {
                    keys: vec![key.into()],
                },
                keys: Some(vec![key.into()]),
                time: None,
            };
            let store = view::open(&dir.join(name), &output, &Options::default()).unwrap();
            let rows = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(vec!["/a", "/b", "/c"])),
                    Arc::new(Int64Array::from(vec![1, 2, 3])),
                    Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5])),
                ],
            )
            .unwrap();
            store.commit(BatchId(0), vec![rows], 0).await.unwrap();
            ctx.register_table(name, Arc::new(ViewTable::new(store, "SELECT 1")))
                .unwrap();
        }
        ctx
    }

    #[tokio::test]
    async fn whole_key_lookups_answer_as_datafusion_and_other_shapes_are_planned() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = session(dir.path()).await;
        let lookups = [
            "SELECT views FROM v WHERE page = '/b'",
            "SELECT views AS n, x.page FROM v x WHERE '/c' = x.page",
            "SELECT * FROM v WHERE page = '/nowhere'",
            "SELECT views FROM v WHERE page = NULL",
        ];
        let planned = [
            "SELECT views FROM v WHERE page = '/b' AND views > 0",
            "SELECT views FROM v WHERE page <> '/b'",
            "SELECT views + 1 FROM v WHERE page = '/b'",
            "SELECT views FROM v WHERE page = '/a' OR page = '/b'",
            "SELECT views FROM v WHERE page = '/b' LIMIT 1",
            "SELECT views FROM v WHERE views = 2",
            "SELECT views FROM v WHERE page = 1",
            "SELECT views FROM by_score WHERE score = 1.5",
            "SELECT views FROM v",
        ];
        for sql in lookups {
            let plan = ctx.state().create_logical_plan(sql).await.unwrap();
            let lookup = Lookup::analyze(&plan).unwrap_or_else(|| panic!("{sql}: not a lookup"));
            assert_eq!(lookup.schema.as_ref(), plan.schema().as_arrow(), "{sql}");
            let got = lookup.run().await.unwrap().expect("a loaded view answers");
            let want = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            let want = datafusion::arrow::compute::concat_batches(&got.schema(), &want).unwrap();
            assert_eq!(got, want, "{sql}");
        }
        for sql in planned {
            let plan = ctx.state().create_logical_plan(sql).await.unwrap();
            assert!(Lookup::analyze(&plan).is_none(), "{sql}: taken as a lookup");
        }
    }
}
