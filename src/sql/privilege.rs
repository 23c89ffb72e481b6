//! What a statement needs of the role that runs it. Pure: the wire asks, before running a
//! statement for a role that is not a superuser, and refuses with 42501.
//!
//! - Reading a stream, sink, table or materialized view needs `pg_read_all_data`. The
//!   catalog (`pg_catalog`, `information_schema`), `SET`, `SHOW`, transaction control and
//!   `FLUSH` need nothing.
//! - `INSERT`, `COPY … FROM STDIN`, `UPDATE`, `DELETE` and `MERGE` need
//!   `pg_write_all_data` (and an `INSERT … SELECT` from a relation, reading too).
//! - Everything else (creating, dropping, altering, stopping, starting, `OPTIMIZE`, roles)
//!   needs a superuser.

use datafusion::sql::sqlparser::ast::{ObjectName, Statement, visit_relations};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use std::ops::ControlFlow;

use super::TidemarkStatement;
use crate::auth::Privilege;
use crate::error::Error;

/// One thing a statement needs: a privilege, and the relation it is needed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub privilege: Privilege,
    pub relation: Option<String>,
}

impl Need {
    fn new(privilege: Privilege, relation: Option<String>) -> Need {
        Need {
            privilege,
            relation,
        }
    }

    /// The refusal, worded as Postgres words it. `sql` is the statement.
    pub fn refusal(&self, sql: &str) -> Error {
        let (message, hint) = match (&self.privilege, &self.relation) {
            (Privilege::Read, Some(r)) => (
                format!("permission denied for table {r}"),
                "Reading needs pg_read_all_data: GRANT pg_read_all_data TO <role>.",
            ),
            (Privilege::Write, Some(r)) => (
                format!("permission denied for table {r}"),
                "Writing needs pg_write_all_data: GRANT pg_write_all_data TO <role>.",
            ),
            _ => (
                format!("permission denied to run {}", statement_head(sql)),
                "Only a superuser may; connect as a role with SUPERUSER.",
            ),
        };
        Error::PermissionDenied {
            message,
            hint: hint.into(),
        }
    }
}

/// The statement's first words, upper case: `CREATE STREAM`, `DROP TABLE`.
fn statement_head(sql: &str) -> String {
    let words: Vec<String> = sql
        .split_whitespace()
        .take(2)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    let two_words = matches!(
        words.first().map(String::as_str),
        Some("CREATE" | "DROP" | "ALTER" | "STOP" | "START" | "TRUNCATE")
    );
    if two_words {
        words.join(" ")
    } else {
        words.first().cloned().unwrap_or_default()
    }
}

/// What one of Tidemark's statements needs.
pub fn of_tidemark(stmt: &TidemarkStatement) -> Vec<Need> {
    use TidemarkStatement as S;
    let write = |table: &str| vec![Need::new(Privilege::Write, Some(table.to_string()))];
    match stmt {
        S::ExplainCreateSink(_)
        | S::ExplainSparkCreateSink(_)
        | S::ShowStreams
        | S::ShowSinks
        | S::ShowViews
        | S::ShowQueries
        | S::ShowProgress(_)
        | S::Listen(_)
        | S::Unlisten(_)
        | S::Notify { .. }
        | S::ShowOptions
        | S::Savepoint(_)
        | S::ShowSetting(_)
        | S::Discard(_)
        | S::Flush { .. } => vec![],
        S::CopyFrom(c) => write(&c.table),
        S::Update { table, .. } | S::Delete { table, .. } => write(table),
        S::Merge(m) => match &m.target {
            super::merge::MergeTarget::Table(t) => write(t),
            // Writing any Delta path on the server's disk: a superuser's.
            super::merge::MergeTarget::Path(_) => vec![Need::new(Privilege::Superuser, None)],
        },
        S::CreateStream(_)
        | S::CreateSink(_)
        | S::DropStream { .. }
        | S::DropSink { .. }
        | S::StopSink { .. }
        | S::StartSink { .. }
        | S::AlterSink { .. }
        | S::Optimize { .. }
        | S::CreateTable(_)
        | S::DropTable { .. }
        | S::CreateView { .. }
        | S::DropView { .. }
        | S::CreateRole { .. }
        | S::AlterRole { .. }
        | S::DropRole { .. }
        | S::GrantRole { .. } => vec![Need::new(Privilege::Superuser, None)],
    }
}

/// What a statement DataFusion runs needs. `is_relation` tells Tidemark's relations
/// (streams, sinks, tables, views: a bare name) from the catalog's. Text that does not
/// parse needs nothing here: running it reports the syntax error.
pub fn of_sql(sql: &str, is_relation: &dyn Fn(&str) -> bool) -> Vec<Need> {
    let Ok(statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return vec![];
    };
    let mut needs = Vec::new();
    for statement in &statements {
        of_statement(statement, sql, is_relation, &mut needs);
    }
    needs
}

