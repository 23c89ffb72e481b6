//! The Postgres wire: the extended protocol (tokio-postgres prepares every query), result
//! column types, SQLSTATEs, psql's `\d` and `\dm`, and SQLAlchemy's inspector.

use tokio_postgres::types::Type;

use crate::harness::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_types_errors_and_psql() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("landing");
    std::fs::create_dir_all(&landing).unwrap();
    std::fs::write(
        landing.join("a.json"),
        "{\"user_id\":\"u1\",\"page\":\"/home\",\"event_time\":\"2026-06-10T10:01:00Z\",\"duration_s\":12.5}\n",
    )
    .unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;

    // Parameters and types through Parse/Bind/Execute.
    let row = client
        .query_one("SELECT $1::BIGINT + 1 AS answer", &[&41i64])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("answer"), 42);

    let stmt = client
        .prepare(
            "SELECT CAST(1 AS SMALLINT) AS a, CAST(2 AS INT) AS b, CAST(3 AS BIGINT) AS c, \
             CAST(1.5 AS REAL) AS d, CAST(2.5 AS DOUBLE PRECISION) AS e, \
             CAST(1.25 AS NUMERIC(5,2)) AS f, 'x' AS g, true AS h, DATE '2026-06-10' AS i, \
             TIMESTAMP '2026-06-10 10:00:00' AS j, \
             CAST('2026-06-10T10:00:00Z' AS TIMESTAMPTZ) AS k, INTERVAL '1 hour' AS l, \
             CAST('ab' AS BYTEA) AS m",
        )
        .await
        .unwrap();
    let types: Vec<Type> = stmt.columns().iter().map(|c| c.type_().clone()).collect();
    assert_eq!(
        types,
        vec![
            Type::INT2,
            Type::INT4,
            Type::INT8,
            Type::FLOAT4,
            Type::FLOAT8,
            Type::NUMERIC,
            Type::TEXT,
            Type::BOOL,
            Type::DATE,
            Type::TIMESTAMP,
            Type::TIMESTAMPTZ,
            Type::INTERVAL,
            Type::BYTEA,
        ]
    );
    let row = client.query_one(&stmt, &[]).await.unwrap();
    assert_eq!(row.get::<_, i16>(0), 1);
    assert_eq!(row.get::<_, f64>(4), 2.5);
    assert_eq!(row.get::<_, &str>(6), "x");
    assert!(row.get::<_, bool>(7));
    assert_eq!(row.get::<_, &[u8]>(12), b"ab");

    // Tidemark's statements through the extended protocol too.
    client
        .execute(
            &format!(
                "CREATE STREAM clicks (user_id TEXT, page TEXT, event_time TIMESTAMP, \
                 duration_s DOUBLE PRECISION) WITH (format = 'json', path = '{}')",
                landing.display()
            ),
            &[],
        )
        .await
        .unwrap();
    let rows = client.query("SHOW STREAMS", &[]).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, &str>("name"), "clicks");
    let rows = client
        .query("SELECT page, duration_s FROM clicks", &[])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, &str>(0), "/home");
    assert_eq!(rows[0].get::<_, f64>(1), 12.5);
    client
        .batch_execute(
            "CREATE MATERIALIZED VIEW page_views AS \
             SELECT page, count(*) AS views FROM clicks GROUP BY page; \
             FLUSH MATERIALIZED VIEW page_views; \
             CREATE TABLE pages (page TEXT PRIMARY KEY, title TEXT)",
        )
        .await
        .unwrap();

    // SQLSTATEs, and the session stays usable after each error.
    for (sql, code) in [
        ("SELECT * FROM nowhere", "42P01"),
        ("SELEC 1", "42601"),
        (
            "CREATE STREAM clicks (a INT) WITH (format = 'json', path = '/tmp')",
            "42710",
        ),
        ("DROP SINK nope", "42P01"),
    ] {
        let err = client.query(sql, &[]).await.unwrap_err();
        let db = err.as_db_error().unwrap_or_else(|| panic!("{sql}: {err}"));
        assert_eq!(db.code().code(), code, "{sql}: {}", db.message());
        assert_eq!(
            client
                .query_one("SELECT 1", &[])
                .await
                .unwrap()
                .get::<_, i64>(0),
            1
        );
    }

    // psql: the meta-commands list streams with their columns.
    if let Ok(out) = std::process::Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "-U",
            "anyone",
            "-d",
            "anydb",
            "-X",
            "-c",
            "\\d",
            "-c",
            "\\d clicks",
            "-c",
            "SELECT version()",
            "-c",
            "\\dm",
            "-c",
            "\\d page_views",
            "-c",
            "\\l",
            "-c",
            "\\dt+",
            "-c",
            "\\df",
            "-c",
            "\\d+ clicks",
            "-c",
            "\\du",
            "-c",
            "\\dn",
            "-c",
            "\\dn+",
            "-c",
            "\\d pages",
            "-c",
            "\\di",
            "-c",
            "CREATE VIEW page_titles AS SELECT page, title FROM pages",
            "-c",
            "\\dv",
            "-c",
            "\\x",
            "-c",
            "SELECT 6 * 7 AS answer",
        ])
        .output()
    {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "psql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("clicks"), "\\d output:\n{stdout}");
        assert!(
            stdout.contains("duration_s"),
            "\\d clicks output:\n{stdout}"
        );
        assert!(
            stdout.contains("double precision"),
            "\\d clicks output:\n{stdout}"
        );
        assert!(stdout.contains("PostgreSQL 17"), "version():\n{stdout}");
        // \dm lists the view by its type; \d describes it with its columns.
        assert!(
            stdout.contains("page_views | materialized view"),
            "\\dm output:\n{stdout}"
        );
        assert!(
            stdout.contains("Materialized view \"public.page_views\""),
            "\\d page_views output:\n{stdout}"
        );
        assert!(
            stdout.contains(" views  | bigint"),
            "\\d page_views output:\n{stdout}"
        );
        // \l lists the database psql connected to; \dt+ says what each relation is.
        assert!(stdout.contains(" anydb "), "\\l output:\n{stdout}");
        assert!(
            stdout.contains("| stream (connector = '"),
            "\\dt+ output:\n{stdout}"
        );
        // \df: no user functions, as in a fresh Postgres database.
        assert!(
            stdout.contains("List of functions"),
            "\\df output:\n{stdout}"
        );
        // \d+ of a stream: its columns with storage; \du: the roles; \dn: the schemas;
        // \x: one row as a record.
        assert!(
            stdout.contains("Table \"public.clicks\"") && stdout.contains("| Storage "),
            "\\d+ clicks output:\n{stdout}"
        );
        assert!(
            stdout.contains("List of roles") && stdout.contains(" anyone "),
            "\\du output:\n{stdout}"
        );
        assert!(
            stdout.contains("List of schemas") && stdout.contains(" public "),
            "\\dn output:\n{stdout}"
        );
        // \du: no memberships is `{}`, as Postgres prints it; \dn+: Postgres's line on
        // public; \d of a table with a key, and \di: the key's index.
        assert!(stdout.contains("| {}"), "\\du output:\n{stdout}");
        assert!(
            stdout.contains("| standard public schema"),
            "\\dn+ output:\n{stdout}"
        );
        assert!(
            stdout.contains("Indexes:\n    \"pages_pkey\" PRIMARY KEY, btree (page)"),
            "\\d pages output:\n{stdout}"
        );
        assert!(
            stdout.contains("pages_pkey | index |"),
            "\\di output:\n{stdout}"
        );
        // A plain view: Postgres's command tag, and \dv lists it.
        assert!(stdout.contains("\nCREATE VIEW\n"), "CREATE VIEW:\n{stdout}");
        assert!(
            stdout.contains("page_titles | view"),
            "\\dv output:\n{stdout}"
        );
        assert!(
            stdout.contains("-[ RECORD 1 ]") && stdout.contains("answer | 42"),
            "\\x output:\n{stdout}"
        );
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "psql is not installed: CI must install it (.ci/run does)"
        );
        eprintln!("psql is not installed: skipping the psql part (.ci/run installs it)");
    }
    // SQLAlchemy's inspector (over psycopg 3) finds the view among the tables.
    let port = server.port.to_string();
    python_check(
        "SQLAlchemy",
        "sqlalchemy, psycopg",
        "sqlalchemy_check.py",
        &[&port],
    );
    // psycopg 3 (extended protocol, transactions, binary results).
    let landing = landing.to_string_lossy();
    python_check("psycopg", "psycopg", "psycopg_check.py", &[&port, &landing]);
    server.stop().await;
}

