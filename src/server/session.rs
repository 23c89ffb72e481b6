//! A session's settings as Postgres reports them, and the session statements around them:
//! the startup (the parameter statuses a client reads, with `server_version` agreeing
//! with `version()`), `SHOW`, `DISCARD` and `current_setting()`.
//!
//! The values are [`config::PG_SETTINGS`]; a session's own `SET`s (datafusion-postgres
//! keeps them in the connection's metadata) and its startup parameters override them.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, LazyLock, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::datatypes::DataType;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use datafusion::scalar::ScalarValue;
use datafusion_postgres::pgwire;
use futures::Sink;
use pgwire::api::auth::{
    DefaultServerParameterProvider, ServerParameterProvider, StartupHandler, finish_authentication,
    protocol_negotiation, save_startup_parameters_to_metadata,
};
use pgwire::api::portal::Format;
use pgwire::api::results::{Response, Tag};
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    METADATA_DATABASE, METADATA_USER, PidSecretKeyGenerator, RandomPidSecretKeyGenerator,
};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::{encode_output, to_pg_error};
use crate::config::{self, PgSetting};
use crate::engine::{Engine, Output, settings};
use crate::error::Error;

/// The startup of a connection: protocol negotiation, the client's parameters kept in the
/// session, a process id and key for cancelling, then AuthenticationOk and Postgres's
/// parameter statuses. No password is asked for (trust).
pub struct Startup {
    pub connections: Arc<ConnectionManager>,
    pids: RandomPidSecretKeyGenerator,
}

impl Startup {
    pub fn new(connections: Arc<ConnectionManager>) -> Startup {
        Startup {
            connections,
            pids: RandomPidSecretKeyGenerator::default(),
        }
    }
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let PgWireFrontendMessage::Startup(startup) = message else {
            return Ok(());
        };
        protocol_negotiation(client, &startup).await?;
        save_startup_parameters_to_metadata(client, &startup);
        let (pid, key) = self.pids.generate(&*client);
        client.set_pid_and_secret_key(pid, key.clone());
        let database = connected_database(&*client);
        client
            .session_extensions()
            .insert::<DatabaseInUse>(DatabaseInUse::new(database));
        let (handle, guard) = self.connections.register(pid, key);
        client
            .session_extensions()
            .insert::<Arc<ConnectionHandle>>(handle);
        client.session_extensions().insert::<ConnectionGuard>(guard);
        finish_authentication(client, &Parameters).await
    }
}

/// The database a client connected to: its startup's `database`, or (as in Postgres) its
/// user's name.
pub fn connected_database<C: ClientInfo + ?Sized>(client: &C) -> String {
    let meta = client.metadata();
    meta.get(METADATA_DATABASE)
        .or_else(|| meta.get(METADATA_USER))
        .cloned()
        .unwrap_or_else(|| "postgres".to_string())
}

/// The database names open connections use, with how many use each.
static DATABASES: LazyLock<Mutex<BTreeMap<String, usize>>> = LazyLock::new(Default::default);

/// A connection's use of a database name, counted while the connection lives.
struct DatabaseInUse(String);

impl DatabaseInUse {
    fn new(name: String) -> DatabaseInUse {
        *DATABASES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.clone())
            .or_default() += 1;
        DatabaseInUse(name)
    }
}

impl Drop for DatabaseInUse {
    fn drop(&mut self) {
        let mut all = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = all.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                all.remove(&self.0);
            }
        }
    }
}

/// The databases `pg_database` lists: `postgres` and every name a connection of this
/// process uses, sorted.
pub fn databases_in_use() -> Vec<String> {
    let all = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    let mut names: Vec<String> = all.keys().cloned().collect();
    if !all.contains_key("postgres") {
        names.push("postgres".into());
        names.sort();
    }
    names
}

/// pgwire's parameter statuses, with Tidemark's `server_version`.
struct Parameters;

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
