//! DataFusion's and Arrow's errors in Postgres's words.
//!
//! Clients and people read errors the way Postgres writes them: `division by zero`,
//! `relation "nope" does not exist`, `invalid input syntax for type integer: "abc"`, with
//! Postgres's SQLSTATE. DataFusion says `Arrow error: Divide by zero error` and
//! `table 'datafusion.public.nope' not found`. This module recognises the errors people
//! meet every day and words them as Postgres does; others keep DataFusion's message
//! (without its prefixes) and get a SQLSTATE by their kind. Pure: a function of the error.

use datafusion::arrow::error::ArrowError;
use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;

use super::SqlState;

/// An error as Postgres would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worded {
    pub state: SqlState,
    pub message: String,
    pub hint: Option<String>,
}

impl Worded {
    fn new(state: SqlState, message: impl Into<String>) -> Worded {
        Worded {
            state,
            message: message.into(),
            hint: None,
        }
    }

    fn with_hint(mut self, hint: &str) -> Worded {
        self.hint = Some(hint.into());
        self
    }
}

const NO_FUNCTION_HINT: &str = "No function matches the given name and argument types. You might need to add explicit type casts.";
const NO_OPERATOR_HINT: &str = "No operator matches the given name and argument types. You might need to add explicit type casts.";

/// `e` in Postgres's words, or `None` when it is not one this module knows.
pub fn reword(e: &DataFusionError) -> Option<Worded> {
    let root = e.find_root();
    match root {
        DataFusionError::SchemaError(err, _) => reword_schema(err),
        DataFusionError::SQL(err, _) => {
            let (message, hint) = reword_syntax(&err.to_string());
            Some(Worded {
                state: SqlState::SyntaxError,
                message,
                hint,
            })
        }
        DataFusionError::ArrowError(err, _) => reword_arrow(err),
        DataFusionError::Plan(m) | DataFusionError::Execution(m) | DataFusionError::Internal(m) => {
            reword_text(m)
        }
        // A function's own failure arrives wrapped ("Compute error: ...", an external
        // error): its text is what can be recognised.
        DataFusionError::External(_) | DataFusionError::Context(..) => {
            reword_text(&root.to_string())
        }
        _ => None,
    }
}

fn reword_schema(err: &SchemaError) -> Option<Worded> {
    Some(match err {
        SchemaError::FieldNotFound { field, .. } => Worded::new(
            SqlState::UndefinedColumn,
            match &field.relation {
                // Postgres does not quote a qualified name here: `column t.b does not exist`.
                Some(r) => format!("column {}.{} does not exist", r, field.name),
                None => format!("column \"{}\" does not exist", field.name),
            },
        ),
        SchemaError::AmbiguousReference { field } => Worded::new(
            SqlState::AmbiguousColumn,
            format!("column reference \"{}\" is ambiguous", field.name),
        ),
        SchemaError::DuplicateQualifiedField { name, .. }
        | SchemaError::DuplicateUnqualifiedField { name } => Worded::new(
            SqlState::DuplicateColumn,
            format!("column \"{name}\" specified more than once"),
        ),
    })
}

fn reword_arrow(err: &ArrowError) -> Option<Worded> {
    match err {
        ArrowError::DivideByZero => Some(Worded::new(SqlState::DivisionByZero, "division by zero")),
        ArrowError::CastError(m) | ArrowError::ParseError(m) => reword_cast(m),
        ArrowError::ComputeError(m) | ArrowError::InvalidArgumentError(m) => reword_text(m),
        _ => None,
    }
}