/// Runs `tests/it/<script>` with `args` and asserts that it succeeds, when python3 can
/// import `modules`; without them the check is skipped, except in CI, where it fails.
fn python_check(client: &str, modules: &str, script: &str, args: &[&str]) {
    let installed = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        assert!(
            std::env::var_os("CI").is_none(),
            "{client} is not installed: CI must install it (.ci/run does)"
        );
        eprintln!("{client} is not installed: skipping its part (.ci/run installs it)");
        return;
    }
    let path = format!("{}/tests/it/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("python3")
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{client} check failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The one value of a simple-protocol query's only row.
async fn simple_row(client: &tokio_postgres::Client, sql: &str) -> Vec<Option<String>> {
    let messages = client.simple_query(sql).await.unwrap();
    let rows: Vec<_> = messages
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(rows.len(), 1, "{sql}");
    (0..rows[0].len())
        .map(|i| rows[0].get(i).map(str::to_string))
        .collect()
}

/// A dashboard's query repeated while a sink commits underneath: the server keeps the
/// query's plan and runs it again on each new version of the table (no statement runs in
/// between that would make it plan again), and every answer matches the rows landed so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_query_sees_every_version_a_sink_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let landing = tmp.path().join("in");
    std::fs::create_dir_all(&landing).unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let client = server.connect().await;
    client
        .batch_execute(&format!(
            "CREATE STREAM nums (n BIGINT) WITH (format = 'json', path = '{}');
             CREATE SINK counted WITH (trigger = 'processing_time 20 milliseconds') \
                 AS SELECT n FROM nums;",
            landing.display()
        ))
        .await
        .unwrap();
    let query = "SELECT count(*), sum(n), max(n) FROM counted WHERE n % 2 = 1";
    let mut landed: Vec<i64> = Vec::new();
    for file in 0..5i64 {
        let ns: Vec<i64> = (file * 10..file * 10 + 7).collect();
        let text: String = ns.iter().map(|n| format!("{{\"n\":{n}}}\n")).collect();
        let tmp_file = landing.join(format!(".f{file}.json"));
        std::fs::write(&tmp_file, text).unwrap();
        std::fs::rename(&tmp_file, landing.join(format!("f{file}.json"))).unwrap();
        landed.extend(&ns);
        // The answer, computed here from the rows landed.
        let odd: Vec<i64> = landed.iter().copied().filter(|n| n % 2 == 1).collect();
        let want = vec![
            Some(odd.len().to_string()),
            Some(odd.iter().sum::<i64>().to_string()),
            odd.iter().max().map(|m| m.to_string()),
        ];
        let got = crate::harness::poll("the sink to commit the new file", || async {
            let row = simple_row(&client, query).await;
            (row == want).then_some(row)
        })
        .await;
        assert_eq!(got, want);
    }
    // Rows INSERTed into a table stream between runs: an INSERT leaves the kept plans
    // kept, and each run still reads the sink's latest version.
    client
        .batch_execute(
            "CREATE STREAM typed (n BIGINT);
             CREATE SINK typed_sink WITH (trigger = 'processing_time 20 milliseconds') \
                 AS SELECT n FROM typed;",
        )
        .await
        .unwrap();
    let typed_query = "SELECT count(*), sum(n) FROM typed_sink";
    let mut total = 0i64;
    for i in 1..=4i64 {
        client
            .simple_query(&format!("INSERT INTO typed VALUES ({i}), ({})", i * 100))
            .await
            .unwrap();
        total += i + i * 100;
        let want = vec![Some((2 * i).to_string()), Some(total.to_string())];
        crate::harness::poll("the sink to commit the inserted rows", || async {
            (simple_row(&client, typed_query).await == want).then_some(())
        })
        .await;
    }
    // A SET between two runs: the answer still follows the session (and the table).
    client
        .batch_execute("SET datafusion.execution.target_partitions = 1")
        .await
        .unwrap();
    let row = simple_row(&client, query).await;
    let odd = landed.iter().filter(|n| *n % 2 == 1).count().to_string();
    assert_eq!(row[0].as_deref(), Some(odd.as_str()));
    server.stop().await;
}
