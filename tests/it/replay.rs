//! BI tools' own catalog queries, replayed side by side with PostgreSQL: DBeaver's schema
//! browser, Npgsql's (Power BI's) type load and Apache Superset's own queries, as
//! `../shared/research/ecosystem-2.md` lists them from the tools' sources. (Grafana's and
//! Metabase's are in `catalog.rs`; SQLAlchemy's, which Superset reflects with, in
//! `sqlalchemy_check.py`.)
//!
//! A tool reads some columns of some rows of each answer; those must be what PostgreSQL
//! answers for the same objects. Object ids differ between the two servers, so a replay
//! substitutes each server's own ids for `{ns}` (schema `public`) and `{rel}` (table
//! `dims`), and compares names rather than ids.

use crate::catalog::{ResultSet, SideBySide, result_sets, side_by_side};
use tokio_postgres::Client;
use tokio_postgres::types::Type;

/// The objects both servers hold.
const SETUP: &[&str] = &[
    "CREATE TABLE dims (id bigint PRIMARY KEY, name text, price double precision, \
     at timestamptz, ok boolean)",
    "CREATE VIEW v_dims AS SELECT id, name FROM dims",
];

/// What of an answer must agree with PostgreSQL's.
enum Check {
    /// The column names and every row.
    Same,
    /// These columns (by name, as a tool reads them) of the rows whose first listed column
    /// is one of `keys`; PostgreSQL must have at least one such row.
    Columns {
        columns: &'static [&'static str],
        keys: &'static [&'static str],
    },
    /// A property of Tidemark's answer that PostgreSQL's answer has too.
    Holds(fn(&ResultSet) -> Result<(), String>),
}

struct Replay {
    tool: &'static str,
    sql: &'static str,
    check: Check,
    /// DBeaver binds `{ns}`/`{rel}` as int8 parameters (pgjdbc's `setLong`); the replay
    /// also sends it that way and checks the row count.
    bind_int8: bool,
}

const fn same(tool: &'static str, sql: &'static str) -> Replay {
    Replay {
        tool,
        sql,
        check: Check::Same,
        bind_int8: false,
    }
}

const fn columns(
    tool: &'static str,
    sql: &'static str,
    columns: &'static [&'static str],
    keys: &'static [&'static str],
) -> Replay {
    Replay {
        tool,
        sql,
        check: Check::Columns { columns, keys },
        bind_int8: false,
    }
}

const fn bound(mut replay: Replay) -> Replay {
    replay.bind_int8 = true;
    replay
}

const BASE_TYPES: &[&str] = &[
    "bool",
    "int2",
    "int4",
    "int8",
    "float4",
    "float8",
    "numeric",
    "text",
    "varchar",
    "bytea",
    "date",
    "timestamp",
    "timestamptz",
    "_int4",
    "_int8",
    "_text",
    "_float8",
    "_bool",
];

fn one_row(set: &ResultSet) -> Result<&Vec<Option<String>>, String> {
    match set.rows.as_slice() {
        [row] => Ok(row),
        rows => Err(format!("expected one row, got {}", rows.len())),
    }
}

/// SQLAlchemy's (and so Superset's) version check.
fn postgres_version(set: &ResultSet) -> Result<(), String> {
    let version = one_row(set)?[0].clone().unwrap_or_default();
    let re =
        regex::Regex::new(r".*(?:PostgreSQL|EnterpriseDB) (\d+)\.?(\d+)?(?:\.(\d+))?").unwrap();
    re.is_match(&version).then_some(()).ok_or(format!(
        "{version:?} does not parse as a PostgreSQL version"
    ))
}

/// Superset's `PostgresEngineSpec.estimate_statement_cost`: the first row's first column,
/// under `QUERY PLAN`, carries `cost=a..b`.
fn explain_cost(set: &ResultSet) -> Result<(), String> {
    if set.names != ["QUERY PLAN"] {
        return Err(format!("columns {:?}, not [\"QUERY PLAN\"]", set.names));
    }
    let first = set
        .rows
        .first()
        .and_then(|r| r[0].clone())
        .unwrap_or_default();
    let re = regex::Regex::new(r"cost=([\d\.]+)\.\.([\d\.]+)").unwrap();
    re.is_match(&first)
        .then_some(())
        .ok_or(format!("{first:?} has no cost=a..b"))
}

