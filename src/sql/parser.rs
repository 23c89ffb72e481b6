//! The parser of Tidemark's own statements, on top of sqlparser's `Parser`.
//!
//! ```text
//! CREATE STREAM [IF NOT EXISTS] name [( col type, ... [, WATERMARK FOR col AS col - INTERVAL '...'] )]
//!     WITH (key = value, ...)
//! CREATE SINK|MATERIALIZED VIEW [IF NOT EXISTS] name [WITH (key = value, ...)] AS query
//! EXPLAIN [SPARK] CREATE SINK|MATERIALIZED VIEW ...
//! DROP STREAM|SINK|MATERIALIZED VIEW [IF EXISTS] name
//! SHOW STREAMS | SHOW SINKS | SHOW MATERIALIZED VIEWS | SHOW QUERIES | SHOW OPTIONS
//! STOP|START SINK|MATERIALIZED VIEW name
//! ALTER SINK|MATERIALIZED VIEW name SET (key = value, ...)
//! FLUSH [SINK|MATERIALIZED VIEW name]
//! OPTIMIZE name [ZORDER BY (col, ...)]
//! CREATE TABLE [IF NOT EXISTS] name [( col type [NOT NULL] [PRIMARY KEY], ... [, PRIMARY KEY (col, ...)] )]
//!     [WITH (key = value, ...)] [AS query]
//! DROP TABLE [IF EXISTS] name [PURGE]
//! MERGE INTO ... (see `sql::merge`), UPDATE ..., DELETE ...
//! CREATE SINK name [WITH (...)] AS MERGE INTO ...
//! CREATE|ALTER|DROP ROLE ..., GRANT ... TO ..., REVOKE ... FROM ... (see `sql::roles`)
//! ```

use std::time::Duration;

use datafusion::arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr, Ident};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use serde::{Deserialize, Serialize};

use super::options::{Options, parse_duration};
use super::types::sql_to_arrow;
use crate::error::{Error, Result};

/// One of Tidemark's statements.
#[derive(Debug, Clone, PartialEq)]
pub enum TidemarkStatement {
    CreateStream(CreateStream),
    CreateSink(CreateSink),
    ExplainCreateSink(CreateSink),
    /// `EXPLAIN SPARK CREATE SINK ...`: the sink as Spark would run it (a PySpark program).
    ExplainSparkCreateSink(CreateSink),
    DropStream {
        name: String,
        if_exists: bool,
    },
    DropSink {
        name: String,
        if_exists: bool,
        kind: QueryKind,
        /// `DROP SINK name PURGE`: the sink's table in the data directory goes too.
        purge: bool,
    },
    ShowStreams,
    ShowSinks,
    /// `SHOW MATERIALIZED VIEWS`.
    ShowViews,
    ShowQueries,
    /// `SHOW PROGRESS name`: the query's last progress report.
    ShowProgress(String),
    /// `LISTEN channel`.
    Listen(String),
    /// `UNLISTEN channel`, or `UNLISTEN *` (`None`).
    Unlisten(Option<String>),
    /// `NOTIFY channel [, 'payload']`.
    Notify {
        channel: String,
        payload: String,
    },
    /// Every connector's options (`tidemark.options`).
    ShowOptions,
    StopSink {
        name: String,
        kind: QueryKind,
    },
    StartSink {
        name: String,
        kind: QueryKind,
    },
    /// `ALTER SINK name SET (key = value, ...)`: safe changes, applied in place.
    AlterSink {
        name: String,
        options: Options,
        kind: QueryKind,
    },
    /// `SAVEPOINT`, `RELEASE [SAVEPOINT]`, `ROLLBACK TO [SAVEPOINT]`: accepted inside a
    /// transaction block, as Postgres does, with nothing to undo (Tidemark's statements
    /// take effect at once).
    Savepoint(SavepointCommand),
    /// `SHOW name` of a run-time setting (`SHOW ALL`, `SHOW TIME ZONE`, …): the name as
    /// written, lower case, words joined by one space. Answered by the wire, which knows
    /// the session's `SET`s.
    ShowSetting(String),
    /// `DISCARD ALL | PLANS | SEQUENCES | TEMP`: what to discard, upper case.
    Discard(String),
    /// Waits until the named sink (or every running sink) has processed what is available.
    Flush {
        sink: Option<String>,
    },
    /// `OPTIMIZE name [ZORDER BY (col, ...)]`: compacts a Delta sink's table.
    Optimize {
        name: String,
        zorder: Vec<String>,
    },
    /// `COPY stream FROM STDIN`: the wire server streams the data in.
    CopyFrom(super::copy::CopyFrom),
    /// `CREATE TABLE`: a Delta table.
    CreateTable(CreateTable),
    /// `DROP TABLE [IF EXISTS] name [PURGE]`.
    DropTable {
        name: String,
        if_exists: bool,
        /// Delete the table's files too (only the table's own directory).
        purge: bool,
    },
    /// `CREATE [OR REPLACE] VIEW name AS query`: a plain view, which DataFusion plans and
    /// the catalog keeps (its statement's text) so that it outlives the process. `name` is
    /// `None` for a view in a schema other than `public`, which is not kept.
    CreateView {
        name: Option<String>,
        sql: String,
    },
    /// `DROP VIEW [IF EXISTS] name, ...`; `names` is `None` if one is in another schema
    /// (DataFusion's statement `sql` alone drops them).
    DropView {
        names: Option<Vec<String>>,
        if_exists: bool,
        sql: String,
    },
    /// A one-off `MERGE INTO`.
    Merge(super::merge::MergeSpec),
    /// `UPDATE table SET col = expr, ... [WHERE predicate]`, expressions as SQL text
    /// with their columns unqualified.
    Update {
        table: String,
        assignments: Vec<(String, String)>,
        predicate: Option<String>,
    },
    /// `DELETE FROM table [WHERE predicate]`.
    Delete {
        table: String,
        predicate: Option<String>,
    },
    /// `CREATE ROLE` or `CREATE USER` (see `sql::roles`).
    CreateRole {
        name: String,
        if_not_exists: bool,
        options: super::roles::RoleOptions,
    },
    /// `ALTER ROLE name [WITH] option ...`.
    AlterRole {
        name: String,
        options: super::roles::RoleOptions,
    },
    /// `DROP ROLE [IF EXISTS] name, ...`.
    DropRole {
        names: Vec<String>,
        if_exists: bool,
    },
    /// `GRANT role, ... TO name, ...` or `REVOKE role, ... FROM name, ...`.
    GrantRole {
        roles: Vec<String>,
        members: Vec<String>,
        revoke: bool,
    },
}

