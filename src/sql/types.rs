//! SQL column types to Arrow types and back, for stream schemas.

use datafusion::arrow::datatypes::{DataType, IntervalUnit, TimeUnit};

use crate::error::{Error, Result};

/// The Arrow type of a SQL type name as written in `CREATE STREAM`.
pub fn sql_to_arrow(sql_type: &str) -> Result<DataType> {
    let t = sql_type.trim().to_ascii_uppercase();
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    let base = t.split('(').next().unwrap_or("").trim();
    let dt = match base {
        "TEXT" | "VARCHAR" | "CHARACTER VARYING" | "STRING" | "CHAR" | "CHARACTER" => {
            DataType::Utf8
        }
        "SMALLINT" | "INT2" => DataType::Int16,
        "INT" | "INTEGER" | "INT4" => DataType::Int32,
        "BIGINT" | "INT8" | "LONG" => DataType::Int64,
        "REAL" | "FLOAT4" => DataType::Float32,
        "DOUBLE PRECISION" | "DOUBLE" | "FLOAT8" | "FLOAT" => DataType::Float64,
        "BOOLEAN" | "BOOL" => DataType::Boolean,
        "DATE" => DataType::Date32,
        "TIMESTAMP" | "TIMESTAMP WITHOUT TIME ZONE" => {
            DataType::Timestamp(TimeUnit::Microsecond, None)
        }
        "TIMESTAMPTZ" | "TIMESTAMP WITH TIME ZONE" => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        }
        "INTERVAL" => DataType::Interval(IntervalUnit::MonthDayNano),
        "BYTEA" | "BINARY" => DataType::Binary,
        "NUMERIC" | "DECIMAL" => {
            let (p, s) = numeric_args(&t)?;
            DataType::Decimal128(p, s)
        }
        _ => {
            return Err(Error::Unsupported {
                message: format!("type \"{}\" is not supported in a stream", sql_type.trim()),
                hint: Some(
                    "Supported: TEXT, SMALLINT, INTEGER, BIGINT, REAL, DOUBLE PRECISION, \
                     NUMERIC(p,s), BOOLEAN, DATE, TIMESTAMP, TIMESTAMPTZ, INTERVAL, BYTEA."
                        .into(),
                ),
            });
        }
    };
    Ok(dt)
}

/// A schema as Spark's `from_json` takes it, in DDL: `a INT, b STRING, c DECIMAL(10, 2)`
/// (names may be quoted with backquotes or double quotes; an optional `:` after a name).
pub fn parse_ddl_schema(ddl: &str) -> Result<Vec<(String, DataType)>> {
    let bad = |why: String| Error::InvalidOption {
        message: format!("invalid schema \"{ddl}\": {why}"),
        hint: Some("Write the schema as Spark's DDL: 'a INT, b STRING'.".into()),
    };
    // Cut at commas outside parentheses.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, ch) in ddl.char_indices() {
        match ch {
            '(' | '<' => depth += 1,
            ')' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&ddl[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&ddl[start..]);
    let mut out = Vec::new();
    for part in parts {
        let part = part.trim();
        if part.is_empty() {
            return Err(bad("an empty field".into()));
        }
        let (name, rest) = match part.chars().next() {
            Some(q @ ('`' | '"')) => {
                let end = part[1..]
                    .find(q)
                    .ok_or_else(|| bad(format!("unclosed quote in \"{part}\"")))?;
                (part[1..=end].to_string(), &part[end + 2..])
            }
            _ => {
                let end = part
                    .find(|c: char| c.is_whitespace() || c == ':')
                    .ok_or_else(|| bad(format!("field \"{part}\" has no type")))?;
                (part[..end].to_string(), &part[end..])
            }
        };
        let ty = rest.trim_start().trim_start_matches(':').trim();
        if ty.is_empty() {
            return Err(bad(format!("field \"{name}\" has no type")));
        }
        let dt = sql_to_arrow(ty).map_err(|e| bad(e.to_string()))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(bad(format!("field \"{name}\" is given twice")));
        }
        out.push((name, dt));
    }
    Ok(out)
}

fn numeric_args(t: &str) -> Result<(u8, i8)> {
    let Some(open) = t.find('(') else {
        return Ok((38, 10));
    };
    let inner = t[open + 1..].trim_end_matches(')');
    let mut parts = inner.split(',').map(|p| p.trim().parse::<i64>());
    let bad = || Error::invalid_option(format!("invalid NUMERIC arguments in \"{t}\""));
    let p = parts.next().and_then(|r| r.ok()).ok_or_else(bad)?;
    let s = match parts.next() {
        Some(r) => r.map_err(|_| bad())?,
        None => 0,
    };
    if !(1..=38).contains(&p) || s < 0 || s > p {
        return Err(bad());
    }
    Ok((p as u8, s as i8))
}

/// The Postgres name of an Arrow type, for `SHOW` output.
pub fn arrow_to_sql(dt: &DataType) -> String {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text".into(),
        DataType::Int8 | DataType::Int16 => "smallint".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "bigint".into(),
        DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Interval(_) => "interval".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "bytea".into(),
        DataType::Decimal128(p, s) => format!("numeric({p},{s})"),
        other => other.to_string().to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_types_map_to_arrow() {
        assert_eq!(sql_to_arrow("text").unwrap(), DataType::Utf8);
        assert_eq!(
            sql_to_arrow("DOUBLE  PRECISION").unwrap(),
            DataType::Float64
        );
        assert_eq!(
            sql_to_arrow("timestamp").unwrap(),
            DataType::Timestamp(TimeUnit::Microsecond, None)
        );
        assert_eq!(
            sql_to_arrow("NUMERIC(10, 2)").unwrap(),
            DataType::Decimal128(10, 2)
        );
        assert_eq!(
            sql_to_arrow("geometry").unwrap_err().sqlstate().code(),
            "0A000"
        );
        assert_eq!(arrow_to_sql(&DataType::Decimal128(10, 2)), "numeric(10,2)");
    }
}