fn positive_integer(set: &ResultSet) -> Result<(), String> {
    let value = one_row(set)?[0].clone().unwrap_or_default();
    match value.parse::<i64>() {
        Ok(n) if n > 0 => Ok(()),
        _ => Err(format!("{value:?} is not a positive integer")),
    }
}

/// DBeaver's table statistics: both sizes, as non-negative integers.
fn sizes(set: &ResultSet) -> Result<(), String> {
    let row = one_row(set)?;
    for (name, value) in set.names.iter().zip(row).skip(1) {
        let value = value.clone().unwrap_or_default();
        if value.parse::<u64>().is_err() {
            return Err(format!("{name} = {value:?}"));
        }
    }
    Ok(())
}

fn keywords(set: &ResultSet) -> Result<(), String> {
    let words = one_row(set)?[0].clone().unwrap_or_default();
    let words: Vec<&str> = words.split(',').collect();
    // Words Postgres reserves that the query's list leaves out; DBeaver highlights them.
    for w in ["analyse", "limit", "offset", "returning", "verbose"] {
        if !words.contains(&w) {
            return Err(format!("keyword {w} is missing"));
        }
    }
    Ok(())
}

const REPLAYS: &[Replay] = &[
    // DBeaver 25 on connect (PostgreDataSource, PostgreDatabase) and when it browses
    // schema `public` (PostgreSchema's table, column, constraint and index caches).
    same("dbeaver", "SET extra_float_digits = 3"),
    same(
        "dbeaver",
        "SET application_name = 'DBeaver 25.1.5 - Main <postgres>'",
    ),
    same("dbeaver", "SELECT current_schema(),session_user"),
    columns(
        "dbeaver",
        "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND d.classoid='pg_namespace'::regclass ORDER BY nspname",
        &["nspname", "description"],
        &["public", "pg_catalog", "information_schema"],
    ),
    same(
        "dbeaver",
        "SELECT n.nspname = ANY(current_schemas(true)), n.nspname, t.typname FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON t.typnamespace = n.oid WHERE t.oid = 1007",
    ),
    same(
        "dbeaver",
        "SELECT typinput='pg_catalog.array_in'::regproc as is_array, typtype, typname, pg_type.oid   FROM pg_catalog.pg_type   LEFT JOIN (select ns.oid as nspoid, ns.nspname, r.r           from pg_namespace as ns           join ( select s.r, (current_schemas(false))[s.r] as nspname                    from generate_series(1, array_upper(current_schemas(false), 1)) as s(r) ) as r          using ( nspname )        ) as sp     ON sp.nspoid = typnamespace  WHERE pg_type.oid = 1007  ORDER BY sp.r, pg_type.oid DESC",
    ),
    columns(
        "dbeaver",
        "SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname='postgres'",
        &["datname", "datistemplate", "datallowconn", "datconnlimit"],
        &["postgres"],
    ),
    columns(
        "dbeaver",
        "SELECT * FROM pg_catalog.pg_settings where name='standard_conforming_strings'",
        &["name", "setting", "vartype"],
        &["standard_conforming_strings"],
    ),
    Replay {
        tool: "dbeaver",
        sql: "SELECT string_agg(word, ',' ) from pg_catalog.pg_get_keywords() where word <> ALL ('{a,abs,absolute,action,ada,add,admin,after,all,allocate,alter,always,and,any,are,array,as,asc}'::text[])",
        check: Check::Holds(keywords),
        bind_int8: false,
    },
    Replay {
        tool: "dbeaver",
        sql: "SELECT version()",
        check: Check::Holds(postgres_version),
        bind_int8: false,
    },
    same(
        "dbeaver",
        "SELECT * FROM pg_catalog.pg_enum WHERE 1<>1 LIMIT 1",
    ),
    same(
        "dbeaver",
        "SELECT reltype FROM pg_catalog.pg_class WHERE 1<>1 LIMIT 1",
    ),
    columns(
        "dbeaver",
        "SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as base_type_name, d.description FROM pg_catalog.pg_type t LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid WHERE t.typname IS NOT NULL AND (c.relkind IS NULL OR c.relkind = 'c') AND (et.typcategory IS NULL OR et.typcategory <> 'C')",
        &[
            "typname",
            "oid",
            "typtype",
            "typcategory",
            "typlen",
            "typelem",
            "typarray",
            "relkind",
            "base_type_name",
        ],
        BASE_TYPES,
    ),
    bound(columns(
        "dbeaver",
        "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key \nFROM pg_catalog.pg_class c\nLEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass\nWHERE c.relnamespace={ns} AND c.relkind not in ('i','I','c')",
        &[
            "relname",
            "relkind",
            "relpersistence",
            "relnatts",
            "relhasindex",
            "relispartition",
            "partition_expr",
            "partition_key",
        ],
        &["dims", "v_dims"],
    )),
    bound(Replay {
        tool: "dbeaver",
        sql: "select c.oid,pg_catalog.pg_total_relation_size(c.oid) as total_rel_size,pg_catalog.pg_relation_size(c.oid) as rel_size FROM pg_class c WHERE c.oid={rel}",
        check: Check::Holds(sizes),
        bind_int8: false,
    }),
    bound(columns(
        "dbeaver",
        "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,dsc.description,dep.objid\nFROM pg_catalog.pg_attribute a\nINNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)\nLEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum)\nLEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)\nLEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid\nWHERE NOT a.attisdropped AND c.relkind not in ('i','I','c') AND c.oid={rel}\nORDER BY a.attnum",
        // (Postgres also lists its system columns, ctid, xmin and the like, which DBeaver
        // leaves out and Tidemark has none of.)
        &[
            "attname",
            "relname",
            "attnum",
            "atttypid",
            "attlen",
            "atttypmod",
            "attnotnull",
            "atthasdef",
            "attidentity",
            "attgenerated",
            "def_value",
            "description",
            "objid",
        ],
        &["id", "name", "price", "at", "ok"],
    )),
    bound(columns(
        "dbeaver",
        "SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,d.description, case when c.contype='c' then \"substring\"(pg_get_constraintdef(c.oid), 7) else null end consrc_copy\nFROM pg_catalog.pg_constraint c\nINNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid\nLEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid\nLEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_constraint'::regclass\nWHERE c.conrelid={rel}\nORDER BY c.oid",
        &[
            "conname",
            "contype",
            "condeferrable",
            "convalidated",
            "conkey",
            "tabrelname",
            "refnamespace",
            "description",
            "consrc_copy",
        ],
        &["dims_pkey"],
    )),
    bound(columns(
        "dbeaver",
        "SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,c.reltablespace,tc.relname as tabrelname,dsc.description,pg_catalog.pg_get_expr(i.indpred, i.indrelid) as pred_expr,pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as expr,pg_catalog.pg_relation_size(i.indexrelid) as index_rel_size,pg_catalog.pg_stat_get_numscans(i.indexrelid) as index_num_scans FROM pg_catalog.pg_index i\nINNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid\nINNER JOIN pg_catalog.pg_class tc ON tc.oid=i.indrelid\nLEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid=dsc.objoid\nWHERE  i.indrelid={rel} ORDER BY tabrelname, c.relname",
        // (Not `indisunique`: Tidemark's keys are informational, as Delta's are, and its
        // index says so.)
        &[
            "relname",
            "tabrelname",
            "indnatts",
            "indnkeyatts",
            "indisprimary",
            "indisvalid",
            "keys",
            "indkey",
            "description",
            "pred_expr",
            "expr",
        ],
        &["dims_pkey"],
    )),
    columns(
        "dbeaver",
        "SELECT c.relname, pg_catalog.pg_get_indexdef(i.indexrelid, 1, true) AS col, pg_catalog.pg_get_constraintdef(k.oid, true) AS def FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_constraint k ON k.conindid = i.indexrelid WHERE i.indrelid = 'dims'::regclass",
        &["relname", "col", "def"],
        &["dims_pkey"],
    ),
    // Apache Superset's own queries (superset/db_engine_specs/postgres.py).
    same(
        "superset",
        "SELECT datname FROM pg_database WHERE datistemplate = false;",
    ),
    same("superset", "set search_path = \"public\""),
    same("superset", "SHOW search_path"),
    Replay {
        tool: "superset",
        sql: "EXPLAIN SELECT * FROM dims WHERE price > 1",
        check: Check::Holds(explain_cost),
        bind_int8: false,
    },
    Replay {
        tool: "superset",
        sql: "SELECT pg_backend_pid()",
        check: Check::Holds(positive_integer),
        bind_int8: false,
    },
    same(
        "superset",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid='0'",
    ),
    same(
        "superset",
        "SELECT pg_cancel_backend(0), pg_terminate_backend(0)",
    ),
];