/// `CREATE TABLE`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateTable {
    pub name: String,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnSpec>,
    /// The `PRIMARY KEY` columns, in order.
    pub primary_key: Vec<String>,
    pub options: Options,
    /// `AS query`: the table's first rows (and, without columns, its schema).
    pub query: Option<String>,
}

/// A column of a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnSpec {
    pub name: String,
    /// The type as written, e.g. `DOUBLE PRECISION`.
    pub sql_type: String,
    #[serde(skip, default = "null_type")]
    pub data_type: DataType,
    /// Declared `NOT NULL` (table streams only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_null: bool,
}

fn null_type() -> DataType {
    DataType::Null
}

/// `WATERMARK FOR col AS col - INTERVAL '...'`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatermarkSpec {
    pub column: String,
    /// The delay, in microseconds.
    pub delay_us: u64,
}

impl WatermarkSpec {
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }
}

/// `CREATE STREAM`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateStream {
    pub name: String,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnSpec>,
    pub watermark: Option<WatermarkSpec>,
    pub options: Options,
}

/// What a streaming query writes into: a sink's table, or a materialized view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryKind {
    #[default]
    Sink,
    MaterializedView,
}

impl QueryKind {
    /// `sink`, `materialized view`: as messages name it.
    pub fn noun(self) -> &'static str {
        match self {
            QueryKind::Sink => "sink",
            QueryKind::MaterializedView => "materialized view",
        }
    }

    /// `SINK`, `MATERIALIZED VIEW`: as statements and command tags spell it.
    pub fn keyword(self) -> &'static str {
        match self {
            QueryKind::Sink => "SINK",
            QueryKind::MaterializedView => "MATERIALIZED VIEW",
        }
    }

    pub fn is_sink(&self) -> bool {
        *self == QueryKind::Sink
    }
}

/// `CREATE SINK` and `CREATE MATERIALIZED VIEW`.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateSink {
    pub kind: QueryKind,
    pub name: String,
    pub if_not_exists: bool,
    /// `CREATE OR REPLACE`: an existing sink or view of the name is kept when the
    /// definition is the same, altered when only alterable options differ, and replaced
    /// over its checkpoint otherwise (see `Engine::replace_sink`).
    pub or_replace: bool,
    pub options: Options,
    /// The `AS` query, as text DataFusion plans; a MERGE sink's `USING` query.
    pub query: String,
    /// `AS MERGE INTO ...`: a MERGE sink, whose query runs over each micro-batch as a
    /// static table.
    pub merge: Option<super::merge::MergeSpec>,
}

/// Parses one statement that [`super::split`] classified as Tidemark's.
pub fn parse_tidemark(sql: &str) -> Result<TidemarkStatement> {
    // Clients put comments first (dbt: `/* {"app": "dbt", ...} */ update ...`).
    let sql = without_leading_comments(sql);
    if sql
        .trim_start()
        .get(..4)
        .is_some_and(|w| w.eq_ignore_ascii_case("COPY"))
    {
        return super::copy::parse_copy_from(sql).map(TidemarkStatement::CopyFrom);
    }
    if let Some(role_statement) = super::roles::parse(sql) {
        return role_statement;
    }
    let first = sql.split_whitespace().next().unwrap_or("");
    let changes_a_table = ["UPDATE", "DELETE", "MERGE"]
        .iter()
        .any(|w| first.eq_ignore_ascii_case(w));
    if changes_a_table && has_placeholders(sql) {
        return Err(Error::Unsupported {
            message: format!(
                "parameters ($1, ...) in {} are not supported yet",
                first.to_ascii_uppercase()
            ),
            hint: Some(
                "Send the values in the statement's text, or bind them in the client \
                 (psycopg's ClientCursor, pgjdbc's preferQueryMode=simple)."
                    .into(),
            ),
        });
    }
    if first.eq_ignore_ascii_case("UPDATE") || first.eq_ignore_ascii_case("DELETE") {
        return parse_update_or_delete(sql);
    }
    if let Some(view) = parse_view_statement(sql)? {
        return Ok(view);
    }
    let sql = super::merge::quote_delta_paths(sql);
    let dialect = PostgreSqlDialect {};
    let mut p = Parser::new(&dialect).try_with_sql(&sql)?;
    let stmt = parse_statement(&mut p)?;
    // Allow a trailing semicolon, nothing else.
    while p.consume_token(&Token::SemiColon) {}
    let next = p.peek_token();
    if next.token != Token::EOF {
        return Err(Error::ParseError {
            message: format!("syntax error at or near \"{}\"", next.token),
            hint: Some("Expected the end of the statement.".into()),
        });
    }
    Ok(stmt)
}

