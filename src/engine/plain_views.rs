//! Plain views: `CREATE [OR REPLACE] VIEW` and `DROP VIEW`. DataFusion plans and answers
//! them; the catalog keeps each view's statement, and the server plans them again when it
//! starts, so a view outlives the process as it does in Postgres. `TEMP` views stay
//! DataFusion's alone and end with the process.

use super::{Engine, Output};
use crate::catalog::ViewDef;
use crate::error::Result;

impl Engine {
    /// Runs the `CREATE VIEW` statement `sql` in the session, then records it.
    /// A view in another schema (`name` `None`) is DataFusion's alone.
    pub(super) async fn create_view(&self, name: Option<String>, sql: String) -> Result<Output> {
        let mut cat = self.catalog.lock().await;
        self.ctx.sql(&sql).await?;
        let Some(name) = name else {
            return Ok(Output::Command("CREATE VIEW".into()));
        };
        match cat.views.iter_mut().find(|v| v.name == name) {
            Some(v) => v.sql = sql,
            None => cat.views.push(ViewDef { name, sql }),
        }
        cat.save(&self.data_dir)?;
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