/// Arrow's cast failures: `Cannot cast string 'abc' to value of Int32 type`, `Can't cast
/// value 1e20 to type Int64`.
fn reword_cast(m: &str) -> Option<Worded> {
    if let Some(rest) = m.strip_prefix("Cannot cast string '") {
        let (value, rest) = rest.rsplit_once("' to value of ")?;
        let arrow = rest.strip_suffix(" type")?;
        let ty = input_type_name(pg_type_name(arrow)?);
        let state = if is_datetime(ty) {
            SqlState::InvalidDatetimeFormat
        } else {
            SqlState::InvalidTextRepresentation
        };
        return Some(Worded::new(
            state,
            format!("invalid input syntax for type {ty}: \"{value}\""),
        ));
    }
    // A string that is no timestamp (an INSERT's value, a cast): Postgres names the type
    // `timestamp` (`timestamp with time zone` too says so only when it knows).
    if let Some(rest) = m.strip_prefix("Error parsing timestamp from '") {
        let (value, _) = rest.split_once("': ").or_else(|| rest.rsplit_once('\''))?;
        return Some(Worded::new(
            SqlState::InvalidDatetimeFormat,
            format!("invalid input syntax for type timestamp: \"{value}\""),
        ));
    }
    if let Some(rest) = m.strip_prefix("Can't cast value ") {
        let (_, arrow) = rest.rsplit_once(" to type ")?;
        let ty = pg_type_name(arrow)?;
        return Some(Worded::new(
            SqlState::NumericValueOutOfRange,
            format!("{ty} out of range"),
        ));
    }
    None
}

/// A sqlparser error's text in Postgres's words: `syntax error at or near "x"` or
/// `syntax error at end of input`, with what the parser expected (and where) as the hint.
/// Texts of another shape keep their words, without sqlparser's prefix.
pub fn reword_syntax(text: &str) -> (String, Option<String>) {
    let text = text.strip_prefix("sql parser error: ").unwrap_or(text);
    let text = text.strip_prefix("sql tokenizer error: ").unwrap_or(text);
    let (body, location) = match text.rfind(" at Line: ") {
        Some(at) => (
            &text[..at],
            Some(
                text[at + 4..]
                    .replace("Line: ", "line ")
                    .replace("Column: ", "column "),
            ),
        ),
        None => (text, None),
    };
    let Some(rest) = body.strip_prefix("Expected: ") else {
        return (text.to_string(), None);
    };
    let (expected, found) = rest.rsplit_once(", found: ").unwrap_or((rest, ""));
    let message = match found {
        "EOF" | "" => "syntax error at end of input".to_string(),
        token => format!("syntax error at or near \"{token}\""),
    };
    let hint = match location {
        Some(at) => format!("Expected {expected} ({at})."),
        None => format!("Expected {expected}."),
    };
    (message, Some(hint))
}