/// Npgsql's type load (`PostgresDatabaseInfo.LoadBackendTypes`, Npgsql 8/9): one simple
/// Query message with four statements, for a server of version 14 or later (ranges and
/// multiranges) and `LoadTableComposites` off.
const NPGSQL_TYPE_LOAD: &str = r#"SELECT version();

SELECT ns.nspname, t.oid, t.typname, t.typtype, t.typnotnull, t.elemtypoid
FROM (
    -- Arrays have typtype=b - this subquery identifies them by their typreceive and converts their typtype to a
    -- We first do this for the type (innerest-most subquery), and then for its element type
    -- This also returns the array element, range subtype and domain base type as elemtypoid
    SELECT
        typ.oid, typ.typnamespace, typ.typname, typ.typtype, typ.typrelid, typ.typnotnull, typ.relkind,
        elemtyp.oid AS elemtypoid, elemtyp.typname AS elemtypname, elemcls.relkind AS elemrelkind,
        CASE WHEN elemproc.proname='array_recv' THEN 'a' ELSE elemtyp.typtype END AS elemtyptype
    FROM (
        SELECT typ.oid, typnamespace, typname, typrelid, typnotnull, relkind, typelem AS elemoid,
            CASE WHEN proc.proname='array_recv' THEN 'a' ELSE typ.typtype END AS typtype,
            CASE
                WHEN proc.proname='array_recv' THEN typ.typelem
                WHEN typ.typtype='r' THEN rngsubtype
                WHEN typ.typtype='m' THEN (SELECT rngtypid FROM pg_range WHERE rngmultitypid = typ.oid)
                WHEN typ.typtype='d' THEN typ.typbasetype
            END AS elemtypoid
        FROM pg_type AS typ
        LEFT JOIN pg_class AS cls ON (cls.oid = typ.typrelid)
        LEFT JOIN pg_proc AS proc ON proc.oid = typ.typreceive
        LEFT JOIN pg_range ON (pg_range.rngtypid = typ.oid)
    ) AS typ
    LEFT JOIN pg_type AS elemtyp ON elemtyp.oid = elemtypoid
    LEFT JOIN pg_class AS elemcls ON (elemcls.oid = elemtyp.typrelid)
    LEFT JOIN pg_proc AS elemproc ON elemproc.oid = elemtyp.typreceive
) AS t
JOIN pg_namespace AS ns ON (ns.oid = typnamespace)
WHERE
    typtype IN ('b', 'r', 'm', 'e', 'd') OR -- Base, range, multirange, enum, domain
    (typtype = 'c' AND relkind='c') OR -- User-defined free-standing composites (not table composites) by default
    (typtype = 'p' AND typname IN ('record', 'void')) OR -- Some special supported pseudo-types
    (typtype = 'a' AND (  -- Array of...
        elemtyptype IN ('b', 'r', 'm', 'e', 'd') OR -- Array of base, range, multirange, enum, domain
        (elemtyptype = 'p' AND elemtypname IN ('record', 'void')) OR -- Arrays of special supported pseudo-types
        (elemtyptype = 'c' AND elemrelkind='c') -- Array of user-defined free-standing composites (not table composites) by default
    ))
