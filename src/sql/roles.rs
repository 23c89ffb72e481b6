//! Role statements, as Postgres spells them:
//!
//! ```text
//! CREATE ROLE|USER [IF NOT EXISTS] name [[WITH] option ...]
//! ALTER ROLE|USER name [WITH] option ...
//! DROP ROLE|USER [IF EXISTS] name [, ...]
//! GRANT role [, ...] TO name [, ...]
//! REVOKE role [, ...] FROM name [, ...]
//!
//! option: SUPERUSER | NOSUPERUSER | LOGIN | NOLOGIN | PASSWORD 'text' | PASSWORD NULL
//! ```
//!
//! `CREATE USER` is `CREATE ROLE … LOGIN`. Other options Postgres knows (`CREATEDB`,
//! `INHERIT`, `VALID UNTIL`, …) are refused with 0A000 rather than ignored.

use datafusion::sql::sqlparser::ast::{
    AlterRoleOperation, Expr, ObjectType, Password, RoleOption, Statement, Value,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use super::TidemarkStatement;
use crate::error::{Error, Result};

/// What `CREATE ROLE` or `ALTER ROLE` sets; `None` leaves a setting as it is (or at its
/// default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoleOptions {
    pub superuser: Option<bool>,
    pub login: Option<bool>,
    /// `PASSWORD 'text'` (`Some(Some)`) or `PASSWORD NULL` (`Some(None)`).
    pub password: Option<Option<String>>,
}

/// Whether the statement's leading words make it a role statement.
pub fn is_role_statement(words: &[String]) -> bool {
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    match w(0) {
        "CREATE" | "ALTER" | "DROP" => matches!(w(1), "ROLE" | "USER"),
        "GRANT" | "REVOKE" => true,
        _ => false,
    }
}

/// Parses a role statement, or `None` if `sql` is not one.
pub fn parse(sql: &str) -> Option<Result<TidemarkStatement>> {
    let mut words = sql.split_whitespace().map(|w| w.to_ascii_uppercase());
    let first = words.next()?;
    let second = words.next().unwrap_or_default();
    match first.as_str() {
        "GRANT" | "REVOKE" => Some(parse_grant(sql, first == "REVOKE")),
        "CREATE" | "ALTER" | "DROP" if matches!(second.as_str(), "ROLE" | "USER") => {
            Some(parse_with_sqlparser(sql, second == "USER"))
        }
        _ => None,
    }
}

fn parse_with_sqlparser(sql: &str, user: bool) -> Result<TidemarkStatement> {
    // sqlparser reads Postgres's role options after `ROLE`; `USER` is the same statement.
    let text = if user {
        let at = sql.to_ascii_uppercase().find("USER").unwrap_or(0);
        format!("{}ROLE{}", &sql[..at], &sql[at + 4..])
    } else {
        sql.to_string()
    };
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, &text)?;
    let [statement] = statements.as_slice() else {
        return Err(Error::Syntax("expected one statement".into()));
    };
    match statement {
        Statement::CreateRole(c) => {
            let [name] = c.names.as_slice() else {
                return Err(Error::Syntax("CREATE ROLE names one role".into()));
            };
            let unsupported = [
                (c.inherit.is_some(), "INHERIT"),
                (c.bypassrls.is_some(), "BYPASSRLS"),
                (c.create_db.is_some(), "CREATEDB"),
                (c.create_role.is_some(), "CREATEROLE"),
                (c.replication.is_some(), "REPLICATION"),
                (c.connection_limit.is_some(), "CONNECTION LIMIT"),
                (c.valid_until.is_some(), "VALID UNTIL"),
                (!c.in_role.is_empty() || !c.in_group.is_empty(), "IN ROLE"),
                (!c.role.is_empty() || !c.user.is_empty(), "ROLE"),
                (!c.admin.is_empty(), "ADMIN"),
            ];
            if let Some((_, what)) = unsupported.iter().find(|(set, _)| *set) {
                return Err(unsupported_option(what));
            }
            let password = match &c.password {
                None => None,
                Some(p) => Some(password_text(p)?),
            };
            Ok(TidemarkStatement::CreateRole {
                name: role_name(&name.to_string()),
                if_not_exists: c.if_not_exists,
                options: RoleOptions {
                    superuser: c.superuser,
                    login: c.login.or(user.then_some(true)),
                    password,
                },
            })
        }
        Statement::AlterRole { name, operation } => {
            let AlterRoleOperation::WithOptions { options } = operation else {
                return Err(Error::unsupported(
                    "ALTER ROLE supports only role options (SUPERUSER, LOGIN, PASSWORD)",
                ));
            };
            let mut set = RoleOptions::default();
            for option in options {
                match option {
                    RoleOption::SuperUser(b) => set.superuser = Some(*b),
                    RoleOption::Login(b) => set.login = Some(*b),
                    RoleOption::Password(p) => set.password = Some(password_text(p)?),
                    other => {
                        let text = other.to_string();
                        let word = text.split_whitespace().next().unwrap_or("");
                        return Err(unsupported_option(word));
                    }
                }
            }
            Ok(TidemarkStatement::AlterRole {
                name: name.value.clone(),
                options: set,
            })
        }
        Statement::Drop {
            object_type: ObjectType::Role | ObjectType::User,
            if_exists,
            names,
            ..
        } => Ok(TidemarkStatement::DropRole {
            names: names.iter().map(|n| role_name(&n.to_string())).collect(),
            if_exists: *if_exists,
        }),
        _ => Err(Error::Syntax(format!(
            "syntax error in \"{}\"",
            sql.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        ))),
    }
}