/// The type's name as Postgres's input functions write it in their errors: `timestamp`
/// and `time`, not their long names.
fn input_type_name(ty: &'static str) -> &'static str {
    match ty {
        "timestamp without time zone" => "timestamp",
        "time without time zone" => "time",
        other => other,
    }
}

/// The messages DataFusion and its functions write as text.
fn reword_text(m: &str) -> Option<Worded> {
    // `abs` of the smallest integer: `Int64Array overflow on abs(-9223372036854775808)`.
    if let Some((array, _)) = m.split_once("Array overflow on abs(")
        && let Some(ty) = pg_type_name(array.trim())
    {
        return Some(Worded::new(
            SqlState::NumericValueOutOfRange,
            format!("{ty} out of range"),
        ));
    }
    if m.contains("Divide by zero") || m.contains("division by zero") {
        return Some(Worded::new(SqlState::DivisionByZero, "division by zero"));
    }
    if let Some(rest) = m.strip_prefix("table '")
        && let Some(name) = rest.strip_suffix("' not found")
    {
        return Some(Worded::new(
            SqlState::UndefinedTable,
            format!("relation \"{}\" does not exist", relation_as_written(name)),
        ));
    }
    // `DROP VIEW` of no view: `View 'v' doesn't exist.`
    if let Some(rest) = m.strip_prefix("View '")
        && let Some(name) = rest.strip_suffix("' doesn't exist.")
    {
        return Some(Worded::new(
            SqlState::UndefinedTable,
            format!("view \"{}\" does not exist", relation_as_written(name)),
        ));
    }
    // `CREATE VIEW` of a name in use: `Table 'v' already exists`.
    if let Some(rest) = m.strip_prefix("Table '")
        && let Some(name) = rest.strip_suffix("' already exists")
    {
        return Some(Worded::new(
            SqlState::DuplicateTable,
            format!("relation \"{}\" already exists", relation_as_written(name)),
        ));
    }
    // A call whose arguments no signature takes; DataFusion names the call with Arrow types.
    if let Some(at) = m.find("No function matches the given name and argument types '") {
        let rest = &m[at + "No function matches the given name and argument types '".len()..];
        let call = rest.split_once("'.").map_or(rest, |(c, _)| c);
        return Some(
            Worded::new(
                SqlState::UndefinedFunction,
                format!("function {} does not exist", pg_call(call)),
            )
            .with_hint(NO_FUNCTION_HINT),
        );
    }
    if let Some(rest) = m.strip_prefix("Invalid function '") {
        let name = rest.split_once('\'').map_or(rest, |(n, _)| n);
        return Some(
            Worded::new(
                SqlState::UndefinedFunction,
                format!("function {name} does not exist"),
            )
            .with_hint(NO_FUNCTION_HINT),
        );
    }
    // An operator no signature takes: `Boolean + Int64`.
    let operands = m
        .strip_prefix("Cannot coerce arithmetic expression ")
        .and_then(|rest| rest.strip_suffix(" to valid types"))
        .or_else(|| m.strip_prefix("Cannot infer common argument type for comparison operation "));
    if let Some(op) = operands.and_then(pg_operator) {
        return Some(
            Worded::new(
                SqlState::UndefinedFunction,
                format!("operator does not exist: {op}"),
            )
            .with_hint(NO_OPERATOR_HINT),
        );
    }
    if m.starts_with("Cannot create filter with non-boolean predicate ")
        && let Some((_, arrow)) = m.rsplit_once(" returning ")
    {
        let ty = pg_type_name(arrow).unwrap_or(arrow);
        return Some(Worded::new(
            SqlState::DatatypeMismatch,
            format!("argument of WHERE must be type boolean, not type {ty}"),
        ));
    }
    // A field of something that has none: `text_column.'x'`.
    if m.starts_with("Cannot access field at argument") {
        return Some(Worded::new(
            SqlState::WrongObjectType,
            strip_sentence_end(m).to_string(),
        ));
    }
    // `SELECT $1` run without a value for it (the simple protocol has none).
    if let Some(rest) = m.strip_prefix("Placeholder '")
        && let Some((name, _)) = rest.split_once("' was not provided a value")
    {
        return Some(Worded::new(
            SqlState::UndefinedParameter,
            format!("there is no parameter {name}"),
        ));
    }
    if m.starts_with("LIMIT must be >=") {
        return Some(Worded::new(
            SqlState::InvalidRowCountInLimitClause,
            "LIMIT must not be negative",
        ));
    }
    if m.starts_with("OFFSET must be >=") {
        return Some(Worded::new(
            SqlState::InvalidRowCountInResultOffsetClause,
            "OFFSET must not be negative",
        ));
    }
    if m.contains("cannot take square root of a negative number") {
        return Some(Worded::new(
            SqlState::InvalidArgumentForPowerFunction,
            "cannot take square root of a negative number",
        ));
    }
    None
}

fn strip_sentence_end(m: &str) -> &str {
    m.strip_suffix('.').unwrap_or(m)
}

/// A table name as the user most likely wrote it: DataFusion resolves `nope` to
/// `datafusion.public.nope`, and Postgres names the relation as written.
fn relation_as_written(resolved: &str) -> &str {
    let name = resolved.strip_prefix("datafusion.").unwrap_or(resolved);
    name.strip_prefix("public.").unwrap_or(name)
}

/// `f(Int64, Utf8)` as Postgres writes a call's signature: `f(bigint, text)`.
fn pg_call(call: &str) -> String {
    let Some((name, args)) = call.split_once('(') else {
        return call.to_string();
    };
    let args = args.strip_suffix(')').unwrap_or(args);
    let args: Vec<&str> = if args.trim().is_empty() {
        vec![]
    } else {
        split_types(args)
            .into_iter()
            .map(|a| pg_type_name(a.trim()).unwrap_or(a.trim()))
            .collect()
    };
    format!("{name}({})", args.join(", "))
}

/// Splits `Int64, Timestamp(ns, "UTC"), Utf8` at the commas outside parentheses.
fn split_types(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[start..]);
    out
}