ORDER BY CASE
       WHEN typtype IN ('b', 'e', 'p') THEN 0           -- First base types, enums, pseudo-types
       WHEN typtype = 'r' THEN 1                        -- Ranges after
       WHEN typtype = 'm' THEN 2                        -- Multiranges after
       WHEN typtype = 'c' THEN 3                        -- Composites after
       WHEN typtype = 'd' AND elemtyptype <> 'a' THEN 4 -- Domains over non-arrays after
       WHEN typtype = 'a' THEN 5                        -- Arrays after
       WHEN typtype = 'd' AND elemtyptype = 'a' THEN 6  -- Domains over arrays last
END;

-- Load field definitions for (free-standing) composite types
SELECT typ.oid, att.attname, att.atttypid
FROM pg_type AS typ
JOIN pg_namespace AS ns ON (ns.oid = typ.typnamespace)
JOIN pg_class AS cls ON (cls.oid = typ.typrelid)
JOIN pg_attribute AS att ON (att.attrelid = typ.typrelid)
WHERE
  (typ.typtype = 'c' AND cls.relkind='c') AND
  attnum > 0 AND     -- Don't load system attributes
  NOT attisdropped
ORDER BY typ.oid, att.attnum;

-- Load enum fields
SELECT pg_type.oid, enumlabel
FROM pg_enum
JOIN pg_type ON pg_type.oid=enumtypid
ORDER BY oid, enumsortorder;
"#;

