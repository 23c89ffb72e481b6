//! A session's settings as Postgres reports them, and the session statements around them:
//! the startup (the parameter statuses a client reads, with `server_version` agreeing
//! with `version()`), `SHOW`, `DISCARD` and `current_setting()`.
//!
//! The values are [`config::PG_SETTINGS`]; a session's own `SET`s (datafusion-postgres
//! keeps them in the connection's metadata) and its startup parameters override them.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use datafusion::scalar::ScalarValue;
use datafusion_postgres::pgwire;
use pgwire::api::auth::{DefaultServerParameterProvider, ServerParameterProvider};
use pgwire::api::portal::Format;
use pgwire::api::results::{Response, Tag};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, METADATA_DATABASE, METADATA_USER};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::response::TransactionStatus;

use super::{encode_output, to_pg_error};
use crate::config::{self, PgSetting};
use crate::engine::{Engine, Output, settings};
use crate::error::Error;

/// The database a client connected to: its startup's `database`, or (as in Postgres) its
/// user's name.
pub fn connected_database<C: ClientInfo + ?Sized>(client: &C) -> String {
    let meta = client.metadata();
    meta.get(METADATA_DATABASE)
        .or_else(|| meta.get(METADATA_USER))
        .cloned()
        .unwrap_or_else(|| "postgres".to_string())
}

/// pgwire's parameter statuses, with Tidemark's `server_version`.
pub(super) struct Parameters;

impl ServerParameterProvider for Parameters {
    fn server_parameters<C: ClientInfo>(&self, client: &C) -> Option<HashMap<String, String>> {
        let mut parameters = DefaultServerParameterProvider::default().server_parameters(client)?;
        parameters.insert("server_version".into(), config::PG_VERSION.into());
        Some(parameters)
    }
}

/// The keys under which a session's `SET`s live in the connection's metadata (where
/// datafusion-postgres puts them), by setting.
fn session_key(setting: &PgSetting) -> Option<&'static str> {
    Some(match setting.name {
        "DateStyle" => "datestyle",
        "IntervalStyle" => "intervalstyle",
        "TimeZone" => "timezone",
        "application_name" => "application_name",
        "bytea_output" => "bytea_output",
        "extra_float_digits" => "extra_float_digits",
        "search_path" => "search_path",
        "client_encoding" => "client_encoding",
        _ => return None,
    })
}

/// `setting`'s value in `client`'s session, if the session set it (by `SET` or in its
/// startup packet).
fn session_value<C: ClientInfo>(client: &C, setting: &PgSetting) -> Option<String> {
    let metadata = client.metadata();
    if setting.name == "statement_timeout" {
        return metadata
            .get("statement_timeout_ms")
            .map(|ms| format!("{ms}ms"));
    }
    session_key(setting)
        .and_then(|key| metadata.get(key))
        .or_else(|| metadata.get(setting.name))
        .cloned()
}

/// `SHOW name` in `client`'s session.
pub async fn show<C: ClientInfo>(
    engine: &Engine,
    client: &C,
    name: &str,
    format: &Format,
) -> PgWireResult<Response> {
    let (schema, batch) =
        settings::show(name, |s| session_value(client, s)).map_err(|e| to_pg_error(&e))?;
    encode_output(engine, Output::Rows(schema, vec![batch]), format).await
}

/// `DISCARD what`: `ALL` forgets the session's portals and its `SET`s; `PLANS`,
/// `SEQUENCES` and `TEMP` have nothing to discard (no plan is kept per session, and
/// there are no sequences or temporary tables). Prepared statements stay (pgwire's store
/// cannot list them), which clients do not notice: a Parse of a name replaces it.
pub fn discard<C>(client: &mut C, what: &str) -> PgWireResult<Response>
where
    C: ClientInfo + ClientPortalStore,
    C::PortalStore: PortalStore,
{
    if what == "ALL" {
        if client.transaction_status() != TransactionStatus::Idle {
            return Err(PgWireError::UserError(Box::new(
                pgwire::error::ErrorInfo::new(
                    "ERROR".into(),
                    "25001".into(),
                    "DISCARD ALL cannot run inside a transaction block".into(),
                ),
            )));
        }
        client.portal_store().clear_portals();
        let metadata = client.metadata_mut();
        metadata.remove("statement_timeout_ms");
        for setting in config::PG_SETTINGS {
            if let Some(key) = session_key(setting) {
                metadata.remove(key);
            }
        }
    }
    Ok(Response::Execution(Tag::new(&format!("DISCARD {what}"))))
}

/// `current_setting(name [, missing_ok])`: the server's value of a setting (not a
/// session's own `SET`: functions run without the session). An unknown name is 42704, or
/// NULL with `missing_ok`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct CurrentSetting {
    signature: Signature,
}

pub fn current_setting_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(CurrentSetting {
        signature: Signature::one_of(
            vec![
                TypeSignature::Exact(vec![DataType::Utf8]),
                TypeSignature::Exact(vec![DataType::Utf8, DataType::Boolean]),
            ],
            Volatility::Stable,
        ),
    })
}

impl ScalarUDFImpl for CurrentSetting {
    fn name(&self) -> &str {
        "current_setting"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        let missing_ok = match args.args.get(1) {
            Some(ColumnarValue::Scalar(ScalarValue::Boolean(b))) => b.unwrap_or(false),
            _ => false,
        };
        let lookup = |name: Option<&str>| -> datafusion::error::Result<Option<String>> {
            let Some(name) = name else { return Ok(None) };
            match config::pg_setting(name) {
                Some(s) => Ok(Some(s.value.to_string())),
                None if missing_ok => Ok(None),
                None => Err(DataFusionError::External(Box::new(Error::UnknownSetting(
                    name.to_string(),
                )))),
            }
        };
        match &args.args[0] {
            ColumnarValue::Scalar(s) => {
                let name = match s {
                    ScalarValue::Utf8(n) | ScalarValue::LargeUtf8(n) | ScalarValue::Utf8View(n) => {
                        n.as_deref()
                    }
                    _ => None,
                };
                Ok(ColumnarValue::Scalar(ScalarValue::Utf8(lookup(name)?)))
            }
            ColumnarValue::Array(a) => {
                let names = datafusion::arrow::compute::cast(a, &DataType::Utf8)?;
                let names = names
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| DataFusionError::Internal("current_setting: not text".into()))?;
                let values = (0..names.len())
                    .map(|i| lookup((!names.is_null(i)).then(|| names.value(i))))
                    .collect::<datafusion::error::Result<StringArray>>()?;
                Ok(ColumnarValue::Array(Arc::new(values)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_that_names_the_version_names_the_same_one() {
        assert!(
            crate::server::VERSION_STRING
                .starts_with(&format!("PostgreSQL {} ", config::PG_VERSION))
        );
        let num = config::pg_setting("server_version_num").unwrap().value;
        let (major, minor) = config::PG_VERSION.split_once('.').unwrap();
        assert_eq!(
            num.parse::<u32>().unwrap(),
            major.parse::<u32>().unwrap() * 10_000 + minor.parse::<u32>().unwrap()
        );
        assert_eq!(
            config::pg_setting("SERVER_VERSION").unwrap().value,
            config::PG_VERSION
        );
    }
}