/// `Boolean + Int64` as `boolean + bigint`; `None` if either side is not a known type.
fn pg_operator(expr: &str) -> Option<String> {
    let mut parts = expr.splitn(3, ' ');
    let (left, op, right) = (parts.next()?, parts.next()?, parts.next()?);
    Some(format!(
        "{} {op} {}",
        pg_type_name(left)?,
        pg_type_name(right)?
    ))
}

fn is_datetime(pg: &str) -> bool {
    pg == "date" || pg == "time" || pg.starts_with("timestamp") || pg.starts_with("time ")
}

/// The Postgres name of an Arrow type as Arrow prints it (`Int32`, `Timestamp(µs)`,
/// `Timestamp(Microsecond, Some("UTC"))`, `Decimal128(10, 2)`).
pub fn pg_type_name(arrow: &str) -> Option<&'static str> {
    let base = arrow.split('(').next().unwrap_or(arrow).trim();
    Some(match base {
        "Int8" | "Int16" | "UInt8" => "smallint",
        "Int32" | "UInt16" => "integer",
        "Int64" | "UInt32" | "UInt64" => "bigint",
        "Float16" | "Float32" => "real",
        "Float64" => "double precision",
        "Utf8" | "LargeUtf8" | "Utf8View" => "text",
        "Boolean" => "boolean",
        "Date32" | "Date64" => "date",
        "Timestamp" => {
            if arrow.contains("Some(") || arrow.contains('"') {
                "timestamp with time zone"
            } else {
                "timestamp without time zone"
            }
        }
        "Time32" | "Time64" => "time without time zone",
        "Decimal32" | "Decimal64" | "Decimal128" | "Decimal256" => "numeric",
        "Binary" | "LargeBinary" | "BinaryView" | "FixedSizeBinary" => "bytea",
        "Interval" | "Duration" => "interval",
        "Null" => "unknown",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::Column;

    fn worded(e: DataFusionError) -> (String, String) {
        let w = reword(&e).expect("reworded");
        (w.state.code().to_string(), w.message)
    }

    fn pair(code: &str, message: &str) -> (String, String) {
        (code.to_string(), message.to_string())
    }

    #[test]
    fn the_everyday_errors_read_as_in_postgres() {
        assert_eq!(
            worded(DataFusionError::ArrowError(
                Box::new(ArrowError::DivideByZero),
                None
            )),
            pair("22012", "division by zero")
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "table 'datafusion.public.nope' not found".into()
            )),
            pair("42P01", "relation \"nope\" does not exist")
        );
        assert_eq!(
            worded(DataFusionError::Execution(
                "Table 'public.v' already exists".into()
            )),
            pair("42P07", "relation \"v\" already exists")
        );
        assert_eq!(
            worded(DataFusionError::Execution("View 'v' doesn't exist.".into())),
            pair("42P01", "view \"v\" does not exist")
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "table 'datafusion.pg_catalog.nope' not found".into()
            )),
            pair("42P01", "relation \"pg_catalog.nope\" does not exist")
        );
        assert_eq!(
            worded(DataFusionError::SchemaError(
                Box::new(SchemaError::FieldNotFound {
                    field: Box::new(Column::from_name("nope")),
                    valid_fields: vec![],
                }),
                Box::new(None)
            )),
            pair("42703", "column \"nope\" does not exist")
        );
        assert_eq!(
            worded(DataFusionError::SchemaError(
                Box::new(SchemaError::FieldNotFound {
                    field: Box::new(Column::new(Some("t"), "b")),
                    valid_fields: vec![],
                }),
                Box::new(None)
            )),
            pair("42703", "column t.b does not exist")
        );
        assert_eq!(
            worded(DataFusionError::ArrowError(
                Box::new(ArrowError::CastError(
                    "Cannot cast string 'abc' to value of Int32 type".into()
                )),
                None
            )),
            pair("22P02", "invalid input syntax for type integer: \"abc\"")
        );
        assert_eq!(
            worded(DataFusionError::ArrowError(
                Box::new(ArrowError::CastError(
                    "Cannot cast string 'x' to value of Date32 type".into()
                )),
                None
            )),
            pair("22007", "invalid input syntax for type date: \"x\"")
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "Invalid function 'nosuchfn'.\nDid you mean 'to_char'?".into()
            )),
            pair("42883", "function nosuchfn does not exist")
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "Function 'character_length' expects 1 arguments but received 3. No function \
                 matches the given name and argument types 'character_length(Int64, Int64, \
                 Int64)'. You might need to add explicit type casts."
                    .into()
            )),
            pair(
                "42883",
                "function character_length(bigint, bigint, bigint) does not exist"
            )
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "Cannot coerce arithmetic expression Boolean + Int64 to valid types".into()
            )),
            pair("42883", "operator does not exist: boolean + bigint")
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "Cannot create filter with non-boolean predicate 'Utf8(\"x\")' returning Utf8"
                    .into()
            )),
            pair(
                "42804",
                "argument of WHERE must be type boolean, not type text"
            )
        );
        assert_eq!(
            worded(DataFusionError::Execution(
                "Placeholder '$1' was not provided a value for execution.".into()
            )),
            pair("42P02", "there is no parameter $1")
        );
        assert_eq!(
            worded(DataFusionError::Plan(
                "LIMIT must be >= 0, '-1' was provided".into()
            )),
            pair("2201W", "LIMIT must not be negative")
        );
    }

    #[test]
    fn syntax_errors_read_as_in_postgres_with_what_was_expected_as_the_hint() {
        assert_eq!(
            reword_syntax(
                "sql parser error: Expected: an expression, found: ; at Line: 1, Column: 10"
            ),
            (
                "syntax error at or near \";\"".to_string(),
                Some("Expected an expression (line 1, column 10).".to_string())
            )
        );
        assert_eq!(
            reword_syntax("Expected: QUERIES, found: EOF"),
            (
                "syntax error at end of input".to_string(),
                Some("Expected QUERIES.".to_string())
            )
        );
        assert_eq!(
            reword_syntax("Unterminated string literal at Line: 1, Column: 8"),
            (
                "Unterminated string literal at Line: 1, Column: 8".to_string(),
                None
            )
        );
    }

    #[test]
    fn unknown_errors_are_left_alone() {
        assert_eq!(
            reword(&DataFusionError::Plan("something else".into())),
            None
        );
        assert_eq!(
            reword(&DataFusionError::ArrowError(
                Box::new(ArrowError::CastError(
                    "Cannot cast string 'x' to Foo".into()
                )),
                None
            )),
            None
        );
    }

    #[test]
    fn arrow_type_names_become_postgres_names() {
        assert_eq!(
            pg_type_name("Timestamp(µs)"),
            Some("timestamp without time zone")
        );
        assert_eq!(
            pg_type_name("Timestamp(Microsecond, Some(\"UTC\"))"),
            Some("timestamp with time zone")
        );
        assert_eq!(pg_type_name("Decimal128(10, 2)"), Some("numeric"));
        assert_eq!(
            pg_call("f(Int64, Timestamp(ns, \"UTC\"), Utf8)"),
            "f(bigint, timestamp with time zone, text)"
        );
        assert_eq!(pg_call("now()"), "now()");
    }
}
