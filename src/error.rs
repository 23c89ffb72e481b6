//! The one error type of Tidemark, with the SQLSTATE each variant carries to the wire.
//!
//! Messages follow the Postgres style guide: lowercase, no final period, identifiers in
//! double quotes. Details and hints are full sentences.

use datafusion::error::DataFusionError;

mod wording;

pub use wording::{Worded, pg_type_name};

/// The SQLSTATE codes Tidemark sends. A small subset of Postgres' appendix A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlState {
    SyntaxError,
    UndefinedTable,
    UndefinedColumn,
    UndefinedObject,
    UndefinedFunction,
    DatatypeMismatch,
    DuplicateObject,
    DuplicateTable,
    DependentObjectsStillExist,
    FeatureNotSupported,
    InvalidParameterValue,
    ObjectNotInPrerequisiteState,
    DivisionByZero,
    NumericValueOutOfRange,
    InvalidDatetimeFormat,
    InvalidRowCountInLimitClause,
    InvalidRowCountInResultOffsetClause,
    InvalidArgumentForPowerFunction,
    AmbiguousColumn,
    DuplicateColumn,
    ProtocolViolation,
    UndefinedParameter,
    InvalidTextRepresentation,
    InvalidBinaryRepresentation,
    InsufficientResources,
    NotNullViolation,
    CardinalityViolation,
    BadCopyFileFormat,
    WrongObjectType,
    QueryCanceled,
    InsufficientPrivilege,
    InvalidPassword,
    IoError,
    ConnectionFailure,
    /// A remote engine (Spark) refused or failed what it was asked: Postgres's `fdw_error`,
    /// the class postgres_fdw and other foreign data wrappers report a remote failure with.
    FdwError,
    InvalidSchemaName,
    InternalError,
}

impl SqlState {
    /// The five-character code.
    pub fn code(self) -> &'static str {
        match self {
            SqlState::SyntaxError => "42601",
            SqlState::UndefinedTable => "42P01",
            SqlState::UndefinedColumn => "42703",
            SqlState::UndefinedObject => "42704",
            SqlState::UndefinedFunction => "42883",
            SqlState::DatatypeMismatch => "42804",
            SqlState::DuplicateObject => "42710",
            SqlState::DuplicateTable => "42P07",
            SqlState::DependentObjectsStillExist => "2BP01",
            SqlState::FeatureNotSupported => "0A000",
            SqlState::InvalidParameterValue => "22023",
            SqlState::ObjectNotInPrerequisiteState => "55000",
            SqlState::DivisionByZero => "22012",
            SqlState::NumericValueOutOfRange => "22003",
            SqlState::InvalidDatetimeFormat => "22007",
            SqlState::InvalidRowCountInLimitClause => "2201W",
            SqlState::InvalidRowCountInResultOffsetClause => "2201X",
            SqlState::InvalidArgumentForPowerFunction => "2201F",
            SqlState::AmbiguousColumn => "42702",
            SqlState::DuplicateColumn => "42701",
            SqlState::ProtocolViolation => "08P01",
            SqlState::UndefinedParameter => "42P02",
            SqlState::InvalidTextRepresentation => "22P02",
            SqlState::InvalidBinaryRepresentation => "22P03",
            SqlState::InsufficientResources => "53000",
            SqlState::NotNullViolation => "23502",
            SqlState::CardinalityViolation => "21000",
            SqlState::BadCopyFileFormat => "22P04",
            SqlState::WrongObjectType => "42809",
            SqlState::QueryCanceled => "57014",
            SqlState::InsufficientPrivilege => "42501",
            SqlState::InvalidPassword => "28P01",
            SqlState::IoError => "58030",
            SqlState::ConnectionFailure => "08006",
            SqlState::FdwError => "HV000",
            SqlState::InvalidSchemaName => "3F000",
            SqlState::InternalError => "XX000",
        }
    }
}

