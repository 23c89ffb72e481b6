//! Who may log in and who is logged in, as the catalog shows it: `pg_roles`, `pg_authid`,
//! `pg_user` and `pg_stat_activity`.
//!
//! The roles are datafusion-postgres's predefined ones (`pg_read_all_data`, …, and the
//! bootstrap superuser `postgres`, oid 10, which `relowner` names), every role made with
//! `CREATE ROLE`, and every user name a connection logged in with by trust (a superuser,
//! since it may do anything), so `WHERE rolname = current_user` finds a row. Stored
//! password hashes are never shown: `pg_roles.rolpassword` is `********` as in Postgres,
//! and `pg_authid.rolpassword` NULL.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, AsArray, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, new_null_array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use super::activity;
use super::catalog::{Patch, batch_by_name, collect_all, database_oid, oid_of_name};
use crate::engine::Engine;

/// One row of `pg_roles`.
#[derive(Debug, Clone, PartialEq)]
struct RoleRow {
    oid: i32,
    name: String,
    superuser: bool,
    login: bool,
}

/// A role's oid: the bootstrap superuser's 10, otherwise derived from the name.
fn role_oid(name: &str) -> i32 {
    if name == "postgres" {
        10
    } else {
        oid_of_name(name)
    }
}

/// `pg_roles` or `pg_authid`, datafusion-postgres's table with Tidemark's roles.
#[derive(Debug)]
pub struct PgRoles {
    pub inner: Arc<dyn TableProvider>,
    /// datafusion-postgres's `pg_authid`, which has the predefined roles' rows (its
    /// `pg_roles` has none).
    pub predefined: Arc<dyn TableProvider>,
    pub engine: Weak<Engine>,
    /// `pg_roles` shows `********` for a password; `pg_authid` would show the hash, and
    /// shows NULL instead.
    pub show_password: bool,
}

impl PgRoles {
    async fn rows(&self, state: &dyn Session) -> Result<Vec<RoleRow>> {
        let schema = self.predefined.schema();
        let batches = collect_all(&self.predefined, state).await?;
        let all = datafusion::arrow::compute::concat_batches(&schema, &batches)?;
        let column = |name: &str| schema.index_of(name).ok().map(|i| all.column(i).clone());
        let mut rows = Vec::new();
        if let (Some(oid), Some(name)) = (column("oid"), column("rolname")) {
            let oid = cast(&oid, &DataType::Int32)?;
            let oid = oid.as_primitive::<Int32Type>();
            let name = cast(&name, &DataType::Utf8)?;
            let name = name.as_string::<i32>();
            for i in 0..all.num_rows() {
                let n = name.value(i);
                // The predefined roles, and the bootstrap superuser.
                if n.starts_with("pg_") || n == "postgres" {
                    rows.push(RoleRow {
                        oid: oid.value(i),
                        name: n.to_string(),
                        superuser: n == "postgres",
                        login: n == "postgres",
                    });
                }
            }
        }
        let roles = self.engine.upgrade().map(|e| e.roles()).unwrap_or_default();
        for role in roles {
            rows.retain(|r| r.name != role.name);
            rows.push(RoleRow {
                oid: role_oid(&role.name),
                name: role.name.clone(),
                superuser: role.superuser,
                login: role.login,
            });
        }
        for user in activity::trusted_users() {
            if !rows.iter().any(|r| r.name == user) {
                rows.push(RoleRow {
                    oid: role_oid(&user),
                    name: user,
                    superuser: true,
                    login: true,
                });
            }
        }
        Ok(rows)
    }
}

#[async_trait]
impl Patch for PgRoles {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let rows = self.rows(state).await?;
        let password = self.show_password.then_some("********");
        Ok(vec![role_batch(&self.inner.schema(), &rows, password)?])
    }
}