fn word_is(p: &Parser, n: usize, word: &str) -> bool {
    matches!(&p.peek_nth_token(n).token, Token::Word(w) if w.value.eq_ignore_ascii_case(word))
}

/// Consumes the next token if it is the (non-keyword) word `word`.
fn parse_word(p: &mut Parser, word: &str) -> bool {
    if word_is(p, 0, word) {
        p.next_token();
        true
    } else {
        false
    }
}

fn expect_word(p: &mut Parser, word: &str) -> Result<()> {
    if parse_word(p, word) {
        Ok(())
    } else {
        Err(Error::Syntax(format!(
            "expected {word}, found {}",
            p.peek_token().token
        )))
    }
}

/// `SINK` or `MATERIALIZED VIEW`, which must come next.
fn parse_query_kind(p: &mut Parser) -> Result<QueryKind> {
    if parse_word(p, "SINK") {
        return Ok(QueryKind::Sink);
    }
    if word_is(p, 0, "MATERIALIZED") && word_is(p, 1, "VIEW") {
        p.next_token();
        p.next_token();
        return Ok(QueryKind::MaterializedView);
    }
    Err(Error::Syntax(format!(
        "expected SINK or MATERIALIZED VIEW, found {}",
        p.peek_token().token
    )))
}

/// A savepoint statement, by the savepoint's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavepointCommand {
    Set(String),
    Release(String),
    RollbackTo(String),
}

impl SavepointCommand {
    /// The command tag Postgres answers with.
    pub fn tag(&self) -> &'static str {
        match self {
            SavepointCommand::Set(_) => "SAVEPOINT",
            SavepointCommand::Release(_) => "RELEASE",
            SavepointCommand::RollbackTo(_) => "ROLLBACK",
        }
    }

    /// The statement's name in Postgres's errors.
    pub fn statement(&self) -> &'static str {
        match self {
            SavepointCommand::Set(_) => "SAVEPOINT",
            SavepointCommand::Release(_) => "RELEASE SAVEPOINT",
            SavepointCommand::RollbackTo(_) => "ROLLBACK TO SAVEPOINT",
        }
    }
}

