//! The startup of a connection, to AuthenticationOk:
//! 1. protocol negotiation, and the client's parameters kept in the session;
//! 2. the connection limit (`--max-connections`, 53300 past it);
//! 3. the proof of who the client is, by [`AuthMethod`]: trust, SCRAM-SHA-256 or md5,
//!    against the roles' stored secrets ([`crate::auth`]);
//! 4. a process id and key for cancelling, and Postgres's parameter statuses.
//!
//! The handler is shared by every connection; what one login has exchanged so far lives
//! in that connection's session extensions, so concurrent logins cannot see each other's
//! state (pgwire's SASL handler keeps it in the shared handler).

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion_postgres::pgwire;
use futures::{Sink, SinkExt};
use pgwire::api::auth::{
    StartupHandler, finish_authentication, protocol_negotiation,
    save_startup_parameters_to_metadata,
};
use pgwire::api::{
    ClientInfo, ConnectionGuard, ConnectionManager, METADATA_USER, PgWireConnectionState,
    PidSecretKeyGenerator, RandomPidSecretKeyGenerator,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::activity::Registered;
use super::interrupt::CancelHandle;
use super::session::{Parameters, connected_database};
use crate::auth::{
    AuthMethod, ScramError, ScramSecret, ScramServer, md5_response_matches, md5_salt,
};
use crate::engine::Engine;

const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// Who a connection is, once its startup is done.
#[derive(Debug, Clone)]
pub struct Login {
    pub user: String,
    /// Admitted without a password (trust): a user name that is no role is a superuser,
    /// as every user of a trust-only server has been.
    pub trusted: bool,
}

/// The startup handler of every connection.
pub struct Startup {
    engine: Arc<Engine>,
    pub connections: Arc<ConnectionManager>,
    pids: RandomPidSecretKeyGenerator,
    auth: Option<AuthMethod>,
    /// Connections past their startup packet, and how many may be (0: no limit).
    open: Arc<AtomicUsize>,
    max_connections: usize,
}

/// What a login has exchanged so far.
enum Exchange {
    ScramFirst,
    ScramFinal(Box<ScramServer>),
    Md5([u8; 4]),
}

/// A connection's place under `--max-connections`, given back when it ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Startup {
    pub fn new(
        engine: Arc<Engine>,
        connections: Arc<ConnectionManager>,
        auth: Option<AuthMethod>,
        max_connections: usize,
    ) -> Startup {
        Startup {
            engine,
            connections,
            pids: RandomPidSecretKeyGenerator::default(),
            auth,
            open: Arc::new(AtomicUsize::new(0)),
            max_connections,
        }
    }

    /// The stored secret of `user`'s password, if it is a role with one.
    fn secret(&self, user: &str) -> Option<crate::auth::Secret> {
        self.engine.role(user).and_then(|r| r.password)
    }

    /// Ends a successful startup.
    async fn admit<C>(&self, client: &mut C, trusted: bool) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let user = user_of(client);
        if let Some(role) = self.engine.role(&user)
            && !role.login
        {
            return Err(fatal(
                "28000",
                format!("role \"{user}\" is not permitted to log in"),
            ));
        }
        let (pid, key) = self.pids.generate(&*client);
        client.set_pid_and_secret_key(pid, key.clone());
        let application_name = client
            .metadata()
            .get("application_name")
            .cloned()
            .unwrap_or_default();
        let (handle, guard) = self.connections.register(pid, key);
        let registered = Registered::new(
            pid,
            connected_database(&*client),
            user.clone(),
            trusted,
            application_name,
            client.socket_addr(),
            handle.clone(),
        );
        let extensions = client.session_extensions();
        extensions.insert::<Registered>(registered);
        extensions.insert::<CancelHandle>(CancelHandle(handle));
        extensions.insert::<ConnectionGuard>(guard);
        extensions.insert::<Login>(Login { user, trusted });
        finish_authentication(client, &Parameters).await
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
        match message {
            PgWireFrontendMessage::Startup(startup) => {
                protocol_negotiation(client, &startup).await?;
                save_startup_parameters_to_metadata(client, &startup);
                let before = self.open.fetch_add(1, Ordering::SeqCst);
                client
                    .session_extensions()
                    .insert::<Slot>(Slot(self.open.clone()));
                if self.max_connections > 0 && before >= self.max_connections {
                    return Err(fatal("53300", "sorry, too many clients already".into()));
                }
                let mut method = AuthMethod::for_peer(self.auth, client.socket_addr().ip());
                // As Postgres's md5: a role whose password is stored only as SCRAM logs in
                // by SCRAM.
                let user = user_of(client);
                if method == AuthMethod::Md5
                    && self
                        .secret(&user)
                        .is_some_and(|s| s.md5.is_none() && s.scram.is_some())
                {
                    method = AuthMethod::ScramSha256;
                }
                let (exchange, request) = match method {
                    AuthMethod::Trust => return self.admit(client, true).await,
                    AuthMethod::ScramSha256 => (
                        Exchange::ScramFirst,
                        Authentication::SASL(vec![SCRAM_SHA_256.into()]),
                    ),
                    AuthMethod::Md5 => {
                        let salt = md5_salt();
                        (
                            Exchange::Md5(salt),
                            Authentication::MD5Password(salt.to_vec()),
                        )
                    }
                };
                set_exchange(client, Some(exchange));
                client.set_state(PgWireConnectionState::AuthenticationInProgress);
                client
                    .send(PgWireBackendMessage::Authentication(request))
                    .await?;
                Ok(())
            }
            PgWireFrontendMessage::PasswordMessageFamily(message) => {
                let user = user_of(client);
                let exchange = take_exchange(client)
                    .ok_or_else(|| fatal("08P01", "unexpected password message".into()))?;
                match exchange {
                    Exchange::ScramFirst => {
                        let initial = message.into_sasl_initial_response()?;
                        if initial.auth_method != SCRAM_SHA_256 {
                            return Err(fatal(
                                "08P01",
                                "client selected an invalid SASL authentication mechanism".into(),
                            ));
                        }
                        // A user that is no role, or has no SCRAM secret, goes through the
                        // exchange with a secret nothing matches.
                        let secret = self
                            .secret(&user)
                            .and_then(|s| s.scram)
                            .and_then(|s| ScramSecret::parse(&s))
                            .unwrap_or_else(ScramSecret::mock);
                        let data = initial.data.unwrap_or_default();
                        let (server, first) = ScramServer::start(secret, &data)
                            .map_err(|e| scram_failure(e, &user))?;
                        set_exchange(client, Some(Exchange::ScramFinal(Box::new(server))));
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLContinue(first.into_bytes().into()),
                            ))
                            .await?;
                        Ok(())
                    }
                    Exchange::ScramFinal(server) => {
                        let response = message.into_sasl_response()?;
                        let last = server
                            .finish(&response.data)
                            .map_err(|e| scram_failure(e, &user))?;
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLFinal(last.into_bytes().into()),
                            ))
                            .await?;
                        self.admit(client, false).await
                    }
                    Exchange::Md5(salt) => {
                        let answer = message.into_password()?;
                        let matches = self
                            .secret(&user)
                            .and_then(|s| s.md5)
                            .is_some_and(|m| md5_response_matches(&m, salt, &answer.password));
                        if !matches {
                            return Err(password_failed(&user));
                        }
                        self.admit(client, false).await
                    }
                }
            }
            _ => Ok(()),
        }
    }
}

fn user_of<C: ClientInfo + ?Sized>(client: &C) -> String {
    client
        .metadata()
        .get(METADATA_USER)
        .cloned()
        .unwrap_or_default()
}

fn set_exchange<C: ClientInfo + ?Sized>(client: &C, exchange: Option<Exchange>) {
    let slot = client
        .session_extensions()
        .get_or_insert_with(|| Mutex::new(None::<Exchange>));
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = exchange;
}

fn take_exchange<C: ClientInfo + ?Sized>(client: &C) -> Option<Exchange> {
    client
        .session_extensions()
        .get::<Mutex<Option<Exchange>>>()
        .and_then(|slot| slot.lock().unwrap_or_else(|e| e.into_inner()).take())
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".into(),
        code.into(),
        message,
    )))
}

fn password_failed(user: &str) -> PgWireError {
    tracing::warn!(user, "password authentication failed");
    fatal(
        "28P01",
        format!("password authentication failed for user \"{user}\""),
    )
}

fn scram_failure(e: ScramError, user: &str) -> PgWireError {
    match e {
        ScramError::WrongPassword => password_failed(user),
        ScramError::Malformed(message) => fatal("08P01", message),
    }
}
