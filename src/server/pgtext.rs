//! Values in text format as PostgreSQL writes them, byte for byte.
//!
//! pgwire's text encoders write every timestamp and time with six decimals
//! (`10:01:00.000000`) and floats in Rust's forms (`12.0`, `1e20`, `inf`); PostgreSQL writes
//! `10:01:00`, `12`, `1e+20` and `Infinity`. Before a batch is encoded for a text-format
//! column, [`to_postgres_text`] turns the columns of those types into PostgreSQL's text
//! (the wire type stays `timestamp`, `float8`, ...: pgwire writes a string as it is). Binary
//! format columns are left to pgwire. Pure: checked against PostgreSQL's own output in
//! `tests/it/errors.rs`.

use std::sync::Arc;

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Date64Type, Field, Float32Type, Float64Type, IntervalDayTimeType,
    IntervalMonthDayNanoType, IntervalUnit, IntervalYearMonthType, Schema, Time32MillisecondType,
    Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType,
};
use datafusion_postgres::pgwire::api::results::{FieldFormat, FieldInfo};

/// Whether Tidemark writes this type's text itself.
fn rewritten(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Timestamp(_, _)
            | DataType::Date32
            | DataType::Date64
            | DataType::Time32(_)
            | DataType::Time64(_)
            | DataType::Float32
            | DataType::Float64
            | DataType::Interval(_)
            | DataType::Struct(_)
    )
}

/// `batch` with each text-format column of a date, time or float type as PostgreSQL's
/// text. The batch as it is when no column needs it.
pub fn to_postgres_text(batch: RecordBatch, fields: &[FieldInfo]) -> RecordBatch {
    let schema = batch.schema();
    let needs = |i: usize| {
        fields
            .get(i)
            .is_some_and(|f| f.format() == FieldFormat::Text)
            && rewritten(schema.field(i).data_type())
    };
    if !(0..batch.num_columns()).any(needs) {
        return batch;
    }
    let mut out_fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (i, column) in batch.columns().iter().enumerate() {
        let field = schema.field(i);
        if needs(i) {
            out_fields.push(Field::new(field.name(), DataType::Utf8, true));
            columns.push(text_column(column));
        } else {
            out_fields.push(field.clone());
            columns.push(column.clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(out_fields)), columns)
        .unwrap_or_else(|_| unreachable!("same columns, same lengths"))
}

fn text_column(a: &ArrayRef) -> ArrayRef {
    let text = |f: &dyn Fn(usize) -> Option<String>| -> ArrayRef {
        Arc::new(
            (0..a.len())
                .map(|i| if a.is_null(i) { None } else { f(i) })
                .collect::<StringArray>(),
        )
    };
    match a.data_type() {
        DataType::Timestamp(unit, tz) => {
            let micros = |i: usize| -> Option<i64> {
                Some(match unit {
                    TimeUnit::Second => {
                        a.as_primitive::<TimestampSecondType>().value(i) * 1_000_000
                    }
                    TimeUnit::Millisecond => {
                        a.as_primitive::<TimestampMillisecondType>().value(i) * 1000
                    }
                    TimeUnit::Microsecond => a.as_primitive::<TimestampMicrosecondType>().value(i),
                    TimeUnit::Nanosecond => a
                        .as_primitive::<TimestampNanosecondType>()
                        .value(i)
                        .div_euclid(1000),
                })
            };
            let offset = tz
                .as_deref()
                .map(|tz| tz.parse::<datafusion::arrow::array::timezone::Tz>().ok());
            text(&|i| {
                let us = micros(i)?;
                let utc = DateTime::from_timestamp_micros(us)?;
                match &offset {
                    None => Some(timestamp(&utc.naive_utc())),
                    Some(tz) => {
                        let local = match tz {
                            Some(tz) => utc.with_timezone(tz).fixed_offset(),
                            None => utc.fixed_offset(),
                        };
                        Some(timestamptz(
                            &local.naive_local(),
                            local.offset().local_minus_utc(),
                        ))
                    }
                }
            })
        }
        DataType::Date32 => text(&|i| {
            let days = a.as_primitive::<Date32Type>().value(i);
            NaiveDate::from_ymd_opt(1970, 1, 1)?
                .checked_add_signed(chrono::Duration::days(days as i64))
                .map(|d| date(&d))
        }),
        DataType::Date64 => text(&|i| {
            let ms = a.as_primitive::<Date64Type>().value(i);
            DateTime::from_timestamp_millis(ms).map(|d| date(&d.date_naive()))
        }),
        DataType::Time32(TimeUnit::Second) => text(&|i| {
            let s = a.as_primitive::<Time32SecondType>().value(i);
            NaiveTime::from_num_seconds_from_midnight_opt(s as u32, 0).map(|t| time(&t))
        }),
        DataType::Time32(_) => text(&|i| {
            let ms = a.as_primitive::<Time32MillisecondType>().value(i) as i64;
            time_of_micros(ms * 1000)
        }),
        DataType::Time64(TimeUnit::Microsecond) => {
            text(&|i| time_of_micros(a.as_primitive::<Time64MicrosecondType>().value(i)))
        }
        DataType::Time64(_) => text(&|i| {
            time_of_micros(
                a.as_primitive::<Time64NanosecondType>()
                    .value(i)
                    .div_euclid(1000),
            )
        }),
        DataType::Interval(IntervalUnit::MonthDayNano) => text(&|i| {
            let v = a.as_primitive::<IntervalMonthDayNanoType>().value(i);
            Some(interval(v.months, v.days, v.nanoseconds / 1000))
        }),
        DataType::Interval(IntervalUnit::DayTime) => text(&|i| {
            let v = a.as_primitive::<IntervalDayTimeType>().value(i);
            Some(interval(0, v.days, v.milliseconds as i64 * 1000))
        }),
        DataType::Interval(IntervalUnit::YearMonth) => text(&|i| {
            Some(interval(
                a.as_primitive::<IntervalYearMonthType>().value(i),
                0,
                0,
            ))
        }),
        DataType::Struct(_) => {
            let row = a.as_struct();
            let fields: Vec<ArrayRef> = row.columns().iter().map(field_text).collect();
            text(&|i| {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|f| {
                        let f = f.as_string::<i32>();
                        if f.is_null(i) {
                            String::new()
                        } else {
                            composite_field(f.value(i))
                        }
                    })
                    .collect();
                Some(format!("({})", parts.join(",")))
            })
        }
        DataType::Float64 => text(&|i| Some(float8(a.as_primitive::<Float64Type>().value(i)))),
        DataType::Float32 => text(&|i| Some(float4(a.as_primitive::<Float32Type>().value(i)))),
        _ => a.clone(),
    }
}