/// `rows` in `schema`'s columns, each by its name (`pg_roles`'s, `pg_authid`'s or
/// `pg_user`'s); a column no role attribute answers is NULL.
fn role_batch(schema: &SchemaRef, rows: &[RoleRow], password: Option<&str>) -> Result<RecordBatch> {
    let flags = |f: &dyn Fn(&RoleRow) -> bool| -> ArrayRef {
        Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(f(r)))))
    };
    batch_by_name(schema, rows.len(), |name| {
        Some(match name {
            "oid" | "usesysid" => {
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.oid)))
            }
            "rolname" | "usename" => {
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.name)))
            }
            "rolsuper" | "usesuper" | "rolcreaterole" | "rolcreatedb" | "usecreatedb"
            | "rolreplication" | "userepl" | "rolbypassrls" | "usebypassrls" => {
                flags(&|r| r.superuser)
            }
            "rolinherit" => flags(&|_| true),
            "rolcanlogin" => flags(&|r| r.login),
            "rolconnlimit" => Arc::new(Int32Array::from_iter_values(rows.iter().map(|_| -1))),
            "rolpassword" | "passwd" => Arc::new(StringArray::from_iter(
                rows.iter().map(|r| password.filter(|_| r.login)),
            )),
            _ => return None,
        })
    })
}

/// `pg_user`: the roles that may log in, in Postgres's view's columns.
#[derive(Debug)]
pub struct PgUser {
    pub roles: Arc<PgRoles>,
}