/// Everything that can go wrong in Tidemark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The statement text does not parse.
    #[error("{0}")]
    Syntax(String),
    /// The statement text does not parse, as sqlparser found: Postgres's words, and what
    /// the parser expected as the hint.
    #[error("{message}")]
    ParseError {
        message: String,
        hint: Option<String>,
    },
    /// A stream, sink or table that does not exist.
    #[error("{kind} \"{name}\" does not exist")]
    UndefinedObject { kind: &'static str, name: String },
    /// `SHOW` or `current_setting` of a setting Tidemark does not have.
    #[error("unrecognized configuration parameter \"{0}\"")]
    UnknownSetting(String),
    /// A name that is already taken.
    #[error("{kind} \"{name}\" already exists")]
    DuplicateObject { kind: &'static str, name: String },
    /// An object that others still depend on.
    #[error("cannot drop {kind} \"{name}\" because {dependents} depend on it")]
    DependentObjects {
        kind: &'static str,
        name: String,
        dependents: String,
    },
    /// A valid statement that Tidemark does not support (yet).
    #[error("{message}")]
    Unsupported {
        message: String,
        hint: Option<String>,
    },
    /// A `WITH (...)` option that is unknown, missing or has a bad value.
    #[error("{message}")]
    InvalidOption {
        message: String,
        hint: Option<String>,
    },
    /// An object that is not in the state the statement needs (a stopped sink, say).
    #[error("{0}")]
    WrongState(String),
    /// Input data that cannot be read as declared (a malformed record under FAILFAST, a
    /// corrupt Parquet file).
    #[error("{0}")]
    BadInput(String),
    /// A checkpoint that the sink's (new) definition cannot continue from (spec §9.4).
    #[error("{message}")]
    IncompatibleCheckpoint { message: String, hint: String },
    /// A NULL for a NOT NULL column of a table stream.
    #[error(
        "null value in column \"{column}\" of relation \"{relation}\" violates not-null constraint"
    )]
    NotNullViolation { column: String, relation: String },
    /// A MERGE that would change one target row twice.
    #[error("{0}")]
    Cardinality(String),
    /// An object of the wrong kind for the statement (COPY into a sink, say).
    #[error("{0}")]
    WrongObjectType(String),
    /// The client abandoned the statement (`CopyFail`).
    #[error("{0}")]
    QueryCanceled(String),

    /// The role may not do this (42501).
    #[error("{message}")]
    PermissionDenied { message: String, hint: String },
    /// A column that the relation does not have.
    #[error("column \"{column}\" of relation \"{relation}\" does not exist")]
    UndefinedColumn { column: String, relation: String },
    /// A row of `COPY ... FROM STDIN` that cannot be taken, with Postgres's SQLSTATE.
    #[error("{message}")]
    BadCopy {
        state: SqlState,
        message: String,
        /// Where: `COPY t, line 2, column c: "x"` (the error's `CONTEXT`).
        context: Option<String>,
    },
    /// A file or directory could not be read or written.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The Delta Lake library failed.
    #[error("delta table {path}: {message}")]
    Delta { path: String, message: String },
    /// DataFusion failed while planning or executing.
    #[error("{}", postgres_error(.0).message)]
    DataFusion(#[from] DataFusionError),
    /// A value the statement computed that its type cannot hold (22003), or a division by
    /// zero (22012): the statement fails rather than answer a wrapped number or `inf`.
    #[error("{message}")]
    DataException { state: SqlState, message: String },
    /// A catalog object that could not be loaded at startup: kept, and answering every
    /// statement that uses it with why (and the SQLSTATE of that error).
    #[error("{kind} \"{name}\" is broken: {message}")]
    Broken {
        kind: &'static str,
        name: String,
        state: SqlState,
        message: String,
    },
    /// A broker (Kafka) could not be reached or refused a request: Postgres's
    /// `connection_failure`, as postgres_fdw reports a remote server it cannot reach.
    #[error("{message}")]
    Broker { message: String },
    /// Spark Connect: the server could not be reached or the session is gone (`lost`,
    /// 08006, and a running query reconnects), or Spark refused or failed the request
    /// (HV000, Spark's message with its error class).
    #[error("{message}")]
    Spark { lost: bool, message: String },
    /// A bug: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

/// The result type of Tidemark's own code.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The SQLSTATE this error is sent with. Exhaustive on purpose: a new variant needs a code.
    pub fn sqlstate(&self) -> SqlState {
        match self {
            Error::Syntax(_) | Error::ParseError { .. } => SqlState::SyntaxError,
            Error::UndefinedObject { kind, .. } => match *kind {
                "stream" | "sink" | "materialized view" | "relation" | "table" => {
                    SqlState::UndefinedTable
                }
                "column" => SqlState::UndefinedColumn,
                "schema" => SqlState::InvalidSchemaName,
                _ => SqlState::UndefinedObject,
            },
            Error::DuplicateObject { .. } => SqlState::DuplicateObject,
            Error::UnknownSetting(_) => SqlState::UndefinedObject,
            Error::DependentObjects { .. } => SqlState::DependentObjectsStillExist,
            Error::Unsupported { .. } => SqlState::FeatureNotSupported,
            Error::InvalidOption { .. } => SqlState::InvalidParameterValue,
            Error::WrongState(_) => SqlState::ObjectNotInPrerequisiteState,
            Error::IncompatibleCheckpoint { .. } => SqlState::ObjectNotInPrerequisiteState,
            Error::BadInput(_) => SqlState::InvalidTextRepresentation,
            Error::NotNullViolation { .. } => SqlState::NotNullViolation,
            Error::Cardinality(_) => SqlState::CardinalityViolation,
            Error::UndefinedColumn { .. } => SqlState::UndefinedColumn,
            Error::WrongObjectType(_) => SqlState::WrongObjectType,
            Error::QueryCanceled(_) => SqlState::QueryCanceled,
            Error::PermissionDenied { .. } => SqlState::InsufficientPrivilege,
            Error::BadCopy { state, .. } => *state,
            Error::Io { .. } => SqlState::IoError,
            Error::Delta { .. } => SqlState::IoError,
            Error::DataFusion(e) => classify_datafusion(e),
            Error::Broken { state, .. } | Error::DataException { state, .. } => *state,
            Error::Broker { .. } => SqlState::ConnectionFailure,
            Error::Spark { lost: true, .. } => SqlState::ConnectionFailure,
            Error::Spark { lost: false, .. } => SqlState::FdwError,
            Error::Internal(_) => SqlState::InternalError,
        }
    }

    /// A hint for the user, when there is one.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Unsupported { hint, .. }
            | Error::InvalidOption { hint, .. }
            | Error::ParseError { hint, .. } => hint.clone(),
            Error::IncompatibleCheckpoint { hint, .. } | Error::PermissionDenied { hint, .. } => {
                Some(hint.clone())
            }
            Error::DataFusion(e) => postgres_error(e).hint,
            Error::Broken { kind, name, .. } => Some(format!(
                "It could not be loaded when the server started. DROP {} {name} and create it \
                 again to mend it.",
                kind.to_uppercase()
            )),
            _ => None,
        }
    }

    /// Where the error happened, when that is not part of the message: Postgres's
    /// `CONTEXT` field (`COPY t, line 2, column c: "x"`).
    pub fn context(&self) -> Option<String> {
        match self {
            Error::BadCopy { context, .. } => context.clone(),
            _ => None,
        }
    }

    /// Shorthand for an [`Error::Unsupported`] without a hint.
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::Unsupported {
            message: message.into(),
            hint: None,
        }
    }

    /// Shorthand for an [`Error::InvalidOption`] without a hint.
    pub fn invalid_option(message: impl Into<String>) -> Error {
        Error::InvalidOption {
            message: message.into(),
            hint: None,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<datafusion::arrow::error::ArrowError> for Error {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        Error::DataFusion(DataFusionError::ArrowError(Box::new(e), None))
    }
}

impl From<datafusion::sql::sqlparser::parser::ParserError> for Error {
    fn from(e: datafusion::sql::sqlparser::parser::ParserError) -> Self {
        let (message, hint) = wording::reword_syntax(&e.to_string());
        Error::ParseError { message, hint }
    }
}

/// A DataFusion error as Postgres would send it: in Postgres's words and with its
/// SQLSTATE where [`wording`] knows the error, else DataFusion's message without its
/// prefixes and a SQLSTATE by the error's kind.
pub fn postgres_error(e: &DataFusionError) -> Worded {
    if let DataFusionError::External(inner) = e.find_root()
        && let Some(ours) = inner.downcast_ref::<Error>()
    {
        return Worded {
            state: ours.sqlstate(),
            message: ours.to_string(),
            hint: ours.hint(),
        };
    }
    wording::reword(e).unwrap_or_else(|| Worded {
        state: classify_by_kind(e),
        message: strip_datafusion_prefix(e),
        hint: None,
    })
}

/// Sorts a DataFusion error into a SQLSTATE, once, here.
pub fn classify_datafusion(e: &DataFusionError) -> SqlState {
    postgres_error(e).state
}

fn classify_by_kind(e: &DataFusionError) -> SqlState {
    use datafusion::arrow::error::ArrowError;
    match e.find_root() {
        DataFusionError::SQL(..) => SqlState::SyntaxError,
        DataFusionError::NotImplemented(_) => SqlState::FeatureNotSupported,
        DataFusionError::ResourcesExhausted(_) => SqlState::InsufficientResources,
        DataFusionError::IoError(_) | DataFusionError::ObjectStore(_) => SqlState::IoError,
        DataFusionError::SchemaError(err, _) => {
            let msg = err.to_string();
            if msg.contains("No field named") || msg.contains("not found") {
                SqlState::UndefinedColumn
            } else {
                SqlState::SyntaxError
            }
        }
        DataFusionError::ArrowError(err, _) => match err.as_ref() {
            ArrowError::DivideByZero => SqlState::DivisionByZero,
            ArrowError::ArithmeticOverflow(_) => SqlState::NumericValueOutOfRange,
            // A literal that does not fit its column's type: `Can't cast value 1e20 to type
            // Int64`, `Overflow happened on: ...`.
            ArrowError::CastError(m)
                if m.contains("Can't cast value") || m.contains("Overflow") =>
            {
                SqlState::NumericValueOutOfRange
            }
            ArrowError::CastError(_) | ArrowError::ParseError(_) => {
                SqlState::InvalidTextRepresentation
            }
            // A NULL for a NOT NULL column of a table: `Column 'id' is declared as
            // non-nullable but contains null values`.
            ArrowError::InvalidArgumentError(m) if m.contains("non-nullable") => {
                SqlState::NotNullViolation
            }
            _ => SqlState::InternalError,
        },
        DataFusionError::Plan(msg) => classify_plan_message(msg),
        DataFusionError::Execution(msg) => {
            if msg.contains("Divide by zero") || msg.contains("division by zero") {
                SqlState::DivisionByZero
            } else if msg.contains("Cannot cast") || msg.contains("Cast error") {
                SqlState::InvalidTextRepresentation
            } else if msg.contains("non-nullable") {
                SqlState::NotNullViolation
            } else if msg.starts_with("Unsupported") || msg.to_ascii_lowercase().contains("invalid")
            {
                // A function refusing an argument's value: `Unsupported date_trunc
                // granularity: 'x'`, `Invalid timezone "x"` (Postgres: 22023).
                SqlState::InvalidParameterValue
            } else {
                SqlState::InternalError
            }
        }
        _ => SqlState::InternalError,
    }
}

fn classify_plan_message(msg: &str) -> SqlState {
    let lower = msg.to_ascii_lowercase();
    if lower.contains("table") && lower.contains("not found") {
        SqlState::UndefinedTable
    } else if lower.contains("no field named") || lower.contains("column") {
        SqlState::UndefinedColumn
    } else if lower.contains("invalid function") || lower.contains("function") {
        SqlState::UndefinedFunction
    } else if lower.contains("already exists") {
        SqlState::DuplicateObject
    } else if lower.contains("cannot") && lower.contains("type") {
        SqlState::DatatypeMismatch
    } else {
        SqlState::SyntaxError
    }
}

/// DataFusion prefixes messages with "Error during planning: " and the like; users do not
/// need them.
pub fn strip_datafusion_prefix(e: &DataFusionError) -> String {
    let root = e.find_root();
    let text = root.to_string();
    for prefix in [
        "Error during planning: ",
        "Execution error: ",
        "This feature is not implemented: ",
        "SQL error: ",
        "Schema error: ",
        "Arrow error: ",
        "External error: ",
    ] {
        if let Some(rest) = text.strip_prefix(prefix) {
            return strip_arrow_prefix(rest);
        }
    }
    strip_arrow_prefix(&text)
}

/// Arrow's own prefixes (`Cast error: `, `Parser error: `) add nothing for users either.
fn strip_arrow_prefix(text: &str) -> String {
    for prefix in ["Cast error: ", "Parser error: ", "Invalid argument error: "] {
        if let Some(rest) = text.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    text.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstate_codes_are_postgres_codes() {
        assert_eq!(Error::Syntax("x".into()).sqlstate().code(), "42601");
        let e = Error::UndefinedObject {
            kind: "stream",
            name: "s".into(),
        };
        assert_eq!(e.sqlstate().code(), "42P01");
        assert_eq!(e.to_string(), "stream \"s\" does not exist");
        assert_eq!(Error::unsupported("x").sqlstate().code(), "0A000");
        assert_eq!(Error::invalid_option("x").sqlstate().code(), "22023");
    }

    #[test]
    fn datafusion_table_not_found_is_undefined_table() {
        let e = DataFusionError::Plan("table 'datafusion.public.nope' not found".into());
        assert_eq!(classify_datafusion(&e), SqlState::UndefinedTable);
        assert_eq!(
            Error::from(e).to_string(),
            "relation \"nope\" does not exist"
        );
    }
}
