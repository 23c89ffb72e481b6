//! The fast path of `INSERT INTO <table stream> [(columns)] VALUES ($1, …), …` in the
//! extended protocol, which drivers send for every row (psycopg's `execute` and
//! `executemany`, pgjdbc's batches, asyncpg's `executemany`): the rows are built from the
//! bound parameters and appended to the stream's log, without planning the statement in
//! DataFusion again at every Execute (about a millisecond of CPU each, which capped
//! concurrent inserts). The values go through the same conversions, checks and SQLSTATEs
//! as `COPY` (`format::copy`).
//!
//! Anything else takes DataFusion's path: literals or expressions among the values,
//! `RETURNING`, `ON CONFLICT`, a target that is not a table stream, or a parameter whose
//! declared type differs from its column's in a way text conversion would not reproduce.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::sql::sqlparser::ast::{Expr, SetExpr, Statement, TableObject, Value};
use datafusion_postgres::pgwire::api::Type;
use datafusion_postgres::pgwire::api::portal::Portal;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::copy::{CopyDecoder, binary_to_text};
use crate::source::table::TableLog;

/// An INSERT the fast path runs.
pub struct FastInsert {
    table: String,
    log: Arc<TableLog>,
    /// The target columns, by name, in the order of the values.
    columns: Vec<String>,
    /// Each row's values: the 0-based parameter index of each.
    rows: Vec<Vec<usize>>,
    /// The Arrow type binary parameter `i` is decoded as.
    param_types: Vec<DataType>,
}

/// The Arrow type a declared parameter type means for decoding, if it is one the path
/// handles.
fn declared_arrow(t: &Type) -> Option<DataType> {
    Some(match *t {
        Type::INT2 => DataType::Int16,
        Type::INT4 => DataType::Int32,
        Type::INT8 => DataType::Int64,
        Type::FLOAT4 => DataType::Float32,
        Type::FLOAT8 => DataType::Float64,
        Type::BOOL => DataType::Boolean,
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::UNKNOWN | Type::NAME => DataType::Utf8,
        Type::DATE => DataType::Date32,
        Type::TIMESTAMP => DataType::Timestamp(TimeUnit::Microsecond, None),
        Type::TIMESTAMPTZ => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        Type::NUMERIC => DataType::Decimal128(38, 10),
        _ => return None,
    })
}

/// Whether a value of `declared` type, as text, converts into `column` as Postgres's
/// assignment would.
fn compatible(declared: &DataType, column: &DataType) -> bool {
    use DataType::*;
    match (declared, column) {
        (Utf8, _) => true,
        (a, b) if a == b => true,
        (Int16, Int32 | Int64) | (Int32, Int64) => true,
        (Int16 | Int32 | Int64, Float32 | Float64 | Decimal128(..)) => true,
        (Float32, Float64) => true,
        (Decimal128(..), Decimal128(..)) => true,
        (Timestamp(_, None), Timestamp(_, None)) => true,
        (Timestamp(_, Some(_)), Timestamp(_, Some(_))) => true,
        _ => false,
    }
}

fn placeholder(e: &Expr) -> Option<usize> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok()?.checked_sub(1),
            _ => None,
        },
        Expr::Nested(inner) => placeholder(inner),
        _ => None,
    }
}

impl FastInsert {
    /// The fast path for `stmt`, if it qualifies. `declared`: the parameter types the
    /// client gave at Parse.
    pub fn analyze(
        engine: &Engine,
        stmt: &Statement,
        declared: &[Option<Type>],
    ) -> Option<FastInsert> {
        let Statement::Insert(ins) = stmt else {
            return None;
        };
        if ins.returning.is_some()
            || ins.on.is_some()
            || ins.overwrite
            || ins.or.is_some()
            || ins.partitioned.is_some()
            || !ins.assignments.is_empty()
        {
            return None;
        }
        let TableObject::TableName(name) = &ins.table else {
            return None;
        };
        let [part] = name.0.as_slice() else {
            return None;
        };
        let table = crate::sql::parser::normalize_ident(part.as_ident()?);
        let log = engine.table_log(&table)?;
        let schema = log.schema();
        let columns: Vec<String> = if ins.columns.is_empty() {
            schema.fields().iter().map(|f| f.name().clone()).collect()
        } else {
            ins.columns
                .iter()
                .map(|c| match c.0.as_slice() {
                    [p] => p.as_ident().map(crate::sql::parser::normalize_ident),
                    _ => None,
                })
                .collect::<Option<_>>()?
        };
        let column_types: Vec<DataType> = columns
            .iter()
            .map(|c| {
                schema
                    .field_with_name(c)
                    .ok()
                    .map(|f| f.data_type().clone())
            })
            .collect::<Option<_>>()?;
        let query = ins.source.as_ref()?;
        if query.with.is_some() || query.order_by.is_some() || query.limit_clause.is_some() {
            return None;
        }
        let SetExpr::Values(values) = query.body.as_ref() else {
            return None;
        };
        let mut rows = Vec::with_capacity(values.rows.len());
        let mut param_types: Vec<Option<DataType>> = Vec::new();
        for row in &values.rows {
            if row.len() != columns.len() {
                return None;
            }
            let mut r = Vec::with_capacity(row.len());
            for (e, column) in row.iter().zip(&column_types) {
                let i = placeholder(e)?;
                if param_types.len() <= i {
                    param_types.resize(i + 1, None);
                }
                let ty = match declared.get(i).cloned().flatten() {
                    None => column.clone(),
                    Some(t) => {
                        let d = declared_arrow(&t)?;
                        if !compatible(&d, column) {
                            return None;
                        }
                        d
                    }
                };
                // A parameter used for two columns of different types: DataFusion's path.
                match &param_types[i] {
                    Some(t) if *t != ty => return None,
                    _ => param_types[i] = Some(ty),
                }
                r.push(i);
            }
            rows.push(r);
        }
        Some(FastInsert {
            table,
            log,
            columns,
            rows,
            param_types: param_types
                .into_iter()
                .map(|t| t.unwrap_or(DataType::Utf8))
                .collect(),
        })
    }

