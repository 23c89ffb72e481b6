//! `SHOW` of Postgres's run-time settings ([`config::PG_SETTINGS`]): one setting as a
//! one-row, one-column result named as Postgres names it (`SHOW time zone` answers a
//! `TimeZone` column), or `SHOW ALL` as `name`, `setting`, `description`. The caller
//! supplies the session's own values (the wire knows a session's `SET`s; `tidemark run`
//! has none).

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::config::{self, PgSetting};
use crate::error::{Error, Result};

/// The result's schema for `SHOW name` (`name` as the parser keeps it: lower case).
pub fn schema(name: &str) -> Result<SchemaRef> {
    if name == "all" {
        return Ok(Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("setting", DataType::Utf8, false),
            Field::new("description", DataType::Utf8, false),
        ])));
    }
    let setting = find(name)?;
    Ok(Arc::new(Schema::new(vec![Field::new(
        setting.name,
        DataType::Utf8,
        false,
    )])))
}

/// `SHOW name`, with `session` giving a setting's value in this session when it has one.
pub fn show(
    name: &str,
    session: impl Fn(&PgSetting) -> Option<String>,
) -> Result<(SchemaRef, RecordBatch)> {
    let schema = schema(name)?;
    let value = |s: &PgSetting| session(s).unwrap_or_else(|| s.value.to_string());
    let columns: Vec<Arc<dyn datafusion::arrow::array::Array>> = if name == "all" {
        let all = config::PG_SETTINGS;
        vec![
            Arc::new(StringArray::from_iter_values(all.iter().map(|s| s.name))),
            Arc::new(StringArray::from_iter_values(all.iter().map(value))),
            Arc::new(StringArray::from_iter_values(
                all.iter().map(|s| s.description),
            )),
        ]
    } else {
        vec![Arc::new(StringArray::from(vec![value(find(name)?)]))]
    };
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    Ok((schema, batch))
}

fn find(name: &str) -> Result<&'static PgSetting> {
    config::pg_setting(name).ok_or_else(|| Error::UnknownSetting(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::AsArray;

    #[test]
    fn a_setting_is_named_as_postgres_names_it_and_the_session_wins() {
        let (schema, batch) = show("time zone", |_| None).unwrap();
        assert_eq!(schema.field(0).name(), "TimeZone");
        assert_eq!(batch.column(0).as_string::<i32>().value(0), "UTC");
        let (_, batch) = show("search_path", |s| {
            (s.name == "search_path").then(|| "lake".to_string())
        })
        .unwrap();
        assert_eq!(batch.column(0).as_string::<i32>().value(0), "lake");
        let (schema, batch) = show("all", |_| None).unwrap();
        assert_eq!(schema.fields().len(), 3);
        assert_eq!(batch.num_rows(), config::PG_SETTINGS.len());
        let e = show("nosuch", |_| None).unwrap_err();
        assert_eq!(e.sqlstate().code(), "42704");
        assert_eq!(
            e.to_string(),
            "unrecognized configuration parameter \"nosuch\""
        );
    }
}
