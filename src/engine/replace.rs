//! `CREATE OR REPLACE SINK | MATERIALIZED VIEW` over an existing one, as dbt re-runs a
//! model: the same definition leaves the running query alone; a definition that differs only
//! in options `ALTER ... SET` may change is applied as that `ALTER`; any other change
//! replaces the definition over the same checkpoint, which must be able to serve it (spec
//! §9.4, Spark's rule): an incompatible change is refused with 55000 and the old query keeps
//! running.

use std::collections::BTreeSet;

use super::{Engine, Output, StopReason, query, query_def, sink_streams_of};
use crate::catalog::{SinkDef, SinkState};
use crate::error::{Error, Result};
use crate::sink::SinkConnector;
use crate::sql::options::{OptionTable, Options};
use crate::sql::parser::{CreateSink, QueryKind};

/// What `CREATE OR REPLACE` does to an existing sink or view.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Replacement {
    /// The same definition: nothing changes; the query keeps running.
    Same,
    /// Only alterable options differ: these values are set, as `ALTER ... SET` sets them
    /// (an option no longer given is set back to its default).
    Alter(Options),
    /// The query or an option `ALTER` cannot change differs.
    Redefine,
}

/// Compares an existing definition with a new one of the same name and kind. Options are
/// compared as written; alterability comes from the connector's option table.
pub(crate) fn replacement(old: &SinkDef, new: &SinkDef, table: &OptionTable) -> Replacement {
    let alterable = |key: &str| table.get(key).is_some_and(|o| o.alterable);
    let fixed = |o: &Options| {
        o.0.iter()
            .filter(|(k, _)| !alterable(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    if old.query != new.query
        || old.merge != new.merge
        || fixed(&old.options) != fixed(&new.options)
    {
        return Replacement::Redefine;
    }
    let keys: BTreeSet<&String> = old
        .options
        .0
        .keys()
        .chain(new.options.0.keys())
        .filter(|k| alterable(k))
        .collect();
    let mut changed = Options::default();
    for key in keys {
        let before = old.options.get(key);
        let after = match new.options.get(key) {
            Some(v) => v,
            // Dropped from the definition: back to the default, if it has one.
            None => match table.get(key).and_then(|o| o.default) {
                Some(default) => default,
                None => return Replacement::Redefine,
            },
        };
        if before != Some(after) {
            changed.0.insert(key.clone(), after.to_string());
        }
    }
    if changed.0.is_empty() {
        Replacement::Same
    } else {
        Replacement::Alter(changed)
    }
}

impl Engine {
    /// `CREATE OR REPLACE` of a sink or view that exists (see the module documentation).
    pub(super) async fn replace_sink(&self, cs: CreateSink) -> Result<Output> {
        let tag = Output::Command(format!("CREATE {}", cs.kind.keyword()));
        let (name, kind) = (cs.name.clone(), cs.kind);
        let mut cat = self.catalog.lock().await;
        let old = query_def(&cat, &name, kind)?.clone();
        let (mut new, shape) = self.sink_def(&cat, &cs).await?;
        let table = match new.connector() {
            Ok(c) if kind == QueryKind::Sink => c.option_table(),
            _ => crate::catalog::option_table(kind),
        };
        match replacement(&old, &new, table) {
            Replacement::Same => {
                tracing::info!(name = %name, "CREATE OR REPLACE: the definition is unchanged");
                let notice = format!("{} \"{name}\" is unchanged: it keeps running", kind.noun());
                return Ok(Output::Notice(notice, Box::new(tag)));
            }
            Replacement::Alter(options) => {
                drop(cat);
                tracing::info!(name = %name, options = ?options.0, "CREATE OR REPLACE: altering");
                let set: Vec<String> = options
                    .0
                    .iter()
                    .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
                    .collect();
                self.alter_sink(&name, options, kind).await?;
                let notice = format!(
                    "{} \"{name}\" altered in place: SET ({})",
                    kind.noun(),
                    set.join(", ")
                );
                return Ok(Output::Notice(notice, Box::new(tag)));
            }
            Replacement::Redefine => {}
        }
        if old.runs_on_spark() || new.runs_on_spark() {
            return Err(Error::Unsupported {
                message: format!(
                    "CREATE OR REPLACE of a sink on Spark changes only what ALTER SINK can \
                     (\"{name}\" would get a new definition)"
                ),
                hint: Some("Drop the sink and create it again.".into()),
            });
        }
        if cat
            .sinks
            .iter()
            .any(|s| s.name != name && s.checkpoint == new.checkpoint)
        {
            return Err(Error::invalid_option(format!(
                "checkpoint location \"{}\" is used by another sink or view",
                new.checkpoint.display()
            )));
        }
        // The checkpoint must serve the new definition; until it is known to, nothing changes.
        let streams = sink_streams_of(&new, &cat)?;
        crate::checkpoint::check_definition(
            &new.checkpoint,
            &format!("{} \"{}\"", kind.noun(), new.name),
            &query::checkpoint_definition(&new, &streams, &shape),
        )?;
        let connector = new.connector()?;
        // A view's rows and a file sink's files are read back in the query's columns: those
        // must stay as they were.
        if matches!(connector, SinkConnector::View | SinkConnector::File(_))
            && Self::sink_output(&old, &cat).await? != shape.output()
        {
            return Err(Error::IncompatibleCheckpoint {
                message: format!(
                    "the new definition of \"{name}\" changes the columns its rows are kept in"
                ),
                hint: format!(
                    "Drop the {} and create it again (dbt: --full-refresh).",
                    kind.noun()
                ),
            });
        }
        connector
            .prepare(&new.name, &new.path, &shape.schema)
            .await?;
        for side in super::side_tables::SideTable::wanted_by(&new.options) {
            self.ensure_side_table(&mut cat, &name, side).await?;
        }
        drop(cat);
        tracing::info!(
            name = %name,
            checkpoint = %new.checkpoint.display(),
            "CREATE OR REPLACE: a new definition over the checkpoint"
        );
        self.stop_query(&name, StopReason::User).await;
        let mut cat = self.catalog.lock().await;
        let Some(i) = cat.sinks.iter().position(|s| s.name == name) else {
            return Err(Error::UndefinedObject {
                kind: kind.noun(),
                name,
            });
        };
        // A stopped query stays stopped; a failed one gets its new definition tried.
        new.state = match old.state {
            SinkState::Failed => SinkState::Running,
            state => state,
        };
        if kind == QueryKind::MaterializedView {
            crate::sink::view::forget(&old.path);
        }
        cat.sinks[i] = new.clone();
        let registered = match self.register_sink(&new, &cat).await {
            Ok(()) => cat.save(&self.data_dir),
            Err(e) => Err(e),
        };
        if let Err(e) = registered {
            cat.sinks[i] = old.clone();
            if let Err(again) = self.register_sink(&old, &cat).await {
                tracing::error!(name = %name, error = %again, "restoring the old definition");
            }
            if old.state == SinkState::Running {
                self.spawn(&cat, &old)?;
            }
            return Err(e);
        }
        if old.owns_checkpoint && old.checkpoint != new.checkpoint {
            let _ = std::fs::remove_dir_all(&old.checkpoint);
        }
        if new.state == SinkState::Running {
            self.spawn(&cat, &new)?;
        }
        let notice = format!(
            "{} \"{name}\" replaced: its new query goes on from its checkpoint",
            kind.noun()
        );
        Ok(Output::Notice(notice, Box::new(tag)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(query: &str, options: &[(&str, &str)]) -> SinkDef {
        let mut d: SinkDef = serde_json::from_value(serde_json::json!({
            "name": "s",
            "query": query,
            "options": {},
            "streams": ["clicks"],
            "path": "/t/s",
            "checkpoint": "/c/s",
            "trigger": "default",
            "output_mode": "append",
            "state": "running",
        }))
        .unwrap();
        d.kind = QueryKind::Sink;
        for (k, v) in options {
            d.options.0.insert(k.to_string(), v.to_string());
        }
        d
    }

    #[test]
    fn the_same_definition_is_kept_and_alterable_options_are_altered() {
        let table = crate::catalog::option_table(QueryKind::Sink);
        let q = "SELECT * FROM clicks";
        let old = def(
            q,
            &[("trigger", "processing_time 1 second"), ("path", "/t/s")],
        );
        assert_eq!(replacement(&old, &old.clone(), table), Replacement::Same);
        let new = def(
            q,
            &[("trigger", "processing_time 5 seconds"), ("path", "/t/s")],
        );
        let Replacement::Alter(changed) = replacement(&old, &new, table) else {
            panic!("not an alter")
        };
        assert_eq!(changed.get("trigger"), Some("processing_time 5 seconds"));
        assert_eq!(changed.0.len(), 1);
        // A trigger no longer given goes back to its default.
        let new = def(q, &[("path", "/t/s")]);
        let Replacement::Alter(changed) = replacement(&old, &new, table) else {
            panic!("not an alter")
        };
        assert_eq!(changed.get("trigger"), Some("default"));
    }

    #[test]
    fn a_new_query_or_fixed_option_is_a_redefinition() {
        let table = crate::catalog::option_table(QueryKind::Sink);
        let old = def("SELECT * FROM clicks", &[("path", "/t/s")]);
        let new = def("SELECT * FROM clicks WHERE x > 1", &[("path", "/t/s")]);
        assert_eq!(replacement(&old, &new, table), Replacement::Redefine);
        let new = def("SELECT * FROM clicks", &[("path", "/t/other")]);
        assert_eq!(replacement(&old, &new, table), Replacement::Redefine);
        // A rate limit dropped from the definition has no default to go back to.
        let old = def("SELECT * FROM clicks", &[("max_files_per_trigger", "3")]);
        let new = def("SELECT * FROM clicks", &[]);
        assert_eq!(replacement(&old, &new, table), Replacement::Redefine);
    }
}
