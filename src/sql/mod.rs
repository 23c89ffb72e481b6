//! SQL text in, statements out: splitting a query string into statements, telling
//! Tidemark's own statements from the ones DataFusion runs, and parsing ours.
//!
//! sqlparser (the version DataFusion re-exports) knows nothing of streams and sinks, so the
//! text is tokenized once, cut at top-level semicolons, and each piece is classified by its
//! leading keywords. Pieces that are not ours are passed on as their original text, so the
//! Postgres-compatibility rewrites of datafusion-postgres see exactly what the client sent.

pub mod copy;
pub mod merge;
pub mod options;
pub mod parser;
pub mod privilege;
pub mod roles;
pub mod types;

use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

pub use parser::{
    ColumnSpec, CreateSink, CreateStream, TidemarkStatement, WatermarkSpec, parse_tidemark,
};

/// One statement of a query string.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// A statement Tidemark handles itself; the text is the statement without its `;`.
    Tidemark(String),
    /// Anything else, for DataFusion; the original text.
    Other(String),
}

impl Piece {
    /// The statement's text.
    pub fn text(&self) -> &str {
        match self {
            Piece::Tidemark(s) | Piece::Other(s) => s,
        }
    }
}

/// Splits `sql` into statements and classifies each. Text that does not tokenize is
/// returned whole as [`Piece::Other`], so the parser that runs it reports the error.
pub fn split(sql: &str) -> Vec<Piece> {
    let dialect = PostgreSqlDialect {};
    let tokens = match Tokenizer::new(&dialect, sql).tokenize_with_location() {
        Ok(t) => t,
        Err(_) => return vec![Piece::Other(sql.to_string())],
    };
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(sql.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let offset = |line: u64, column: u64| -> usize {
        let Some(&start) = line_starts.get((line as usize).saturating_sub(1)) else {
            return sql.len();
        };
        let rest = &sql[start..];
        rest.char_indices()
            .nth((column as usize).saturating_sub(1))
            .map(|(i, _)| start + i)
            .unwrap_or(sql.len())
    };
    let mut pieces = Vec::new();
    let mut start = 0usize;
    let mut words: Vec<String> = Vec::new();
    // `COPY t FROM STDIN` is Tidemark's (a table stream's write path); other COPYs are not.
    let mut stdin = false;
    let mut flush = |start: usize, end: usize, words: &mut Vec<String>, stdin: &mut bool| {
        let text = sql[start..end].trim();
        let copy_in = *stdin && words.first().is_some_and(|w| w == "COPY");
        *stdin = false;
        if !words.is_empty() && !text.is_empty() {
            if copy_in || is_tidemark(words) {
                pieces.push(Piece::Tidemark(text.to_string()));
            } else {
                pieces.push(Piece::Other(text.to_string()));
            }
        }
        words.clear();
    };
    for t in &tokens {
        match &t.token {
            Token::SemiColon => {
                let end = offset(t.span.start.line, t.span.start.column);
                flush(start, end, &mut words, &mut stdin);
                start = offset(t.span.end.line, t.span.end.column);
            }
            Token::Whitespace(_) => {}
            Token::Word(w) if w.value.eq_ignore_ascii_case("STDIN") => {
                stdin = true;
                if words.len() < 3 {
                    words.push("STDIN".into());
                }
            }
            Token::Word(w) if words.len() < 4 => words.push(w.value.to_ascii_uppercase()),
            Token::Period if words.len() < 4 => words.push(".".into()),
            _ if words.len() < 4 => words.push(String::new()),
            _ => {}
        }
    }
    flush(start, sql.len(), &mut words, &mut stdin);
    pieces
}

/// Whether the leading words name one of Tidemark's statements.
fn is_tidemark(words: &[String]) -> bool {
    if roles::is_role_statement(words) {
        return true;
    }
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    match w(0) {
        "CREATE" | "DROP" => {
            matches!(w(1), "STREAM" | "SINK" | "MATERIALIZED" | "TABLE" | "VIEW")
                || (w(0) == "CREATE"
                    && w(1) == "OR"
                    && w(2) == "REPLACE"
                    && matches!(w(3), "SINK" | "MATERIALIZED" | "VIEW"))
        }
        // Tables are Delta tables: their changes go through deltalake.
        "MERGE" | "UPDATE" | "DELETE" => true,
        // `SHOW` of a setting is ours too (the wire answers it from the session), and a bare
        // `SHOW` (a syntax error; datafusion-postgres's SHOW hook panics on it). DataFusion
        // keeps its own `SHOW TABLES`, `SHOW COLUMNS`, `SHOW FUNCTIONS` and dotted names
        // (`SHOW datafusion.execution.batch_size`).
        "SHOW" => {
            !matches!(
                w(1),
                "TABLES" | "COLUMNS" | "FUNCTIONS" | "CATALOGS" | "CREATE" | "FULL"
            ) && w(2) != "."
        }
        "DISCARD" | "LISTEN" | "UNLISTEN" | "NOTIFY" => true,
        "STOP" | "START" | "ALTER" => matches!(w(1), "SINK" | "MATERIALIZED"),
        "FLUSH" | "OPTIMIZE" | "SAVEPOINT" | "RELEASE" => true,
        "ROLLBACK" => w(1) == "TO",
        "EXPLAIN" => {
            (w(1) == "CREATE" && matches!(w(2), "SINK" | "MATERIALIZED"))
                || (w(1) == "SPARK" && w(2) == "CREATE" && matches!(w(3), "SINK" | "MATERIALIZED"))
        }
        _ => false,
    }
}

/// Rewrites Spark's references to the window column of a `GROUP BY window(...)` query —
/// `window.start`, `window.end`, `window` — into expressions DataFusion can plan:
/// `get_field(window(...), 'start')` and the call itself. Bare `window.start` in the
/// select list keeps Spark's column name (`start`). Other queries are returned unchanged.
pub fn expand_window_refs(query: &str) -> crate::error::Result<String> {
    use datafusion::sql::sqlparser::ast::{
        Expr, Ident, SelectItem, SetExpr, Statement, visit_expressions_mut,
    };
    use datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    let dialect = PostgreSqlDialect {};
    let mut stmts = Parser::parse_sql(&dialect, query)?;
    if let Some(stmt) = stmts.first_mut() {
        rewrite_window_tvf(stmt)?;
        if let Statement::Query(q) = stmt {
            spark_implicit_names(q, true)?;
        }
    }
    let window = match stmts.first() {
        Some(Statement::Query(q)) => match q.body.as_ref() {
            SetExpr::Select(select) => group_by_window(select),
            _ => None,
        },
        _ => None,
    };
    let Some((column, window)) = window else {
        return Ok(stmts
            .first()
            .map(|s| s.to_string())
            .unwrap_or_else(|| query.to_string()));
    };
    let field = |name: &str| -> crate::error::Result<Expr> {
        let text = format!("get_field({window}, '{name}')");
        Ok(Parser::new(&dialect).try_with_sql(&text)?.parse_expr()?)
    };
    let (start, end) = (field("start")?, field("end")?);
    // Keep Spark's names for bare references in the select list.
    if let Some(Statement::Query(q)) = stmts.first_mut()
        && let SetExpr::Select(select) = q.body.as_mut()
    {
        for item in &mut select.projection {
            if let SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) = item
                && parts.len() == 2
                && parts[0].value.eq_ignore_ascii_case(&column)
            {
                let alias = parts[1].value.to_ascii_lowercase();
                *item = SelectItem::ExprWithAlias {
                    expr: Expr::CompoundIdentifier(parts.clone()),
                    alias: Ident::new(alias),
                };
            }
        }
    }
    let _ = visit_expressions_mut(&mut stmts, |e| {
        match e {
            Expr::CompoundIdentifier(parts)
                if parts.len() == 2 && parts[0].value.eq_ignore_ascii_case(&column) =>
            {
                match parts[1].value.to_ascii_lowercase().as_str() {
                    "start" => *e = start.clone(),
                    "end" => *e = end.clone(),
                    _ => {}
                }
            }
            Expr::Identifier(id) if id.value.eq_ignore_ascii_case(&column) => {
                *e = window.clone();
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    Ok(stmts[0].to_string())
}

/// The `window(...)` or `session_window(...)` a select groups by, with its column name.
fn group_by_window(
    select: &datafusion::sql::sqlparser::ast::Select,
) -> Option<(String, datafusion::sql::sqlparser::ast::Expr)> {
    use datafusion::sql::sqlparser::ast::{Expr, GroupByExpr};
    let GroupByExpr::Expressions(exprs, _) = &select.group_by else {
        return None;
    };
    exprs.iter().find_map(|e| match e {
        Expr::Function(f)
            if ["window", "session_window"]
                .contains(&f.name.to_string().to_ascii_lowercase().as_str()) =>
        {
            Some((f.name.to_string().to_ascii_lowercase(), e.clone()))
        }
        _ => None,
    })
}

/// Spark's implicit column names inside a query, so that a query written for Spark finds
/// them: in a subquery of `FROM`, the bare `window` (or `session_window`) of a
/// `GROUP BY window(...)` is that window, named `window`, and an unnamed call is named as
/// Spark names it (`count(1)` for `count(*)`, `sum(n)` for `sum(e.n)`); in any query,
/// `window.start` and `window.end` over such a subquery's `window` column are its fields.
/// The outermost query's own `GROUP BY window(...)` is left to [`expand_window_refs`].
fn spark_implicit_names(
    query: &mut datafusion::sql::sqlparser::ast::Query,
    top: bool,
) -> crate::error::Result<()> {
    use datafusion::sql::sqlparser::ast::SetExpr;
    fn body(b: &mut SetExpr, top: bool) -> crate::error::Result<()> {
        match b {
            SetExpr::Select(select) => implicit_names_in_select(select, top),
            SetExpr::Query(q) => spark_implicit_names(q, top),
            SetExpr::SetOperation { left, right, .. } => {
                body(left, top)?;
                body(right, top)
            }
            _ => Ok(()),
        }
    }
    body(query.body.as_mut(), top)
}

fn implicit_names_in_select(
    select: &mut datafusion::sql::sqlparser::ast::Select,
    top: bool,
) -> crate::error::Result<()> {
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident, SelectItem, TableFactor,
        visit_expressions_mut,
    };
    use std::ops::ControlFlow;
    // Subqueries first: their columns are what this select reads.
    for t in &mut select.from {
        for factor in
            std::iter::once(&mut t.relation).chain(t.joins.iter_mut().map(|j| &mut j.relation))
        {
            if let TableFactor::Derived { subquery, .. } = factor {
                spark_implicit_names(subquery, false)?;
            }
        }
    }
    let window = group_by_window(select);
    let field = |of: Expr, name: &str| -> crate::error::Result<Expr> {
        let text = format!("get_field({of}, '{name}')");
        Ok(
            datafusion::sql::sqlparser::parser::Parser::new(&PostgreSqlDialect {})
                .try_with_sql(&text)?
                .parse_expr()?,
        )
    };
    if let Some((column, w)) = &window {
        if top {
            return Ok(());
        }
        // A subquery's own window: the bare name is the window, named as Spark names it.
        for item in &mut select.projection {
            if let SelectItem::UnnamedExpr(Expr::Identifier(id)) = item
                && id.value.eq_ignore_ascii_case(column)
            {
                *item = SelectItem::ExprWithAlias {
                    expr: w.clone(),
                    alias: Ident::new(column.clone()),
                };
            }
        }
    } else {
        // `window.start` of a subquery's `window` column, unless a relation is named so.
        let named_window = select.from.iter().any(|t| {
            std::iter::once(&t.relation)
                .chain(t.joins.iter().map(|j| &j.relation))
                .any(|f| match f {
                    TableFactor::Table { name, alias, .. } => {
                        let n = alias
                            .as_ref()
                            .map_or(name.to_string(), |a| a.name.value.clone());
                        n.eq_ignore_ascii_case("window") || n.eq_ignore_ascii_case("session_window")
                    }
                    TableFactor::Derived { alias, .. } => alias.as_ref().is_some_and(|a| {
                        a.name.value.eq_ignore_ascii_case("window")
                            || a.name.value.eq_ignore_ascii_case("session_window")
                    }),
                    _ => false,
                })
        });
        if !named_window {
            let is_window_field = |parts: &[Ident]| {
                parts.len() == 2
                    && ["window", "session_window"]
                        .contains(&parts[0].value.to_ascii_lowercase().as_str())
                    && ["start", "end"].contains(&parts[1].value.to_ascii_lowercase().as_str())
            };
            for item in &mut select.projection {
                if let SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) = item
                    && is_window_field(parts)
                {
                    let alias = Ident::new(parts[1].value.to_ascii_lowercase());
                    *item = SelectItem::ExprWithAlias {
                        expr: Expr::CompoundIdentifier(parts.clone()),
                        alias,
                    };
                }
            }
            let mut failed = None;
            let _ = visit_expressions_mut(&mut select.projection, |e| {
                if let Expr::CompoundIdentifier(parts) = e
                    && is_window_field(parts)
                {
                    let of = Expr::Identifier(Ident::with_quote(
                        '"',
                        parts[0].value.to_ascii_lowercase(),
                    ));
                    match field(of, &parts[1].value.to_ascii_lowercase()) {
                        Ok(f) => *e = f,
                        Err(err) => failed = Some(err),
                    }
                }
                ControlFlow::<()>::Continue(())
            });
            if let Some(e) = failed {
                return Err(e);
            }
        }
    }
    if top {
        return Ok(());
    }
    // Unnamed calls get Spark's names: `count(1)`, `sum(n)`.
    for item in &mut select.projection {
        if let SelectItem::UnnamedExpr(Expr::Function(f)) = item {
            let mut named = f.clone();
            named.name = datafusion::sql::sqlparser::ast::ObjectName::from(vec![Ident::new(
                named.name.to_string().to_ascii_lowercase(),
            )]);
            let mut star = false;
            if let FunctionArguments::List(list) = &mut named.args {
                for a in &mut list.args {
                    match a {
                        FunctionArg::Unnamed(FunctionArgExpr::Wildcard) => star = true,
                        FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::CompoundIdentifier(
                            parts,
                        ))) => {
                            let last = parts.last().cloned();
                            if let Some(last) = last {
                                *a = FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(
                                    last,
                                )));
                            }
                        }
                        _ => {}
                    }
                }
            }
            let name = named.name.to_string();
            let alias = if star && name == "count" {
                "count(1)".to_string()
            } else {
                named.to_string()
            };
            *item = SelectItem::ExprWithAlias {
                expr: Expr::Function(f.clone()),
                alias: Ident::with_quote('"', alias),
            };
        }
    }
    Ok(())
}

