//! Rewrites of client catalog queries that DataFusion cannot plan, before
//! datafusion-postgres sees them.
//!
//! datafusion-postgres answers a correlated scalar subquery in a select list of a
//! `pg_catalog` query with NULL (its `RemoveSubqueryFromProjection`): DataFusion cannot run
//! it. SQLAlchemy's column reflection (`Inspector.get_columns`) wraps such subqueries in
//! `CASE WHEN <column has a default / an identity / a collation> THEN (SELECT ...) END`,
//! which that rule does not see and DataFusion fails to plan. Tidemark extends the rule to
//! that form: in a query that reads `pg_catalog`, a select-list `CASE` whose results are
//! all NULL or correlated scalar subqueries is NULL. The answer is right for Tidemark's
//! objects: no column has a default, an identity or a collation (`pg_attribute` says
//! `atthasdef = false`, `attidentity = ''`, `attcollation = 0`), so Postgres would take
//! the NULL branch too.

use std::collections::HashSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, CaseWhen, Expr, Query, SelectItem, SetExpr, TableFactor, Value, VisitMut,
    VisitorMut, visit_expressions, visit_relations,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// `sql` rewritten, if it is one statement that reads `pg_catalog` and has such a `CASE`.
pub fn rewrite_catalog_query(sql: &str) -> Option<String> {
    let lower = sql.to_ascii_lowercase();
    if !(lower.contains("pg_") && lower.contains("case") && lower.matches("select").count() > 1) {
        return None;
    }
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let [stmt] = statements.as_mut_slice() else {
        return None;
    };
    let mut reads_catalog = false;
    let _ = visit_relations(stmt, |name| {
        let text = name.to_string().to_ascii_lowercase();
        if text.starts_with("pg_catalog.") || text.starts_with("pg_") {
            reads_catalog = true;
        }
        ControlFlow::<()>::Continue(())
    });
    if !reads_catalog {
        return None;
    }
    let mut rewriter = CaseOfCorrelatedSubqueries { changed: false };
    let _ = stmt.visit(&mut rewriter);
    rewriter.changed.then(|| stmt.to_string())
}

struct CaseOfCorrelatedSubqueries {
    changed: bool,
}

