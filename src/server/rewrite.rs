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
use std::sync::LazyLock;

use datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken;
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, CaseWhen, Expr, Query, SelectItem, SetExpr, TableFactor, Value, VisitMut,
    VisitorMut, visit_expressions, visit_relations,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// What a statement's rewrite needs to know of its session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionFacts {
    /// The database the client connected to (Tidemark answers to any name).
    pub database: String,
    /// The backend's process id, as its `BackendKeyData` gave it.
    pub pid: i32,
    /// The user the client logged in as.
    pub user: String,
}

/// `sql` rewritten for DataFusion and for this session, if it is one statement that needs
/// it (`None` otherwise, and for text that does not parse):
/// - `current_database()` and `current_catalog` are the connected database's name,
///   `current_user`, `session_user` and `current_role` the user logged in, and
///   `pg_backend_pid()` the connection's pid: the session's engine is shared by every
///   connection, so these are filled in per statement; `pg_cancel_backend(pid)` and
///   `pg_terminate_backend(pid)` get the user as a second argument, whose rights they check;
///   `pg_notify(channel, payload)` gets the pid as a third, the notification's sender;
/// - `'pg_class'::regclass` (and the other system catalogs) is the catalog's oid in
///   Postgres, the `classoid` of `pg_description`'s and `pg_depend`'s rows;
/// - `x::regtype::text` is `format_type(x, NULL)`, the type's name (`integer`), as
///   Postgres's `regtype` output is (pgcli's column types), and `x::regtype[]` of a list of
///   oids is `regtype_names(x)`, their names;
/// - Grafana's search-path membership subquery (a function in `FROM` DataFusion cannot
///   plan, `string_to_array(...) s`) is `SELECT unnest(current_schemas(false))`, which
///   lists the same schemas;
/// - in a query that reads `pg_catalog`, a select-list `CASE` of correlated subqueries is
///   NULL (see the module's documentation).
pub fn rewrite_client_query(sql: &str, session: &SessionFacts) -> Option<String> {
    let lower = sql.to_ascii_lowercase();
    let catalog_case =
        lower.contains("pg_") && lower.contains("case") && lower.matches("select").count() > 1;
    let per_session = [
        "current_database",
        "current_catalog",
        "current_user",
        "session_user",
        "current_role",
        "pg_backend_pid",
        "_backend",
        "acl,",
        "regclass",
        "regtype",
        "regproc",
        "search_path",
        "format",
        "pg_user",
        "pg_stat_activity",
        "indkey",
        "pg_notify",
    ]
    .iter()
    .any(|w| lower.contains(w));
    let catalog_subqueries = (lower.contains("pg_") || lower.contains("information_schema"))
        && lower.matches("select").count() > 1;
    let query = {
        let t = lower.trim_start();
        t.starts_with("with")
            || t.starts_with('(')
            || (t.starts_with("select") && !names_columns_only(t))
    };
    let regproc_join =
        lower.contains("pg_proc") && REGPROC_COLUMNS.iter().any(|c| lower.contains(c));
    let database_names = may_name_a_database(&lower);
    if !(catalog_case
        || per_session
        || catalog_subqueries
        || query
        || regproc_join
        || database_names)
    {
        return None;
    }
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let [stmt] = statements.as_mut_slice() else {
        return None;
    };
    if let Some(set) = set_as_text(stmt) {
        return Some(set);
    }
    if lower.contains("_pg_expandarray(i.indkey)") && lower.contains("indisprimary") {
        return pgjdbc_primary_keys(stmt);
    }
    let before = unnamed_items(stmt);
    let mut changed = false;
    let dropped_database = database_names && drop_database_names(stmt);
    changed |= dropped_database;
    if per_session {
        let mut session = SessionRewrite {
            session,
            changed: false,
        };
        let _ = stmt.visit(&mut session);
        changed |= session.changed;
    }
    if catalog_case && let Some(text) = rewrite_catalog_case(stmt) {
        changed = true;
        // Reparsed: the text the CASE rewrite printed is what the next passes read.
        let mut again = Parser::parse_sql(&PostgreSqlDialect {}, &text).ok()?;
        let [s] = again.as_mut_slice() else {
            return Some(text);
        };
        *stmt = s.clone();
    }
    if catalog_subqueries && reads_catalog(stmt) {
        let mut arrays = ArraySubqueries { changed: false };
        let _ = stmt.visit(&mut arrays);
        changed |= arrays.changed;
        let mut aggregate = AggregateCorrelatedSubqueries { changed: false };
        let _ = stmt.visit(&mut aggregate);
        changed |= aggregate.changed;
    }
    if regproc_join && reads_catalog(stmt) {
        let mut regproc = RegprocJoins { changed: false };
        let _ = stmt.visit(&mut regproc);
        changed |= regproc.changed;
    }
    if changed {
        keep_names(stmt, before);
    }
    changed |= name_output_columns(stmt);
    // Grafana's search-path query is one datafusion-postgres replaces (with no rows);
    // Tidemark answers it.
    let search_path = lower.contains("current_setting('search_path')");
    if !changed || (!search_path && !dropped_database && replaced_by_datafusion_postgres(sql)) {
        return None;
    }
    Some(stmt.to_string())
}

/// The schemas a `database.schema.name` can name here.
const SCHEMAS: [&str; 3] = ["public", "information_schema", "pg_catalog"];

/// Whether `lower` may hold `database.schema.name` (dbt writes every name so): the cheap
/// test before a parse.
fn may_name_a_database(lower: &str) -> bool {
    SCHEMAS
        .iter()
        .any(|s| lower.contains(&format!("\".\"{s}\".")) || lower.contains(&format!(".{s}.")))
}

/// `database.schema.name` as `schema.name`: Tidemark has one database and answers to any
/// name (as `current_database()` does), and DataFusion resolves two-part names only.
fn drop_database_names(stmt: &mut datafusion::sql::sqlparser::ast::Statement) -> bool {
    let mut changed = false;
    let _ = datafusion::sql::sqlparser::ast::visit_relations_mut(stmt, |name| {
        let schema = name.0.get(1).and_then(|p| p.as_ident()).map(|i| {
            if i.quote_style.is_some() {
                i.value.clone()
            } else {
                i.value.to_ascii_lowercase()
            }
        });
        if name.0.len() == 3 && schema.is_some_and(|s| SCHEMAS.contains(&s.as_str())) {
            name.0.remove(0);
            changed = true;
        }
        ControlFlow::<()>::Continue(())
    });
    changed
}

/// Whether `select` (lower case) lists plain columns only (`SELECT a, t.b, "C", * FROM`),
/// whose names need no rewrite: the cheap test that keeps a dashboard's queries from being
/// parsed twice.
fn names_columns_only(select: &str) -> bool {
    let list = select.trim_start_matches("select");
    let list = match list.find(" from ") {
        Some(end) => &list[..end],
        None => list,
    };
    list.chars().all(|c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ',' | '"' | '*' | ' ' | '\n' | '\t')
    }) && !list
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .any(|w| {
            w.chars().next().is_some_and(|c| c.is_ascii_digit())
                || w.starts_with("current_")
                || matches!(
                    w,
                    "case"
                        | "cast"
                        | "interval"
                        | "true"
                        | "false"
                        | "null"
                        | "not"
                        | "exists"
                        | "user"
                        | "session_user"
                        | "localtime"
                        | "localtimestamp"
                )
        })
}

