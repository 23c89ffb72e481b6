//! The catalog side by side with PostgreSQL: the same table made in Tidemark and in a real
//! PostgreSQL cluster, then the queries BI tools and drivers send to browse a database
//! (`information_schema`, Metabase's field sync, Grafana's table and column lists,
//! correlated catalog lookups, the functions they call) must answer the same rows.
//! Where Tidemark also claims Postgres's column names, they must agree too.

use crate::harness::{Postgres, TestServer, connect_as};
use tokio_postgres::{Client, SimpleQueryMessage};

/// What must agree.
#[derive(Clone, Copy, PartialEq)]
enum Agree {
    /// The rows, as text.
    Rows,
    /// The rows and the column names.
    Named,
}

/// The table, as both servers take it. (A `varchar` column would differ: Tidemark stores
/// it as `text`, and says so.)
const TABLE: &str = "CREATE TABLE dims (id bigint PRIMARY KEY, name text, price double precision, \
    qty integer, small smallint, at timestamp, at_tz timestamptz, day date, ok boolean, \
    amount numeric(10,2), r real)";

const CASES: &[(&str, Agree)] = &[
    (
        "SELECT column_name, ordinal_position, is_nullable, data_type, udt_schema, udt_name, \
         numeric_precision, numeric_precision_radix, numeric_scale, datetime_precision, \
         character_maximum_length, character_octet_length, is_identity, is_generated, \
         column_default, is_updatable, dtd_identifier \
         FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'dims' \
         ORDER BY ordinal_position",
        Agree::Named,
    ),
    (
        "SELECT table_schema, table_name, table_type, is_insertable_into, is_typed \
         FROM information_schema.tables WHERE table_schema = 'public'",
        Agree::Named,
    ),
    (
        "SELECT constraint_schema, constraint_name, table_name, constraint_type, is_deferrable, \
         initially_deferred, enforced FROM information_schema.table_constraints \
         WHERE table_schema = 'public' AND constraint_type = 'PRIMARY KEY'",
        Agree::Named,
    ),
    (
        "SELECT constraint_name, table_name, column_name, ordinal_position, \
         position_in_unique_constraint FROM information_schema.key_column_usage \
         WHERE table_schema = 'public'",
        Agree::Named,
    ),
    (
        "SELECT schema_name FROM information_schema.schemata WHERE schema_name = 'public'",
        Agree::Named,
    ),
    // Metabase's field sync (metabase/driver/postgres.clj), as it sends it.
    (
        r#"SELECT c.column_name AS name, c.udt_name AS "database-type", c.ordinal_position - 1 AS "database-position", c.table_schema AS "table-schema", c.table_name AS "table-name", pk.column_name IS NOT NULL AS "pk?", COL_DESCRIPTION(CAST(CAST(FORMAT('%I.%I', CAST(c.table_schema AS TEXT), CAST(c.table_name AS TEXT)) AS REGCLASS) AS OID), c.ordinal_position) AS "field-comment", ((column_default IS NULL) OR (LOWER(column_default) = 'null')) AND (is_nullable = 'NO') AND NOT (((column_default IS NOT NULL) AND (column_default LIKE '%nextval(%')) OR (is_identity <> 'NO')) AS "database-required", ((column_default IS NOT NULL) AND (column_default LIKE '%nextval(%')) OR (is_identity <> 'NO') AS "database-is-auto-increment" FROM information_schema.columns AS c LEFT JOIN (SELECT tc.table_schema, tc.table_name, kc.column_name FROM information_schema.table_constraints AS tc INNER JOIN information_schema.key_column_usage AS kc ON (tc.constraint_name = kc.constraint_name) AND (tc.table_schema = kc.table_schema) AND (tc.table_name = kc.table_name) WHERE tc.constraint_type = 'PRIMARY KEY') AS pk ON (c.table_schema = pk.table_schema) AND (c.table_name = pk.table_name) AND (c.column_name = pk.column_name) WHERE c.table_schema !~ '^information_schema|catalog_history|pg_' AND (c.table_schema IN ('public')) ORDER BY "table-schema" ASC, "table-name" ASC, "database-position" ASC"#,
        Agree::Named,
    ),
    // Grafana's table list: the tables of the schemas on the search path.
    (
        r#"SELECT quote_ident(table_name) AS "table" FROM information_schema.tables WHERE quote_ident(table_schema) NOT IN ('information_schema', 'pg_catalog', '_timescaledb_cache', '_timescaledb_catalog', '_timescaledb_internal', '_timescaledb_config', 'timescaledb_information', 'timescaledb_experimental') AND table_type = 'BASE TABLE' AND quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1), array_upper(string_to_array(current_setting('search_path'),','),1)) as i, string_to_array(current_setting('search_path'),',') s)"#,
        Agree::Named,
    ),
    // Grafana's column list of a table.
    (
        r#"SELECT quote_ident(column_name) AS "column", data_type AS "type" FROM information_schema.columns WHERE CASE WHEN array_length(parse_ident('dims'),1) = 2 THEN quote_ident(table_schema) = (parse_ident('dims'))[1] AND quote_ident(table_name) = (parse_ident('dims'))[2] ELSE quote_ident(table_name) = 'dims' AND quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '"$user"' THEN user ELSE trim(s[i]) END FROM generate_series(array_lower(string_to_array(current_setting('search_path'),','),1), array_upper(string_to_array(current_setting('search_path'),','),1)) as i, string_to_array(current_setting('search_path'),',') s) END"#,
        Agree::Named,
    ),
    // Grafana's schema API (its backend, over the extended protocol; here as text).
    (
        "SELECT column_name, data_type, udt_name, numeric_precision, numeric_scale \
         FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'dims' \
         ORDER BY ordinal_position",
        Agree::Named,
    ),
    // Metabase's table list: pg_class with its comment (none for a table made here).
    (
        r#"SELECT "n"."nspname" AS "schema", "c"."relname" AS "name", CASE "c"."relkind" WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE' WHEN 'v' THEN 'VIEW' WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE NULL END AS "type" FROM "pg_catalog"."pg_class" AS "c" INNER JOIN "pg_catalog"."pg_namespace" AS "n" ON "c"."relnamespace" = "n"."oid" LEFT JOIN "pg_catalog"."pg_description" AS "d" ON ("c"."oid" = "d"."objoid") AND ("d"."objsubid" = '0') AND ("d"."classoid" = 'pg_class'::regclass) WHERE ("c"."relnamespace" = "n"."oid") AND ("n"."nspname" !~ '^pg_') AND ("n"."nspname" <> 'information_schema') AND c.relkind in ('r', 'p', 'v', 'f', 'm') AND ("n"."nspname" IN ('public')) ORDER BY "type" ASC, "schema" ASC, "name" ASC"#,
        Agree::Named,
    ),
    // Correlated lookups (pgcli's and Npgsql's shape), and the system catalogs' oids
    // joining across pg_type and pg_class.
    (
        "SELECT t.typname, (SELECT c.relname FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid) \
         AS rel FROM pg_catalog.pg_type t WHERE t.typname IN ('pg_class', 'pg_type', 'int4') \
         ORDER BY 1",
        Agree::Named,
    ),
    (
        "SELECT a.attname, (SELECT t.typname FROM pg_catalog.pg_type t WHERE t.oid = a.atttypid) \
         AS type FROM pg_catalog.pg_attribute a \
         WHERE a.attrelid = 'dims'::regclass AND a.attnum > 0 ORDER BY a.attnum",
        Agree::Named,
    ),
    (
        "SELECT 'pg_class'::regclass::oid, 'pg_catalog.pg_type'::regclass::oid, \
         to_regclass('pg_namespace')::oid AS ns, to_regclass('nope') IS NULL AS missing, \
         to_regclass('dims') = 'dims'::regclass AS dims",
        Agree::Rows,
    ),
    (
        "SELECT a.attname, a.atttypid::regtype::text FROM pg_catalog.pg_attribute a \
         WHERE a.attrelid = 'dims'::regclass AND a.attnum > 0 ORDER BY a.attnum",
        Agree::Named,
    ),
    (
        "SELECT current_database(), pg_backend_pid() > 0 AS live",
        Agree::Named,
    ),
    (
        "SELECT datname FROM pg_catalog.pg_database WHERE datname = current_database()",
        Agree::Named,
    ),
    (
        "SELECT format('%s|%I|%L|%L|%2$s|%%', 'a b', 'A b', 'it''s', NULL) AS f, \
         format('%I.%I', 'public', 'dims') AS g",
        Agree::Named,
    ),
    (
        "SELECT pg_size_pretty(0::bigint), pg_size_pretty(10239::bigint), \
         pg_size_pretty(10240::bigint), pg_size_pretty(1234567::bigint), \
         pg_size_pretty(123456789012::bigint), pg_size_pretty(-10240::bigint)",
        Agree::Rows,
    ),
    // Result columns named as Postgres names them.
    (
        "SELECT count(*), max(price), 1, min(day)::text FROM dims",
        Agree::Named,
    ),
    (
        "SELECT format_type(20, NULL), format_type(1184, -1), format_type(25, NULL)",
        Agree::Rows,
    ),
    (
        // (A relation's obj_description is Tidemark's line on what it is; sql/slt/catalog.slt.)
        "SELECT obj_description(123456789, 'pg_class') IS NULL AS unknown, \
         col_description('dims'::regclass, 1) IS NULL AS no_column_comment",
        Agree::Rows,
    ),
];