fn parse_statement(p: &mut Parser) -> Result<TidemarkStatement> {
    if parse_word(p, "SAVEPOINT") {
        return Ok(TidemarkStatement::Savepoint(SavepointCommand::Set(
            parse_name(p)?,
        )));
    }
    if parse_word(p, "RELEASE") {
        parse_word(p, "SAVEPOINT");
        return Ok(TidemarkStatement::Savepoint(SavepointCommand::Release(
            parse_name(p)?,
        )));
    }
    if parse_word(p, "ROLLBACK") {
        expect_word(p, "TO")?;
        parse_word(p, "SAVEPOINT");
        return Ok(TidemarkStatement::Savepoint(SavepointCommand::RollbackTo(
            parse_name(p)?,
        )));
    }
    if p.parse_keyword(Keyword::MERGE) {
        return Ok(TidemarkStatement::Merge(super::merge::parse_merge(p)?));
    }
    if parse_word(p, "CREATE") {
        if p.parse_keywords(&[Keyword::OR, Keyword::REPLACE]) {
            let kind = parse_query_kind(p).map_err(|_| {
                Error::Syntax(format!(
                    "CREATE OR REPLACE makes a SINK or a MATERIALIZED VIEW, found {}",
                    p.peek_token().token
                ))
            })?;
            let mut sink = parse_create_sink(p, kind)?;
            if sink.if_not_exists {
                return Err(Error::Syntax(
                    "CREATE OR REPLACE and IF NOT EXISTS cannot be combined".into(),
                ));
            }
            sink.or_replace = true;
            return Ok(TidemarkStatement::CreateSink(sink));
        }
        if parse_word(p, "TABLE") {
            return Ok(TidemarkStatement::CreateTable(parse_create_table(p)?));
        }
        if parse_word(p, "STREAM") {
            return Ok(TidemarkStatement::CreateStream(parse_create_stream(p)?));
        }
        let kind = parse_query_kind(p)?;
        return Ok(TidemarkStatement::CreateSink(parse_create_sink(p, kind)?));
    }
    if parse_word(p, "EXPLAIN") {
        let spark = parse_word(p, "SPARK");
        expect_word(p, "CREATE")?;
        let kind = parse_query_kind(p)?;
        let sink = parse_create_sink(p, kind)?;
        return Ok(if spark {
            TidemarkStatement::ExplainSparkCreateSink(sink)
        } else {
            TidemarkStatement::ExplainCreateSink(sink)
        });
    }
    if parse_word(p, "DROP") {
        if parse_word(p, "TABLE") {
            let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = parse_name(p)?;
            let purge = p.parse_keyword(Keyword::PURGE);
            return Ok(TidemarkStatement::DropTable {
                name,
                if_exists,
                purge,
            });
        }
        let kind = if parse_word(p, "STREAM") {
            None
        } else {
            Some(parse_query_kind(p)?)
        };
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let name = parse_name(p)?;
        let purge = kind == Some(QueryKind::Sink) && p.parse_keyword(Keyword::PURGE);
        return Ok(match kind {
            None => TidemarkStatement::DropStream { name, if_exists },
            Some(kind) => TidemarkStatement::DropSink {
                name,
                if_exists,
                kind,
                purge,
            },
        });
    }
    if parse_word(p, "SHOW") {
        if parse_word(p, "STREAMS") {
            return Ok(TidemarkStatement::ShowStreams);
        }
        if parse_word(p, "SINKS") {
            return Ok(TidemarkStatement::ShowSinks);
        }
        if parse_word(p, "MATERIALIZED") {
            expect_word(p, "VIEWS")?;
            return Ok(TidemarkStatement::ShowViews);
        }
        if parse_word(p, "OPTIONS") {
            return Ok(TidemarkStatement::ShowOptions);
        }
        if parse_word(p, "QUERIES") {
            return Ok(TidemarkStatement::ShowQueries);
        }
        if word_is(p, 0, "PROGRESS")
            && !matches!(p.peek_nth_token(1).token, Token::EOF | Token::SemiColon)
        {
            p.next_token();
            return Ok(TidemarkStatement::ShowProgress(parse_name(p)?));
        }
        // A setting: one or more words (`search_path`, `TIME ZONE`, `"TimeZone"`).
        let mut words = Vec::new();
        loop {
            match p.peek_token().token {
                Token::Word(w) => {
                    p.next_token();
                    words.push(w.value.to_ascii_lowercase());
                }
                Token::EOF | Token::SemiColon if !words.is_empty() => break,
                _ => {
                    return Err(p
                        .expected::<()>("a setting name, STREAMS, SINKS or QUERIES", p.peek_token())
                        .unwrap_err()
                        .into());
                }
            }
        }
        return Ok(TidemarkStatement::ShowSetting(words.join(" ")));
    }
    if parse_word(p, "LISTEN") {
        return Ok(TidemarkStatement::Listen(parse_channel(p)?));
    }
    if parse_word(p, "UNLISTEN") {
        if p.consume_token(&Token::Mul) {
            return Ok(TidemarkStatement::Unlisten(None));
        }
        return Ok(TidemarkStatement::Unlisten(Some(parse_channel(p)?)));
    }
    if parse_word(p, "NOTIFY") {
        let channel = parse_channel(p)?;
        let payload = if p.consume_token(&Token::Comma) {
            p.parse_literal_string()?
        } else {
            String::new()
        };
        return Ok(TidemarkStatement::Notify { channel, payload });
    }
    if parse_word(p, "DISCARD") {
        for what in ["ALL", "PLANS", "SEQUENCES", "TEMP", "TEMPORARY"] {
            if parse_word(p, what) {
                let what = if what == "TEMPORARY" { "TEMP" } else { what };
                return Ok(TidemarkStatement::Discard(what.into()));
            }
        }
        return Err(p
            .expected::<()>("ALL, PLANS, SEQUENCES or TEMP", p.peek_token())
            .unwrap_err()
            .into());
    }
    if parse_word(p, "STOP") {
        let kind = parse_query_kind(p)?;
        return Ok(TidemarkStatement::StopSink {
            name: parse_name(p)?,
            kind,
        });
    }
    if parse_word(p, "START") {
        let kind = parse_query_kind(p)?;
        return Ok(TidemarkStatement::StartSink {
            name: parse_name(p)?,
            kind,
        });
    }
    if parse_word(p, "ALTER") {
        let kind = parse_query_kind(p)?;
        let name = parse_name(p)?;
        if !p.parse_keyword(Keyword::SET) {
            return Err(Error::Syntax(format!(
                "expected SET, found {}",
                p.peek_token().token
            )));
        }
        // `SET (...)` reads like `WITH (...)`.
        let options = parse_option_list(p)?;
        return Ok(TidemarkStatement::AlterSink {
            name,
            options,
            kind,
        });
    }
    if parse_word(p, "FLUSH") {
        let sink = if word_is(p, 0, "SINK") || word_is(p, 0, "MATERIALIZED") {
            parse_query_kind(p)?;
            Some(parse_name(p)?)
        } else {
            None
        };
        return Ok(TidemarkStatement::Flush { sink });
    }
    if parse_word(p, "OPTIMIZE") {
        let name = parse_name(p)?;
        let mut zorder = Vec::new();
        if parse_word(p, "ZORDER") {
            expect_word(p, "BY")?;
            let parens = p.consume_token(&Token::LParen);
            loop {
                zorder.push(normalize_ident(&p.parse_identifier()?));
                if !p.consume_token(&Token::Comma) {
                    break;
                }
            }
            if parens {
                p.expect_token(&Token::RParen)?;
            }
        }
        return Ok(TidemarkStatement::Optimize { name, zorder });
    }
    Err(Error::Syntax(format!(
        "unexpected {} at the start of a statement",
        p.peek_token().token
    )))
}

/// `CREATE [OR REPLACE] VIEW` (not `TEMP`, not `MATERIALIZED`) and `DROP VIEW`, if `sql`
/// is one of them: Tidemark keeps plain views in its catalog, and DataFusion plans them.
fn parse_view_statement(sql: &str) -> Result<Option<TidemarkStatement>> {
    use datafusion::sql::sqlparser::ast::{ObjectType, Statement};
    let words: Vec<String> = sql
        .split_whitespace()
        .take(4)
        .map(|w| w.to_ascii_uppercase())
        .collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let is_view = matches!(
        words.as_slice(),
        ["CREATE", "VIEW", ..] | ["CREATE", "OR", "REPLACE", "VIEW"] | ["DROP", "VIEW", ..]
    );
    if !is_view {
        return Ok(None);
    }
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql)?;
    let [statement] = statements.as_slice() else {
        return Err(Error::Syntax("expected one statement".into()));
    };
    // A view in another schema (one `CREATE SCHEMA` made in DataFusion's memory, as dbt's
    // tests do) stays DataFusion's alone: not kept (`None`).
    let text = sql.trim().trim_end_matches(';').to_string();
    Ok(match statement {
        Statement::CreateView(v) if !v.temporary && !v.materialized => {
            Some(TidemarkStatement::CreateView {
                name: qualified_name(&v.name).ok(),
                sql: text,
            })
        }
        Statement::Drop {
            object_type: ObjectType::View,
            if_exists,
            names,
            ..
        } => Some(TidemarkStatement::DropView {
            names: names
                .iter()
                .map(qualified_name)
                .collect::<Result<Vec<_>>>()
                .ok(),
            if_exists: *if_exists,
            sql: text,
        }),
        _ => None,
    })
}