/// The unnamed select-list items of every query of `stmt`, in visiting order.
fn unnamed_items(stmt: &mut datafusion::sql::sqlparser::ast::Statement) -> Vec<Vec<Option<Expr>>> {
    struct Collect(Vec<Vec<Option<Expr>>>);
    impl VisitorMut for Collect {
        type Break = ();
        fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
            self.0.push(match query.body.as_ref() {
                SetExpr::Select(select) => select
                    .projection
                    .iter()
                    .map(|item| match item {
                        SelectItem::UnnamedExpr(e) => Some(e.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            });
            ControlFlow::Continue(())
        }
    }
    let mut c = Collect(Vec::new());
    let _ = stmt.visit(&mut c);
    c.0
}

/// Gives each select-list item a rewrite changed the name Postgres gives the original
/// (`SELECT current_database()` answers a column `current_database`), unless another
/// item has that name. `before` is [`unnamed_items`] of the statement before the
/// rewrites; nothing is named if the rewrites changed how many queries there are.
fn keep_names(
    stmt: &mut datafusion::sql::sqlparser::ast::Statement,
    before: Vec<Vec<Option<Expr>>>,
) {
    struct Name {
        before: Vec<Vec<Option<Expr>>>,
        next: usize,
    }
    impl VisitorMut for Name {
        type Break = ();
        fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
            let originals = self.before.get(self.next).cloned().unwrap_or_default();
            self.next += 1;
            let SetExpr::Select(select) = query.body.as_mut() else {
                return ControlFlow::Continue(());
            };
            alias_unique(select, |i, e| match originals.get(i) {
                Some(Some(original)) if original != e => Some(postgres_name(original)),
                _ => None,
            });
            ControlFlow::Continue(())
        }
    }
    if unnamed_items(stmt).len() != before.len() {
        return;
    }
    let _ = stmt.visit(&mut Name { before, next: 0 });
}

/// Whether datafusion-postgres answers `sql` with a whole-query replacement of its own
/// (its list of client queries DataFusion cannot run, psql's `\d` among them), which
/// matches the client's text: a rewrite here would stop the match.
fn replaced_by_datafusion_postgres(sql: &str) -> bool {
    use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
    static PARSER: LazyLock<PostgresCompatibilityParser> =
        LazyLock::new(PostgresCompatibilityParser::new);
    match (
        PARSER.parse(sql),
        Parser::parse_sql(&PostgreSqlDialect {}, sql),
    ) {
        (Ok(theirs), Ok(plain)) => {
            theirs
                != plain
                    .into_iter()
                    .map(|s| PARSER.rewrite(s))
                    .collect::<Vec<_>>()
        }
        _ => false,
    }
}

/// Names the unnamed columns of a query's result as Postgres names them
/// (`FigureColname`): `SELECT count(*)` answers a column `count`, `SELECT 1` one named
/// `?column?`, `SELECT x::text` one named `x` (DataFusion would say `count(*)`, `Int64(1)`
/// and `x`). A plain column reference keeps its name; an item whose name another item of
/// the list has too keeps DataFusion's (which refuses two columns of one name). Of a
/// `UNION`, the first select names the result, as in Postgres. Whether anything changed.
fn name_output_columns(stmt: &mut datafusion::sql::sqlparser::ast::Statement) -> bool {
    fn name_set_expr(body: &mut SetExpr) -> bool {
        match body {
            SetExpr::Select(select) => alias_unique(select, |_, e| {
                (!matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)))
                    .then(|| postgres_name(e))
            }),
            SetExpr::SetOperation { left, .. } => name_set_expr(left),
            SetExpr::Query(q) => name_set_expr(q.body.as_mut()),
            _ => false,
        }
    }
    match stmt {
        datafusion::sql::sqlparser::ast::Statement::Query(q) => name_set_expr(q.body.as_mut()),
        _ => false,
    }
}

/// The name Postgres gives an unaliased select-list expression: [`figure_colname`]'s, or
/// `?column?`.
fn postgres_name(e: &Expr) -> String {
    figure_colname(e).map_or_else(|| "?column?".to_string(), |n| n.0)
}

/// Aliases each unnamed item of `select` that `name_for(position, expr)` names, unless
/// another item of the list has that name too (DataFusion refuses two result columns of
/// one name). Whether any item was aliased.
fn alias_unique(
    select: &mut datafusion::sql::sqlparser::ast::Select,
    name_for: impl Fn(usize, &Expr) -> Option<String>,
) -> bool {
    let names: Vec<Option<String>> = select
        .projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) => Some(postgres_name(e)),
            SelectItem::ExprWithAlias { alias, .. } => Some(alias.value.clone()),
            _ => None,
        })
        .collect();
    let mut changed = false;
    for (i, item) in select.projection.iter_mut().enumerate() {
        let SelectItem::UnnamedExpr(e) = item else {
            continue;
        };
        let Some(name) = name_for(i, e) else {
            continue;
        };
        let unique = names
            .iter()
            .enumerate()
            .all(|(j, n)| j == i || n.as_deref() != Some(name.as_str()));
        if unique {
            *item = SelectItem::ExprWithAlias {
                expr: e.clone(),
                alias: datafusion::sql::sqlparser::ast::Ident::with_quote('"', name),
            };
            changed = true;
        }
    }
    changed
}

/// Whether `stmt` reads `pg_catalog` or `information_schema`.
fn reads_catalog(stmt: &datafusion::sql::sqlparser::ast::Statement) -> bool {
    let mut reads = false;
    let _ = visit_relations(stmt, |name| {
        let text = name.to_string().to_ascii_lowercase();
        if text.starts_with("pg_") || text.contains("information_schema.") {
            reads = true;
            return ControlFlow::Break(());
        }
        ControlFlow::<()>::Continue(())
    });
    reads
}

/// In a query that reads the catalogs, a correlated scalar subquery that is not
/// aggregated (`(SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid)`: pgcli's data
/// types, Npgsql's type loading, SQLAlchemy's columns) becomes `((SELECT max(...) ...))`.
/// DataFusion refuses the first form ("must be aggregated to return at most one row") and
/// plans the second as a join; the catalog keys such lookups use match one row at most,
/// which `max` returns unchanged. The extra parentheses keep datafusion-postgres from
/// replacing the subquery with NULL (its rule for select-list subqueries).
struct AggregateCorrelatedSubqueries {
    changed: bool,
}

const AGGREGATES: [&str; 11] = [
    "max",
    "min",
    "count",
    "sum",
    "avg",
    "array_agg",
    "string_agg",
    "bool_and",
    "bool_or",
    "json_agg",
    "every",
];

impl VisitorMut for AggregateCorrelatedSubqueries {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::Subquery(query) = expr else {
            return ControlFlow::Continue(());
        };
        if !is_correlated(query) || !correlated_by_equalities(query) {
            return ControlFlow::Continue(());
        }
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        let grouped = !matches!(
            &select.group_by,
            datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(e, _) if e.is_empty()
        );
        if grouped || select.having.is_some() || query.order_by.is_some() {
            return ControlFlow::Continue(());
        }
        let [item] = select.projection.as_mut_slice() else {
            return ControlFlow::Continue(());
        };
        let (SelectItem::UnnamedExpr(value) | SelectItem::ExprWithAlias { expr: value, .. }) = item
        else {
            return ControlFlow::Continue(());
        };
        if let Expr::Function(f) = value
            && AGGREGATES.contains(&function_name(f).as_str())
        {
            return ControlFlow::Continue(());
        }
        let wrapped = format!("max({value})");
        let Ok(call) = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&wrapped)
            .and_then(|mut p| p.parse_expr())
        else {
            return ControlFlow::Continue(());
        };
        *value = call;
        // `LIMIT 1` was the client's way of saying "one row"; max says it now.
        query.limit_clause = None;
        *expr = Expr::Nested(Box::new(expr.clone()));
        self.changed = true;
        ControlFlow::Continue(())
    }
}