type Rows = (Vec<String>, Vec<Vec<Option<String>>>);

/// One statement's answer, as text: its column names and rows.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ResultSet {
    pub names: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

/// The answers of a simple Query message, one per statement that returns rows (or
/// completes), in order; an error reads `SQLSTATE: message`.
pub(crate) async fn result_sets(client: &Client, sql: &str) -> Result<Vec<ResultSet>, String> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(|e| match e.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        })?;
    let mut sets = Vec::new();
    let mut current = ResultSet::default();
    for m in messages {
        match m {
            SimpleQueryMessage::RowDescription(cols) => {
                current.names = cols.iter().map(|c| c.name().to_string()).collect();
            }
            SimpleQueryMessage::Row(row) => {
                current.rows.push(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_string))
                        .collect(),
                );
            }
            SimpleQueryMessage::CommandComplete(_) => sets.push(std::mem::take(&mut current)),
            _ => {}
        }
    }
    Ok(sets)
}

async fn rows(client: &Client, sql: &str) -> Result<Rows, String> {
    let last = result_sets(client, sql).await?.pop().unwrap_or_default();
    Ok((last.names, last.rows))
}

/// Tidemark and a PostgreSQL cluster of its own, each after `setup`, connected as user and
/// database `postgres` (the one database a fresh cluster has).
pub(crate) struct SideBySide {
    pub server: TestServer,
    pub tidemark: Client,
    pub pg: Client,
    pub _postgres: Postgres,
    pub _dir: tempfile::TempDir,
}