/// `sql` from its first word: leading blanks, `-- line` and `/* block */` comments
/// (nested, as Postgres allows) skipped. An unclosed comment is left for the parser.
fn without_leading_comments(sql: &str) -> &str {
    let mut rest = sql.trim_start();
    loop {
        if let Some(line) = rest.strip_prefix("--") {
            rest = line
                .find('\n')
                .map_or("", |end| &line[end + 1..])
                .trim_start();
        } else if rest.starts_with("/*") {
            let mut depth = 0usize;
            let mut end = None;
            let bytes = rest.as_bytes();
            let mut i = 0;
            while i + 1 < bytes.len() {
                match (bytes[i], bytes[i + 1]) {
                    (b'/', b'*') => {
                        depth += 1;
                        i += 2;
                    }
                    (b'*', b'/') => {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            end = Some(i);
                            break;
                        }
                    }
                    _ => i += 1,
                }
            }
            match end {
                Some(end) => rest = rest[end..].trim_start(),
                None => return rest,
            }
        } else {
            return rest;
        }
    }
}

/// An identifier, lowercased unless quoted (as Postgres and DataFusion do).
pub fn normalize_ident(ident: &Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_ascii_lowercase()
    }
}

/// A stream's, sink's, view's or table's name: `name`, `public.name` or
/// `database.public.name`, as dbt and other tools qualify names. Every object lives in
/// schema `public`; another schema is Postgres's 3F000. Tidemark answers to any database
/// name, so the database part is not checked.
fn parse_name(p: &mut Parser) -> Result<String> {
    qualified_name(&p.parse_object_name(false)?)
}

/// A relation's name from `name`, `public.name` or `database.public.name` (Tidemark has
/// one database, which answers to any name, and one schema); another schema is 3F000.
pub(super) fn qualified_name(name: &datafusion::sql::sqlparser::ast::ObjectName) -> Result<String> {
    let parts = name
        .0
        .iter()
        .map(|part| {
            part.as_ident()
                .map(normalize_ident)
                .ok_or_else(|| Error::Syntax(format!("\"{name}\" is not a name")))
        })
        .collect::<Result<Vec<_>>>()?;
    match parts.as_slice() {
        [name] => Ok(name.clone()),
        [schema, name] | [_, schema, name] if schema == "public" => Ok(name.clone()),
        [schema, _] | [_, schema, _] => Err(Error::UndefinedObject {
            kind: "schema",
            name: schema.clone(),
        }),
        _ => Err(Error::Syntax(format!(
            "improper qualified name (too many dotted names): {name}"
        ))),
    }
}

/// A `LISTEN`/`NOTIFY` channel: an identifier, folded to lower case unless quoted, and
/// cut to Postgres's 63 bytes.
fn parse_channel(p: &mut Parser) -> Result<String> {
    let ident = p.parse_identifier()?;
    let mut name = normalize_ident(&ident);
    if name.len() > 63 {
        let mut end = 63;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    Ok(name)
}

fn parse_create_stream(p: &mut Parser) -> Result<CreateStream> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = parse_name(p)?;
    let mut columns = Vec::new();
    let mut watermark = None;
    if p.consume_token(&Token::LParen) {
        loop {
            if word_is(p, 0, "WATERMARK") && word_is(p, 1, "FOR") {
                p.next_token();
                p.next_token();
                if watermark.is_some() {
                    return Err(Error::Syntax("a stream has at most one WATERMARK".into()));
                }
                watermark = Some(parse_watermark_clause(p)?);
            } else {
                let (column, primary_key) = parse_column(p)?;
                if primary_key {
                    return Err(Error::unsupported(format!(
                        "column constraints other than NOT NULL are not supported in streams \
                         (column \"{}\")",
                        column.name
                    )));
                }
                columns.push(column);
            }
            if p.consume_token(&Token::RParen) {
                break;
            }
            p.expect_token(&Token::Comma)?;
        }
    }
    let options = parse_with_options(p)?.unwrap_or_default();
    Ok(CreateStream {
        name,
        if_not_exists,
        columns,
        watermark,
        options,
    })
}

/// After `WATERMARK FOR`: `col AS col [- INTERVAL '...']`.
fn parse_watermark_clause(p: &mut Parser) -> Result<WatermarkSpec> {
    let column = normalize_ident(&p.parse_identifier()?);
    p.expect_keyword_is(Keyword::AS)?;
    let expr = p.parse_expr()?;
    watermark_from_expr(&column, &expr)
}

fn watermark_from_expr(column: &str, expr: &Expr) -> Result<WatermarkSpec> {
    let refers_to_column = |e: &Expr| match e {
        Expr::Identifier(i) => normalize_ident(i) == column,
        _ => false,
    };
    let bad = || {
        Error::Syntax(format!(
            "watermark must be \"{column} - INTERVAL '<delay>'\", got \"{expr}\""
        ))
    };
    match expr {
        e if refers_to_column(e) => Ok(WatermarkSpec {
            column: column.to_string(),
            delay_us: 0,
        }),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Minus,
            right,
        } if refers_to_column(left) => {
            let text = right.to_string().replace('\'', "");
            let delay = parse_duration(&text).map_err(|_| bad())?;
            Ok(WatermarkSpec {
                column: column.to_string(),
                delay_us: delay.as_micros() as u64,
            })
        }
        _ => Err(bad()),
    }
}