/// Rewrites the table-valued window forms Flink and RisingWave users write into Spark's:
///
/// - `FROM TUMBLE(s, t, size) ... GROUP BY window_start, window_end, k` becomes
///   `FROM s ... GROUP BY window(t, size), k`, with `window_start` / `window_end` read as
///   `window.start` / `window.end`; `HOP(s, t, slide, size)` becomes `window(t, size, slide)`;
/// - `FROM TUMBLE(s, t, size)` without such a GROUP BY becomes a derived table that adds
///   the `window_start` and `window_end` columns to every row.
fn rewrite_window_tvf(
    stmt: &mut datafusion::sql::sqlparser::ast::Statement,
) -> crate::error::Result<()> {
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, GroupByExpr, Ident, ObjectName, SelectItem, SetExpr,
        Statement, TableFactor, visit_expressions_mut,
    };
    use datafusion::sql::sqlparser::parser::Parser;
    use std::ops::ControlFlow;

    let Statement::Query(q) = stmt else {
        return Ok(());
    };
    let SetExpr::Select(select) = q.body.as_mut() else {
        return Ok(());
    };
    let Some(from) = select.from.first_mut() else {
        return Ok(());
    };
    let TableFactor::Table {
        name,
        alias,
        args: Some(args),
        ..
    } = &from.relation
    else {
        return Ok(());
    };
    let kind = name.to_string().to_ascii_uppercase();
    if !matches!(kind.as_str(), "TUMBLE" | "HOP" | "SESSION") {
        return Ok(());
    }
    if kind == "SESSION" {
        return Err(crate::error::Error::unsupported(
            "session windows are not supported yet",
        ));
    }
    let exprs: Vec<String> = args
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e.to_string()),
            other => Err(crate::error::Error::Syntax(format!(
                "unexpected argument {other} of {kind}"
            ))),
        })
        .collect::<crate::error::Result<_>>()?;
    let call = match (kind.as_str(), exprs.as_slice()) {
        ("TUMBLE", [_, t, size]) => format!("window({t}, {size})"),
        ("HOP", [_, t, slide, size]) => format!("window({t}, {size}, {slide})"),
        ("SESSION", [_, t, gap]) => format!("session_window({t}, {gap})"),
        _ => {
            return Err(crate::error::Error::Syntax(format!(
                "{kind} takes (stream, time column, {})",
                match kind.as_str() {
                    "HOP" => "slide, size",
                    "SESSION" => "gap",
                    _ => "size",
                }
            )));
        }
    };
    let stream = exprs[0].clone();
    let alias = match alias.clone() {
        Some(a) => a,
        None => {
            // Parse an alias rather than build the struct: its fields vary by version.
            let q = Parser::parse_sql(
                &PostgreSqlDialect {},
                &format!("SELECT 1 FROM t AS {stream}"),
            )?;
            match q.into_iter().next() {
                Some(Statement::Query(q)) => match *q.body {
                    SetExpr::Select(s) => match s.from.into_iter().next().map(|f| f.relation) {
                        Some(TableFactor::Table { alias: Some(a), .. }) => a,
                        _ => return Err(crate::error::Error::Internal("alias".into())),
                    },
                    _ => return Err(crate::error::Error::Internal("alias".into())),
                },
                _ => return Err(crate::error::Error::Internal("alias".into())),
            }
        }
    };
    let is_window_col =
        |e: &Expr, col: &str| matches!(e, Expr::Identifier(i) if i.value.eq_ignore_ascii_case(col));
    let grouped = match &select.group_by {
        GroupByExpr::Expressions(g, _) => g
            .iter()
            .any(|e| is_window_col(e, "window_start") || is_window_col(e, "window_end")),
        _ => false,
    };
    let parse = |text: &str| -> crate::error::Result<Expr> {
        Ok(Parser::new(&PostgreSqlDialect {})
            .try_with_sql(text)?
            .parse_expr()?)
    };
    if grouped {
        from.relation = TableFactor::Table {
            name: ObjectName::from(vec![Ident::new(stream)]),
            alias: Some(alias),
            args: None,
            with_hints: vec![],
            version: None,
            with_ordinality: false,
            partitions: vec![],
            json_path: None,
            sample: None,
            index_hints: vec![],
        };
        let window = parse(&call)?;
        if let GroupByExpr::Expressions(g, _) = &mut select.group_by {
            let mut out = Vec::new();
            for e in g.drain(..) {
                if is_window_col(&e, "window_start") || is_window_col(&e, "window_end") {
                    if !out.contains(&window) {
                        out.push(window.clone());
                    }
                } else {
                    out.push(e);
                }
            }
            *g = out;
        }
        // Keep the column names of bare references in the select list.
        for item in &mut select.projection {
            if let SelectItem::UnnamedExpr(e) = item
                && (is_window_col(e, "window_start") || is_window_col(e, "window_end"))
            {
                let name = e.to_string().to_ascii_lowercase();
                *item = SelectItem::ExprWithAlias {
                    expr: e.clone(),
                    alias: Ident::new(name),
                };
            }
        }
        let column = if kind == "SESSION" {
            "session_window"
        } else {
            "window"
        };
        let start = parse(&format!("{column}.start"))?;
        let end = parse(&format!("{column}.end"))?;
        let _ = visit_expressions_mut(stmt, |e| {
            if is_window_col(e, "window_start") {
                *e = start.clone();
            } else if is_window_col(e, "window_end") {
                *e = end.clone();
            }
            ControlFlow::<()>::Continue(())
        });
        return Ok(());
    }
    if kind != "TUMBLE" {
        return Err(crate::error::Error::Unsupported {
            message: format!(
                "{kind} windows are computed over groups; {kind} is supported only with GROUP \
                 BY window_start, window_end"
            ),
            hint: Some("Group by window_start, window_end, or use TUMBLE.".into()),
        });
    }
    let derived = format!(
        "SELECT * FROM (SELECT *, get_field({call}, 'start') AS window_start, \
         get_field({call}, 'end') AS window_end FROM {stream}) AS {}",
        alias.name
    );
    let Statement::Query(dq) = Parser::parse_sql(&PostgreSqlDialect {}, &derived)?.remove(0) else {
        return Err(crate::error::Error::Internal(
            "derived table did not parse".into(),
        ));
    };
    let SetExpr::Select(ds) = *dq.body else {
        return Err(crate::error::Error::Internal(
            "derived table is not a select".into(),
        ));
    };
    let mut derived_from = ds.from;
    from.relation = derived_from.remove(0).relation;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_valued_windows_become_spark_windows() {
        let q = super::expand_window_refs(
            "SELECT window_start, window_end, page, count(*) AS n \
             FROM TUMBLE(clicks, event_time, INTERVAL '5 minutes') \
             GROUP BY window_start, window_end, page",
        )
        .unwrap();
        assert_eq!(
            q,
            "SELECT get_field(window(event_time, INTERVAL '5 minutes'), 'start') AS window_start, \
             get_field(window(event_time, INTERVAL '5 minutes'), 'end') AS window_end, page, \
             count(*) AS n FROM clicks AS clicks \
             GROUP BY window(event_time, INTERVAL '5 minutes'), page"
        );
        let q = super::expand_window_refs(
            "SELECT window_start, count(*) FROM HOP(clicks, event_time, INTERVAL '1 minute', \
             INTERVAL '5 minutes') AS h GROUP BY window_start, window_end",
        )
        .unwrap();
        assert!(
            q.contains("GROUP BY window(event_time, INTERVAL '5 minutes', INTERVAL '1 minute')"),
            "{q}"
        );
        let q = super::expand_window_refs(
            "SELECT page, window_start FROM TUMBLE(clicks, event_time, '5 minutes')",
        )
        .unwrap();
        assert!(q.contains("FROM (SELECT *, get_field(window(event_time, '5 minutes'), 'start') AS window_start"), "{q}");
        assert!(
            super::expand_window_refs("SELECT * FROM SESSION(clicks, t, '5 minutes')").is_err()
        );
    }

    #[test]
    fn subqueries_name_their_columns_as_spark_does() {
        let q = super::expand_window_refs(
            "SELECT word, window.start AS start, window_time(window) AS wt, cnt FROM \
             (SELECT word, window, count(*) AS cnt FROM events GROUP BY word, window(ts, '5 minutes'))",
        )
        .unwrap();
        assert_eq!(
            q,
            "SELECT word, get_field(\"window\", 'start') AS start, window_time(window) AS wt, cnt \
             FROM (SELECT word, window(ts, '5 minutes') AS window, count(*) AS cnt FROM events \
             GROUP BY word, window(ts, '5 minutes'))"
        );
        let q = super::expand_window_refs(
            "SELECT word, \"count(1)\", \"sum(n)\" FROM (SELECT word, COUNT(*), sum(e.n) FROM events AS e GROUP BY word)",
        )
        .unwrap();
        assert!(
            q.contains("COUNT(*) AS \"count(1)\", sum(e.n) AS \"sum(n)\""),
            "{q}"
        );
        // The outermost query keeps its names; a table named window keeps its columns.
        let q = "SELECT count(*) FROM events";
        assert_eq!(super::expand_window_refs(q).unwrap(), q);
        let q = "SELECT window.start FROM t AS window";
        assert_eq!(super::expand_window_refs(q).unwrap(), q);
    }

    #[test]
    fn window_references_become_fields_of_the_group_by_window() {
        let q = super::expand_window_refs(
            "SELECT window.start AS ws, window.end, page, count(*) FROM clicks \
             GROUP BY window(event_time, '5 minutes'), page HAVING max(window.start) > 0",
        )
        .unwrap();
        assert_eq!(
            q,
            "SELECT get_field(window(event_time, '5 minutes'), 'start') AS ws, \
             get_field(window(event_time, '5 minutes'), 'end') AS end, page, count(*) \
             FROM clicks GROUP BY window(event_time, '5 minutes'), page \
             HAVING max(get_field(window(event_time, '5 minutes'), 'start')) > 0"
        );
        let plain = "SELECT a FROM t GROUP BY a";
        assert_eq!(super::expand_window_refs(plain).unwrap(), plain);
    }

    use super::*;

    #[test]
    fn split_classifies_and_keeps_original_text() {
        let pieces = split(
            "CREATE STREAM s (a INT) WITH (path = '/x;y', format = 'json');\n\
             select 1 ;  ; SHOW streams; -- trailing comment",
        );
        assert_eq!(
            pieces,
            vec![
                Piece::Tidemark(
                    "CREATE STREAM s (a INT) WITH (path = '/x;y', format = 'json')".into()
                ),
                Piece::Other("select 1".into()),
                Piece::Tidemark("SHOW streams".into()),
            ]
        );
    }

    #[test]
    fn settings_are_shown_by_tidemark_and_datafusion_keeps_its_own_shows() {
        let ours = |sql: &str| matches!(split(sql).as_slice(), [Piece::Tidemark(_)]);
        assert!(ours("SHOW search_path"));
        assert!(ours("show TIME ZONE"));
        assert!(ours("SHOW"));
        assert!(ours("SHOW \\ ]"));
        assert!(ours("DISCARD ALL"));
        assert!(!ours("SHOW datafusion.execution.batch_size"));
        assert!(!ours("SHOW TABLES"));
        assert!(!ours("SHOW COLUMNS FROM t"));
    }

    #[test]
    fn split_handles_multibyte_text() {
        let pieces = split("SELECT 'é;ü' AS x; SHOW SINKS");
        assert_eq!(
            pieces,
            vec![
                Piece::Other("SELECT 'é;ü' AS x".into()),
                Piece::Tidemark("SHOW SINKS".into())
            ]
        );
    }

    #[test]
    fn split_passes_untokenizable_text_whole() {
        let pieces = split("SELECT 'unterminated");
        assert_eq!(pieces, vec![Piece::Other("SELECT 'unterminated".into())]);
    }
}