/// Starts both, or `None` where PostgreSQL is not installed outside CI.
pub(crate) async fn side_by_side(setup: &[&str]) -> Option<SideBySide> {
    let dir = tempfile::tempdir().unwrap();
    let postgres = Postgres::start(dir.path())?;
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    let tidemark = connect_as(server.port, "postgres").await;
    let pg = postgres.connect().await;
    for sql in setup {
        tidemark.batch_execute(sql).await.unwrap();
        pg.batch_execute(sql).await.unwrap();
    }
    Some(SideBySide {
        server,
        tidemark,
        pg,
        _postgres: postgres,
        _dir: dir,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_queries_answer_as_postgres_answers() {
    let Some(SideBySide {
        server,
        tidemark,
        pg,
        _postgres,
        _dir,
    }) = side_by_side(&[TABLE]).await
    else {
        return;
    };
    let mut mismatches = Vec::new();
    for (sql, agree) in CASES {
        let theirs = rows(&pg, sql).await;
        let ours = rows(&tidemark, sql).await;
        let theirs = theirs.unwrap_or_else(|e| panic!("PostgreSQL refused {sql}: {e}"));
        let same = match (&ours, agree) {
            (Ok(ours), Agree::Named) => *ours == theirs,
            (Ok(ours), Agree::Rows) => ours.1 == theirs.1,
            (Err(_), _) => false,
        };
        if !same {
            mismatches.push(format!(
                "{sql}\n  postgres: {theirs:?}\n  tidemark: {ours:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} catalog queries differ from PostgreSQL's answers:\n{}",
        mismatches.len(),
        CASES.len(),
        mismatches.join("\n")
    );
    server.stop().await;
}

/// pgjdbc's `DatabaseMetaData` (getCatalogs, getSchemas, getTables, getColumns,
/// getPrimaryKeys, getTypeInfo) and a prepared catalog query, from Java: the answers a
/// PostgreSQL server gives the same driver (`tests/it/JdbcMeta.java` lists them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgjdbc_database_metadata_answers_as_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    crate::ingest::run_client(
        "pgjdbc metadata (apt-get install default-jre-headless libpostgresql-jdbc-java)",
        "java",
        &[
            "-cp",
            "/usr/share/java/postgresql.jar",
            &crate::ingest::script("JdbcMeta.java"),
            &server.port.to_string(),
        ],
    );
    server.stop().await;
}