/// A struct's field as text: PostgreSQL's text of the types Tidemark writes itself, `t`/`f`
/// for booleans, Arrow's text for the rest.
fn field_text(a: &ArrayRef) -> ArrayRef {
    if rewritten(a.data_type()) {
        return text_column(a);
    }
    if let DataType::Boolean = a.data_type() {
        let b = a.as_boolean();
        return Arc::new(
            (0..b.len())
                .map(|i| b.is_valid(i).then(|| if b.value(i) { "t" } else { "f" }))
                .collect::<StringArray>(),
        );
    }
    datafusion::arrow::compute::cast(a, &DataType::Utf8)
        .unwrap_or_else(|_| Arc::new(StringArray::new_null(a.len())))
}

/// A field of a composite value's text, quoted as PostgreSQL's `record_out` quotes it:
/// when empty or holding a quote, backslash, parenthesis, comma or space.
fn composite_field(v: &str) -> String {
    let quote = v.is_empty()
        || v.chars()
            .any(|c| matches!(c, '"' | '\\' | '(' | ')' | ',') || c.is_ascii_whitespace());
    if !quote {
        return v.to_string();
    }
    let mut out = String::from('"');
    for c in v.chars() {
        if c == '"' || c == '\\' {
            out.push(c);
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn time_of_micros(us: i64) -> Option<String> {
    let secs = us.div_euclid(1_000_000);
    let nanos = (us.rem_euclid(1_000_000) * 1000) as u32;
    NaiveTime::from_num_seconds_from_midnight_opt(secs as u32, nanos).map(|t| time(&t))
}

/// `.5`, `.123456`: the microseconds without trailing zeros, or nothing.
fn fraction(micros: u32) -> String {
    if micros == 0 {
        return String::new();
    }
    let digits = format!(".{micros:06}");
    digits.trim_end_matches('0').to_string()
}

/// A year as PostgreSQL writes it: four digits at least, and ` BC` for year 0 and before
/// (the proleptic year 0 is 1 BC).
fn year_and_era(year: i32) -> (String, &'static str) {
    if year <= 0 {
        (format!("{:04}", 1 - year), " BC")
    } else {
        (format!("{year:04}"), "")
    }
}

/// `2026-06-10`.
pub fn date(d: &NaiveDate) -> String {
    let (year, era) = year_and_era(d.year());
    format!("{year}-{:02}-{:02}{era}", d.month(), d.day())
}

/// `10:01:00`, `10:01:00.25`.
pub fn time(t: &NaiveTime) -> String {
    format!(
        "{:02}:{:02}:{:02}{}",
        t.hour(),
        t.minute(),
        t.second(),
        fraction(t.nanosecond() / 1000)
    )
}

/// `2026-06-10 10:01:00.5`.
pub fn timestamp(t: &NaiveDateTime) -> String {
    let (year, era) = year_and_era(t.year());
    format!(
        "{year}-{:02}-{:02} {}{era}",
        t.month(),
        t.day(),
        time(&t.time())
    )
}

/// `2026-06-10 10:01:00+00`, `... +05:30`: the local time and its offset from UTC.
pub fn timestamptz(local: &NaiveDateTime, offset_secs: i32) -> String {
    let (year, era) = year_and_era(local.year());
    let sign = if offset_secs < 0 { '-' } else { '+' };
    let off = offset_secs.unsigned_abs();
    let (h, m, s) = (off / 3600, off / 60 % 60, off % 60);
    let mut zone = format!("{sign}{h:02}");
    if m != 0 || s != 0 {
        zone.push_str(&format!(":{m:02}"));
    }
    if s != 0 {
        zone.push_str(&format!(":{s:02}"));
    }
    format!(
        "{year}-{:02}-{:02} {}{zone}{era}",
        local.month(),
        local.day(),
        time(&local.time())
    )
}

/// An interval in PostgreSQL's default style (`IntervalStyle = postgres`): `1 year 2 mons`,
/// `3 days 02:00:00`, `-1 days +02:00:00`, `00:00:01.5`, `00:00:00` (`EncodeInterval`).
pub fn interval(months: i32, days: i32, micros: i64) -> String {
    let mut out = String::new();
    // Whether nothing is written yet, and whether the last part written was negative.
    let (mut is_zero, mut is_before) = (true, false);
    let mut part = |value: i64, unit: &str, out: &mut String| {
        if value == 0 {
            return;
        }
        let space = if is_zero { "" } else { " " };
        let plus = if is_before && value > 0 { "+" } else { "" };
        let s = if value != 1 { "s" } else { "" };
        out.push_str(&format!("{space}{plus}{value} {unit}{s}"));
        is_before = value < 0;
        is_zero = false;
    };
    part((months / 12) as i64, "year", &mut out);
    part((months % 12) as i64, "mon", &mut out);
    part(days as i64, "day", &mut out);
    if is_zero || micros != 0 {
        let minus = micros < 0;
        let us = micros.unsigned_abs();
        let (h, m, sec, frac) = (
            us / 3_600_000_000,
            us / 60_000_000 % 60,
            us / 1_000_000 % 60,
            (us % 1_000_000) as u32,
        );
        let space = if is_zero { "" } else { " " };
        let sign = if minus {
            "-"
        } else if is_before {
            "+"
        } else {
            ""
        };
        out.push_str(&format!(
            "{space}{sign}{h:02}:{m:02}:{sec:02}{}",
            fraction(frac)
        ));
    }
    out
}

/// A float as PostgreSQL (12 and later, `extra_float_digits` 1) writes it: the shortest
/// digits that read back to the same value, in fixed notation for decimal exponents from
/// -4 to `digits - 1`, else as `1e+20`.
fn shortest(v: f64, scientific: String, digits: i32) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form: `1.25e1`, `-1e-5`.
    let (mantissa, exp) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let figures: String = mantissa.chars().filter(|c| *c != '.').collect();
    if exp < -4 || exp >= digits {
        let (first, rest) = figures.split_at(1);
        let point = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{point}e{esign}{:02}", exp.unsigned_abs());
    }
    if exp < 0 {
        return format!("{sign}0.{}{figures}", "0".repeat((-exp - 1) as usize));
    }
    let int_len = exp as usize + 1;
    if figures.len() <= int_len {
        format!("{sign}{figures}{}", "0".repeat(int_len - figures.len()))
    } else {
        format!("{sign}{}.{}", &figures[..int_len], &figures[int_len..])
    }
}

/// `float8`: `12.5`, `1e+20`, `Infinity`.
pub fn float8(v: f64) -> String {
    shortest(v, format!("{v:e}"), 15)
}

/// `float4` (`real`).
pub fn float4(v: f32) -> String {
    shortest(v as f64, format!("{v:e}"), 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_postgres_writes_them() {
        // PostgreSQL 15's own output for the same values.
        for (v, pg) in [
            (12.5, "12.5"),
            (1e20, "1e+20"),
            (0.1, "0.1"),
            (1e15, "1e+15"),
            (1e14, "100000000000000"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-0.0, "-0"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
            (f64::NAN, "NaN"),
            (100.0, "100"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (-2.5e-7, "-2.5e-07"),
        ] {
            assert_eq!(float8(v), pg, "{v}");
        }
        assert_eq!(float4(1.5), "1.5");
        assert_eq!(float4(1e6), "1e+06");
        assert_eq!(float4(0.1), "0.1");
    }

    #[test]
    fn composite_fields_are_quoted_as_postgres_quotes_them() {
        assert_eq!(
            composite_field("2026-06-10 10:00:00"),
            "\"2026-06-10 10:00:00\""
        );
        assert_eq!(composite_field("a\"b"), "\"a\"\"b\"");
        assert_eq!(composite_field("plain"), "plain");
        assert_eq!(composite_field(""), "\"\"");
    }

    #[test]
    fn intervals_as_postgres_writes_them() {
        const HOUR: i64 = 3_600_000_000;
        // PostgreSQL 15's own output for the same values.
        assert_eq!(interval(0, 1, 2 * HOUR), "1 day 02:00:00");
        assert_eq!(interval(0, 0, 300_000_000), "00:05:00");
        assert_eq!(interval(14, 0, 0), "1 year 2 mons");
        assert_eq!(interval(0, 0, -1_000_000), "-00:00:01");
        assert_eq!(interval(0, 0, 1_500_000), "00:00:01.5");
        assert_eq!(interval(0, 3, 0), "3 days");
        assert_eq!(interval(0, -1, 2 * HOUR), "-1 days +02:00:00");
        assert_eq!(interval(0, 0, 0), "00:00:00");
        assert_eq!(interval(-14, 0, 0), "-1 years -2 mons");
    }

    #[test]
    fn dates_and_times_as_postgres_writes_them() {
        let t = NaiveDate::from_ymd_opt(2026, 6, 10)
            .unwrap()
            .and_hms_micro_opt(10, 1, 0, 0)
            .unwrap();
        assert_eq!(timestamp(&t), "2026-06-10 10:01:00");
        let t5 = t + chrono::Duration::milliseconds(500);
        assert_eq!(timestamp(&t5), "2026-06-10 10:01:00.5");
        let tz = t + chrono::Duration::microseconds(123456);
        assert_eq!(timestamptz(&tz, 0), "2026-06-10 10:01:00.123456+00");
        assert_eq!(timestamptz(&t, 19800), "2026-06-10 10:01:00+05:30");
        assert_eq!(timestamptz(&t, -3 * 3600), "2026-06-10 10:01:00-03");
        assert_eq!(
            time(&NaiveTime::from_hms_milli_opt(10, 1, 0, 250).unwrap()),
            "10:01:00.25"
        );
        let bc = NaiveDate::from_ymd_opt(0, 1, 1)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap();
        assert_eq!(timestamp(&bc), "0001-01-01 00:00:00 BC");
        assert_eq!(
            date(&NaiveDate::from_ymd_opt(2026, 6, 10).unwrap()),
            "2026-06-10"
        );
    }
}
