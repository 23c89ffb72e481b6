//! `MERGE INTO target USING source ON condition WHEN ...`: Delta's MERGE, as Databricks and
//! Spark SQL write it, parsed into a [`MergeSpec`] that `sink::delta` runs.
//!
//! ```text
//! MERGE INTO { table | delta.`/path` } [[AS] alias]
//! USING { (query) | table } [[AS] alias]
//! ON condition
//! { WHEN MATCHED [AND cond] THEN { UPDATE SET * | UPDATE SET col = expr, ... | DELETE }
//! | WHEN NOT MATCHED [BY TARGET] [AND cond] THEN { INSERT * | INSERT [(cols)] VALUES (exprs) }
//! | WHEN NOT MATCHED BY SOURCE [AND cond] THEN { UPDATE SET col = expr, ... | DELETE } } ...
//! ```
//!
//! sqlparser parses MERGE, but not Delta's `UPDATE SET *` and `INSERT *`, nor a path in
//! backticks; the clauses are read here on its `Parser`. Expressions are kept as SQL text:
//! delta-rs resolves them against the source and target schemas.

use datafusion::sql::sqlparser::ast::{AssignmentTarget, Expr, TableFactor};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use serde::{Deserialize, Serialize};

use super::parser::normalize_ident;
use crate::error::{Error, Result};

/// What a MERGE writes into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeTarget {
    /// A table made with `CREATE TABLE`.
    Table(String),
    /// `` delta.`/path` ``: a Delta table by its path.
    Path(String),
}

/// Which rows a `WHEN` clause applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeWhen {
    /// A target row that a source row matches.
    Matched,
    /// A source row that matches no target row (`NOT MATCHED [BY TARGET]`).
    NotMatched,
    /// A target row that no source row matches.
    NotMatchedBySource,
}

/// What a `WHEN` clause does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeAction {
    /// `UPDATE SET *`: every target column from the source column of the same name.
    UpdateAll,
    /// `UPDATE SET col = expr, ...` (target column, expression).
    Update(Vec<(String, String)>),
    Delete,
    /// `INSERT *`: every target column from the source column of the same name.
    InsertAll,
    /// `INSERT [(cols)] VALUES (exprs)`; no columns means the target's, in order.
    Insert {
        columns: Vec<String>,
        values: Vec<String>,
    },
}

/// One `WHEN ... THEN ...` clause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeClause {
    pub when: MergeWhen,
    /// The `AND` condition, as SQL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
    pub action: MergeAction,
}

/// A parsed `MERGE` statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeSpec {
    pub target: MergeTarget,
    /// The name the clauses give the target (its alias, or the table's name).
    pub target_alias: String,
    /// The `USING` relation as a query.
    pub source: String,
    /// The name the clauses give the source.
    pub source_alias: String,
    /// The `ON` condition, as SQL.
    pub on: String,
    pub clauses: Vec<MergeClause>,
}

impl MergeSpec {
    /// Whether a clause acts on target rows that no source row matches: such a MERGE
    /// changes the table even when the source is empty.
    pub fn acts_without_source(&self) -> bool {
        self.clauses
            .iter()
            .any(|c| c.when == MergeWhen::NotMatchedBySource)
    }

