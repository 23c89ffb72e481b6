//! Plain views: `CREATE [OR REPLACE] VIEW` and `DROP VIEW`. DataFusion plans and answers
//! them; the catalog keeps each view's statement, and the server plans them again when it
//! starts, so a view outlives the process as it does in Postgres. `TEMP` views stay
//! DataFusion's alone and end with the process.

use datafusion::logical_expr::{DdlStatement, LogicalPlan};

use super::{Engine, Output};
use crate::catalog::ViewDef;
use crate::error::Result;

impl Engine {
    /// Plans the `CREATE VIEW` statement `sql`, records it, then registers the view in the
    /// session, so that a view the catalog could not keep is never shown.
    /// A view in another schema (`name` `None`) is DataFusion's alone.
    pub(super) async fn create_view(&self, name: Option<String>, sql: String) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        let plan = self.ctx.state().create_logical_plan(&sql).await?;
        let Some(name) = name else {
            self.ctx.execute_logical_plan(plan).await?;
            return Ok(Output::Command("CREATE VIEW".into()));
        };
        let replaces =
            matches!(&plan, LogicalPlan::Ddl(DdlStatement::CreateView(v)) if v.or_replace);
        if !replaces && self.ctx.table_exist(name.as_str())? {
            // DataFusion's own error for a name in use; nothing is recorded.
            self.ctx.execute_logical_plan(plan).await?;
            return Ok(Output::Command("CREATE VIEW".into()));
        }
        // What to put back if the view cannot be recorded or registered.
        let previous = match cat.views.iter().position(|v| v.name == name) {
            Some(i) => Some((i, std::mem::replace(&mut cat.views[i].sql, sql))),
            None => {
                cat.views.push(ViewDef { name, sql });
                None
            }
        };
        let undo = |cat: &mut crate::catalog::Catalog| match previous {
            Some((i, sql)) => cat.views[i].sql = sql,
            None => {
                cat.views.pop();
            }
        };
        if let Err(e) = cat.save(&self.data_dir) {
            undo(&mut cat);
            return Err(e);
        }
        if let Err(e) = self.ctx.execute_logical_plan(plan).await {
            undo(&mut cat);
            cat.save(&self.data_dir)?;
            return Err(e.into());
        }
        Ok(Output::Command("CREATE VIEW".into()))
    }

    /// `DROP VIEW`: DataFusion drops the views (42P01 for one that is not there, unless `IF
    /// EXISTS`), then the catalog forgets them.
    /// With a view in another schema (`names` `None`), DataFusion runs `sql` alone.
    pub(super) async fn drop_views(
        &self,
        names: Option<Vec<String>>,
        if_exists: bool,
        sql: &str,
    ) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        let Some(names) = names else {
            self.ctx.sql(sql).await?;
            return Ok(Output::Command("DROP VIEW".into()));
        };
        for name in &names {
            let quoted = format!("\"{}\"", name.replace('"', "\"\""));
            let sql = if if_exists {
                format!("DROP VIEW IF EXISTS {quoted}")
            } else {
                format!("DROP VIEW {quoted}")
            };
            self.ctx.sql(&sql).await?;
            cat.views.retain(|v| &v.name != name);
        }
        cat.save(&self.data_dir)?;
        Ok(Output::Command("DROP VIEW".into()))
    }

    /// Plans the catalog's views again at start-up, after every stream, table and sink. A
    /// view may read one made after it (`CREATE OR REPLACE` keeps a view's place), so each
    /// round plans what it can until none is left or a round makes no progress; a view
    /// that cannot be planned stays in the catalog and is logged.
    pub(super) async fn restore_views(&self, views: &[ViewDef]) {
        let mut left: Vec<&ViewDef> = views.iter().collect();
        loop {
            let mut failed = Vec::new();
            let mut errors = Vec::new();
            for v in &left {
                if let Err(e) = self.ctx.sql(&v.sql).await {
                    failed.push(*v);
                    errors.push(e);
                }
            }
            if failed.is_empty() {
                return;
            }
            if failed.len() == left.len() {
                for (v, e) in failed.iter().zip(errors) {
                    tracing::error!(view = %v.name, error = %e, "view cannot be planned");
                }
                return;
            }
            left = failed;
        }
    }
}