fn of_statement(
    statement: &Statement,
    sql: &str,
    is_relation: &dyn Fn(&str) -> bool,
    needs: &mut Vec<Need>,
) {
    match statement {
        Statement::Query(_) => reads(statement, is_relation, needs),
        Statement::Explain { statement, .. } => of_statement(statement, sql, is_relation, needs),
        Statement::Prepare { statement, .. } => of_statement(statement, sql, is_relation, needs),
        Statement::Insert(insert) => {
            needs.push(Need::new(Privilege::Write, Some(insert.table.to_string())));
            if let Some(source) = &insert.source {
                reads(source, is_relation, needs);
            }
        }
        _ => {
            let first = sql
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            let harmless = matches!(
                first.as_str(),
                "SET"
                    | "RESET"
                    | "SHOW"
                    | "BEGIN"
                    | "START"
                    | "COMMIT"
                    | "END"
                    | "ROLLBACK"
                    | "ABORT"
                    | "SAVEPOINT"
                    | "RELEASE"
                    | "DISCARD"
                    | "DEALLOCATE"
                    | "EXECUTE"
                    | "DECLARE"
                    | "FETCH"
                    | "CLOSE"
                    | "LISTEN"
                    | "UNLISTEN"
                    | "NOTIFY"
                    | "DESCRIBE"
            );
            if harmless {
                reads(statement, is_relation, needs);
            } else {
                needs.push(Need::new(Privilege::Superuser, None));
            }
        }
    }
}

/// Adds a read of every Tidemark relation `node` names.
fn reads<N: datafusion::sql::sqlparser::ast::Visit>(
    node: &N,
    is_relation: &dyn Fn(&str) -> bool,
    needs: &mut Vec<Need>,
) {
    let _ = visit_relations(node, |name: &ObjectName| {
        if let Some(relation) = user_relation(name, is_relation)
            && !needs
                .iter()
                .any(|n| n.relation.as_deref() == Some(&relation))
        {
            needs.push(Need::new(Privilege::Read, Some(relation)));
        }
        ControlFlow::<()>::Continue(())
    });
}

/// The relation's name if it is one of Tidemark's: bare, or in schema `public`.
fn user_relation(name: &ObjectName, is_relation: &dyn Fn(&str) -> bool) -> Option<String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|p| p.as_ident())
        .map(|i| match i.quote_style {
            Some(_) => i.value.clone(),
            None => i.value.to_lowercase(),
        })
        .collect();
    let relation = match parts.as_slice() {
        [r] => r,
        [schema, r] if schema == "public" => r,
        [_, schema, r] if schema == "public" => r,
        _ => return None,
    };
    is_relation(relation).then(|| relation.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn privileges(sql: &str) -> Vec<(Privilege, Option<String>)> {
        let is_relation = |n: &str| matches!(n, "events" | "totals");
        of_sql(sql, &is_relation)
            .into_iter()
            .map(|n| (n.privilege, n.relation))
            .collect()
    }

    #[test]
    fn reading_a_relation_needs_read_and_the_catalog_needs_nothing() {
        assert_eq!(
            privileges("SELECT * FROM events JOIN public.totals USING (k)"),
            vec![
                (Privilege::Read, Some("events".into())),
                (Privilege::Read, Some("totals".into()))
            ]
        );
        assert_eq!(
            privileges("SELECT relname FROM pg_catalog.pg_class"),
            vec![]
        );
        assert_eq!(privileges("SELECT 1"), vec![]);
        assert_eq!(
            privileges("EXPLAIN SELECT count(*) FROM (SELECT * FROM events) e"),
            vec![(Privilege::Read, Some("events".into()))]
        );
        for harmless in ["SET TIME ZONE 'UTC'", "SHOW search_path", "BEGIN", "COMMIT"] {
            assert_eq!(privileges(harmless), vec![], "{harmless}");
        }
    }

    #[test]
    fn writing_needs_write_and_everything_else_a_superuser() {
        assert_eq!(
            privileges("INSERT INTO events VALUES (1)"),
            vec![(Privilege::Write, Some("events".into()))]
        );
        assert_eq!(
            privileges("INSERT INTO events SELECT * FROM totals"),
            vec![
                (Privilege::Write, Some("events".into())),
                (Privilege::Read, Some("totals".into()))
            ]
        );
        assert_eq!(
            privileges("CREATE VIEW v AS SELECT 1"),
            vec![(Privilege::Superuser, None)]
        );
        let refusal = of_sql("CREATE VIEW v AS SELECT 1", &|_| false)[0].refusal("create view v");
        assert_eq!(refusal.sqlstate().code(), "42501");
        assert_eq!(refusal.to_string(), "permission denied to run CREATE VIEW");
        let stop = crate::sql::parse_tidemark("STOP SINK s").unwrap();
        assert_eq!(of_tidemark(&stop)[0].privilege, Privilege::Superuser);
        let flush = crate::sql::parse_tidemark("FLUSH").unwrap();
        assert!(of_tidemark(&flush).is_empty());
    }
}