/// `ARRAY(SELECT x FROM ... WHERE <correlated by equalities>)` in a catalog query (psql's
/// `\du`) as `coalesce((SELECT array_agg(x) FROM ... WHERE ...), make_array())`, which
/// DataFusion decorrelates into a join (`{}` when nothing matches, as in Postgres). An `ARRAY` over a set
/// function of an outer column (`unnest(tc.reloptions)` in psql's `\d+`), which DataFusion
/// cannot plan, is a NULL text array: Tidemark's relations have no options, and
/// `pg_class.reloptions` (which datafusion-postgres's `pg_class` lacks) is NULL too.
struct ArraySubqueries {
    changed: bool,
}

impl VisitorMut for ArraySubqueries {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::FunctionArguments;
        if let Expr::CompoundIdentifier(parts) = expr
            && parts
                .last()
                .is_some_and(|p| p.value.eq_ignore_ascii_case("reloptions"))
            && let Ok(null) = Parser::new(&PostgreSqlDialect {})
                .try_with_sql("CAST(NULL AS TEXT[])")
                .and_then(|mut p| p.parse_expr())
        {
            *expr = null;
            self.changed = true;
            return ControlFlow::Continue(());
        }
        let Expr::Function(f) = expr else {
            return ControlFlow::Continue(());
        };
        let FunctionArguments::Subquery(query) = &f.args else {
            return ControlFlow::Continue(());
        };
        if function_name(f) != "array" {
            return ControlFlow::Continue(());
        }
        let SetExpr::Select(select) = query.body.as_ref() else {
            return ControlFlow::Continue(());
        };
        let over_a_function = select.from.iter().any(|t| {
            matches!(
                t.relation,
                TableFactor::Table { args: Some(_), .. }
                    | TableFactor::Function { .. }
                    | TableFactor::UNNEST { .. }
            )
        });
        let replacement = if over_a_function {
            "CAST(NULL AS TEXT[])".to_string()
        } else {
            let [item] = select.projection.as_slice() else {
                return ControlFlow::Continue(());
            };
            let (SelectItem::UnnamedExpr(value) | SelectItem::ExprWithAlias { expr: value, .. }) =
                item
            else {
                return ControlFlow::Continue(());
            };
            if !is_correlated(query) || !correlated_by_equalities(query) || query.order_by.is_some()
            {
                return ControlFlow::Continue(());
            }
            let mut aggregated = query.as_ref().clone();
            if let SetExpr::Select(s) = aggregated.body.as_mut() {
                s.projection = vec![SelectItem::UnnamedExpr(Expr::Identifier(
                    datafusion::sql::sqlparser::ast::Ident::new("__array_item"),
                ))];
            }
            let text =
                aggregated
                    .to_string()
                    .replacen("__array_item", &format!("array_agg({value})"), 1);
            // An empty result is `{}`, as Postgres's ARRAY() gives (array_agg's is NULL).
            format!("coalesce(({text}), make_array())")
        };
        if let Ok(parsed) = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&replacement)
            .and_then(|mut p| p.parse_expr())
        {
            *expr = parsed;
            self.changed = true;
        }
        ControlFlow::Continue(())
    }
}

/// `pg_type`'s function columns (`typreceive`, `typinput`, ...) are `regproc` in Postgres,
/// which compares with `pg_proc.oid` and prints as the function's name;
/// datafusion-postgres keeps the name as text. So `p.oid = t.typreceive` (Npgsql's type
/// load joins so) compares names: `p.proname = t.typreceive`.
struct RegprocJoins {
    changed: bool,
}

const REGPROC_COLUMNS: &[&str] = &[
    "typinput",
    "typoutput",
    "typreceive",
    "typsend",
    "typmodin",
    "typmodout",
    "typanalyze",
];

impl VisitorMut for RegprocJoins {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::BinaryOperator;
        let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = expr
        else {
            return ControlFlow::Continue(());
        };
        let last = |e: &Expr| match e {
            Expr::CompoundIdentifier(parts) => parts.last().map(|p| p.value.to_ascii_lowercase()),
            Expr::Identifier(ident) => Some(ident.value.to_ascii_lowercase()),
            _ => None,
        };
        let is_regproc = |e: &Expr| last(e).is_some_and(|n| REGPROC_COLUMNS.contains(&n.as_str()));
        let oid_side = if is_regproc(right) && last(left).as_deref() == Some("oid") {
            left
        } else if is_regproc(left) && last(right).as_deref() == Some("oid") {
            right
        } else {
            return ControlFlow::Continue(());
        };
        match oid_side.as_mut() {
            Expr::CompoundIdentifier(parts) => {
                if let Some(p) = parts.last_mut() {
                    *p = datafusion::sql::sqlparser::ast::Ident::new("proname");
                }
            }
            Expr::Identifier(ident) => {
                *ident = datafusion::sql::sqlparser::ast::Ident::new("proname")
            }
            _ => {}
        }
        self.changed = true;
        ControlFlow::Continue(())
    }
}

/// `unnest(x.indkey)` as `unnest(CAST(string_to_array(x.indkey, ' ') AS SMALLINT[]))`, and
/// `generate_subscripts(x.indkey, 1)` as the positions alongside it: `pg_index`'s
/// `int2vector` and `oidvector` columns (`indkey`, `indoption`, `indclass`,
/// `indcollation`) are kept by datafusion-postgres as their text (`1 2`).
fn indkey_call(f: &datafusion::sql::sqlparser::ast::Function) -> Option<Expr> {
    use datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments};
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(column))) = list.args.first() else {
        return None;
    };
    let name = match column {
        Expr::Identifier(i) => i.value.to_ascii_lowercase(),
        Expr::CompoundIdentifier(parts) => parts.last()?.value.to_ascii_lowercase(),
        _ => return None,
    };
    // int2vector and oidvector columns, and their elements' type.
    let element = match name.as_str() {
        "indkey" | "indoption" => "SMALLINT",
        "indclass" | "indcollation" => "INT",
        _ => return None,
    };
    let array = format!("string_to_array({column}, ' ')");
    let call = if function_name(f) == "unnest" {
        format!("unnest(CAST({array} AS {element}[]))")
    } else {
        // The dimension stays (a client's parameter, `$1`, must keep its place).
        let dimension = match list.args.get(1) {
            Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(d))) => d.to_string(),
            _ => "1".to_string(),
        };
        format!("unnest(range(1, CAST(array_length({array}, {dimension}) AS BIGINT) + 1))")
    };
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&call)
        .and_then(|mut p| p.parse_expr())
        .ok()
}

