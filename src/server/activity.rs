//! The sessions of this server and what each is doing: `pg_stat_activity`, and the
//! databases (`pg_database`) and users (`pg_roles`) open connections use.
//!
//! A connection registers at the end of its startup ([`Registered`], kept in its session
//! extensions and removed when the connection ends); the connection loop marks it active
//! with its statement while a `Query` or `Execute` runs, and idle after.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock, Mutex};

use chrono::{DateTime, Utc};

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