    /// The MERGE as SQL, for EXPLAIN and messages.
    pub fn describe(&self) -> String {
        let target = match &self.target {
            MergeTarget::Table(t) => t.clone(),
            MergeTarget::Path(p) => format!("delta.`{p}`"),
        };
        let mut out = format!(
            "MERGE INTO {target} AS {} USING (...) AS {} ON {}",
            self.target_alias, self.source_alias, self.on
        );
        for c in &self.clauses {
            out.push_str(match c.when {
                MergeWhen::Matched => " WHEN MATCHED",
                MergeWhen::NotMatched => " WHEN NOT MATCHED",
                MergeWhen::NotMatchedBySource => " WHEN NOT MATCHED BY SOURCE",
            });
            if let Some(cond) = &c.condition {
                out.push_str(&format!(" AND {cond}"));
            }
            out.push_str(" THEN ");
            out.push_str(&match &c.action {
                MergeAction::UpdateAll => "UPDATE SET *".to_string(),
                MergeAction::Update(sets) => format!(
                    "UPDATE SET {}",
                    sets.iter()
                        .map(|(c, e)| format!("{c} = {e}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                MergeAction::Delete => "DELETE".to_string(),
                MergeAction::InsertAll => "INSERT *".to_string(),
                MergeAction::Insert { columns, values } => {
                    let cols = if columns.is_empty() {
                        String::new()
                    } else {
                        format!("({}) ", columns.join(", "))
                    };
                    format!("INSERT {cols}VALUES ({})", values.join(", "))
                }
            });
        }
        out
    }
}

/// The identifier a `` delta.`/path` `` target is read as (a quoted identifier, so that
/// the tokenizer keeps the path whole).
const PATH_PREFIX: &str = "delta:";

/// Rewrites each `` delta.`/path` `` into the quoted identifier `"delta:/path"`.
pub fn quote_delta_paths(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(i) = find_ignore_case(rest, "delta.`") {
        let after = &rest[i + "delta.`".len()..];
        let Some(end) = after.find('`') else { break };
        // Only a whole word: not `mydelta.`.
        let word_start = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        out.push_str(&rest[..i]);
        if word_start {
            out.push('"');
            out.push_str(PATH_PREFIX);
            out.push_str(&after[..end].replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(&rest[i..i + "delta.`".len() + end + 1]);
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

fn find_ignore_case(haystack: &str, needle: &str) -> Option<usize> {
    haystack
        .as_bytes()
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Parses a MERGE statement after its `MERGE` keyword (the text went through
/// [`quote_delta_paths`]).
pub fn parse_merge(p: &mut Parser) -> Result<MergeSpec> {
    let _ = p.parse_keyword(Keyword::INTO);
    let target_name = p.parse_object_name(false)?;
    let (target, default_alias) = match target_name.0.as_slice() {
        [part] => {
            let ident = part
                .as_ident()
                .ok_or_else(|| Error::Syntax(format!("\"{target_name}\" is not a name")))?;
            match ident.value.strip_prefix(PATH_PREFIX) {
                Some(path) if ident.quote_style.is_some() => {
                    (MergeTarget::Path(path.to_string()), None)
                }
                _ => {
                    let name = normalize_ident(ident);
                    (MergeTarget::Table(name.clone()), Some(name))
                }
            }
        }
        // `public.t`, `db.public.t`: the table's name, which the clauses may use.
        _ => {
            let name = super::parser::qualified_name(&target_name)?;
            (MergeTarget::Table(name.clone()), Some(name))
        }
    };
    let target_alias = match parse_alias(p)? {
        Some(a) => a,
        None => default_alias.ok_or_else(|| {
            Error::Syntax(
                "a MERGE into delta.`/path` needs an alias: MERGE INTO delta.`/path` AS t".into(),
            )
        })?,
    };
    p.expect_keyword_is(Keyword::USING)?;
    let (source, source_alias) = match p.parse_table_factor()? {
        TableFactor::Derived {
            subquery, alias, ..
        } => {
            let alias = alias.ok_or_else(|| {
                Error::Syntax("the USING subquery needs an alias: USING (...) AS s".into())
            })?;
            (subquery.to_string(), normalize_ident(&alias.name))
        }
        TableFactor::Table { name, alias, .. } => {
            let alias = match alias {
                Some(a) => normalize_ident(&a.name),
                None => name
                    .0
                    .last()
                    .and_then(|p| p.as_ident())
                    .map(normalize_ident)
                    .unwrap_or_else(|| name.to_string()),
            };
            (format!("SELECT * FROM {name}"), alias)
        }
        other => {
            return Err(Error::Syntax(format!(
                "USING {other}: the source of a MERGE is a table or a (subquery) AS alias"
            )));
        }
    };
    if source_alias == target_alias {
        return Err(Error::Syntax(format!(
            "the MERGE target and source are both named \"{source_alias}\": give one an alias"
        )));
    }
    p.expect_keyword_is(Keyword::ON)?;
    let on = expr_text(p.parse_expr()?);
    let mut clauses = Vec::new();
    while p.parse_keyword(Keyword::WHEN) {
        clauses.push(parse_clause(p)?);
    }
    if clauses.is_empty() {
        return Err(Error::Syntax(format!(
            "expected WHEN after the MERGE's ON condition, found {}",
            p.peek_token().token
        )));
    }
    Ok(MergeSpec {
        target,
        target_alias,
        source,
        source_alias,
        on,
        clauses,
    })
}

/// `[AS] alias`, unless the next word is `USING`, `ON` or `WHEN`.
fn parse_alias(p: &mut Parser) -> Result<Option<String>> {
    let explicit = p.parse_keyword(Keyword::AS);
    match &p.peek_token().token {
        Token::Word(w)
            if explicit || !matches!(w.keyword, Keyword::USING | Keyword::ON | Keyword::WHEN) =>
        {
            Ok(Some(normalize_ident(&p.parse_identifier()?)))
        }
        _ if explicit => Err(Error::Syntax(format!(
            "expected an alias after AS, found {}",
            p.peek_token().token
        ))),
        _ => Ok(None),
    }
}

fn parse_clause(p: &mut Parser) -> Result<MergeClause> {
    let when = if p.parse_keyword(Keyword::NOT) {
        p.expect_keyword_is(Keyword::MATCHED)?;
        if p.parse_keywords(&[Keyword::BY, Keyword::SOURCE]) {
            MergeWhen::NotMatchedBySource
        } else {
            // `BY TARGET` is the default.
            let _ = p.parse_keywords(&[Keyword::BY, Keyword::TARGET]);
            MergeWhen::NotMatched
        }
    } else {
        p.expect_keyword_is(Keyword::MATCHED)?;
        MergeWhen::Matched
    };
    let condition = if p.parse_keyword(Keyword::AND) {
        Some(expr_text(p.parse_expr()?))
    } else {
        None
    };
    p.expect_keyword_is(Keyword::THEN)?;
    let clause_name = match when {
        MergeWhen::Matched => "WHEN MATCHED",
        MergeWhen::NotMatched => "WHEN NOT MATCHED",
        MergeWhen::NotMatchedBySource => "WHEN NOT MATCHED BY SOURCE",
    };
    let action = match p.parse_one_of_keywords(&[Keyword::UPDATE, Keyword::DELETE, Keyword::INSERT])
    {
        Some(Keyword::UPDATE) if when != MergeWhen::NotMatched => {
            p.expect_keyword_is(Keyword::SET)?;
            if p.consume_token(&Token::Mul) {
                if when == MergeWhen::NotMatchedBySource {
                    return Err(Error::Syntax(
                        "UPDATE SET * is not allowed in WHEN NOT MATCHED BY SOURCE: there is no \
                         source row"
                            .into(),
                    ));
                }
                MergeAction::UpdateAll
            } else {
                let mut sets = Vec::new();
                for a in p.parse_comma_separated(Parser::parse_assignment)? {
                    let AssignmentTarget::ColumnName(name) = &a.target else {
                        return Err(Error::Syntax(format!(
                            "UPDATE SET {}: assign one column at a time",
                            a.target
                        )));
                    };
                    let column = name
                        .0
                        .last()
                        .and_then(|p| p.as_ident())
                        .map(normalize_ident)
                        .ok_or_else(|| Error::Syntax(format!("\"{name}\" is not a column")))?;
                    sets.push((column, expr_text(a.value)));
                }
                MergeAction::Update(sets)
            }
        }
        Some(Keyword::DELETE) if when != MergeWhen::NotMatched => MergeAction::Delete,
        Some(Keyword::INSERT) if when == MergeWhen::NotMatched => {
            if p.consume_token(&Token::Mul) {
                MergeAction::InsertAll
            } else {
                let mut columns = Vec::new();
                if p.consume_token(&Token::LParen) {
                    loop {
                        columns.push(normalize_ident(&p.parse_identifier()?));
                        if p.consume_token(&Token::RParen) {
                            break;
                        }
                        p.expect_token(&Token::Comma)?;
                    }
                }
                p.expect_keyword_is(Keyword::VALUES)?;
                p.expect_token(&Token::LParen)?;
                let values: Vec<Expr> = p.parse_comma_separated(Parser::parse_expr)?;
                p.expect_token(&Token::RParen)?;
                if !columns.is_empty() && columns.len() != values.len() {
                    return Err(Error::Syntax(format!(
                        "INSERT has {} columns but {} values",
                        columns.len(),
                        values.len()
                    )));
                }
                MergeAction::Insert {
                    columns,
                    values: values.into_iter().map(expr_text).collect(),
                }
            }
        }
        Some(k) => {
            return Err(Error::Syntax(format!(
                "{k:?} is not allowed in {clause_name}: {}",
                match when {
                    MergeWhen::NotMatched => "it may only INSERT",
                    _ => "it may UPDATE or DELETE",
                }
            )));
        }
        None => {
            return Err(Error::Syntax(format!(
                "expected UPDATE, DELETE or INSERT after {clause_name} ... THEN, found {}",
                p.peek_token().token
            )));
        }
    };
    Ok(MergeClause {
        when,
        condition,
        action,
    })
}

/// An expression's text with its unquoted names in lower case, as Postgres folds them:
/// delta-rs resolves the text with the aliases as written here (`AS DBT_INTERNAL_SOURCE`
/// is `dbt_internal_source`), and did not fold a qualifier.
fn expr_text(mut expr: Expr) -> String {
    use datafusion::sql::sqlparser::ast::{Ident, visit_expressions_mut};
    use std::ops::ControlFlow;
    let fold = |i: &mut Ident| {
        if i.quote_style.is_none() {
            i.value = i.value.to_lowercase();
        }
    };
    let _ = visit_expressions_mut(&mut expr, |e| {
        match e {
            Expr::Identifier(i) => fold(i),
            Expr::CompoundIdentifier(parts) => parts.iter_mut().for_each(fold),
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    expr.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;

    fn parse(sql: &str) -> Result<MergeSpec> {
        let sql = quote_delta_paths(sql);
        let dialect = PostgreSqlDialect {};
        let mut p = Parser::new(&dialect).try_with_sql(&sql)?;
        p.expect_keyword_is(Keyword::MERGE)?;
        parse_merge(&mut p)
    }

    #[test]
    fn parses_the_seeds_upsert() {
        let m = parse(
            "MERGE INTO delta.`/tmp/lake/user_last_page` AS t \
             USING (SELECT user_id, page, event_time FROM clicks) AS s \
             ON t.user_id = s.user_id \
             WHEN MATCHED AND s.event_time > t.event_time THEN UPDATE SET * \
             WHEN NOT MATCHED THEN INSERT *",
        )
        .unwrap();
        assert_eq!(
            m.target,
            MergeTarget::Path("/tmp/lake/user_last_page".into())
        );
        assert_eq!(m.target_alias, "t");
        assert_eq!(m.source_alias, "s");
        assert_eq!(m.source, "SELECT user_id, page, event_time FROM clicks");
        assert_eq!(m.on, "t.user_id = s.user_id");
        assert_eq!(m.clauses.len(), 2);
        assert_eq!(m.clauses[0].when, MergeWhen::Matched);
        assert_eq!(
            m.clauses[0].condition.as_deref(),
            Some("s.event_time > t.event_time")
        );
        assert_eq!(m.clauses[0].action, MergeAction::UpdateAll);
        assert_eq!(m.clauses[1].action, MergeAction::InsertAll);
        assert!(!m.acts_without_source());
    }

    #[test]
    fn unquoted_names_fold_to_lower_case_as_the_aliases_do() {
        let m = parse(
            "MERGE INTO snap AS DEST USING staged AS SRC ON SRC.ID = DEST.id \
             WHEN MATCHED AND Dest.\"Valid\" IS NULL THEN UPDATE SET v = SRC.V \
             WHEN NOT MATCHED THEN INSERT (id) VALUES (SRC.Id)",
        )
        .unwrap();
        assert_eq!(
            (m.target_alias.as_str(), m.source_alias.as_str()),
            ("dest", "src")
        );
        assert_eq!(m.on, "src.id = dest.id");
        assert_eq!(
            m.clauses[0].condition.as_deref(),
            Some("dest.\"Valid\" IS NULL")
        );
        assert_eq!(
            m.clauses[0].action,
            MergeAction::Update(vec![("v".into(), "src.v".into())])
        );
        assert_eq!(
            m.clauses[1].action,
            MergeAction::Insert {
                columns: vec!["id".into()],
                values: vec!["src.id".into()]
            }
        );
    }

    #[test]
    fn parses_every_clause_kind() {
        let m = parse(
            "MERGE INTO Users USING updates ON users.id = updates.id \
             WHEN MATCHED AND updates.deleted THEN DELETE \
             WHEN MATCHED THEN UPDATE SET users.n = users.n + updates.n, name = upper(updates.name) \
             WHEN NOT MATCHED BY TARGET THEN INSERT (id, n) VALUES (updates.id, 1) \
             WHEN NOT MATCHED BY SOURCE AND users.n > 10 THEN UPDATE SET n = 0 \
             WHEN NOT MATCHED BY SOURCE THEN DELETE",
        )
        .unwrap();
        assert_eq!(m.target, MergeTarget::Table("users".into()));
        assert_eq!(m.target_alias, "users");
        assert_eq!(m.source, "SELECT * FROM updates");
        assert_eq!(m.source_alias, "updates");
        assert_eq!(m.clauses[0].action, MergeAction::Delete);
        assert_eq!(
            m.clauses[1].action,
            MergeAction::Update(vec![
                ("n".into(), "users.n + updates.n".into()),
                ("name".into(), "upper(updates.name)".into())
            ])
        );
        assert_eq!(
            m.clauses[2].action,
            MergeAction::Insert {
                columns: vec!["id".into(), "n".into()],
                values: vec!["updates.id".into(), "1".into()]
            }
        );
        assert_eq!(m.clauses[3].when, MergeWhen::NotMatchedBySource);
        assert_eq!(m.clauses[4].action, MergeAction::Delete);
        assert!(m.acts_without_source());
    }

    #[test]
    fn refuses_what_merge_does_not_allow() {
        for bad in [
            "MERGE INTO delta.`/x` USING s ON true WHEN MATCHED THEN DELETE",
            "MERGE INTO t USING (SELECT 1) ON true WHEN MATCHED THEN DELETE",
            "MERGE INTO t USING s ON t.a = s.a",
            "MERGE INTO t USING s ON t.a = s.a WHEN NOT MATCHED THEN DELETE",
            "MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN INSERT *",
            "MERGE INTO t USING s ON t.a = s.a WHEN NOT MATCHED BY SOURCE THEN UPDATE SET *",
            "MERGE INTO t USING s ON t.a = s.a WHEN NOT MATCHED THEN INSERT (a, b) VALUES (1)",
            "MERGE INTO t USING t ON true WHEN MATCHED THEN DELETE",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.sqlstate().code(), "42601", "{bad}: {e}");
        }
    }

    #[test]
    fn delta_paths_become_quoted_identifiers_only_as_whole_words() {
        assert_eq!(
            quote_delta_paths("MERGE INTO delta.`/a \"b\"` AS t"),
            "MERGE INTO \"delta:/a \"\"b\"\"\" AS t"
        );
        assert_eq!(quote_delta_paths("x mydelta.`/a`"), "x mydelta.`/a`");
        assert_eq!(quote_delta_paths("DELTA.`/a` b"), "\"delta:/a\" b");
    }
}