/// The ids a replay substitutes: schema `public`'s and table `dims`'s, on one server.
async fn ids(client: &Client) -> (i64, i64) {
    let sql = "SELECT (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'public') AS ns, \
               'dims'::regclass::oid AS rel";
    let set = answer(client, sql).await.unwrap();
    let id = |i: usize| -> i64 {
        let text = set.rows[0][i].as_deref().unwrap_or_default();
        text.parse()
            .unwrap_or_else(|_| panic!("an oid, not {text:?}"))
    };
    (id(0), id(1))
}

fn render(sql: &str, (ns, rel): (i64, i64)) -> String {
    sql.replace("{ns}", &ns.to_string())
        .replace("{rel}", &rel.to_string())
}

/// The checked part of an answer: the named columns of the keyed rows, sorted.
fn project(
    set: &ResultSet,
    columns: &[&str],
    keys: &[&str],
) -> Result<Vec<Vec<Option<String>>>, String> {
    let at: Vec<usize> = columns
        .iter()
        .map(|c| {
            set.names
                .iter()
                .position(|n| n == c)
                .ok_or(format!("no column {c} in {:?}", set.names))
        })
        .collect::<Result<_, _>>()?;
    let mut rows: Vec<Vec<Option<String>>> = set
        .rows
        .iter()
        .filter(|r| r[at[0]].as_deref().is_some_and(|k| keys.contains(&k)))
        .map(|r| at.iter().map(|&i| r[i].clone()).collect())
        .collect();
    rows.sort();
    Ok(rows)
}

/// Compares one replay's answers; `Err` says how they differ.
fn compare(check: &Check, ours: &ResultSet, theirs: &ResultSet) -> Result<(), String> {
    match check {
        Check::Same => (ours == theirs)
            .then_some(())
            .ok_or(format!("postgres: {theirs:?}\n  tidemark: {ours:?}")),
        Check::Columns { columns, keys } => {
            let theirs = project(theirs, columns, keys)
                .map_err(|e| format!("the replay is wrong for PostgreSQL: {e}"))?;
            assert!(
                !theirs.is_empty(),
                "PostgreSQL has none of the rows {keys:?}"
            );
            let ours = project(ours, columns, keys)?;
            (ours == theirs)
                .then_some(())
                .ok_or(format!("postgres: {theirs:?}\n  tidemark: {ours:?}"))
        }
        Check::Holds(property) => {
            property(theirs).map_err(|e| format!("the replay is wrong for PostgreSQL: {e}"))?;
            property(ours)
        }
    }
}