    /// Binds the portal's parameters, converts and checks the rows, appends them as one
    /// frame (durable when this returns). The number of rows.
    pub async fn execute<S>(&self, portal: &Portal<S>) -> Result<u64> {
        let schema: SchemaRef = self.log.schema();
        let mut decoder = CopyDecoder::for_insert(&self.table, schema, Some(&self.columns))?;
        for row in &self.rows {
            let mut fields = Vec::with_capacity(row.len());
            for &i in row {
                let Some(bytes) = portal
                    .parameters
                    .get(i)
                    .ok_or_else(|| Error::Syntax(format!("there is no parameter ${}", i + 1)))?
                else {
                    fields.push(None);
                    continue;
                };
                let text = if portal.parameter_format.is_binary(i) {
                    binary_to_text(&self.param_types[i], bytes).map_err(|m| Error::BadCopy {
                        state: crate::error::SqlState::InvalidBinaryRepresentation,
                        message: format!("{m} (parameter ${})", i + 1),
                        context: None,
                    })?
                } else {
                    String::from_utf8(bytes.to_vec()).map_err(|_| Error::BadCopy {
                        state: crate::error::SqlState::InvalidTextRepresentation,
                        message: "invalid byte sequence for encoding \"UTF8\"".into(),
                        context: None,
                    })?
                };
                fields.push(Some(text));
            }
            decoder.push_row(fields);
        }
        let (_, batches) = decoder.finish()?;
        self.log.append(batches).await
    }
}

/// Postgres's arity rules for `INSERT ... VALUES`, before DataFusion plans it (DataFusion
/// says `Column count doesn't match insert query!` or `Inconsistent data length across
/// values list`). Rows of different lengths: `VALUES lists must all be the same length`;
/// more values than target columns: `INSERT has more expressions than target columns`;
/// fewer than the listed columns: the reverse (all 42601). Fewer values than the table has
/// columns, with no column list, fill the first columns and leave the rest NULL, as in
/// Postgres: the statement comes back with that column list. `None`: nothing to change.
pub async fn check_values_arity(engine: &Engine, sql: &str) -> Result<Option<String>> {
    use datafusion::sql::sqlparser::ast::{Ident, ObjectName};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let Ok(mut statements) = Parser::parse_sql(&PostgreSqlDialect {}, sql) else {
        return Ok(None);
    };
    let [Statement::Insert(insert)] = statements.as_mut_slice() else {
        return Ok(None);
    };
    let Some(source) = &insert.source else {
        return Ok(None);
    };
    let SetExpr::Values(values) = source.body.as_ref() else {
        return Ok(None);
    };
    let Some(first) = values.rows.first() else {
        return Ok(None);
    };
    let n = first.len();
    if values.rows.iter().any(|r| r.len() != n) {
        return Err(Error::Syntax(
            "VALUES lists must all be the same length".into(),
        ));
    }
    let more_values = || Error::Syntax("INSERT has more expressions than target columns".into());
    if !insert.columns.is_empty() {
        return match n.cmp(&insert.columns.len()) {
            std::cmp::Ordering::Greater => Err(more_values()),
            std::cmp::Ordering::Less => Err(Error::Syntax(
                "INSERT has more target columns than expressions".into(),
            )),
            std::cmp::Ordering::Equal => Ok(None),
        };
    }
    let TableObject::TableName(name) = &insert.table else {
        return Ok(None);
    };
    let reference = datafusion::common::TableReference::from(name.to_string());
    let Ok(table) = engine.context().table_provider(reference).await else {
        // An unknown table: DataFusion's error names it.
        return Ok(None);
    };
    let schema = table.schema();
    if n > schema.fields().len() {
        return Err(more_values());
    }
    if n == schema.fields().len() {
        return Ok(None);
    }
    insert.columns = schema
        .fields()
        .iter()
        .take(n)
        .map(|f| ObjectName::from(vec![Ident::with_quote('"', f.name())]))
        .collect();
    Ok(Some(statements[0].to_string()))
}
