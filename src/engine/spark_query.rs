//! A sink whose query runs on Spark (`engine = 'spark'`): the task the engine starts in
//! place of the trigger loop. It holds a Spark Connect session for the query's life,
//! starts the query (or finds it again), and turns Spark's progress reports into the
//! registry's, so `SHOW QUERIES`, `tidemark.progress`, `/metrics`, the dashboard and
//! `LISTEN` see it as they see a local query.
//!
//! - The session id and the query's ids are kept in `<checkpoint>/spark-session.json`, so
//!   after a Tidemark restart the same session (if the Connect server still holds it) is
//!   opened again and the running query found among its active ones.
//! - Polling the query's status keeps the session from going idle.
//! - A lost connection is retried; once the server answers again, a query it no longer
//!   runs (the server restarted, the session expired) is started again from its Spark
//!   checkpoint, which makes the restart exactly-once for Spark's sinks.
//! - `STOP`, `DROP` and `ALTER` stop the query on Spark; a Tidemark shutdown leaves it
//!   running there, to be found again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use uuid::Uuid;

use super::progress::{ListenerEvent, Progress, Registry, Status};
use super::query::{Outcome, StopReason};
use crate::catalog::SinkDef;
use crate::error::{Error, Result};
use crate::spark::SparkPlan;
use crate::spark::connect::{QueryIds, Remote, Session, is_connection_lost};

/// How long one call to the Connect server may take, and how long connecting may.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the query's progress and status are asked for.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// The longest wait between attempts to reach a Connect server that does not answer.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(5);

/// Everything the task needs.
pub struct SparkTask {
    pub def: SinkDef,
    pub plan: SparkPlan,
    pub remote: Remote,
    pub registry: Arc<Registry>,
    pub stop: watch::Receiver<Option<StopReason>>,
}

/// What is kept across Tidemark's restarts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SessionFile {
    session_id: String,
    query: Option<QueryIds>,
    /// The newest report announced (LISTEN events, metrics): after a restart, Spark's
    /// recent reports up to it fill `tidemark.progress` again without being announced
    /// twice.
    #[serde(default)]
    announced: Option<Seen>,
}

impl SessionFile {
    fn path(def: &SinkDef) -> PathBuf {
        def.checkpoint.join("spark-session.json")
    }

    fn load(def: &SinkDef) -> SessionFile {
        crate::fsutil::read_optional(&Self::path(def))
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_str::<SessionFile>(&b).ok())
            .filter(|f| Uuid::parse_str(&f.session_id).is_ok())
            .unwrap_or_else(|| SessionFile {
                session_id: Uuid::new_v4().to_string(),
                query: None,
                announced: None,
            })
    }

    fn save(&self, def: &SinkDef) -> Result<()> {
        crate::fsutil::create_dir_all(&def.checkpoint)?;
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::Internal(format!("spark-session.json: {e}")))?;
        crate::fsutil::write_atomic(&Self::path(def), &bytes)
    }
}

/// The Spark query and run ids the sink's last run saved, if any.
pub fn saved_ids(def: &SinkDef) -> Option<(Uuid, Uuid)> {
    let q = SessionFile::load(def).query?;
    Some((
        Uuid::parse_str(&q.id).ok()?,
        Uuid::parse_str(&q.run_id).ok()?,
    ))
}

/// The newest report taken so far: the query's id, and its place in the query's order
/// (Spark's reports are ordered by batch id, then by time: idle reports repeat the batch
/// id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    query: Uuid,
    at: (u64, i64),
}

impl Seen {
    /// Whether a report keyed `self` comes after `taken`: always for another query (the
    /// local run before a move to Spark, a Spark checkpoint started from scratch), else
    /// by batch id and time.
    fn is_after(&self, taken: &Option<Seen>) -> bool {
        taken
            .as_ref()
            .is_none_or(|t| t.query != self.query || self.at > t.at)
    }
}

/// Runs the query on Spark until it finishes, fails or is stopped.
pub async fn run(task: SparkTask) -> Outcome {
    let name = task.def.name.clone();
    let registry = task.registry.clone();
    let outcome = match run_inner(task).await {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(query = %name, error = %e, "query on Spark failed");
            Outcome::Failed(e)
        }
    };
    // A shutdown leaves the query running on Spark: it has not terminated.
    if matches!(outcome, Outcome::Stopped(StopReason::Shutdown)) {
        super::metrics::query_ended(&name, false);
    } else {
        super::query::announce_end(&registry, &name, &outcome);
    }
    outcome
}