async fn answer(client: &Client, sql: &str) -> Result<ResultSet, String> {
    Ok(result_sets(client, sql).await?.pop().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bi_tools_catalog_queries_answer_as_postgres_answers() {
    let Some(SideBySide {
        server,
        tidemark,
        pg,
        _postgres,
        _dir,
    }) = side_by_side(SETUP).await
    else {
        return;
    };
    let (our_ids, their_ids) = (ids(&tidemark).await, ids(&pg).await);
    let mut failures = Vec::new();
    for replay in REPLAYS {
        let theirs = answer(&pg, &render(replay.sql, their_ids))
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL refused {}: {e}", replay.sql));
        let outcome = match answer(&tidemark, &render(replay.sql, our_ids)).await {
            Ok(ours) => compare(&replay.check, &ours, &theirs).and(Ok(ours.rows.len())),
            Err(e) => Err(e),
        };
        let outcome = match (outcome, replay.bind_int8) {
            (Ok(count), true) => bound_count(&tidemark, replay.sql, our_ids)
                .await
                .and_then(|n| {
                    (n == count)
                        .then_some(())
                        .ok_or(format!("{n} rows when bound as int8, {count} as text"))
                }),
            (outcome, _) => outcome.map(|_| ()),
        };
        if let Err(e) = outcome {
            failures.push(format!("[{}] {}\n  {e}", replay.tool, replay.sql));
        }
    }
    if let Err(e) = npgsql_type_load(&tidemark, &pg).await {
        failures.push(format!("[npgsql] type load\n  {e}"));
    }
    assert!(
        failures.is_empty(),
        "{} of {} replays differ from PostgreSQL's answers:\n{}",
        failures.len(),
        REPLAYS.len() + 1,
        failures.join("\n")
    );
    server.stop().await;
}

/// The statement as DBeaver sends it: prepared, with its ids bound as int8.
async fn bound_count(client: &Client, sql: &str, (ns, rel): (i64, i64)) -> Result<usize, String> {
    let (sql, value) = if sql.contains("{ns}") {
        (sql.replace("{ns}", "$1"), ns)
    } else {
        (sql.replace("{rel}", "$1"), rel)
    };
    let statement = client
        .prepare_typed(&sql, &[Type::INT8])
        .await
        .map_err(|e| format!("prepare with an int8 parameter: {e:?}"))?;
    let rows = client
        .query(&statement, &[&value])
        .await
        .map_err(|e| format!("execute with an int8 parameter: {e:?}"))?;
    Ok(rows.len())
}

/// Npgsql reads four result sets in order. Each type row Tidemark sends must be the row
/// PostgreSQL sends for that type (oids of built-in types are fixed), every array must
/// come after its element (Npgsql skips an array whose element it has not seen), and the
/// types a table here can hold must all be there.
async fn npgsql_type_load(tidemark: &Client, pg: &Client) -> Result<(), String> {
    let ours = result_sets(tidemark, NPGSQL_TYPE_LOAD).await?;
    let theirs = result_sets(pg, NPGSQL_TYPE_LOAD).await?;
    if ours.len() != 4 || theirs.len() != 4 {
        return Err(format!(
            "{} result sets (PostgreSQL: {}), not 4",
            ours.len(),
            theirs.len()
        ));
    }
    postgres_version(&ours[0])?;
    if ours[1].names != theirs[1].names {
        return Err(format!(
            "type columns {:?}, not {:?}",
            ours[1].names, theirs[1].names
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for row in &ours[1].rows {
        if !theirs[1].rows.contains(row) && row[0].as_deref() == Some("pg_catalog") {
            return Err(format!("type row {row:?} is not PostgreSQL's"));
        }
        if row[3].as_deref() == Some("a") && !seen.contains(&row[5]) {
            return Err(format!("array {row:?} comes before its element"));
        }
        seen.insert(row[1].clone());
    }
    for name in BASE_TYPES {
        if !ours[1].rows.iter().any(|r| r[2].as_deref() == Some(name)) {
            return Err(format!("type {name} is not loaded"));
        }
    }
    for i in [2, 3] {
        if ours[i] != theirs[i] {
            return Err(format!(
                "result set {i}: {:?}, PostgreSQL: {:?}",
                ours[i], theirs[i]
            ));
        }
    }
    Ok(())
}