fn pg_user_schema() -> SchemaRef {
    let text = |n: &str| Field::new(n, DataType::Utf8, true);
    let flag = |n: &str| Field::new(n, DataType::Boolean, true);
    Arc::new(Schema::new(vec![
        text("usename"),
        Field::new("usesysid", DataType::Int32, true),
        flag("usecreatedb"),
        flag("usesuper"),
        flag("userepl"),
        flag("usebypassrls"),
        text("passwd"),
        Field::new(
            "valuntil",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new(
            "useconfig",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ),
    ]))
}

#[async_trait]
impl TableProvider for PgUser {
    fn schema(&self) -> SchemaRef {
        pg_user_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let rows: Vec<RoleRow> = self
            .roles
            .rows(state)
            .await?
            .into_iter()
            .filter(|r| r.login)
            .collect();
        let schema = pg_user_schema();
        let batch = role_batch(&schema, &rows, Some("********"))?;
        MemTable::try_new(schema, vec![vec![batch]])?
            .scan(state, projection, filters, limit)
            .await
    }
}

/// `pg_stat_activity`: one row per open session.
pub fn pg_stat_activity() -> Result<MemTable> {
    let text = |n: &str| Field::new(n, DataType::Utf8, true);
    let int = |n: &str| Field::new(n, DataType::Int32, true);
    let time = |n: &str| {
        Field::new(
            n,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        )
    };
    let schema = Arc::new(Schema::new(vec![
        int("datid"),
        text("datname"),
        int("pid"),
        int("leader_pid"),
        int("usesysid"),
        text("usename"),
        text("application_name"),
        text("client_addr"),
        text("client_hostname"),
        int("client_port"),
        time("backend_start"),
        time("xact_start"),
        time("query_start"),
        time("state_change"),
        text("wait_event_type"),
        text("wait_event"),
        text("state"),
        text("backend_xid"),
        text("backend_xmin"),
        Field::new("query_id", DataType::Int64, true),
        text("query"),
        text("backend_type"),
    ]));
    let sessions = activity::sessions();
    let activities: Vec<_> = sessions.iter().map(|s| s.activity()).collect();
    let n = sessions.len();
    let ts = |f: &dyn Fn(usize) -> Option<i64>| -> ArrayRef {
        Arc::new(TimestampMicrosecondArray::from_iter((0..n).map(f)).with_timezone("UTC"))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from_iter_values(
            sessions.iter().map(|s| database_oid(&s.database)),
        )),
        Arc::new(StringArray::from_iter_values(
            sessions.iter().map(|s| &s.database),
        )),
        Arc::new(Int32Array::from_iter_values(sessions.iter().map(|s| s.pid))),
        new_null_array(&DataType::Int32, n),
        Arc::new(Int32Array::from_iter_values(
            sessions.iter().map(|s| role_oid(&s.user)),
        )),
        Arc::new(StringArray::from_iter_values(
            sessions.iter().map(|s| &s.user),
        )),
        Arc::new(StringArray::from_iter_values(
            sessions.iter().map(|s| &s.application_name),
        )),
        Arc::new(StringArray::from_iter_values(
            sessions.iter().map(|s| s.client.ip().to_string()),
        )),
        new_null_array(&DataType::Utf8, n),
        Arc::new(Int32Array::from_iter_values(
            sessions.iter().map(|s| i32::from(s.client.port())),
        )),
        ts(&|i| Some(sessions[i].backend_start.timestamp_micros())),
        new_null_array(
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            n,
        ),
        ts(&|i| activities[i].query_start.map(|t| t.timestamp_micros())),
        ts(&|i| Some(activities[i].state_change.timestamp_micros())),
        new_null_array(&DataType::Utf8, n),
        new_null_array(&DataType::Utf8, n),
        Arc::new(StringArray::from_iter_values(
            activities.iter().map(|a| a.state),
        )),
        new_null_array(&DataType::Utf8, n),
        new_null_array(&DataType::Utf8, n),
        Arc::new(Int64Array::from(vec![None::<i64>; n])),
        Arc::new(StringArray::from_iter_values(
            activities.iter().map(|a| a.query.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            sessions.iter().map(|_| "client backend"),
        )),
    ];
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    MemTable::try_new(schema, vec![vec![batch]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Array;

    #[test]
    fn role_rows_fill_each_catalogs_columns_by_name() {
        let rows = vec![
            RoleRow {
                oid: 10,
                name: "postgres".into(),
                superuser: true,
                login: true,
            },
            RoleRow {
                oid: 6181,
                name: "pg_read_all_data".into(),
                superuser: false,
                login: false,
            },
        ];
        let batch = role_batch(&pg_user_schema(), &rows, Some("********")).unwrap();
        assert_eq!(batch.num_rows(), 2);
        let passwd = batch.column_by_name("passwd").unwrap().as_string::<i32>();
        assert_eq!(passwd.value(0), "********");
        assert!(
            passwd.is_null(1),
            "a role that cannot log in has no password shown"
        );
        let sysid = batch.column_by_name("usesysid").unwrap();
        assert_eq!(sysid.as_primitive::<Int32Type>().value(1), 6181);
        assert!(batch.column_by_name("valuntil").unwrap().is_null(0));
        assert_eq!(role_oid("postgres"), 10);
        assert!(role_oid("ann") > 16384);
    }
}

/// `pg_auth_members`: datafusion-postgres's rows, and one per predefined role granted to a
/// role (`GRANT pg_read_all_data TO name`), so psql's `\du` shows "Member of".
#[derive(Debug)]
pub struct PgAuthMembers {
    pub inner: Arc<dyn TableProvider>,
    pub predefined: Arc<dyn TableProvider>,
    pub engine: Weak<Engine>,
}

#[async_trait]
impl Patch for PgAuthMembers {
    fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }

    async fn batches(&self, state: &dyn Session) -> Result<Vec<RecordBatch>> {
        let roles = PgRoles {
            inner: self.predefined.clone(),
            predefined: self.predefined.clone(),
            engine: self.engine.clone(),
            show_password: false,
        };
        let oids: std::collections::HashMap<String, i32> = roles
            .rows(state)
            .await?
            .into_iter()
            .map(|r| (r.name, r.oid))
            .collect();
        let mut grants = Vec::new();
        for role in self.engine.upgrade().map(|e| e.roles()).unwrap_or_default() {
            for granted in &role.member_of {
                if let Some(&oid) = oids.get(granted) {
                    grants.push((oid, role_oid(&role.name)));
                }
            }
        }
        let mut batches = collect_all(&self.inner, state).await?;
        let n = grants.len();
        batches.push(batch_by_name(&self.inner.schema(), n, |name| {
            Some(match name {
                "oid" => Arc::new(Int32Array::from_iter_values(
                    grants.iter().map(|(g, m)| oid_of_name(&format!("{g}:{m}"))),
                )) as ArrayRef,
                "roleid" => Arc::new(Int32Array::from_iter_values(grants.iter().map(|g| g.0))),
                "member" => Arc::new(Int32Array::from_iter_values(grants.iter().map(|g| g.1))),
                "grantor" => Arc::new(Int32Array::from_iter_values(grants.iter().map(|_| 10))),
                "admin_option" => Arc::new(BooleanArray::from(vec![false; n])),
                "inherit_option" | "set_option" => Arc::new(BooleanArray::from(vec![true; n])),
                _ => return None,
            })
        })?);
        Ok(batches)
    }
}
