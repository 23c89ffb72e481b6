//! Errors side by side with PostgreSQL: the same statements sent to Tidemark and to a real
//! PostgreSQL cluster must fail with the same SQLSTATE, and, where Tidemark claims
//! Postgres's wording, with the same message.

use crate::harness::{Postgres, TestServer};

/// How much of the error must agree.
#[derive(Clone, Copy, PartialEq)]
enum Agree {
    /// SQLSTATE and message.
    Message,
    /// SQLSTATE only (Postgres's message names what Tidemark cannot know, such as the
    /// argument types of a function that does not exist).
    Code,
}

const CASES: &[(&str, Agree)] = &[
    ("SELECT 1/0", Agree::Message),
    ("SELECT * FROM nope", Agree::Message),
    ("SELECT * FROM pg_catalog.nope", Agree::Message),
    ("SELECT nope FROM (VALUES (1)) AS t(a)", Agree::Message),
    ("SELECT t.b FROM (VALUES (1)) AS t(a)", Agree::Message),
    (
        "SELECT a FROM (VALUES (1)) AS t(a) GROUP BY a HAVING b > 1",
        Agree::Message,
    ),
    ("SELECT nosuchfn(1)", Agree::Code),
    ("SELECT length(1, 2, 3)", Agree::Code),
    ("SELECT 'abc'::int", Agree::Message),
    ("SELECT ''::int", Agree::Message),
    ("SELECT CAST('x' AS date)", Agree::Message),
    ("SELECT 'x'::float8", Agree::Message),
    ("SELECT 1 WHERE 'x'::text", Agree::Message),
    ("SELECT true + 1", Agree::Code),
    ("SELECT 1 LIMIT -1", Agree::Message),
    ("SELECT 1 OFFSET -1", Agree::Message),
    ("SELECT 1 +", Agree::Code),
    ("SELEC 1", Agree::Code),
    ("SHOW", Agree::Code),
    ("DROP TABLE nope", Agree::Message),
    // Numbers are right or the statement fails (22003, 22012), never wrapped or `inf`.
    ("SELECT 9223372036854775807 + 1", Agree::Message),
    ("SELECT -9223372036854775807 - 2", Agree::Message),
    ("SELECT 4611686018427387904 * 2", Agree::Message),
    ("SELECT -(-9223372036854775807 - 1)", Agree::Message),
    ("SELECT abs(-9223372036854775807 - 1)", Agree::Message),
    ("SELECT (-9223372036854775807 - 1) / -1", Agree::Message),
    ("SELECT CAST(40000 AS smallint)", Agree::Message),
    (
        "SELECT CAST(9223372036854775807 AS integer)",
        Agree::Message,
    ),
    ("SELECT 5 % 0", Agree::Message),
    ("SELECT 1.0 / 0", Agree::Message),
    ("SELECT 0.0 / 0", Agree::Message),
    ("SELECT CAST(1 AS double precision) / 0", Agree::Message),
    ("SELECT CAST(0 AS double precision) / 0", Agree::Message),
    ("SELECT CAST(1 AS real) / CAST(0 AS real)", Agree::Message),
    // INSERT's errors, on `ins (a BIGINT, b TIMESTAMP, c TEXT)` (a stream here, a table
    // there).
    (
        "INSERT INTO ins VALUES (1, 'not a time', 'x')",
        Agree::Message,
    ),
    ("INSERT INTO ins VALUES ('abc', NULL, 'x')", Agree::Message),
    ("INSERT INTO ins VALUES (1, NULL, 'x', 4)", Agree::Message),
    ("INSERT INTO ins (a, b) VALUES (1)", Agree::Message),
    ("INSERT INTO ins (a) VALUES (1, 2)", Agree::Message),
    ("INSERT INTO ins VALUES (1), (1, NULL)", Agree::Message),
    ("SELECT CAST('x' AS timestamp)", Agree::Message),
    ("SELECT CAST('x' AS time)", Agree::Message),
    ("SELECT CAST('x' AS bigint)", Agree::Message),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_sqlstate_and_words_postgres_uses() {
    let dir = tempfile::tempdir().unwrap();
    let Some(postgres) = Postgres::start(dir.path()) else {
        return;
    };
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    let tidemark = server.connect().await;
    let pg = postgres.connect().await;
    tidemark
        .batch_execute("CREATE STREAM ins (a BIGINT, b TIMESTAMP, c TEXT)")
        .await
        .unwrap();
    pg.batch_execute("CREATE TABLE ins (a BIGINT, b TIMESTAMP, c TEXT)")
        .await
        .unwrap();
    let mut mismatches = Vec::new();
    for (sql, agree) in CASES {
        let error = |r: Result<_, tokio_postgres::Error>| match r {
            Ok(_) => ("(no error)".to_string(), String::new()),
            Err(e) => match e.as_db_error() {
                Some(db) => (db.code().code().to_string(), db.message().to_string()),
                None => ("(no ErrorResponse)".to_string(), e.to_string()),
            },
        };
        let theirs = error(pg.simple_query(sql).await);
        let ours = error(tidemark.simple_query(sql).await);
        assert!(theirs.0.len() == 5, "{sql}: PostgreSQL answered {theirs:?}");
        let same = match agree {
            Agree::Message => ours == theirs,
            Agree::Code => ours.0 == theirs.0,
        };
        if !same {
            mismatches.push(format!(
                "{sql}\n  postgres: {theirs:?}\n  tidemark: {ours:?}"
            ));
        }
    }
    // COPY's errors: the same SQLSTATE and message, and for a value that does not convert
    // the same CONTEXT (where: table, line, column, value).
    for (data, compare_context) in [
        ("1\tnot a time\tx\n", true),
        ("abc\t\\N\tx\n", true),
        ("1\t2026-06-10 10:00:00\tx\n2\tnope\ty\n", true),
        ("1\t2026-06-10 10:00:00\n", false),
    ] {
        let mut theirs = copy_error(&pg, data).await;
        let mut ours = copy_error(&tidemark, data).await;
        if !compare_context {
            theirs.2 = None;
            ours.2 = None;
        }
        if ours != theirs {
            mismatches.push(format!(
                "COPY {data:?}\n  postgres: {theirs:?}\n  tidemark: {ours:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "errors differ from PostgreSQL's:\n{}",
        mismatches.join("\n")
    );
    server.stop().await;
}

/// A `COPY ins FROM STDIN` of `data` that must fail: its SQLSTATE, message and context.
async fn copy_error(
    client: &tokio_postgres::Client,
    data: &str,
) -> (String, String, Option<String>) {
    use futures::SinkExt;
    let sink = client
        .copy_in::<_, bytes::Bytes>("COPY ins FROM STDIN")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    let done = match sink.send(bytes::Bytes::from(data.to_string())).await {
        Ok(()) => sink.finish().await,
        Err(e) => Err(e),
    };
    let e = done.expect_err("a bad COPY fails");
    let db = e.as_db_error().expect("an ErrorResponse");
    (
        db.code().code().to_string(),
        db.message().to_string(),
        db.where_().map(str::to_string),
    )
}

/// Fewer values than columns, with no column list: the rest are NULL, as in Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_of_fewer_values_fills_the_rest_with_null() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    let c = server.connect().await;
    c.batch_execute(
        "CREATE STREAM ins (a BIGINT, b TIMESTAMP, c TEXT);
         INSERT INTO ins VALUES (1), (2);
         INSERT INTO ins VALUES (3, '2026-06-10 10:01:00')",
    )
    .await
    .unwrap();
    let got = crate::harness::rows(&c, "SELECT a, b, c FROM ins ORDER BY a").await;
    let want: Vec<Vec<Option<String>>> = vec![
        vec![Some("1".into()), None, None],
        vec![Some("2".into()), None, None],
        vec![Some("3".into()), Some("2026-06-10 10:01:00".into()), None],
    ];
    assert_eq!(got, want);
    server.stop().await;
}

/// The values whose text PostgreSQL writes its own way (no trailing zero fractions, `+00`,
/// `Infinity`, `1e+20`), in text format, byte for byte as PostgreSQL sends them.
const VALUES: &[&str] = &[
    "SELECT CAST('2026-06-10 10:01:00' AS TIMESTAMP)",
    "SELECT CAST('2026-06-10 10:01:00.5' AS TIMESTAMP)",
    "SELECT CAST('2026-06-10 10:01:00.123456' AS TIMESTAMP)",
    "SELECT CAST('2026-06-10 10:01:00+00' AS TIMESTAMP WITH TIME ZONE)",
    "SELECT CAST('2026-06-10 10:01:00.25+00' AS TIMESTAMP WITH TIME ZONE)",
    "SELECT CAST('1969-12-31 23:59:59.999999' AS TIMESTAMP)",
    "SELECT CAST('2026-06-10' AS DATE)",
    "SELECT CAST('10:01:00' AS TIME)",
    "SELECT CAST('10:01:00.25' AS TIME)",
    "SELECT CAST(12.5 AS DOUBLE PRECISION)",
    "SELECT CAST(100 AS DOUBLE PRECISION)",
    "SELECT CAST(0.1 AS DOUBLE PRECISION)",
    "SELECT CAST('1e20' AS DOUBLE PRECISION)",
    "SELECT CAST('1e15' AS DOUBLE PRECISION)",
    "SELECT CAST('1e14' AS DOUBLE PRECISION)",
    "SELECT CAST('0.00001' AS DOUBLE PRECISION)",
    "SELECT CAST('-0' AS DOUBLE PRECISION)",
    "SELECT CAST('123456789012345678' AS DOUBLE PRECISION)",
    "SELECT CAST('Infinity' AS DOUBLE PRECISION)",
    "SELECT CAST('-Infinity' AS DOUBLE PRECISION)",
    "SELECT CAST('NaN' AS DOUBLE PRECISION)",
    "SELECT CAST(1.5 AS REAL)",
    "SELECT CAST(0.1 AS REAL)",
    "SELECT CAST(1.50 AS NUMERIC(10, 2))",
    "SELECT INTERVAL '1 day 2 hours'",
    "SELECT INTERVAL '5 minutes'",
    "SELECT INTERVAL '3 days'",
    "SELECT INTERVAL '1 year 2 months'",
    "SELECT INTERVAL '1.5 seconds'",
    "SELECT INTERVAL '-1 day 2 hours'",
    "SELECT INTERVAL '0 seconds'",
    "SELECT INTERVAL '1 month -1 day'",
    "SELECT CAST(NULL AS TIMESTAMP)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_print_as_postgres_prints_them() {
    let dir = tempfile::tempdir().unwrap();
    let Some(postgres) = Postgres::start(dir.path()) else {
        return;
    };
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    let tidemark = server.connect().await;
    let pg = postgres.connect().await;
    // Tidemark's session is in UTC.
    pg.batch_execute("SET TIME ZONE 'UTC'").await.unwrap();
    let mut mismatches = Vec::new();
    for sql in VALUES {
        let theirs = crate::harness::rows(&pg, sql).await;
        let ours = crate::harness::rows(&tidemark, sql).await;
        if ours != theirs {
            mismatches.push(format!(
                "{sql}\n  postgres: {theirs:?}\n  tidemark: {ours:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "values print unlike PostgreSQL's:\n{}",
        mismatches.join("\n")
    );
    // The same values through the extended protocol, text format (psycopg's libpq).
    let dsn =
        |port: u16, user: &str| format!("host=127.0.0.1 port={port} user={user} dbname={user}");
    let mut child = std::process::Command::new("python3")
        .arg(crate::ingest::script("values_check.py"))
        .arg(dsn(server.port, "tidemark"))
        .arg(dsn(postgres.port, "postgres"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3 (psycopg: pip install 'psycopg[binary]')");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(VALUES.join("\n").as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "extended protocol, text format:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop().await;
}
