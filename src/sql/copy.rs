//! `COPY name [(columns)] FROM STDIN [WITH] (options)`: Postgres's statement, both its
//! option syntaxes, parsed into [`CopyFrom`]. The data itself is decoded by
//! `crate::format::copy`.

use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Statement,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::error::{Error, Result};

/// A `COPY ... FROM STDIN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFrom {
    pub table: String,
    /// The column list, if given.
    pub columns: Option<Vec<String>>,
    pub options: CopyOptions,
}

/// `FORMAT text`, `FORMAT csv` or `FORMAT binary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFormat {
    Text,
    Csv,
    /// Postgres's binary tuples (what asyncpg's `copy_records_to_table` sends).
    Binary,
}

/// The options of a `COPY ... FROM STDIN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOptions {
    pub format: CopyFormat,
    pub delimiter: u8,
    /// The text of a NULL: `\N` for text, the empty unquoted field for CSV.
    pub null: String,
    pub header: bool,
    pub quote: u8,
    pub escape: u8,
}

impl CopyOptions {
    pub fn text() -> CopyOptions {
        CopyOptions {
            format: CopyFormat::Text,
            delimiter: b'\t',
            null: "\\N".into(),
            header: false,
            quote: b'"',
            escape: b'"',
        }
    }

    pub fn csv() -> CopyOptions {
        CopyOptions {
            format: CopyFormat::Csv,
            delimiter: b',',
            null: String::new(),
            header: false,
            quote: b'"',
            escape: b'"',
        }
    }
}

fn one_byte(c: char, what: &str) -> Result<u8> {
    if c.is_ascii() {
        Ok(c as u8)
    } else {
        Err(Error::invalid_option(format!(
            "COPY {what} must be a single one-byte character"
        )))
    }
}