/// Parses the sink option `watermark = 'event_time - 10 minutes'`.
pub fn parse_watermark_option(text: &str) -> Result<WatermarkSpec> {
    let bad = || Error::InvalidOption {
        message: format!("invalid watermark \"{text}\""),
        hint: Some("Write it as 'event_time - 10 minutes'.".into()),
    };
    let (col, delay) = match text.split_once('-') {
        Some((c, d)) => (c.trim(), Some(d.trim())),
        None => (text.trim(), None),
    };
    if col.is_empty() || col.contains(char::is_whitespace) {
        return Err(bad());
    }
    let delay_us = match delay {
        Some(d) => parse_duration(d).map_err(|_| bad())?.as_micros() as u64,
        None => 0,
    };
    Ok(WatermarkSpec {
        column: col.trim_matches('"').to_string(),
        delay_us,
    })
}

fn parse_create_sink(p: &mut Parser, kind: QueryKind) -> Result<CreateSink> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = parse_name(p)?;
    let options = parse_with_options(p)?.unwrap_or_default();
    if !p.parse_keyword(Keyword::AS) {
        return Err(Error::Syntax(format!(
            "expected WITH (...) or AS after CREATE {} {name}, found {}",
            kind.keyword(),
            p.peek_token().token
        )));
    }
    if p.parse_keyword(Keyword::MERGE) {
        if kind != QueryKind::Sink {
            return Err(Error::Syntax(
                "a materialized view is a query; MERGE makes a sink: CREATE SINK ... AS MERGE"
                    .into(),
            ));
        }
        let merge = super::merge::parse_merge(p)?;
        return Ok(CreateSink {
            kind,
            name,
            if_not_exists,
            or_replace: false,
            options,
            query: merge.source.clone(),
            merge: Some(merge),
        });
    }
    let query = p.parse_query()?;
    Ok(CreateSink {
        kind,
        name,
        if_not_exists,
        or_replace: false,
        options,
        query: query.to_string(),
        merge: None,
    })
}

/// Whether `sql` has a bind parameter (`$1`, `?`) outside its string literals.
fn has_placeholders(sql: &str) -> bool {
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;
    Tokenizer::new(&PostgreSqlDialect {}, sql)
        .tokenize()
        .map(|tokens| tokens.iter().any(|t| matches!(t, Token::Placeholder(_))))
        .unwrap_or(false)
}

/// `UPDATE` and `DELETE` of one table. The table's own name or alias may qualify columns;
/// they are written unqualified, as delta-rs resolves them against the table.
fn parse_update_or_delete(sql: &str) -> Result<TidemarkStatement> {
    use datafusion::sql::sqlparser::ast::{
        AssignmentTarget, FromTable, Statement, TableFactor, TableWithJoins, visit_expressions_mut,
    };
    use std::ops::ControlFlow;
    let mut stmts = Parser::parse_sql(&PostgreSqlDialect {}, sql)?;
    let [stmt] = stmts.as_mut_slice() else {
        return Err(Error::Syntax("expected one statement".into()));
    };
    let _ = visit_expressions_mut(stmt, |e| {
        if let Expr::CompoundIdentifier(parts) = e
            && parts.len() == 2
            && let Some(column) = parts.pop()
        {
            *e = Expr::Identifier(column);
        }
        ControlFlow::<()>::Continue(())
    });
    let table_of = |t: &TableWithJoins| -> Result<String> {
        match &t.relation {
            TableFactor::Table { name, .. } if t.joins.is_empty() => qualified_name(name),
            other => Err(Error::unsupported(format!(
                "{other}: UPDATE and DELETE change one table, by its name"
            ))),
        }
    };
    match stmt {
        Statement::Update(u) => {
            if u.from.is_some() || u.returning.is_some() || u.limit.is_some() {
                return Err(Error::unsupported(
                    "UPDATE ... FROM, RETURNING and LIMIT are not supported: use MERGE INTO",
                ));
            }
            let assignments = u
                .assignments
                .iter()
                .map(|a| match &a.target {
                    AssignmentTarget::ColumnName(name) => name
                        .0
                        .last()
                        .and_then(|p| p.as_ident())
                        .map(|i| (normalize_ident(i), a.value.to_string()))
                        .ok_or_else(|| Error::Syntax(format!("\"{name}\" is not a column"))),
                    other => Err(Error::unsupported(format!(
                        "UPDATE SET {other}: assign one column at a time"
                    ))),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(TidemarkStatement::Update {
                table: table_of(&u.table)?,
                assignments,
                predicate: u.selection.as_ref().map(ToString::to_string),
            })
        }
        Statement::Delete(d) => {
            let tables = match &d.from {
                FromTable::WithFromKeyword(t) | FromTable::WithoutKeyword(t) => t,
            };
            let [table] = tables.as_slice() else {
                return Err(Error::unsupported("DELETE changes one table"));
            };
            if d.using.is_some() || d.returning.is_some() || d.limit.is_some() {
                return Err(Error::unsupported(
                    "DELETE ... USING, RETURNING and LIMIT are not supported: use MERGE INTO",
                ));
            }
            Ok(TidemarkStatement::Delete {
                table: table_of(table)?,
                predicate: d.selection.as_ref().map(ToString::to_string),
            })
        }
        other => Err(Error::Syntax(format!(
            "expected UPDATE or DELETE, found {other}"
        ))),
    }
}

/// `name type [NOT NULL | NULL | PRIMARY KEY] ...`: the column, and whether it is declared
/// the primary key. Other constraints are refused.
fn parse_column(p: &mut Parser) -> Result<(ColumnSpec, bool)> {
    use datafusion::sql::sqlparser::ast::ColumnOption;
    let def = p.parse_column_def()?;
    let name = normalize_ident(&def.name);
    let (mut not_null, mut primary_key) = (false, false);
    for o in &def.options {
        match &o.option {
            ColumnOption::NotNull => not_null = true,
            ColumnOption::Null => not_null = false,
            ColumnOption::PrimaryKey(_) => primary_key = true,
            other => {
                return Err(Error::unsupported(format!(
                    "column constraint {other} is not supported (column \"{name}\"): NOT NULL \
                     is, and PRIMARY KEY in tables"
                )));
            }
        }
    }
    let sql_type = def.data_type.to_string();
    Ok((
        ColumnSpec {
            name,
            data_type: sql_to_arrow(&sql_type)?,
            sql_type,
            not_null,
        },
        primary_key,
    ))
}

fn parse_create_table(p: &mut Parser) -> Result<CreateTable> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = parse_name(p)?;
    let mut columns = Vec::new();
    let mut primary_key: Vec<String> = Vec::new();
    let mut set_key = |key: Vec<String>| {
        if !primary_key.is_empty() {
            return Err(Error::Syntax(format!(
                "multiple primary keys for table \"{name}\" are not allowed"
            )));
        }
        primary_key = key;
        Ok(())
    };
    if p.consume_token(&Token::LParen) && !p.consume_token(&Token::RParen) {
        loop {
            if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
                p.expect_token(&Token::LParen)?;
                let mut key = Vec::new();
                loop {
                    key.push(normalize_ident(&p.parse_identifier()?));
                    if p.consume_token(&Token::RParen) {
                        break;
                    }
                    p.expect_token(&Token::Comma)?;
                }
                set_key(key)?;
            } else {
                let (column, primary_key) = parse_column(p)?;
                if primary_key {
                    set_key(vec![column.name.clone()])?;
                }
                columns.push(column);
            }
            if p.consume_token(&Token::RParen) {
                break;
            }
            p.expect_token(&Token::Comma)?;
        }
    }
    let options = parse_with_options(p)?.unwrap_or_default();
    let query = if p.parse_keyword(Keyword::AS) {
        Some(p.parse_query()?.to_string())
    } else {
        None
    };
    Ok(CreateTable {
        name,
        if_not_exists,
        columns,
        primary_key,
        options,
        query,
    })
}