/// pgjdbc's `DatabaseMetaData.getPrimaryKeys` query (`(information_schema._pg_expandarray(
/// i.indkey)).n` over `pg_index`: a composite field of a set-returning function, which
/// DataFusion cannot plan), as the same question put to `key_column_usage`: the schema
/// and table it names, its columns and order.
fn pgjdbc_primary_keys(stmt: &datafusion::sql::sqlparser::ast::Statement) -> Option<String> {
    let mut schema = None;
    let mut table = None;
    let _ = visit_expressions(stmt, |e| {
        if let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = e
            && let Expr::CompoundIdentifier(parts) = left.as_ref()
            && let [alias, column] = parts.as_slice()
            && let Expr::Value(v) = right.as_ref()
            && let Value::SingleQuotedString(text) | Value::EscapedStringLiteral(text) = &v.value
        {
            match (alias.value.as_str(), column.value.as_str()) {
                ("n", "nspname") => schema = Some(text.clone()),
                ("ct", "relname") => table = Some(text.clone()),
                _ => {}
            }
        }
        ControlFlow::<()>::Continue(())
    });
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let mut sql =
        "SELECT NULL AS table_cat, table_schema AS table_schem, table_name, column_name, \
                   ordinal_position AS key_seq, constraint_name AS pk_name \
                   FROM information_schema.key_column_usage WHERE true"
            .to_string();
    if let Some(s) = schema {
        sql.push_str(&format!(" AND table_schema = {}", quote(&s)));
    }
    if let Some(t) = table {
        sql.push_str(&format!(" AND table_name = {}", quote(&t)));
    }
    sql.push_str(" ORDER BY table_name, pk_name, key_seq");
    Some(sql)
}

/// The columns of `pg_type` that hold a function, which datafusion-postgres keeps as the
/// function's name: `typinput = 'array_in'::regproc` (pgjdbc's and DBeaver's array test)
/// compares names.
const REGPROC_NAME_COLUMNS: [&str; 8] = [
    "typinput",
    "typoutput",
    "typreceive",
    "typsend",
    "typmodin",
    "typmodout",
    "typanalyze",
    "typsubscript",
];

/// `'name'::regproc` as the name, when `other` is one of [`REGPROC_NAME_COLUMNS`].
fn regproc_as_name(other: &Expr, cast: &Expr) -> Option<Expr> {
    let column = match other {
        Expr::Identifier(i) => &i.value,
        Expr::CompoundIdentifier(parts) => &parts.last()?.value,
        _ => return None,
    };
    if !REGPROC_NAME_COLUMNS.contains(&column.to_ascii_lowercase().as_str()) {
        return None;
    }
    let Expr::Cast {
        expr, data_type, ..
    } = cast
    else {
        return None;
    };
    if !type_name_is(data_type, &["regproc"]) {
        return None;
    }
    let Expr::Value(v) = expr.as_ref() else {
        return None;
    };
    let Value::SingleQuotedString(name) = &v.value else {
        return None;
    };
    let name = name.strip_prefix("pg_catalog.").unwrap_or(name);
    Some(Expr::Value(
        Value::SingleQuotedString(name.to_string()).into(),
    ))
}

/// Postgres's oids of the system catalogs clients name in `'...'::regclass`.
const SYSTEM_CATALOG_OIDS: &[(&str, i32)] = &[
    ("pg_aggregate", 2600),
    ("pg_am", 2601),
    ("pg_attrdef", 2604),
    ("pg_attribute", 1249),
    ("pg_authid", 1260),
    ("pg_cast", 2605),
    ("pg_class", 1259),
    ("pg_collation", 3456),
    ("pg_constraint", 2606),
    ("pg_database", 1262),
    ("pg_depend", 2608),
    ("pg_description", 2609),
    ("pg_enum", 3501),
    ("pg_extension", 3079),
    ("pg_index", 2610),
    ("pg_inherits", 2611),
    ("pg_language", 2612),
    ("pg_namespace", 2615),
    ("pg_opclass", 2616),
    ("pg_operator", 2617),
    ("pg_proc", 1255),
    ("pg_range", 3541),
    ("pg_rewrite", 2618),
    ("pg_sequence", 2224),
    ("pg_tablespace", 1213),
    ("pg_trigger", 2620),
    ("pg_type", 1247),
];

/// The Postgres oid of a system catalog named as `regclass` input (`pg_class`,
/// `pg_catalog.pg_class`).
pub fn system_catalog_oid(name: &str) -> Option<i32> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name);
    SYSTEM_CATALOG_OIDS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, oid)| *oid)
}

struct SessionRewrite<'a> {
    session: &'a SessionFacts,
    changed: bool,
}

fn type_name_is(t: &datafusion::sql::sqlparser::ast::DataType, names: &[&str]) -> bool {
    let text = t.to_string().to_ascii_lowercase();
    let text = text.strip_prefix("pg_catalog.").unwrap_or(&text);
    names.contains(&text)
}

fn function_name(f: &datafusion::sql::sqlparser::ast::Function) -> String {
    let text = f.name.to_string().to_ascii_lowercase();
    text.strip_prefix("pg_catalog.")
        .unwrap_or(&text)
        .to_string()
}

/// Whether `f`'s first argument is a catalog's access-privilege column (`relacl`, ...).
fn first_argument_is_acl(f: &datafusion::sql::sqlparser::ast::Function) -> bool {
    use datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments};
    const ACLS: &[&str] = &[
        "relacl",
        "nspacl",
        "datacl",
        "attacl",
        "proacl",
        "typacl",
        "lanacl",
        "spcacl",
        "fdwacl",
        "srvacl",
        "defaclacl",
    ];
    let FunctionArguments::List(list) = &f.args else {
        return false;
    };
    let name = match list.args.first() {
        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::CompoundIdentifier(parts)))) => {
            parts.last().map(|p| p.value.to_ascii_lowercase())
        }
        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(i)))) => {
            Some(i.value.to_ascii_lowercase())
        }
        _ => None,
    };
    name.is_some_and(|n| ACLS.contains(&n.as_str()))
}

fn has_no_arguments(f: &datafusion::sql::sqlparser::ast::Function) -> bool {
    use datafusion::sql::sqlparser::ast::FunctionArguments;
    match &f.args {
        FunctionArguments::None => true,
        FunctionArguments::List(l) => l.args.is_empty(),
        FunctionArguments::Subquery(_) => false,
    }
}