impl VisitorMut for CaseOfCorrelatedSubqueries {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_mut() {
            for item in &mut select.projection {
                let (SelectItem::UnnamedExpr(expr) | SelectItem::ExprWithAlias { expr, .. }) = item
                else {
                    continue;
                };
                if is_case_of_correlated_subqueries(expr) {
                    *expr = null_keeping_parameters(expr);
                    self.changed = true;
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// NULL, in a form that still names the parameters `expr` names, each with its cast, so
/// that their types are inferred as in the original statement:
/// `CASE WHEN $1::VARCHAR IS NULL OR ... THEN NULL END`.
fn null_keeping_parameters(expr: &Expr) -> Expr {
    let null = || Expr::Value(Value::Null.into());
    let mut cast: Vec<Expr> = Vec::new();
    let mut bare: Vec<Expr> = Vec::new();
    let _ = visit_expressions(expr, |e| {
        match e {
            Expr::Cast { expr: inner, .. } if is_placeholder(inner) => cast.push(e.clone()),
            e if is_placeholder(e) => bare.push(e.clone()),
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    let named_in_casts: Vec<String> = cast
        .iter()
        .filter_map(|e| match e {
            Expr::Cast { expr, .. } => Some(expr.to_string()),
            _ => None,
        })
        .collect();
    bare.retain(|b| !named_in_casts.contains(&b.to_string()));
    let condition = cast
        .into_iter()
        .chain(bare)
        .map(|p| Expr::IsNull(Box::new(p)))
        .reduce(|a, b| Expr::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::Or,
            right: Box::new(b),
        });
    match condition {
        None => null(),
        Some(condition) => Expr::Case {
            case_token: AttachedToken::empty(),
            end_token: AttachedToken::empty(),
            operand: None,
            conditions: vec![CaseWhen {
                condition,
                result: null(),
            }],
            else_result: None,
        },
    }
}

fn is_placeholder(e: &Expr) -> bool {
    matches!(e, Expr::Value(v) if matches!(v.value, Value::Placeholder(_)))
}

/// `CASE ... THEN r ... [ELSE r] END` where every `r` is NULL or a correlated scalar
/// subquery, and one at least is a subquery.
fn is_case_of_correlated_subqueries(expr: &Expr) -> bool {
    let Expr::Case {
        conditions,
        else_result,
        ..
    } = expr
    else {
        return false;
    };
    let results = conditions
        .iter()
        .map(|c| &c.result)
        .chain(else_result.as_deref());
    let mut subqueries = 0;
    for r in results {
        match r {
            Expr::Value(v) if v.value == Value::Null => {}
            Expr::Subquery(q) if is_correlated(q) => subqueries += 1,
            _ => return false,
        }
    }
    subqueries > 0
}

/// Whether `query` names a column of a table it does not read (`outer.column`).
fn is_correlated(query: &Query) -> bool {
    let mut inner: HashSet<String> = HashSet::new();
    let _ = visit_relations(query, |name| {
        let text = name.to_string().to_ascii_lowercase();
        if let Some(last) = text.rsplit('.').next() {
            inner.insert(last.to_string());
        }
        inner.insert(text);
        ControlFlow::<()>::Continue(())
    });
    if let SetExpr::Select(select) = query.body.as_ref() {
        for from in &select.from {
            for factor in
                std::iter::once(&from.relation).chain(from.joins.iter().map(|j| &j.relation))
            {
                if let TableFactor::Table { alias: Some(a), .. } = factor {
                    inner.insert(a.name.value.to_ascii_lowercase());
                }
            }
        }
    }
    let mut correlated = false;
    let _ = visit_expressions(query, |e| {
        if let Expr::CompoundIdentifier(parts) = e
            && parts.len() >= 2
        {
            let table = parts[parts.len() - 2].value.to_ascii_lowercase();
            let full = parts[..parts.len() - 1]
                .iter()
                .map(|p| p.value.to_ascii_lowercase())
                .collect::<Vec<_>>()
                .join(".");
            if !inner.contains(&table) && !inner.contains(&full) {
                correlated = true;
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    correlated
}

/// A statement DataFusion would panic on, refused first with Postgres's error: a scalar or
/// `IN` subquery with an empty select list (`SELECT (SELECT FROM t)`; DataFusion 55 indexes
/// the subquery's first column to name the expression). `None` for everything else,
/// including text that does not parse (the parser that runs it reports that).
pub fn refuse_unplannable(sql: &str) -> Option<crate::error::Error> {
    if !has_empty_select_list(sql) {
        return None;
    }
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let mut found = None;
    for stmt in &statements {
        let _ = visit_expressions(stmt, |e| {
            let (query, message) = match e {
                Expr::Subquery(q) => (q, "subquery must return only one column"),
                Expr::InSubquery { subquery, .. } => (subquery, "subquery has too few columns"),
                _ => return ControlFlow::Continue(()),
            };
            if matches!(query.body.as_ref(), SetExpr::Select(s) if s.projection.is_empty()) {
                found = Some(message);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        });
    }
    found.map(|m| crate::error::Error::Syntax(m.into()))
}

/// Whether some `SELECT` in `sql` is followed directly by `FROM` (or ends the text): the
/// cheap test before parsing.
fn has_empty_select_list(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    let mut rest = lower.as_str();
    while let Some(at) = rest.find("select") {
        rest = &rest[at + "select".len()..];
        let next = rest.trim_start_matches(|c: char| c.is_whitespace());
        if next.is_empty() || next.starts_with(')') || next.starts_with("from") {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_of_correlated_subqueries_in_a_catalog_query_is_null() {
        let sql = "SELECT pg_catalog.pg_attribute.attname AS name, \
            CASE WHEN pg_catalog.pg_attribute.atthasdef THEN \
              (SELECT pg_catalog.pg_get_expr(pg_catalog.pg_attrdef.adbin, pg_catalog.pg_attrdef.adrelid) \
               FROM pg_catalog.pg_attrdef \
               WHERE pg_catalog.pg_attrdef.adrelid = pg_catalog.pg_attribute.attrelid) \
            ELSE NULL END AS \"default\", \
            CASE WHEN pg_catalog.pg_attribute.attnum > 0 THEN 'yes' END AS plain, \
            CASE WHEN true THEN (SELECT max(oid) FROM pg_catalog.pg_type t WHERE t.oid > 0) END AS uncorrelated \
            FROM pg_catalog.pg_attribute";
        let out = rewrite_catalog_query(sql).expect("rewritten");
        assert!(out.contains("NULL AS \"default\""), "{out}");
        assert!(out.contains("THEN 'yes' END AS plain"), "{out}");
        assert!(
            out.contains("SELECT max(oid) FROM pg_catalog.pg_type t"),
            "{out}"
        );
    }

    #[test]
    fn the_parameters_of_what_is_removed_keep_their_casts() {
        let sql = "SELECT CASE WHEN pg_catalog.pg_attribute.attidentity != $1::VARCHAR THEN \
              (SELECT json_build_object($2::VARCHAR, pg_catalog.pg_sequence.seqstart) \
               FROM pg_catalog.pg_sequence \
               WHERE pg_catalog.pg_attribute.attidentity != $3 \
               AND pg_catalog.pg_sequence.seqrelid = pg_catalog.pg_attribute.attrelid) \
            ELSE NULL END AS identity_options \
            FROM pg_catalog.pg_attribute WHERE pg_catalog.pg_attribute.attnum > $4::SMALLINT";
        let out = rewrite_catalog_query(sql).expect("rewritten");
        assert!(
            out.contains(
                "CASE WHEN $1::VARCHAR IS NULL OR $2::VARCHAR IS NULL OR $3 IS NULL THEN NULL END AS identity_options"
            ),
            "{out}"
        );
        assert!(out.contains("attnum > $4::SMALLINT"), "{out}");
    }

    #[test]
    fn queries_of_other_tables_are_left_alone() {
        assert_eq!(
            rewrite_catalog_query(
                "SELECT CASE WHEN v.n > 0 THEN (SELECT w.n FROM w WHERE w.k = v.k) END FROM v"
            ),
            None
        );
        assert_eq!(rewrite_catalog_query("SELECT 1"), None);
    }

    #[test]
    fn an_empty_subquery_is_refused_before_datafusion_sees_it() {
        let refused = |sql: &str| refuse_unplannable(sql).map(|e| e.to_string());
        assert_eq!(
            refused("SELECT (SELECT FROM clicks), 1"),
            Some("subquery must return only one column".into())
        );
        assert_eq!(
            refused("SELECT 1 WHERE 1 IN (select\n from t)"),
            Some("subquery has too few columns".into())
        );
        assert_eq!(refused("SELECT FROM clicks"), None);
        assert_eq!(refused("SELECT EXISTS (SELECT FROM t)"), None);
        assert_eq!(refused("SELECT (SELECT 1 FROM t)"), None);
    }
}