async fn run_inner(mut task: SparkTask) -> Result<Outcome> {
    let def = task.def.clone();
    let mut file = SessionFile::load(&def);
    let mut seen = task.registry.last_progress(&def.name).map(|p| Seen {
        query: p.id,
        at: (p.batch_id.get(), p.timestamp.timestamp_millis()),
    });
    let mut retry_wait = Duration::from_millis(100);
    crate::spark::handover::clear_pending_output(
        &def,
        std::path::Path::new(&task.plan.write.checkpoint),
    )?;
    task.registry.update(&def.name, |s| {
        s.engine = "spark";
        s.status = Status::Running;
        s.checkpoint = Some(task.plan.write.checkpoint.clone());
        s.plan = task.plan.pyspark().lines().map(str::to_string).collect();
    });
    loop {
        let asked = *task.stop.borrow();
        if let Some(reason) = asked {
            return Ok(Outcome::Stopped(reason));
        }
        match attach(&task, &mut file).await {
            Ok((mut session, ids)) => {
                retry_wait = Duration::from_millis(100);
                task.registry.update(&def.name, |s| s.error = None);
                match watch_query(&mut task, &mut session, &ids, &mut seen, &mut file).await {
                    // A stopped query's ids stay in the file: SHOW QUERIES shows them after
                    // a restart, and START, not finding it active, starts it again.
                    Ok(Some(outcome)) => return Ok(outcome),
                    Ok(None) => {}
                    Err(e) if is_connection_lost(&e) => note_retry(&task, &e),
                    Err(e) => return Err(e),
                }
            }
            Err(e) if is_connection_lost(&e) => note_retry(&task, &e),
            Err(e) => return Err(e),
        }
        // Wait before trying again, unless asked to stop.
        tokio::select! {
            _ = tokio::time::sleep(retry_wait) => {}
            _ = task.stop.changed() => {}
        }
        retry_wait = (retry_wait * 2).min(MAX_RETRY_WAIT);
    }
}

fn note_retry(task: &SparkTask, e: &Error) {
    tracing::warn!(query = %task.def.name, error = %e, "Spark Connect lost; reconnecting");
    let msg = format!("{e} (reconnecting)");
    task.registry
        .update(&task.def.name, |s| s.error = Some(msg));
}