/// Parses a `COPY ... FROM STDIN` statement.
pub fn parse_copy_from(sql: &str) -> Result<CopyFrom> {
    let stmts = Parser::parse_sql(&PostgreSqlDialect {}, sql)?;
    let Some(Statement::Copy {
        source,
        to: false,
        target: CopyTarget::Stdin,
        options,
        legacy_options,
        ..
    }) = stmts.into_iter().next()
    else {
        return Err(Error::unsupported(
            "only COPY <stream> FROM STDIN is supported here",
        ));
    };
    let CopySource::Table {
        table_name,
        columns,
    } = source
    else {
        return Err(Error::unsupported("COPY (query) FROM is not valid"));
    };
    let table = table_name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(super::parser::normalize_ident)
        .ok_or_else(|| Error::Syntax("COPY needs a table name".into()))?;
    let columns =
        (!columns.is_empty()).then(|| columns.iter().map(super::parser::normalize_ident).collect());
    // FORMAT decides the defaults of the other options, wherever it is written.
    let csv = options
        .iter()
        .any(|o| matches!(o, CopyOption::Format(f) if f.value.eq_ignore_ascii_case("csv")))
        || legacy_options
            .iter()
            .any(|o| matches!(o, CopyLegacyOption::Csv(_)));
    let mut o = if csv {
        CopyOptions::csv()
    } else {
        CopyOptions::text()
    };
    let mut quote_set = false;
    let mut escape_set = false;
    // Options that mean nothing to binary data, as Postgres refuses them.
    let mut text_only: Option<&'static str> = None;
    for opt in options {
        match &opt {
            CopyOption::Delimiter(_) => text_only = text_only.or(Some("DELIMITER")),
            CopyOption::Null(_) => text_only = text_only.or(Some("NULL")),
            CopyOption::Header(_) => text_only = text_only.or(Some("HEADER")),
            CopyOption::Quote(_) => text_only = text_only.or(Some("QUOTE")),
            CopyOption::Escape(_) => text_only = text_only.or(Some("ESCAPE")),
            _ => {}
        }
        match opt {
            CopyOption::Format(f) => match f.value.to_ascii_lowercase().as_str() {
                "csv" | "text" => {}
                "binary" => o.format = CopyFormat::Binary,
                other => {
                    return Err(Error::invalid_option(format!(
                        "COPY format \"{other}\" not recognized"
                    )));
                }
            },
            CopyOption::Delimiter(c) => o.delimiter = one_byte(c, "delimiter")?,
            CopyOption::Null(s) => o.null = s,
            CopyOption::Header(h) => o.header = h,
            CopyOption::Quote(c) => {
                o.quote = one_byte(c, "quote")?;
                quote_set = true;
            }
            CopyOption::Escape(c) => {
                o.escape = one_byte(c, "escape")?;
                escape_set = true;
            }
            CopyOption::Encoding(e)
                if e.eq_ignore_ascii_case("utf8") || e.eq_ignore_ascii_case("utf-8") => {}
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )));
            }
        }
    }
    for opt in legacy_options {
        match opt {
            CopyLegacyOption::Csv(csv_opts) => {
                for c in csv_opts {
                    match c {
                        CopyLegacyCsvOption::Header => o.header = true,
                        CopyLegacyCsvOption::Quote(q) => {
                            o.quote = one_byte(q, "quote")?;
                            quote_set = true;
                        }
                        CopyLegacyCsvOption::Escape(e) => {
                            o.escape = one_byte(e, "escape")?;
                            escape_set = true;
                        }
                        other => {
                            return Err(Error::unsupported(format!(
                                "COPY option {other} is not supported"
                            )));
                        }
                    }
                }
            }
            CopyLegacyOption::Delimiter(c) => o.delimiter = one_byte(c, "delimiter")?,
            CopyLegacyOption::Null(s) => o.null = s,
            CopyLegacyOption::Header => o.header = true,
            CopyLegacyOption::Binary => o.format = CopyFormat::Binary,
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )));
            }
        }
    }
    if quote_set && !escape_set {
        o.escape = o.quote;
    }
    if o.format == CopyFormat::Binary
        && let Some(what) = text_only.or(o.header.then_some("HEADER"))
    {
        return Err(Error::Syntax(format!(
            "cannot specify {what} in BINARY mode"
        )));
    }
    if o.format == CopyFormat::Text && o.header {
        return Err(Error::invalid_option(
            "COPY HEADER available only in CSV mode",
        ));
    }
    Ok(CopyFrom {
        table,
        columns,
        options: o,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_option_syntaxes_as_psql_sends_them() {
        let c = parse_copy_from("COPY events FROM STDIN").unwrap();
        assert_eq!(c.table, "events");
        assert_eq!(c.options, CopyOptions::text());
        let c = parse_copy_from(
            "COPY Events (id, \"Ts\") FROM STDIN WITH (FORMAT csv, HEADER true, DELIMITER ';', NULL 'NA')",
        )
        .unwrap();
        assert_eq!(c.table, "events");
        assert_eq!(c.columns, Some(vec!["id".to_string(), "Ts".to_string()]));
        assert_eq!(c.options.format, CopyFormat::Csv);
        assert!(c.options.header);
        assert_eq!(c.options.delimiter, b';');
        assert_eq!(c.options.null, "NA");
        let c = parse_copy_from("COPY events FROM STDIN WITH CSV HEADER").unwrap();
        assert_eq!(c.options.format, CopyFormat::Csv);
        assert!(c.options.header);
        let c =
            parse_copy_from("COPY \"events\"(\"id\", \"v\") FROM STDIN (FORMAT binary)").unwrap();
        assert_eq!(c.options.format, CopyFormat::Binary);
        assert_eq!(c.columns, Some(vec!["id".to_string(), "v".to_string()]));
        assert_eq!(
            parse_copy_from("COPY events FROM STDIN BINARY")
                .unwrap()
                .options
                .format,
            CopyFormat::Binary
        );
        assert!(parse_copy_from("COPY events FROM STDIN (FORMAT binary, DELIMITER ',')").is_err());
        assert!(parse_copy_from("COPY events FROM STDIN (HEADER)").is_err());
    }
}