/// A role name as written: unquoted names fold to lower case, as in Postgres.
fn role_name(written: &str) -> String {
    match written.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\"\"", "\""),
        None => written.to_lowercase(),
    }
}

fn unsupported_option(what: &str) -> Error {
    Error::Unsupported {
        message: format!("role option {what} is not supported"),
        hint: Some(
            "Tidemark's roles have SUPERUSER, LOGIN and PASSWORD; grant pg_read_all_data or \
             pg_write_all_data for reading or writing."
                .into(),
        ),
    }
}

fn password_text(p: &Password) -> Result<Option<String>> {
    match p {
        Password::NullPassword => Ok(None),
        Password::Password(Expr::Value(v)) => match &v.value {
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => Ok(Some(s.clone())),
            Value::Null => Ok(None),
            _ => Err(Error::Syntax("PASSWORD takes a string".into())),
        },
        Password::Password(_) => Err(Error::Syntax("PASSWORD takes a string".into())),
    }
}

/// `GRANT role [, ...] TO name [, ...]` or `REVOKE role [, ...] FROM name [, ...]`.
fn parse_grant(sql: &str, revoke: bool) -> Result<TidemarkStatement> {
    let dialect = PostgreSqlDialect {};
    let on_objects = Tokenizer::new(&dialect, sql)
        .tokenize()
        .unwrap_or_default()
        .iter()
        .any(|t| matches!(t, Token::Word(w) if w.keyword == Keyword::ON));
    let mut p = Parser::new(&dialect).try_with_sql(sql)?;
    p.next_token(); // GRANT or REVOKE
    if on_objects {
        return Err(Error::Unsupported {
            message: format!(
                "{} ... ON is not supported",
                if revoke { "REVOKE" } else { "GRANT" }
            ),
            hint: Some(
                "Grant a predefined role: GRANT pg_read_all_data TO name (SELECT), \
                 GRANT pg_write_all_data TO name (INSERT, COPY, UPDATE, DELETE, MERGE)."
                    .into(),
            ),
        });
    }
    let roles = p.parse_comma_separated(|p| p.parse_identifier())?;
    let joiner = if revoke { Keyword::FROM } else { Keyword::TO };
    p.expect_keyword(joiner)?;
    let members = p.parse_comma_separated(|p| p.parse_identifier())?;
    while p.consume_token(&Token::SemiColon) {}
    let next = p.peek_token();
    if next.token != Token::EOF {
        return Err(Error::ParseError {
            message: format!("syntax error at or near \"{}\"", next.token),
            hint: None,
        });
    }
    let name = |i: &datafusion::sql::sqlparser::ast::Ident| match i.quote_style {
        Some(_) => i.value.clone(),
        None => i.value.to_lowercase(),
    };
    Ok(TidemarkStatement::GrantRole {
        roles: roles.iter().map(name).collect(),
        members: members.iter().map(name).collect(),
        revoke,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(sql: &str) -> TidemarkStatement {
        parse(sql).expect("a role statement").expect("parses")
    }

    #[test]
    fn create_role_and_user() {
        assert_eq!(
            parsed("CREATE ROLE Ann WITH LOGIN PASSWORD 'pw'"),
            TidemarkStatement::CreateRole {
                name: "ann".into(),
                if_not_exists: false,
                options: RoleOptions {
                    superuser: None,
                    login: Some(true),
                    password: Some(Some("pw".into())),
                },
            }
        );
        assert_eq!(
            parsed("create user \"Bob\" superuser password 'x'"),
            TidemarkStatement::CreateRole {
                name: "Bob".into(),
                if_not_exists: false,
                options: RoleOptions {
                    superuser: Some(true),
                    login: Some(true),
                    password: Some(Some("x".into())),
                },
            }
        );
        assert!(matches!(
            parse("CREATE ROLE r CREATEDB"),
            Some(Err(Error::Unsupported { .. }))
        ));
    }

    #[test]
    fn alter_drop_grant_revoke() {
        assert_eq!(
            parsed("ALTER ROLE ann WITH NOLOGIN PASSWORD NULL"),
            TidemarkStatement::AlterRole {
                name: "ann".into(),
                options: RoleOptions {
                    superuser: None,
                    login: Some(false),
                    password: Some(None),
                },
            }
        );
        assert_eq!(
            parsed("DROP USER IF EXISTS a, B"),
            TidemarkStatement::DropRole {
                names: vec!["a".into(), "b".into()],
                if_exists: true,
            }
        );
        assert_eq!(
            parsed("GRANT pg_read_all_data TO ann, bob;"),
            TidemarkStatement::GrantRole {
                roles: vec!["pg_read_all_data".into()],
                members: vec!["ann".into(), "bob".into()],
                revoke: false,
            }
        );
        assert_eq!(
            parsed("REVOKE pg_read_all_data FROM ann"),
            TidemarkStatement::GrantRole {
                roles: vec!["pg_read_all_data".into()],
                members: vec!["ann".into()],
                revoke: true,
            }
        );
        assert!(matches!(
            parse("GRANT SELECT ON t TO ann"),
            Some(Err(Error::Unsupported { .. }))
        ));
        assert!(parse("CREATE STREAM s").is_none());
    }
}