/// `WITH (key = value, ...)`, if present. Keys may be dotted or quoted; values are string
/// literals, numbers, booleans or bare words.
fn parse_with_options(p: &mut Parser) -> Result<Option<Options>> {
    if !p.parse_keyword(Keyword::WITH) {
        return Ok(None);
    }
    parse_option_list(p).map(Some)
}

/// `(key = value, ...)`.
fn parse_option_list(p: &mut Parser) -> Result<Options> {
    p.expect_token(&Token::LParen)?;
    let mut pairs = Vec::new();
    if p.consume_token(&Token::RParen) {
        return Ok(Options::default());
    }
    loop {
        let mut key = option_atom(p, true)?;
        while p.consume_token(&Token::Period) {
            key.push('.');
            key.push_str(&option_atom(p, true)?);
        }
        p.expect_token(&Token::Eq)?;
        let value = option_atom(p, false)?;
        pairs.push((key.to_ascii_lowercase(), value));
        if p.consume_token(&Token::RParen) {
            break;
        }
        p.expect_token(&Token::Comma)?;
    }
    Options::try_from_pairs(pairs)
}

fn option_atom(p: &mut Parser, is_key: bool) -> Result<String> {
    let t = p.next_token();
    match t.token {
        Token::Word(w) => Ok(w.value),
        Token::SingleQuotedString(s) => Ok(s),
        Token::Number(n, _) if !is_key => Ok(n),
        Token::Minus if !is_key => match p.next_token().token {
            Token::Number(n, _) => Ok(format!("-{n}")),
            other => Err(Error::Syntax(format!("expected a number, found {other}"))),
        },
        other => Err(Error::Syntax(format!(
            "expected an option {}, found {other}",
            if is_key { "name" } else { "value" }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_comments_are_skipped() {
        assert_eq!(
            without_leading_comments("  -- a\n /* b /* nested */ c */\n UPDATE t SET a = 1"),
            "UPDATE t SET a = 1"
        );
        assert_eq!(without_leading_comments("/* open"), "/* open");
        assert!(matches!(
            parse_tidemark("/* {\"app\": \"dbt\"} */ update \"tidemark\".\"public\".\"t\" set a = 1"),
            Ok(TidemarkStatement::Update { ref table, .. }) if table == "t"
        ));
    }

    #[test]
    fn parses_create_stream_with_watermark() {
        let s = parse_tidemark(
            "CREATE STREAM IF NOT EXISTS Clicks (user_id TEXT, event_time TIMESTAMP, \
             duration_s DOUBLE PRECISION, \
             WATERMARK FOR event_time AS event_time - INTERVAL '10 minutes') \
             WITH (connector = 'file', format = 'json', path = '/tmp/x', max_files_per_trigger = 10)",
        )
        .unwrap();
        let TidemarkStatement::CreateStream(cs) = s else {
            panic!("not a stream")
        };
        assert_eq!(cs.name, "clicks");
        assert!(cs.if_not_exists);
        assert_eq!(cs.columns.len(), 3);
        assert_eq!(cs.columns[2].data_type, DataType::Float64);
        assert_eq!(
            cs.watermark,
            Some(WatermarkSpec {
                column: "event_time".into(),
                delay_us: 600_000_000
            })
        );
        assert_eq!(cs.options.get("max_files_per_trigger"), Some("10"));
    }

    #[test]
    fn names_may_be_qualified_with_public_and_any_database() {
        for sql in [
            "DROP SINK s",
            "DROP SINK public.s",
            "DROP SINK PUBLIC.s",
            "DROP SINK \"analytics\".\"public\".\"s\"",
        ] {
            let Ok(TidemarkStatement::DropSink { name, .. }) = parse_tidemark(sql) else {
                panic!("{sql}")
            };
            assert_eq!(name, "s", "{sql}");
        }
        let e = parse_tidemark("DROP SINK staging.s").unwrap_err();
        assert_eq!(e.sqlstate().code(), "3F000");
        assert_eq!(e.to_string(), "schema \"staging\" does not exist");
        let e = parse_tidemark("DROP SINK a.b.c.d").unwrap_err();
        assert_eq!(e.sqlstate().code(), "42601");
    }

    #[test]
    fn parses_create_sink_with_options_before_as() {
        let s = parse_tidemark(
            "CREATE SINK s WITH (connector = 'delta', trigger = 'available_now') \
             AS SELECT upper(page) AS p FROM clicks WHERE duration_s > 1",
        )
        .unwrap();
        let TidemarkStatement::CreateSink(cs) = s else {
            panic!("not a sink")
        };
        assert_eq!(cs.name, "s");
        assert_eq!(cs.options.get("trigger"), Some("available_now"));
        assert_eq!(
            cs.query,
            "SELECT upper(page) AS p FROM clicks WHERE duration_s > 1"
        );
    }

    #[test]
    fn parses_small_statements() {
        assert_eq!(
            parse_tidemark("DROP SINK IF EXISTS \"MySink\"").unwrap(),
            TidemarkStatement::DropSink {
                name: "MySink".into(),
                if_exists: true,
                kind: QueryKind::Sink,
                purge: false,
            }
        );
        assert!(matches!(
            parse_tidemark("DROP SINK s PURGE").unwrap(),
            TidemarkStatement::DropSink { purge: true, .. }
        ));
        assert_eq!(
            parse_tidemark("drop materialized view v").unwrap(),
            TidemarkStatement::DropSink {
                name: "v".into(),
                if_exists: false,
                kind: QueryKind::MaterializedView,
                purge: false,
            }
        );
        assert_eq!(
            parse_tidemark("SHOW MATERIALIZED VIEWS").unwrap(),
            TidemarkStatement::ShowViews
        );
        assert_eq!(
            parse_tidemark("STOP MATERIALIZED VIEW v").unwrap(),
            TidemarkStatement::StopSink {
                name: "v".into(),
                kind: QueryKind::MaterializedView,
            }
        );
        let TidemarkStatement::CreateSink(cs) = parse_tidemark(
            "CREATE MATERIALIZED VIEW IF NOT EXISTS v WITH (output_mode = 'complete') \
             AS SELECT page, count(*) AS n FROM clicks GROUP BY page",
        )
        .unwrap() else {
            panic!("not a view")
        };
        assert_eq!(
            (cs.kind, cs.name.as_str(), cs.if_not_exists),
            (QueryKind::MaterializedView, "v", true)
        );
        assert!(matches!(
            parse_tidemark("EXPLAIN CREATE MATERIALIZED VIEW v AS SELECT 1").unwrap(),
            TidemarkStatement::ExplainCreateSink(CreateSink {
                kind: QueryKind::MaterializedView,
                ..
            })
        ));
        assert_eq!(
            parse_tidemark("show queries;").unwrap(),
            TidemarkStatement::ShowQueries
        );
        assert_eq!(
            parse_tidemark("SHOW OPTIONS").unwrap(),
            TidemarkStatement::ShowOptions
        );
        assert_eq!(
            parse_tidemark("OPTIMIZE a").unwrap(),
            TidemarkStatement::Optimize {
                name: "a".into(),
                zorder: vec![]
            }
        );
        assert_eq!(
            parse_tidemark("optimize \"A\" zorder by (Page, \"X\")").unwrap(),
            TidemarkStatement::Optimize {
                name: "A".into(),
                zorder: vec!["page".into(), "X".into()]
            }
        );
        assert_eq!(
            parse_tidemark("OPTIMIZE a ZORDER BY b, c").unwrap(),
            TidemarkStatement::Optimize {
                name: "a".into(),
                zorder: vec!["b".into(), "c".into()]
            }
        );
        assert!(parse_tidemark("OPTIMIZE a ZORDER BY").is_err());
        assert!(parse_tidemark("OPTIMIZE a ZORDER (b)").is_err());
        assert_eq!(
            parse_tidemark("FLUSH SINK a").unwrap(),
            TidemarkStatement::Flush {
                sink: Some("a".into())
            }
        );
    }

    #[test]
    fn rejects_bad_statements_with_syntax_errors() {
        for sql in [
            "CREATE SINK s WITH (a = 1)",
            "CREATE STREAM s (a INT",
            "DROP SINK a b",
            "CREATE STREAM s WITH (a = 1, a = 2)",
            "CREATE MATERIALIZED v AS SELECT 1",
            "SHOW MATERIALIZED VIEW",
        ] {
            let e = parse_tidemark(sql).unwrap_err();
            assert!(
                matches!(e.sqlstate().code(), "42601" | "22023"),
                "{sql}: {e}"
            );
        }
    }

    #[test]
    fn parses_watermark_option() {
        assert_eq!(
            parse_watermark_option("event_time - 10 minutes").unwrap(),
            WatermarkSpec {
                column: "event_time".into(),
                delay_us: 600_000_000
            }
        );
        assert!(parse_watermark_option("a b - 1 minute").is_err());
    }
}
