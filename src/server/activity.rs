//! The sessions of this server and what each is doing: `pg_stat_activity`, and the
//! databases (`pg_database`) and users (`pg_roles`) open connections use.
//!
//! A connection registers at the end of its startup ([`Registered`], kept in its session
//! extensions and removed when the connection ends); the connection loop marks it active
//! with its statement while a `Query` or `Execute` runs, and idle after.
//!
//! Another session may signal it, as Postgres's `pg_cancel_backend(pid)` and
//! `pg_terminate_backend(pid)` do ([`signal`]): a cancel stops its running statement (as a
//! cancel request does); a termination also ends the connection, with `FATAL 57P01`, once
//! that statement has stopped, or at once when it is idle.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use chrono::{DateTime, Utc};
use datafusion::arrow::array::{Array, AsArray, BooleanArray};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility, create_udf};
use datafusion_postgres::pgwire::api::ConnectionHandle;
use tokio::sync::Notify;

use crate::engine::Engine;

/// One session, as `pg_stat_activity` shows it.
#[derive(Debug)]
pub struct Session {
    pub pid: i32,
    pub database: String,
    pub user: String,
    /// Logged in by trust (a user name that need not be a role).
    pub trusted: bool,
    pub application_name: String,
    pub client: SocketAddr,
    pub backend_start: DateTime<Utc>,
    activity: Mutex<Activity>,
    /// Its running statement's cancel, as a cancel request fires it.
    cancel: Arc<ConnectionHandle>,
    terminating: AtomicBool,
    terminate: Notify,
    /// Its `LISTEN` channels and the notifications not yet sent.
    pub mailbox: super::notify::Mailbox,
}

/// What `pg_cancel_backend` and `pg_terminate_backend` ask of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Cancel,
    Terminate,
}

/// What a session is doing.
#[derive(Debug, Clone)]
pub struct Activity {
    /// `active`, `idle`, `idle in transaction`, `idle in transaction (aborted)`.
    pub state: &'static str,
    /// The running statement, or the last one.
    pub query: String,
    pub query_start: Option<DateTime<Utc>>,
    pub state_change: DateTime<Utc>,
}

impl Session {
    pub fn activity(&self) -> Activity {
        self.activity
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Marks the session running `query`.
    pub fn start(&self, query: &str) {
        let now = Utc::now();
        let mut a = self.activity.lock().unwrap_or_else(|e| e.into_inner());
        a.state = "active";
        a.query = query.to_string();
        a.query_start = Some(now);
        a.state_change = now;
    }

    /// Whether another session asked this one to end.
    pub fn terminating(&self) -> bool {
        self.terminating.load(Ordering::SeqCst)
    }

    /// Resolves when another session asks this one to end (at once if it has).
    pub async fn terminated(&self) {
        let notified = self.terminate.notified();
        if !self.terminating() {
            notified.await;
        }
    }

    /// Marks the session waiting for its client, in `state`.
    pub fn rest(&self, state: &'static str) {
        let mut a = self.activity.lock().unwrap_or_else(|e| e.into_inner());
        if a.state != state {
            a.state = state;
            a.state_change = Utc::now();
        }
    }
}

static SESSIONS: LazyLock<Mutex<BTreeMap<i32, Arc<Session>>>> = LazyLock::new(Default::default);

/// A connection's entry among the sessions, removed when the connection ends.
pub struct Registered(pub Arc<Session>);

impl Registered {
    pub fn new(
        pid: i32,
        database: String,
        user: String,
        trusted: bool,
        application_name: String,
        client: SocketAddr,
        cancel: Arc<ConnectionHandle>,
    ) -> Registered {
        let now = Utc::now();
        let session = Arc::new(Session {
            pid,
            database,
            user,
            trusted,
            application_name,
            client,
            backend_start: now,
            activity: Mutex::new(Activity {
                state: "idle",
                query: String::new(),
                query_start: None,
                state_change: now,
            }),
            cancel,
            terminating: AtomicBool::new(false),
            terminate: Notify::new(),
            mailbox: Default::default(),
        });
        SESSIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, session.clone());
        Registered(session)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut all = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
        if all
            .get(&self.0.pid)
            .is_some_and(|s| Arc::ptr_eq(s, &self.0))
        {
            all.remove(&self.0.pid);
        }
    }
}