impl VisitorMut for SessionRewrite<'_> {
    type Break = ();

    /// `pg_user` and `pg_stat_activity` unqualified are `pg_catalog`'s, as Postgres's
    /// search path finds them (datafusion-postgres qualifies only the tables it makes).
    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::{Ident, ObjectName, ObjectNamePart};
        if let TableFactor::Table {
            name, args: None, ..
        } = factor
            && let [ObjectNamePart::Identifier(ident)] = name.0.as_slice()
            && ident.quote_style.is_none()
            && ["pg_user", "pg_stat_activity"]
                .iter()
                .any(|t| ident.value.eq_ignore_ascii_case(t))
        {
            let table = ident.clone();
            *name = ObjectName(vec![
                ObjectNamePart::Identifier(Ident::new("pg_catalog")),
                ObjectNamePart::Identifier(table),
            ]);
            self.changed = true;
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if is_search_path_membership(query) {
            let replacement = Parser::parse_sql(
                &PostgreSqlDialect {},
                "SELECT unnest(current_schemas(false))",
            );
            if let Ok(mut stmts) = replacement
                && let Some(datafusion::sql::sqlparser::ast::Statement::Query(q)) = stmts.pop()
            {
                *query = *q;
                self.changed = true;
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let text = |s: &str| Expr::Value(Value::SingleQuotedString(s.to_string()).into());
        let number = |n: i32| Expr::Value(Value::Number(n.to_string(), false).into());
        let replacement = match expr {
            Expr::Function(f) if has_no_arguments(f) => match function_name(f).as_str() {
                "current_database" | "current_catalog" => Some(text(&self.session.database)),
                "current_user" | "session_user" | "current_role" => Some(text(&self.session.user)),
                // An integer, as in Postgres (a bare literal would be a bigint here).
                "pg_backend_pid" => Some(Expr::Cast {
                    kind: datafusion::sql::sqlparser::ast::CastKind::Cast,
                    expr: Box::new(number(self.session.pid)),
                    data_type: datafusion::sql::sqlparser::ast::DataType::Integer(None),
                    array: false,
                    format: None,
                }),
                _ => None,
            },
            // An access-privilege list printed (psql's `\dn+`, `\l+`, `\dp`): none here,
            // which Postgres prints as NULL (default privileges); datafusion-postgres's
            // columns are text, which `array_to_string` refuses.
            Expr::Function(f)
                if function_name(f) == "array_to_string" && first_argument_is_acl(f) =>
            {
                Parser::new(&PostgreSqlDialect {})
                    .try_with_sql("CAST(NULL AS TEXT)")
                    .and_then(|mut p| p.parse_expr())
                    .ok()
            }
            Expr::Function(f)
                if matches!(
                    function_name(f).as_str(),
                    "pg_cancel_backend" | "pg_terminate_backend"
                ) =>
            {
                use datafusion::sql::sqlparser::ast::{
                    FunctionArg, FunctionArgExpr, FunctionArguments,
                };
                match &mut f.args {
                    FunctionArguments::List(list) if list.args.len() == 1 => {
                        list.args
                            .push(FunctionArg::Unnamed(FunctionArgExpr::Expr(text(
                                &self.session.user,
                            ))));
                        self.changed = true;
                    }
                    _ => {}
                }
                None
            }
            // `pg_notify(channel, payload)` notifies from the caller's pid.
            Expr::Function(f) if function_name(f) == "pg_notify" => {
                use datafusion::sql::sqlparser::ast::{
                    FunctionArg, FunctionArgExpr, FunctionArguments,
                };
                if let FunctionArguments::List(list) = &mut f.args
                    && list.args.len() == 2
                {
                    list.args
                        .push(FunctionArg::Unnamed(FunctionArgExpr::Expr(number(
                            self.session.pid,
                        ))));
                    self.changed = true;
                }
                None
            }
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } if type_name_is(data_type, &["regclass"]) => match inner.as_ref() {
                Expr::Value(v) if !matches!(v.value, Value::Placeholder(_)) => match &v.value {
                    Value::SingleQuotedString(name) => system_catalog_oid(name).map(number),
                    _ => None,
                },
                // Text computed per row (Metabase's `format('%I.%I', ...)::regclass`), or
                // sent as a parameter (SQLAlchemy's `CAST(%(param)s AS REGCLASS)`), which
                // datafusion-postgres would cast as an integer.
                e if is_text_expression(e)
                    || matches!(e, Expr::Value(v) if matches!(v.value, Value::Placeholder(_))) =>
                {
                    Some(Expr::Function(datafusion::sql::sqlparser::ast::Function {
                        name: datafusion::sql::sqlparser::ast::ObjectName::from(vec![
                            datafusion::sql::sqlparser::ast::Ident::new("to_regclass"),
                        ]),
                        uses_odbc_syntax: false,
                        parameters: datafusion::sql::sqlparser::ast::FunctionArguments::None,
                        args: datafusion::sql::sqlparser::ast::FunctionArguments::List(
                            datafusion::sql::sqlparser::ast::FunctionArgumentList {
                                duplicate_treatment: None,
                                args: vec![datafusion::sql::sqlparser::ast::FunctionArg::Unnamed(
                                    datafusion::sql::sqlparser::ast::FunctionArgExpr::Expr(
                                        e.clone(),
                                    ),
                                )],
                                clauses: vec![],
                            },
                        ),
                        filter: None,
                        null_treatment: None,
                        over: None,
                        within_group: vec![],
                    }))
                }
                _ => None,
            },
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } if type_name_is(data_type, &["text", "varchar", "character varying", "name"]) => {
                match inner.as_ref() {
                    Expr::Cast {
                        data_type: inner_type,
                        ..
                    } if type_name_is(inner_type, &["regtype"]) => {
                        let call = format!("format_type({inner}, NULL)");
                        Parser::new(&PostgreSqlDialect {})
                            .try_with_sql(&call)
                            .and_then(|mut p| p.parse_expr())
                            .ok()
                    }
                    _ => None,
                }
            }
            // An oid list as type names (pgcli's function signatures).
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } if type_name_is(data_type, &["regtype[]"]) => Parser::new(&PostgreSqlDialect {})
                .try_with_sql(&format!("regtype_names({inner})"))
                .and_then(|mut p| p.parse_expr())
                .ok(),
            Expr::Function(f) if function_name(f) == "format" => format_call(f),
            // `pg_index.indkey` (an int2vector, text here) as the array SQLAlchemy unnests.
            Expr::Function(f)
                if matches!(function_name(f).as_str(), "unnest" | "generate_subscripts") =>
            {
                indkey_call(f)
            }
            Expr::BinaryOp {
                left,
                op: op @ (BinaryOperator::Eq | BinaryOperator::NotEq),
                right,
            } => {
                let op = op.clone();
                match (regproc_as_name(left, right), regproc_as_name(right, left)) {
                    (Some(name), _) => Some(Expr::BinaryOp {
                        left: left.clone(),
                        op,
                        right: Box::new(name),
                    }),
                    (None, Some(name)) => Some(Expr::BinaryOp {
                        left: Box::new(name),
                        op,
                        right: right.clone(),
                    }),
                    (None, None) => None,
                }
            }
            _ => None,
        };
        if let Some(r) = replacement {
            *expr = r;
            self.changed = true;
        }
        ControlFlow::Continue(())
    }
}

