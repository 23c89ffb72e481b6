//! Tables: `CREATE TABLE` and `DROP TABLE` over Delta tables, the `MERGE INTO` statement,
//! `UPDATE` and `DELETE`, and what a MERGE sink's `CREATE` checks.
//!
//! `INSERT`, `UPDATE` and `DELETE` are planned by DataFusion against the table's provider
//! (`sink::delta::table::DeltaWriteTable`), which runs each as one Delta commit.

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::TableReference;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;

use super::{Engine, Output, absolute};
use crate::catalog::{Catalog, TableDef};
use crate::error::{Error, Result};
use crate::sink::delta;
use crate::sql::merge::{MergeAction, MergeSpec, MergeTarget};
use crate::sql::parser::CreateTable;

impl Engine {
    /// Registers a table's provider in the session.
    pub(super) async fn register_table(&self, t: &TableDef) -> Result<()> {
        let provider = delta::table::DeltaWriteTable::try_new(&t.path).await?;
        self.ctx
            .register_table(TableReference::bare(t.name.clone()), Arc::new(provider))?;
        Ok(())
    }

    pub(super) async fn create_table(&self, ct: CreateTable) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        if let Some(kind) = self.name_taken(&cat, &ct.name) {
            if ct.if_not_exists {
                return Ok(Output::Command("CREATE TABLE".into()));
            }
            return Err(Error::DuplicateObject {
                kind,
                name: ct.name,
            });
        }
        ct.options.check(&crate::sink::TABLE_OPTIONS)?;
        let (path, owns_path) = match ct.options.get("path") {
            Some(p) => (absolute(p)?, false),
            None => (self.data_dir.join("tables").join(&ct.name), true),
        };
        for k in &ct.primary_key {
            if !ct.columns.is_empty() && !ct.columns.iter().any(|c| &c.name == k) {
                return Err(Error::UndefinedColumn {
                    column: k.clone(),
                    relation: ct.name.clone(),
                });
            }
        }
        let existing = delta::merge::existing_schema(&path).await?;
        // The rows of `AS query`, planned before anything is created.
        let source = match &ct.query {
            Some(q) if !ct.columns.is_empty() => {
                return Err(Error::Syntax(format!(
                    "CREATE TABLE {} gives both columns and AS {q}: the query's columns are \
                     the table's",
                    ct.name
                )));
            }
            Some(q) => Some(self.ctx.sql(q).await?),
            None => None,
        };
        let schema: SchemaRef = if let Some(df) = &source {
            let fields: Vec<Field> = df
                .schema()
                .fields()
                .iter()
                .map(|f| {
                    let nullable = !ct.primary_key.contains(f.name());
                    f.as_ref()
                        .clone()
                        .with_data_type(super::query::storable(f.data_type()))
                        .with_nullable(nullable)
                })
                .collect();
            Arc::new(Schema::new(fields))
        } else if !ct.columns.is_empty() {
            Arc::new(Schema::new(
                ct.columns
                    .iter()
                    .map(|c| {
                        let nullable = !c.not_null && !ct.primary_key.contains(&c.name);
                        Field::new(&c.name, c.data_type.clone(), nullable)
                    })
                    .collect::<Vec<_>>(),
            ))
        } else {
            match &existing {
                Some(s) => s.clone(),
                None => {
                    return Err(Error::InvalidOption {
                        message: format!(
                            "there is no Delta table at \"{}\" to register as \"{}\"",
                            path.display(),
                            ct.name
                        ),
                        hint: Some(
                            "Give the table's columns to create it, or point path at an \
                             existing Delta table."
                                .into(),
                        ),
                    });
                }
            }
        };
        if existing.is_some() && source.is_some() {
            return Err(Error::InvalidOption {
                message: format!(
                    "there is a Delta table at \"{}\" already: CREATE TABLE ... AS makes a new one",
                    path.display()
                ),
                hint: Some("Register it without AS, then INSERT INTO it.".into()),
            });
        }
        delta::ensure_table(&path, &ct.name, &schema).await?;
        let def = TableDef {
            name: ct.name.clone(),
            path,
            primary_key: ct.primary_key.clone(),
            options: ct.options.clone(),
            owns_path: owns_path && existing.is_none(),
        };
        self.register_table(&def).await?;
        cat.tables.push(def);
        if let Err(e) = cat.save(&self.data_dir) {
            cat.tables.pop();
            let _ = self
                .ctx
                .deregister_table(TableReference::bare(ct.name.clone()));
            return Err(e);
        }
        drop(cat);
        let Some(df) = source else {
            return Ok(Output::Command("CREATE TABLE".into()));
        };
        // Postgres answers CREATE TABLE AS with `SELECT n`; a failed query leaves no table.
        match self.fill_table(&ct.name, df).await {
            Ok(n) => Ok(Output::Command(format!("SELECT {n}"))),
            Err(e) => {
                if let Err(undo) = self.drop_table(&ct.name, true, true).await {
                    tracing::warn!(table = %ct.name, error = %undo, "removing a table whose AS query failed");
                }
                Err(e)
            }
        }
    }

    /// Side table `kind` of sink or view `sink` (`late_rows = 'table'`, ...), made in the
    /// data directory unless a table of that name with its columns exists (a sink made
    /// again keeps writing to it). Returns whether it was made now.
    pub(super) async fn ensure_side_table(
        &self,
        cat: &mut Catalog,
        sink: &str,
        kind: super::side_tables::SideTable,
    ) -> Result<bool> {
        let name = kind.table(sink);
        let schema = kind.schema();
        if let Some(t) = cat.table(&name) {
            let existing = delta::merge::existing_schema(&t.path).await?;
            let same = existing.is_some_and(|e| {
                e.fields().len() == schema.fields().len()
                    && e.fields()
                        .iter()
                        .zip(schema.fields())
                        .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
            });
            if !same {
                return Err(Error::DuplicateObject {
                    kind: "table",
                    name,
                });
            }
            return Ok(false);
        }
        if let Some(kind) = self.name_taken(cat, &name) {
            return Err(Error::DuplicateObject { kind, name });
        }
        let path = self.data_dir.join("tables").join(&name);
        delta::ensure_table(&path, &name, &schema).await?;
        let def = TableDef {
            name,
            path,
            primary_key: vec![],
            options: Default::default(),
            owns_path: true,
        };
        self.register_table(&def).await?;
        cat.tables.push(def);
        Ok(true)
    }

    /// Writes a `CREATE TABLE ... AS` query's rows into the new table, in one commit.
    async fn fill_table(&self, name: &str, df: datafusion::dataframe::DataFrame) -> Result<usize> {
        let schema = self
            .ctx
            .table_provider(TableReference::bare(name.to_string()))
            .await?
            .schema();
        let batches = df
            .collect()
            .await?
            .into_iter()
            .map(|b| super::cast_to_schema(b.columns(), &schema))
            .collect::<Result<Vec<_>>>()?;
        let n = batches.iter().map(|b| b.num_rows()).sum();
        self.ctx
            .read_table(Arc::new(MemTable::try_new(schema, vec![batches])?))?
            .write_table(name, Default::default())
            .await?;
        Ok(n)
    }

    pub(super) async fn drop_table(
        &self,
        name: &str,
        if_exists: bool,
        purge: bool,
    ) -> Result<Output> {
        let tag = Output::Command("DROP TABLE".into());
        let mut cat = self.catalog.lock().await;
        let Some(def) = cat.table(name).cloned() else {
            if cat.stream(name).is_some() || cat.sink(name).is_some() {
                let kind = if cat.stream(name).is_some() {
                    "STREAM"
                } else {
                    cat.sink(name).map(|s| s.kind.keyword()).unwrap_or("SINK")
                };
                return Err(Error::WrongObjectType(format!(
                    "\"{name}\" is not a table: use DROP {kind} {name}"
                )));
            }
            // A table of the session's own (CREATE EXTERNAL TABLE, CREATE TEMP TABLE).
            let reference = TableReference::bare(name.to_string());
            if self.ctx.table_exist(reference.clone()).unwrap_or(false) {
                self.ctx.deregister_table(reference)?;
                return Ok(tag);
            }
            if if_exists {
                return Ok(tag);
            }
            return Err(Error::UndefinedObject {
                kind: "table",
                name: name.to_string(),
            });
        };
        let dependents: Vec<String> = cat
            .sinks
            .iter()
            .filter(|s| {
                (s.merge.is_some() && s.path == def.path)
                    || s.tables.contains(&def.name)
                    || super::side_tables::SideTable::wanted_by(&s.options)
                        .into_iter()
                        .any(|k| k.table(&s.name) == def.name)
            })
            .map(|s| format!("{} \"{}\"", s.kind.noun(), s.name))
            .collect();
        if !dependents.is_empty() {
            return Err(Error::DependentObjects {
                kind: "table",
                name: name.to_string(),
                dependents: dependents.join(", "),
            });
        }
        cat.tables.retain(|t| t.name != name);
        cat.save(&self.data_dir)?;
        self.forget_problem(name);
        self.ctx
            .deregister_table(TableReference::bare(name.to_string()))?;
        if purge {
            let lock = delta::table_lock(&def.path);
            let _write = lock.lock().await;
            std::fs::remove_dir_all(&def.path)
                .map_err(|e| Error::io(format!("removing {}", def.path.display()), e))?;
        }
        Ok(tag)
    }

    /// The directory of a MERGE's target: a table's, or the path. Streams and the tables of
    /// sinks and views are refused: their writers own them.
    pub(super) fn merge_target(&self, cat: &Catalog, target: &MergeTarget) -> Result<PathBuf> {
        match target {
            MergeTarget::Path(p) => {
                let path = absolute(p)?;
                if let Some(s) = cat
                    .sinks
                    .iter()
                    .find(|s| s.merge.is_none() && s.path == path)
                {
                    return Err(Error::WrongObjectType(format!(
                        "delta.`{p}` is the table of {} \"{}\", which only its query writes",
                        s.kind.noun(),
                        s.name
                    )));
                }
                Ok(path)
            }
            MergeTarget::Table(name) => {
                if let Some(t) = cat.table(name) {
                    return Ok(t.path.clone());
                }
                if cat.stream(name).is_some() || cat.sink(name).is_some() {
                    return Err(Error::WrongObjectType(format!(
                        "\"{name}\" is not a table: MERGE writes into a table made with CREATE \
                         TABLE, or delta.`/path`"
                    )));
                }
                Err(Error::UndefinedObject {
                    kind: "relation",
                    name: name.clone(),
                })
            }
        }
    }

    /// `MERGE INTO ...`: the source query's rows merged in one commit. Answers `MERGE n`,
    /// the rows inserted, updated and deleted.
    pub(super) async fn merge(&self, spec: MergeSpec) -> Result<Output> {
        let path = {
            let cat = self.catalog.lock().await;
            self.merge_target(&cat, &spec.target)?
        };
        let Some(target) = delta::merge::existing_schema(&path).await? else {
            return Err(Error::UndefinedObject {
                kind: "relation",
                name: format!("delta.`{}`", path.display()),
            });
        };
        let df = self.ctx.sql(&spec.source).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        check_merge(&spec, &target, &schema).await?;
        let rows = df.collect().await?;
        let report = delta::merge::merge(&path, &spec, schema, rows, None)
            .await?
            .unwrap_or_default();
        Ok(Output::Command(format!("MERGE {}", report.rows_changed())))
    }

    /// The directory of a table that `UPDATE` and `DELETE` change.
    async fn table_path(&self, name: &str) -> Result<PathBuf> {
        let cat = self.catalog.lock().await;
        if let Some(t) = cat.table(name) {
            return Ok(t.path.clone());
        }
        if cat.stream(name).is_some() || cat.sink(name).is_some() {
            return Err(Error::WrongObjectType(format!(
                "cannot change \"{name}\": only tables made with CREATE TABLE take UPDATE and \
                 DELETE (streams are appended to, sinks and views are written by their query)"
            )));
        }
        Err(Error::UndefinedObject {
            kind: "relation",
            name: name.to_string(),
        })
    }

    /// `UPDATE`: one Delta commit; answers `UPDATE n`.
    pub(super) async fn update(
        &self,
        table: &str,
        assignments: &[(String, String)],
        predicate: Option<&str>,
    ) -> Result<Output> {
        let path = self.table_path(table).await?;
        let schema = self.ctx.table_provider(table).await?.schema();
        if let Some((c, _)) = assignments
            .iter()
            .find(|(c, _)| schema.index_of(c).is_err())
        {
            return Err(Error::UndefinedColumn {
                column: c.clone(),
                relation: table.to_string(),
            });
        }
        let n = delta::table::update(&path, assignments, predicate).await?;
        Ok(Output::Command(format!("UPDATE {n}")))
    }

    /// `DELETE`: one Delta commit; answers `DELETE n`.
    pub(super) async fn delete(&self, table: &str, predicate: Option<&str>) -> Result<Output> {
        let path = self.table_path(table).await?;
        let n = delta::table::delete(&path, predicate).await?;
        Ok(Output::Command(format!("DELETE {n}")))
    }
}