/// Every open session, by pid.
pub fn sessions() -> Vec<Arc<Session>> {
    SESSIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect()
}

/// The session `pid`, if it is open.
pub fn session(pid: i32) -> Option<Arc<Session>> {
    SESSIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&pid)
        .cloned()
}

/// Signals session `pid`; false when there is no such session.
pub async fn signal(pid: i32, signal: Signal) -> bool {
    let Some(session) = session(pid) else {
        return false;
    };
    if signal == Signal::Terminate {
        session.terminating.store(true, Ordering::SeqCst);
        session.terminate.notify_waiters();
    }
    session.cancel.cancel().await;
    true
}

/// The databases `pg_database` lists: `postgres` and every name an open connection uses,
/// sorted.
pub fn databases_in_use() -> Vec<String> {
    let mut names: Vec<String> = sessions().iter().map(|s| s.database.clone()).collect();
    names.push("postgres".into());
    names.sort();
    names.dedup();
    names
}

/// The users open connections logged in as by trust, sorted.
pub fn trusted_users() -> Vec<String> {
    let mut names: Vec<String> = sessions()
        .iter()
        .filter(|s| s.trusted)
        .map(|s| s.user.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `pg_cancel_backend(pid, caller)` and `pg_terminate_backend(pid, caller)` (the rewrite
/// adds the caller, the user logged in): true when session `pid` exists and was signalled,
/// false when there is none. A superuser may signal any session, another role only its own
/// (Postgres's rule, without `pg_signal_backend`); otherwise 42501.
pub fn signal_udfs(engine: Weak<Engine>) -> Vec<ScalarUDF> {
    [
        ("pg_cancel_backend", Signal::Cancel),
        ("pg_terminate_backend", Signal::Terminate),
    ]
    .into_iter()
    .map(|(name, signal)| {
        let engine = engine.clone();
        create_udf(
            name,
            vec![DataType::Int64, DataType::Utf8],
            DataType::Boolean,
            Volatility::Volatile,
            Arc::new(move |args: &[ColumnarValue]| {
                let arrays = ColumnarValue::values_to_arrays(args)?;
                let pids = datafusion::arrow::compute::cast(&arrays[0], &DataType::Int64)?;
                let pids = pids.as_primitive::<Int64Type>();
                let callers = datafusion::arrow::compute::cast(&arrays[1], &DataType::Utf8)?;
                let callers = callers.as_string::<i32>();
                let mut out = Vec::with_capacity(pids.len());
                for i in 0..pids.len() {
                    if pids.is_null(i) {
                        out.push(None);
                        continue;
                    }
                    let target = i32::try_from(pids.value(i)).ok().and_then(session);
                    let Some(target) = target else {
                        out.push(Some(false));
                        continue;
                    };
                    let caller = callers.is_valid(i).then(|| callers.value(i));
                    let superuser = |name: &str| {
                        let role = engine.upgrade().and_then(|e| e.role(name));
                        // A user logged in by trust that is not a role is a superuser.
                        role.is_none_or(|r| r.superuser)
                    };
                    let allowed = caller.is_some_and(|c| {
                        superuser(c) || (c == target.user && !superuser(&target.user))
                    });
                    if !allowed {
                        let what = match signal {
                            Signal::Cancel => "cancel query",
                            Signal::Terminate => "terminate process",
                        };
                        return Err(DataFusionError::External(Box::new(
                            crate::error::Error::PermissionDenied {
                                message: format!("permission denied to {what}"),
                                hint: "Only a superuser, or the session's own role, may.".into(),
                            },
                        )));
                    }
                    // The statement that asked goes on; the signal lands in its own time.
                    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                        let pid = target.pid;
                        runtime.spawn(async move { self::signal(pid, signal).await });
                    }
                    out.push(Some(true));
                }
                Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(out))))
            }),
        )
    })
    .collect()
}