/// The name Postgres gives an unaliased select-list expression, and how strongly
/// (Postgres's `FigureColname`): a column or function names it (2); a cast with a weaker
/// operand or a `CASE` names it after itself (1); constants and operators do not.
fn figure_colname(e: &Expr) -> Option<(String, u8)> {
    match e {
        Expr::Identifier(i) => Some((i.value.clone(), 2)),
        Expr::CompoundIdentifier(parts) => parts.last().map(|i| (i.value.clone(), 2)),
        Expr::Function(f) => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| (i.value.to_ascii_lowercase(), 2)),
        Expr::Nested(inner) => figure_colname(inner),
        Expr::Cast {
            expr, data_type, ..
        } => match figure_colname(expr) {
            Some(strong) if strong.1 == 2 => Some(strong),
            _ => {
                let t = data_type.to_string().to_ascii_lowercase();
                let t = t.rsplit('.').next().unwrap_or(&t).to_string();
                Some((t, 1))
            }
        },
        Expr::Case { .. } => Some(("case".into(), 1)),
        Expr::Exists { .. } => Some(("exists".into(), 2)),
        Expr::Subquery(q) => match q.body.as_ref() {
            SetExpr::Select(select) => match select.projection.first()? {
                SelectItem::ExprWithAlias { alias, .. } => Some((alias.value.clone(), 2)),
                SelectItem::UnnamedExpr(e) => Some((postgres_name(e), 2)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// `format('...', args)` with a literal format string, as the concatenation it makes:
/// `%s` is the argument as text ('' for NULL), `%I` `quote_ident(...)`, `%L` a quoted
/// literal (`NULL` for NULL), `%%` a percent sign; `%n$` picks argument n. `None` for any
/// other specification (widths, flags), which is left to fail as before.
fn format_call(f: &datafusion::sql::sqlparser::ast::Function) -> Option<Expr> {
    use datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments};
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let args: Vec<&Expr> = list
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let (spec, rest) = args.split_first()?;
    let Expr::Value(v) = spec else {
        return None;
    };
    let Value::SingleQuotedString(spec) = &v.value else {
        return None;
    };
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let mut parts: Vec<String> = Vec::new();
    let mut literal = String::new();
    let mut next = 0usize;
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            literal.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let index = if digits.is_empty() {
            next
        } else {
            if chars.next() != Some('$') {
                return None;
            }
            digits.parse::<usize>().ok()?.checked_sub(1)?
        };
        let conversion = chars.next()?;
        if conversion == '%' && digits.is_empty() {
            literal.push('%');
            continue;
        }
        let arg = rest.get(index)?;
        next = index + 1;
        if !literal.is_empty() {
            parts.push(quote(&std::mem::take(&mut literal)));
        }
        parts.push(match conversion {
            's' => format!("coalesce(CAST(({arg}) AS TEXT), '')"),
            'I' => format!("quote_ident(CAST(({arg}) AS TEXT))"),
            'L' => format!(
                "CASE WHEN ({arg}) IS NULL THEN 'NULL' ELSE chr(39) || \
                 replace(CAST(({arg}) AS TEXT), chr(39), chr(39) || chr(39)) || chr(39) END"
            ),
            _ => return None,
        });
    }
    if !literal.is_empty() || parts.is_empty() {
        parts.push(quote(&literal));
    }
    let sql = format!("({})", parts.join(" || "));
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&sql)
        .and_then(|mut p| p.parse_expr())
        .ok()
}

/// Whether `e` computes text: a concatenation, a cast to text, or a text function.
fn is_text_expression(e: &Expr) -> bool {
    match e {
        Expr::Nested(inner) => is_text_expression(inner),
        Expr::BinaryOp {
            op: BinaryOperator::StringConcat,
            ..
        } => true,
        Expr::Cast { data_type, .. } => {
            type_name_is(data_type, &["text", "varchar", "character varying", "name"])
        }
        Expr::Function(f) => matches!(
            function_name(f).as_str(),
            "format" | "concat" | "concat_ws" | "quote_ident" | "lower" | "upper" | "trim"
        ),
        _ => false,
    }
}

/// `SET search_path = "public"`, `SET search_path TO a, b` (identifiers, or a list) as
/// `SET search_path = 'public'` / `'a, b'`: datafusion-postgres keeps a session setting
/// only when it is one literal, and Postgres's `SHOW` prints the list so (Superset sends
/// the quoted form). Settings other than those datafusion-postgres keeps are left alone.
fn set_as_text(stmt: &datafusion::sql::sqlparser::ast::Statement) -> Option<String> {
    use datafusion::sql::sqlparser::ast::{Set, Statement};
    let Statement::Set(Set::SingleAssignment {
        scope: None,
        hivevar: false,
        variable,
        values,
    }) = stmt
    else {
        return None;
    };
    let name = variable.to_string().to_ascii_lowercase();
    if name != "search_path" || values.is_empty() {
        return None;
    }
    if let [Expr::Value(v)] = values.as_slice()
        && matches!(v.value, Value::SingleQuotedString(_))
    {
        return None;
    }
    let items: Vec<String> = values
        .iter()
        .map(|v| match v {
            Expr::Identifier(ident) => Some(quote_ident(&ident.value)),
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) => Some(quote_ident(s)),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<_>>()?;
    let list = items.join(", ").replace('\'', "''");
    Some(format!("SET {name} = '{list}'"))
}

/// An identifier as Postgres's `quote_ident` writes it (and `SHOW search_path` a schema's
/// name): as it is when it is lower-case letters, digits and underscores not starting with
/// a digit, otherwise double-quoted (`"$user"`, `"Line No"`).
pub(super) fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Whether `query` is Grafana's list of the schemas in `search_path`: a select from
/// `generate_series(... current_setting('search_path') ...)`.
fn is_search_path_membership(query: &Query) -> bool {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return false;
    };
    select.from.iter().any(|f| {
        let text = f.relation.to_string().to_ascii_lowercase();
        text.starts_with("generate_series(") && text.contains("current_setting('search_path')")
    })
}

/// `stmt`'s text with its catalog `CASE`s made NULL, if it reads `pg_catalog` and has one.
fn rewrite_catalog_case(stmt: &mut datafusion::sql::sqlparser::ast::Statement) -> Option<String> {
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

/// Whether every condition of `query` (a `SELECT`) that names an outer column is an
/// equality between outer columns on one side and its own on the other, and its select
/// list names no outer column: the correlation DataFusion turns into a join.
fn correlated_by_equalities(query: &Query) -> bool {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return false;
    };
    let inner = inner_names(query);
    let refs = |e: &Expr| -> (bool, bool) {
        let (mut outer, mut own) = (false, false);
        let _ = visit_expressions(e, |x| {
            match x {
                Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
                    if is_outer(parts, &inner) {
                        outer = true;
                    } else {
                        own = true;
                    }
                }
                Expr::Identifier(_) => own = true,
                _ => {}
            }
            ControlFlow::<()>::Continue(())
        });
        (outer, own)
    };
    if select.projection.iter().any(|item| match item {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => refs(e).0,
        _ => true,
    }) {
        return false;
    }
    let mut conjuncts = Vec::new();
    fn split<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
        match e {
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            } => {
                split(left, out);
                split(right, out);
            }
            Expr::Nested(inner) => split(inner, out),
            other => out.push(other),
        }
    }
    if let Some(w) = &select.selection {
        split(w, &mut conjuncts);
    }
    conjuncts.into_iter().all(|c| {
        if !refs(c).0 {
            return true;
        }
        match c {
            Expr::BinaryOp {
                left,
                op: BinaryOperator::Eq,
                right,
            } => {
                let (l, r) = (refs(left), refs(right));
                (l == (true, false) && r == (false, true))
                    || (l == (false, true) && r == (true, false))
            }
            _ => false,
        }
    })
}

/// The relations and aliases `query`'s own `FROM` names (lower case).
fn inner_names(query: &Query) -> HashSet<String> {
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
    inner
}