/// Opens the session and finds the query among its active ones, or starts it from its
/// checkpoint.
async fn attach(task: &SparkTask, file: &mut SessionFile) -> Result<(Session, QueryIds)> {
    let def = &task.def;
    let mut session = Session::connect(&task.remote, &file.session_id, CALL_TIMEOUT).await?;
    let found = match &file.query {
        Some(q) => match session.find_active(&q.id).await {
            Ok(found) => found,
            Err(e) if is_closed_session(&e) => {
                // The server closed that session (it expired): a new one starts the query.
                file.session_id = Uuid::new_v4().to_string();
                session = Session::connect(&task.remote, &file.session_id, CALL_TIMEOUT).await?;
                None
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    let ids = match found {
        Some(ids) => {
            tracing::info!(query = %def.name, id = %ids.id, run_id = %ids.run_id, "found the query on Spark");
            ids
        }
        None => {
            let ids = session.start(&task.plan).await?;
            tracing::info!(query = %def.name, id = %ids.id, run_id = %ids.run_id, remote = %task.remote, "started the query on Spark");
            file.query = Some(ids.clone());
            file.save(def)?;
            if let (Ok(id), Ok(run_id)) = (Uuid::parse_str(&ids.id), Uuid::parse_str(&ids.run_id)) {
                task.registry.post(ListenerEvent::Started {
                    id,
                    run_id,
                    name: def.name.clone(),
                    timestamp: Utc::now(),
                });
            }
            ids
        }
    };
    task.registry.update(&def.name, |s| {
        s.id = Uuid::parse_str(&ids.id).ok();
        s.run_id = Uuid::parse_str(&ids.run_id).ok();
        s.started_at = Some(Utc::now());
    });
    Ok((session, ids))
}

fn is_closed_session(e: &Error) -> bool {
    matches!(e, Error::Spark { message, .. } if message.contains("INVALID_HANDLE"))
}

/// Polls the query until it ends (`Some`) or the connection is lost (an error that
/// `is_connection_lost`).
async fn watch_query(
    task: &mut SparkTask,
    session: &mut Session,
    ids: &QueryIds,
    seen: &mut Option<Seen>,
    file: &mut SessionFile,
) -> Result<Option<Outcome>> {
    loop {
        take_progress(task, session, ids, seen, file).await?;
        let state = session.status(ids).await?;
        if !state.is_active {
            // Reports made between the two calls.
            take_progress(task, session, ids, seen, file).await?;
            return Ok(Some(match session.exception(ids).await? {
                Some(message) => Outcome::Failed(Error::Spark {
                    lost: false,
                    message: format!("the query failed on Spark: {message}"),
                }),
                None => Outcome::Finished,
            }));
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = task.stop.changed() => {}
        }
        let asked = *task.stop.borrow();
        if let Some(reason) = asked {
            if reason == StopReason::User {
                session.stop(ids).await?;
                take_progress(task, session, ids, seen, file).await?;
            }
            return Ok(Some(Outcome::Stopped(reason)));
        }
    }
}

/// A report's place in the order, read without the rest of it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReportKey {
    id: Uuid,
    batch_id: u64,
    timestamp: chrono::DateTime<Utc>,
}

impl ReportKey {
    /// Whether `json` is a report after `taken` (one that does not parse is taken, and
    /// its error reported, by `Progress::from_spark_json`).
    fn is_new(json: &str, taken: &Option<Seen>) -> bool {
        serde_json::from_str::<ReportKey>(json).map_or(true, |k| {
            Seen {
                query: k.id,
                at: (k.batch_id, k.timestamp.timestamp_millis()),
            }
            .is_after(taken)
        })
    }
}

/// Publishes the reports Spark made since the last one taken. Asks for the last report
/// first (small), and for the recent ones (up to 100) only when it is new. Reports an
/// earlier Tidemark process announced (`file.announced`) only fill the registry again.
async fn take_progress(
    task: &SparkTask,
    session: &mut Session,
    ids: &QueryIds,
    seen: &mut Option<Seen>,
    file: &mut SessionFile,
) -> Result<()> {
    let name = &task.def.name;
    let Some(last) = session.last_progress(ids).await? else {
        return Ok(());
    };
    if !ReportKey::is_new(&last, seen) {
        return Ok(());
    }
    let mut announced = false;
    for json in session.recent_progress(ids).await? {
        if !ReportKey::is_new(&json, seen) {
            continue;
        }
        tracing::trace!(query = %name, report = %json, "Spark progress");
        let mut p = match Progress::from_spark_json(&json, Utc::now()) {
            Ok(p) => p,
            Err(e) => {
                let head: String = json.chars().take(4000).collect();
                tracing::warn!(query = %name, error = %e, report = %head, "a Spark progress report did not parse");
                continue;
            }
        };
        let key = Seen {
            query: p.id,
            at: (p.batch_id.get(), p.timestamp.timestamp_millis()),
        };
        if !key.is_after(seen) {
            continue;
        }
        *seen = Some(key.clone());
        if !key.is_after(&file.announced) {
            task.registry.update(name, |s| {
                if !p.idle {
                    s.last_batch_id = Some(p.batch_id);
                }
            });
            p.name = name.clone();
            task.registry.push_progress(p);
            continue;
        }
        file.announced = Some(key);
        // Reported under the sink's name, whatever Spark calls it.
        p.name = name.clone();
        super::metrics::record(&p);
        let idle = p.idle;
        let (id, run_id, timestamp) = (p.id, p.run_id, p.timestamp);
        // No new data: what FLUSH waits for (Spark reports an idle trigger every
        // `noDataProgressEventInterval`, 10 s by default).
        let drained = idle || p.num_input_rows == 0;
        task.registry.update(name, |s| {
            if !idle {
                s.last_batch_id = Some(p.batch_id);
            }
            s.last_progress_at = Some(Utc::now());
            s.triggers += 1;
            if drained {
                s.last_drained_trigger = s.triggers;
            }
        });
        if idle {
            task.registry.push_progress(p);
            task.registry.post(ListenerEvent::Idle {
                id,
                run_id,
                name: name.clone(),
                timestamp,
            });
        } else {
            let p = Arc::new(p);
            task.registry.push_progress((*p).clone());
            task.registry.post(ListenerEvent::Progress(p));
        }
        announced = true;
    }
    if announced {
        file.save(&task.def)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_taken_in_batch_then_time_order_within_a_query() {
        let (q, other) = (Uuid::new_v4(), Uuid::new_v4());
        let seen = |query, batch, ms| Seen {
            query,
            at: (batch, ms),
        };
        let taken = Some(seen(q, 3, 10));
        assert!(seen(q, 4, 1).is_after(&taken));
        assert!(seen(q, 3, 11).is_after(&taken));
        assert!(!seen(q, 3, 10).is_after(&taken));
        assert!(!seen(q, 2, 99).is_after(&taken));
        // A new query (a checkpoint started again) begins at batch 0.
        assert!(seen(other, 0, 1).is_after(&taken));
        assert!(seen(q, 0, 1).is_after(&None));
        let json = |id: Uuid, b| {
            format!(r#"{{"id":"{id}","batchId":{b},"timestamp":"2026-01-01T00:00:00.000Z"}}"#)
        };
        assert!(ReportKey::is_new(&json(other, 0), &taken));
        assert!(!ReportKey::is_new(&json(q, 2), &taken));
    }
}