/// Checks a MERGE before it runs: the columns `*` and the assignments name (see
/// `delta::merge::check`), and every expression planned against the target and the
/// source, so that an unknown column or function is reported (42703, 42883) at once.
pub(super) async fn check_merge(
    spec: &MergeSpec,
    target: &SchemaRef,
    source: &SchemaRef,
) -> Result<()> {
    delta::merge::check(spec, target, source)?;
    let mut exprs = vec![spec.on.clone()];
    for c in &spec.clauses {
        exprs.extend(c.condition.clone());
        match &c.action {
            MergeAction::Update(sets) => exprs.extend(sets.iter().map(|(_, e)| e.clone())),
            MergeAction::Insert { values, .. } => exprs.extend(values.iter().cloned()),
            MergeAction::UpdateAll | MergeAction::InsertAll | MergeAction::Delete => {}
        }
    }
    let ctx = SessionContext::new();
    ctx.register_table(
        "__merge_target",
        Arc::new(MemTable::try_new(target.clone(), vec![vec![]])?),
    )?;
    ctx.register_table(
        "__merge_source",
        Arc::new(MemTable::try_new(source.clone(), vec![vec![]])?),
    )?;
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    // Each expression named apart: one may appear in several clauses (dbt's snapshot
    // MERGE sets and inserts the same source column).
    let items: Vec<String> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| format!("({e}) AS __merge_expr_{i}"))
        .collect();
    let sql = format!(
        "SELECT {} FROM __merge_target AS {} CROSS JOIN __merge_source AS {}",
        items.join(", "),
        quote(&spec.target_alias),
        quote(&spec.source_alias)
    );
    ctx.sql(&sql).await?.into_unoptimized_plan();
    Ok(())
}