/// Whether `table.column` (or `schema.table.column`) names a table not in `inner`.
fn is_outer(parts: &[datafusion::sql::sqlparser::ast::Ident], inner: &HashSet<String>) -> bool {
    let table = parts[parts.len() - 2].value.to_ascii_lowercase();
    let full = parts[..parts.len() - 1]
        .iter()
        .map(|p| p.value.to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(".");
    !inner.contains(&table) && !inner.contains(&full)
}

/// Whether `query` names a column of a table it does not read (`outer.column`).
fn is_correlated(query: &Query) -> bool {
    let inner = inner_names(query);
    let mut correlated = false;
    let _ = visit_expressions(query, |e| {
        if let Expr::CompoundIdentifier(parts) = e
            && parts.len() >= 2
            && is_outer(parts, &inner)
        {
            correlated = true;
            return ControlFlow::Break(());
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

    fn rewrite(sql: &str) -> Option<String> {
        rewrite_client_query(
            sql,
            &SessionFacts {
                database: "shop".into(),
                pid: 42,
                user: "ann".into(),
            },
        )
    }

    #[test]
    fn a_database_part_is_dropped_whatever_else_the_query_holds() {
        // dbt's column lookup: "information_schema" holds "format", a per-session word.
        let sql = rewrite(
            "/* {\"app\": \"dbt\"} */ select column_name from \"shop\".\"information_schema\".\"columns\" \
             where table_name = 'base' and table_schema = 'public'",
        )
        .unwrap();
        assert!(
            sql.contains("FROM \"information_schema\".\"columns\""),
            "{sql}"
        );
        assert!(rewrite("SELECT a FROM shop.sales.t WHERE a = 1").is_none());
    }

    #[test]
    fn pg_notify_sends_from_the_callers_pid() {
        let sql = rewrite("SELECT pg_notify('chat', 'hi')").unwrap();
        assert!(sql.contains("pg_notify('chat', 'hi', 42)"), "{sql}");
    }

    #[test]
    fn session_functions_are_the_sessions() {
        assert_eq!(
            rewrite("SELECT current_database(), pg_catalog.pg_backend_pid()").as_deref(),
            Some(
                "SELECT 'shop' AS \"current_database\", CAST(42 AS INTEGER) AS \"pg_backend_pid\""
            )
        );
        assert_eq!(
            rewrite("SELECT datname FROM pg_database WHERE datname = current_catalog").as_deref(),
            Some("SELECT datname FROM pg_database WHERE datname = 'shop'")
        );
        assert_eq!(
            rewrite("SELECT pid, query FROM pg_stat_activity").as_deref(),
            Some("SELECT pid, query FROM pg_catalog.pg_stat_activity")
        );
        assert_eq!(
            rewrite("SELECT current_user, session_user").as_deref(),
            Some("SELECT 'ann' AS \"current_user\", 'ann' AS \"session_user\"")
        );
        // Only those (the name is Postgres's for the column either way).
        assert_eq!(
            rewrite("SELECT current_databases()").as_deref(),
            Some("SELECT current_databases() AS \"current_databases\"")
        );
    }

    #[test]
    fn system_catalogs_are_their_postgres_oids() {
        assert_eq!(
            rewrite("SELECT 'pg_class'::regclass, 'pg_catalog.pg_type'::regclass::oid").as_deref(),
            Some("SELECT 1259 AS \"regclass\", 1247::oid AS \"oid\"")
        );
        // A user relation is left to the lookup in pg_class, an oid column as it is.
        assert_eq!(
            rewrite("SELECT 'clicks'::regclass").as_deref(),
            Some("SELECT 'clicks'::REGCLASS AS \"regclass\"")
        );
        assert_eq!(
            rewrite("SELECT c.oid::regclass FROM pg_class c").as_deref(),
            Some("SELECT c.oid::REGCLASS AS \"oid\" FROM pg_class c")
        );
        // Text computed per row is looked up by to_regclass.
        assert_eq!(
            rewrite("SELECT (s || '.' || t)::regclass AS r FROM x").as_deref(),
            Some("SELECT to_regclass((s || '.' || t)) AS r FROM x")
        );
    }

    #[test]
    fn array_subqueries_of_the_catalog_plan() {
        // psql's \du: the roles a role is a member of.
        assert_eq!(
            rewrite("SELECT r.rolname, ARRAY(SELECT b.rolname FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) WHERE m.member = r.oid) as memberof FROM pg_catalog.pg_roles r").as_deref(),
            Some("SELECT r.rolname, coalesce((SELECT array_agg(b.rolname) AS \"rolname\" FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) WHERE m.member = r.oid), make_array()) AS memberof FROM pg_catalog.pg_roles r")
        );
        // psql's \d+: a table's options (Tidemark's have none).
        assert_eq!(
            rewrite("SELECT array_to_string(c.reloptions || array(select 'toast.' || x from pg_catalog.unnest(tc.reloptions) x), ', ') FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid)").as_deref(),
            Some("SELECT array_to_string(CAST(NULL AS TEXT[]) || CAST(NULL AS TEXT[]), ', ') AS \"array_to_string\" FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid)")
        );
    }

    #[test]
    fn psqls_describe_plus_query_plans() {
        let sql = "SELECT c.relchecks, c.relkind, c.relhasindex, c.relhasrules, c.relhastriggers, c.relrowsecurity, c.relforcerowsecurity, false AS relhasoids, c.relispartition, pg_catalog.array_to_string(c.reloptions || array(select 'toast.' || x from pg_catalog.unnest(tc.reloptions) x), ', ')\n, c.reltablespace, CASE WHEN c.reloftype = 0 THEN '' ELSE c.reloftype::pg_catalog.regtype::pg_catalog.text END, c.relpersistence, c.relreplident, am.amname\nFROM pg_catalog.pg_class c\n LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid)\nLEFT JOIN pg_catalog.pg_am am ON (c.relam = am.oid)\nWHERE c.oid = '16386';";
        let out = rewrite(sql).unwrap_or_default();
        assert!(!out.to_lowercase().contains("array(select"), "{out}");
        assert!(!out.contains("reloptions"), "{out}");
    }

    #[test]
    fn an_oid_list_as_regtype_array_is_its_names() {
        assert_eq!(
            rewrite("SELECT COALESCE(proallargtypes::regtype[], proargtypes::regtype[])::text[] FROM pg_proc").as_deref(),
            Some("SELECT COALESCE(regtype_names(proallargtypes), regtype_names(proargtypes))::TEXT[] AS \"coalesce\" FROM pg_proc")
        );
    }

    #[test]
    fn a_regtype_as_text_is_its_name() {
        assert_eq!(
            rewrite("SELECT a.atttypid::regtype::text FROM pg_attribute a").as_deref(),
            Some(
                "SELECT format_type(a.atttypid::regtype, NULL) AS \"atttypid\" FROM pg_attribute a"
            )
        );
    }

    #[test]
    fn a_correlated_lookup_is_aggregated_and_keeps_its_name() {
        assert_eq!(
            rewrite(
                "SELECT t.oid, (SELECT c.relkind = 'c' FROM pg_class c WHERE c.oid = t.typrelid LIMIT 1) \
                 FROM pg_type t"
            )
            .as_deref(),
            Some(
                "SELECT t.oid, ((SELECT max(c.relkind = 'c') AS \"?column?\" FROM pg_class c \
                 WHERE c.oid = t.typrelid)) \
                 AS \"?column?\" FROM pg_type t"
            )
        );
        // Already aggregated, uncorrelated, outside the catalogs, or correlated in a way
        // DataFusion cannot join on (psql's \\d: left to datafusion-postgres): only named.
        for (sql, name) in [
            (
                "SELECT (SELECT count(*) FROM pg_class c WHERE c.oid = t.typrelid) FROM pg_type t",
                "count",
            ),
            (
                "SELECT (SELECT oid FROM pg_class LIMIT 1) FROM pg_type t",
                "oid",
            ),
            ("SELECT (SELECT v FROM w WHERE w.k = t.k) FROM t", "v"),
            (
                "SELECT (SELECT d.adbin FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid \
                 AND a.atthasdef) FROM pg_catalog.pg_attribute a",
                "adbin",
            ),
        ] {
            let out = rewrite(sql).expect("named");
            assert!(!out.contains("max("), "{out}");
            assert!(out.contains(&format!(") AS \"{name}\"")), "{out}");
        }
    }

    #[test]
    fn a_regproc_compared_with_a_type_function_is_its_name() {
        assert_eq!(
            rewrite("SELECT typinput='pg_catalog.array_in'::regproc as is_array FROM pg_type")
                .as_deref(),
            Some("SELECT typinput = 'array_in' AS is_array FROM pg_type")
        );
    }

    #[test]
    fn pgjdbc_primary_keys_read_key_column_usage() {
        let sql = "SELECT result.TABLE_CAT, result.TABLE_SCHEM, result.TABLE_NAME, \
            result.COLUMN_NAME, result.KEY_SEQ, result.PK_NAME FROM (SELECT NULL AS TABLE_CAT, \
            n.nspname AS TABLE_SCHEM, ct.relname AS TABLE_NAME, a.attname AS COLUMN_NAME, \
            (information_schema._pg_expandarray(i.indkey)).n AS KEY_SEQ, ci.relname AS PK_NAME, \
            information_schema._pg_expandarray(i.indkey) AS KEYS, a.attnum AS A_ATTNUM \
            FROM pg_catalog.pg_class ct JOIN pg_catalog.pg_attribute a ON (ct.oid = a.attrelid) \
            JOIN pg_catalog.pg_namespace n ON (ct.relnamespace = n.oid) \
            JOIN pg_catalog.pg_index i ON ( a.attrelid = i.indrelid) \
            JOIN pg_catalog.pg_class ci ON (ci.oid = i.indexrelid) WHERE true \
            AND n.nspname = E'public' AND ct.relname = 'it''s' AND i.indisprimary ) result \
            where result.A_ATTNUM = (result.KEYS).x \
            ORDER BY result.table_name, result.pk_name, result.key_seq";
        let out = rewrite(sql).expect("rewritten");
        assert!(
            out.contains("FROM information_schema.key_column_usage"),
            "{out}"
        );
        assert!(
            out.contains("AND table_schema = 'public' AND table_name = 'it''s'"),
            "{out}"
        );
    }

    #[test]
    fn format_is_the_concatenation_it_makes() {
        assert_eq!(
            rewrite("SELECT FORMAT('%I.%I', s, t) FROM x").as_deref(),
            Some(
                "SELECT (quote_ident(CAST((s) AS TEXT)) || '.' || quote_ident(CAST((t) AS TEXT))) \
                 AS \"format\" FROM x"
            )
        );
        assert_eq!(
            rewrite("SELECT format('100%% %2$s and %1$L', a, b) AS f").as_deref(),
            Some(
                "SELECT ('100% ' || coalesce(CAST((b) AS TEXT), '') || ' and ' || \
                 CASE WHEN (a) IS NULL THEN 'NULL' ELSE chr(39) || replace(CAST((a) AS TEXT), \
                 chr(39), chr(39) || chr(39)) || chr(39) END) AS f"
            )
        );
        // Widths and flags are not rewritten.
        assert_eq!(
            rewrite("SELECT format('%-10s', a)").as_deref(),
            Some("SELECT format('%-10s', a) AS \"format\"")
        );
    }

    #[test]
    fn a_join_of_pg_proc_to_a_regproc_column_compares_names() {
        let out = rewrite(
            "SELECT t.typname FROM pg_type AS t LEFT JOIN pg_proc AS proc \
             ON proc.oid = t.typreceive WHERE proc.proname = 'array_recv'",
        )
        .expect("rewritten");
        assert!(out.contains("ON proc.proname = t.typreceive"), "{out}");
        // Other joins on oid stay.
        let out = rewrite(
            "SELECT t.typname, (SELECT 1 FROM pg_proc p WHERE p.oid = t.oid) FROM pg_type t",
        );
        assert!(
            out.as_deref().is_none_or(|o| o.contains("p.oid = t.oid")),
            "{out:?}"
        );
    }

    #[test]
    fn a_search_path_of_names_is_set_as_postgres_prints_it() {
        assert_eq!(
            rewrite("set search_path = \"public\"").as_deref(),
            Some("SET search_path = 'public'")
        );
        assert_eq!(
            rewrite("SET search_path TO \"$user\", public, \"My\"").as_deref(),
            Some("SET search_path = '\"$user\", public, \"My\"'")
        );
        assert_eq!(rewrite("SET search_path = 'public'"), None);
    }

    #[test]
    fn grafanas_search_path_subquery_lists_current_schemas() {
        let sql = "SELECT quote_ident(table_name) FROM information_schema.tables WHERE \
            quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user \
            ELSE trim(s[i]) END FROM generate_series(array_lower(string_to_array(\
            current_setting('search_path'),','),1), array_upper(string_to_array(\
            current_setting('search_path'),','),1)) as i, \
            string_to_array(current_setting('search_path'),',') s)";
        assert_eq!(
            rewrite(sql).as_deref(),
            Some(
                "SELECT quote_ident(table_name) AS \"quote_ident\" FROM information_schema.tables WHERE \
                 quote_ident(table_schema) IN (SELECT unnest(current_schemas(false)) AS \"case\")"
            )
        );
    }

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
        let out = rewrite(sql).expect("rewritten");
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
        let out = rewrite(sql).expect("rewritten");
        assert!(
            out.contains(
                "CASE WHEN $1::VARCHAR IS NULL OR $2::VARCHAR IS NULL OR $3 IS NULL THEN NULL END AS identity_options"
            ),
            "{out}"
        );
        assert!(out.contains("attnum > $4::SMALLINT"), "{out}");
    }

    #[test]
    fn queries_of_other_tables_are_only_named() {
        assert_eq!(
            rewrite("SELECT CASE WHEN v.n > 0 THEN (SELECT w.n FROM w WHERE w.k = v.k) END FROM v")
                .as_deref(),
            Some(
                "SELECT CASE WHEN v.n > 0 THEN (SELECT w.n FROM w WHERE w.k = v.k) END AS \"case\" FROM v"
            )
        );
    }

    /// Postgres's names, as a PostgreSQL server gives them (Debian's 15, psql).
    #[test]
    fn result_columns_are_named_as_postgres_names_them() {
        let named = |sql: &str| rewrite(sql).unwrap_or_else(|| sql.to_string());
        assert_eq!(named("SELECT 1"), "SELECT 1 AS \"?column?\"");
        assert_eq!(
            named("SELECT count(*), sum(x) FROM t"),
            "SELECT count(*) AS \"count\", sum(x) AS \"sum\" FROM t"
        );
        assert_eq!(
            named("SELECT t.a::text, b + 1, now() AS n FROM t"),
            "SELECT t.a::TEXT AS \"a\", b + 1 AS \"?column?\", now() AS n FROM t"
        );
        // Plain columns and stars keep their names: nothing to rewrite.
        assert_eq!(rewrite("SELECT a, t.b, * FROM t"), None);
        // Two items of one name: DataFusion refuses duplicate names, so both keep theirs.
        assert_eq!(rewrite("SELECT count(a), count(b) FROM t"), None);
        // A union takes the first select's names.
        assert_eq!(
            named("SELECT 1 UNION ALL SELECT 2"),
            "SELECT 1 AS \"?column?\" UNION ALL SELECT 2"
        );
        assert_eq!(
            rewrite("SELECT window_start, \"Page\", t.views FROM t WHERE x = count(1)"),
            None
        );
        assert!(names_columns_only("select a, t.b, \"c d\", * from t"));
        assert!(!names_columns_only("select a, 1 from t"));
        assert!(names_columns_only("select distinct a as b from t"));
        assert!(!names_columns_only("select current_user"));
        // Not a query: left alone.
        assert_eq!(rewrite("INSERT INTO t SELECT 1"), None);
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
