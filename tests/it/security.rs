//! Security over the wire, against real `tidemark serve` processes: roles made with
//! `CREATE ROLE`, password logins (SCRAM-SHA-256 and md5) from tokio-postgres, psql,
//! psycopg 3 and 2, asyncpg, node-postgres and pgjdbc, concurrent logins, a read-only role, TLS, cancel and
//! `statement_timeout`, and the connection limits.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};

use crate::harness::{DEADLINE, TestServer, connect, poll};
use crate::ingest::{run_client, script};

/// Logs in with a password.
async fn login(port: u16, user: &str, password: &str) -> Result<Client, tokio_postgres::Error> {
    let conn_str =
        format!("host=127.0.0.1 port={port} user={user} password={password} dbname=tidemark");
    let (client, connection) = tokio_postgres::connect(&conn_str, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The SQLSTATE of a failed login or statement.
fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

async fn refused(client: &Client, sql: &str) -> (String, String) {
    let e = client
        .simple_query(sql)
        .await
        .expect_err(&format!("{sql} should be refused"));
    let message = e.as_db_error().map(|d| d.message().to_string());
    (sqlstate(&e), message.unwrap_or_default())
}

fn tls_file(name: &str) -> String {
    format!("{}/tests/it/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs psql with a connection string and `-c sql`; its exit status and output.
fn psql(conninfo: &str, sql: &str) -> (bool, String) {
    let out = std::process::Command::new("psql")
        .args(["-X", "-At", conninfo, "-c", sql])
        .output()
        .expect("psql must be installed (.ci/run installs postgresql-client)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn jdbc_login(url: &str, user: &str, password: &str, expect: &str) {
    run_client(
        "pgjdbc login (apt-get install default-jre-headless libpostgresql-jdbc-java)",
        "java",
        &[
            "-cp",
            "/usr/share/java/postgresql.jar",
            &script("JdbcLogin.java"),
            url,
            user,
            password,
            expect,
        ],
    );
}

/// Logs in with `driver` (psycopg, psycopg2, asyncpg or node-postgres) over TLS verified
/// against `ca`, or without TLS when `ca` is `-`; `expect` is `plain`, `tls` or the
/// refusal's SQLSTATE (`driver_login.py`).
fn driver_login(driver: &str, port: u16, password: &str, ca: &str, expect: &str) {
    let port = port.to_string();
    if driver == "node-postgres" {
        let args = [port.as_str(), "ann", password, ca, expect];
        return crate::clients::run_node("node_pg_login.js", &args);
    }
    run_client(
        &format!("{driver} login (pip install 'psycopg[binary]' psycopg2-binary asyncpg)"),
        "python3",
        &[
            &script("driver_login.py"),
            driver,
            &port,
            "ann",
            password,
            ca,
            expect,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_passwords_privileges_and_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");

    // Trust on loopback (the default): the first roles are made from this machine.
    let server = TestServer::start(&data, 0, &[]).await;
    let admin = connect(server.port).await;
    admin
        .batch_execute(
            "CREATE ROLE boss SUPERUSER LOGIN PASSWORD 'boss-pw';
             CREATE ROLE ann LOGIN PASSWORD 'ann-pw';
             CREATE USER reader PASSWORD 'reader-pw';
             GRANT pg_read_all_data TO reader;
             CREATE ROLE writer LOGIN PASSWORD 'writer-pw';
             GRANT pg_write_all_data TO writer;
             CREATE ROLE nologin PASSWORD 'nologin-pw';
             CREATE TABLE t (id BIGINT);
             INSERT INTO t VALUES (1), (2);
             CREATE STREAM ev (id BIGINT) WITH (connector = 'table');
             CREATE SINK ev_copy AS SELECT id FROM ev;",
        )
        .await
        .unwrap();
    for (sql, code) in [
        ("CREATE ROLE ann", "42710"),
        ("ALTER ROLE nobody WITH LOGIN", "42704"),
        ("DROP ROLE nobody", "42704"),
        ("GRANT pg_read_all_data TO nobody", "42704"),
        ("GRANT SELECT ON t TO ann", "0A000"),
        ("CREATE ROLE r CREATEDB", "0A000"),
        ("CREATE ROLE pg_mine", "22023"),
    ] {
        assert_eq!(refused(&admin, sql).await.0, code, "{sql}");
    }
    admin
        .batch_execute("DROP ROLE IF EXISTS nobody")
        .await
        .unwrap();
    // Passwords are stored as Postgres stores them, never in clear.
    let catalog = std::fs::read_to_string(data.join("catalog.json")).unwrap();
    assert!(catalog.contains("SCRAM-SHA-256$4096:"), "{catalog}");
    for password in ["boss-pw", "ann-pw", "reader-pw"] {
        assert!(!catalog.contains(password), "{password} stored in clear");
    }
    // A password given already hashed is kept as given: `sam` gets ann's SCRAM secret
    // (which does not depend on the name), and so ann's password, with no md5 secret.
    let roles: serde_json::Value = serde_json::from_str(&catalog).unwrap();
    let ann = roles["roles"]
        .as_array()
        .and_then(|all| all.iter().find(|r| r["name"] == "ann"));
    let scram = ann
        .and_then(|r| r["password"]["scram"].as_str())
        .unwrap_or_else(|| panic!("ann's SCRAM secret in {catalog}"))
        .to_string();
    admin
        .batch_execute(&format!("CREATE ROLE sam LOGIN PASSWORD '{scram}'"))
        .await
        .unwrap();
    server.stop().await;

    // Passwords required, TLS offered.
    let (cert, key) = (tls_file("server.pem"), tls_file("server.key"));
    let server = TestServer::start_with(
        &data,
        &[],
        &[
            "--auth",
            "scram-sha-256",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
    )
    .await;
    let port = server.port;
    let ann = login(port, "ann", "ann-pw").await.expect("ann logs in");
    let one: i64 = ann.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    for (user, password, code) in [
        ("ann", "wrong", "28P01"),
        ("nobody", "ann-pw", "28P01"),
        ("nologin", "nologin-pw", "28000"),
    ] {
        let e = login(port, user, password).await.expect_err("refused");
        assert_eq!(sqlstate(&e), code, "{user}: {e}");
    }
    let e = login(port, "ann", "wrong").await.err().unwrap();
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "password authentication failed for user \"ann\""
    );

    // Concurrent logins, right and wrong passwords interleaved, each get their own answer.
    let attempts = (0..24).map(|i| async move {
        let (user, password) = match i % 3 {
            0 => ("ann", "ann-pw"),
            1 => ("reader", "reader-pw"),
            _ => ("ann", "reader-pw"),
        };
        let outcome = match login(port, user, password).await {
            Ok(c) => c
                .query_one("SELECT 7", &[])
                .await
                .map(|r| r.get::<_, i64>(0) == 7)
                .unwrap_or(false),
            Err(_) => false,
        };
        (i, outcome)
    });
    for (i, ok) in futures::future::join_all(attempts).await {
        assert_eq!(ok, i % 3 != 2, "login {i}");
    }

    // A read-only role reads, and may change nothing (42501).
    let reader = login(port, "reader", "reader-pw").await.unwrap();
    let n: i64 = reader
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2);
    reader
        .batch_execute("SET TIME ZONE 'UTC'; SHOW search_path; SELECT relname FROM pg_class")
        .await
        .unwrap();
    for sql in [
        "INSERT INTO t VALUES (3)",
        "INSERT INTO ev VALUES (3)",
        "CREATE STREAM s2 (a INT) WITH (connector = 'table')",
        "DROP TABLE t",
        "STOP SINK ev_copy",
        "CREATE ROLE x",
        "DELETE FROM t",
        "CREATE VIEW v AS SELECT 1",
    ] {
        assert_eq!(refused(&reader, sql).await.0, "42501", "{sql}");
    }
    assert_eq!(
        refused(&reader, "INSERT INTO t VALUES (3)").await.1,
        "permission denied for table t"
    );
    // The extended protocol is checked too.
    let e = reader
        .execute("INSERT INTO t VALUES ($1)", &[&3i64])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "42501");
    // A writer writes and may not read.
    let writer = login(port, "writer", "writer-pw").await.unwrap();
    writer
        .batch_execute("INSERT INTO t VALUES (3)")
        .await
        .unwrap();
    assert_eq!(refused(&writer, "SELECT * FROM t").await.0, "42501");
    // A grant or a revoke counts at once, in open sessions too.
    let boss = login(port, "boss", "boss-pw").await.unwrap();
    // The catalog shows the roles (no password hash) and who is connected.
    let roles: Vec<(String, bool, bool, Option<String>)> = boss
        .query(
            "SELECT rolname, rolsuper, rolcanlogin, rolpassword FROM pg_roles \
             WHERE rolname IN ('boss', 'reader', 'nologin') ORDER BY rolname",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let stars = Some("********".to_string());
    assert_eq!(
        roles,
        vec![
            ("boss".into(), true, true, stars.clone()),
            ("nologin".into(), false, false, None),
            ("reader".into(), false, true, stars),
        ]
    );
    let who: Vec<(String, String)> = boss
        .query(
            "SELECT a.usename, a.state FROM pg_stat_activity a \
             JOIN pg_roles r ON r.oid = a.usesysid \
             WHERE a.usename IN ('reader', 'writer') ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        who,
        vec![
            ("reader".into(), "idle".into()),
            ("writer".into(), "idle".into())
        ]
    );
    boss.batch_execute("REVOKE pg_read_all_data FROM reader; ALTER ROLE ann PASSWORD 'ann-new'")
        .await
        .unwrap();
    assert_eq!(refused(&reader, "SELECT * FROM t").await.0, "42501");
    assert_eq!(
        sqlstate(&login(port, "ann", "ann-pw").await.err().unwrap()),
        "28P01"
    );
    login(port, "ann", "ann-new")
        .await
        .expect("the new password");
    let n: i64 = boss
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 3);

    // psql: SCRAM in the clear and over TLS, the server's certificate verified.
    let plain = format!("host=127.0.0.1 port={port} user=ann password=ann-new sslmode=disable");
    assert_eq!(psql(&plain, "SELECT 6 * 7"), (true, "42\n".into()));
    let (ok, text) = psql(
        &format!("host=127.0.0.1 port={port} user=ann password=bad sslmode=disable"),
        "SELECT 1",
    );
    assert!(
        !ok && text.contains("password authentication failed for user \"ann\""),
        "{text}"
    );
    let ca = tls_file("ca.pem");
    for mode in ["require", "verify-full"] {
        let tls = format!(
            "host=localhost port={port} user=ann password=ann-new sslmode={mode} sslrootcert={ca}"
        );
        let (ok, text) = psql(&tls, "\\conninfo");
        assert!(ok && text.contains("SSL connection"), "{mode}: {text}");
    }
    // The drivers: SCRAM in the clear and over verified TLS, and a wrong password refused.
    for driver in ["psycopg", "psycopg2", "asyncpg", "node-postgres"] {
        driver_login(driver, port, "ann-new", "-", "plain");
        driver_login(driver, port, "ann-new", &ca, "tls");
        driver_login(driver, port, "bad", "-", "28P01");
    }
    // pgjdbc: SCRAM, then SCRAM over verified TLS, then a wrong password (28P01).
    let url = format!("jdbc:postgresql://localhost:{port}/tidemark");
    jdbc_login(&format!("{url}?sslmode=disable"), "ann", "ann-new", "ok");
    jdbc_login(
        &format!("{url}?sslmode=verify-full&sslrootcert={ca}"),
        "ann",
        "ann-new",
        "ok",
    );
    jdbc_login(&format!("{url}?sslmode=disable"), "ann", "bad", "28P01");
    server.stop().await;

    // md5, for clients without SCRAM: libpq answers the server's md5 challenge.
    let server = TestServer::start_with(&data, &[], &["--auth", "md5"]).await;
    let md5 = format!(
        "host=127.0.0.1 port={} user=ann password=ann-new sslmode=disable",
        server.port
    );
    assert_eq!(psql(&md5, "SELECT 1"), (true, "1\n".into()));
    let (ok, text) = psql(&md5.replace("ann-new", "ann-pw"), "SELECT 1");
    assert!(
        !ok && text.contains("password authentication failed"),
        "{text}"
    );
    for driver in ["psycopg2", "asyncpg", "node-postgres"] {
        driver_login(driver, server.port, "ann-new", "-", "plain");
        driver_login(driver, server.port, "ann-pw", "-", "28P01");
    }
    // A role with only a SCRAM secret logs in by SCRAM under md5, as in Postgres.
    let sam = md5.replace("user=ann", "user=sam");
    assert_eq!(
        psql(&sam.replace("ann-new", "ann-pw"), "SELECT current_user"),
        (true, "sam\n".into())
    );
    let (ok, text) = psql(&sam, "SELECT 1");
    assert!(
        !ok && text.contains("password authentication failed"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_off_loopback_needs_insecure() {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--auth",
            "trust",
            "--data-dir",
        ])
        .arg(tmp.path().join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started: {stderr}");
    assert!(stderr.contains("refusing to listen on 0.0.0.0"), "{stderr}");
    // Said on purpose, it starts.
    let server = TestServer::start_with(
        &tmp.path().join("data"),
        &[],
        &["--listen", "0.0.0.0:0", "--auth", "trust", "--insecure"],
    )
    .await;
    connect(server.port).await;
    server.stop().await;
}

/// The long query every cancel test stops: counting a trillion rows.
const LONG_QUERY: &str = "SELECT count(*) FROM generate_series(1, 1000000000000)";

/// Runs `sql` in psql (database `database`), presses Ctrl-C until psql ends, and returns
/// what psql printed.
async fn psql_ctrl_c(port: u16, database: &str, sql: &str) -> String {
    let mut child = tokio::process::Command::new("psql")
        .args(["-X", "-h", "127.0.0.1", "-p", &port.to_string(), "-d"])
        .args([database, "-c", sql])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("psql must be installed (.ci/run installs postgresql-client)");
    // Wait until the statement runs (psql has its Ctrl-C handler by then).
    let watcher = connect(port).await;
    poll("psql's statement to run", || async {
        let rows = watcher
            .query(
                "SELECT query FROM pg_stat_activity WHERE datname = $1 AND state = 'active'",
                &[&database],
            )
            .await
            .unwrap();
        rows.iter()
            .any(|r| r.get::<_, &str>(0) == sql)
            .then_some(())
    })
    .await;
    let pid = child.id().expect("psql's pid").to_string();
    let deadline = Instant::now() + DEADLINE;
    loop {
        // The statement may not have reached the server yet: press again until psql ends.
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status();
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        assert!(Instant::now() < deadline, "psql did not stop on Ctrl-C");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = child.wait_with_output().await.unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Cancels `client`'s running statement, again and again, until `running` ends; its error.
async fn cancel_until_done(
    client: &Client,
    running: tokio::task::JoinHandle<
        Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error>,
    >,
) -> tokio_postgres::Error {
    let token = client.cancel_token();
    let deadline = Instant::now() + DEADLINE;
    while !running.is_finished() {
        assert!(Instant::now() < deadline, "the statement was not cancelled");
        token.cancel_query(NoTls).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.await.unwrap().expect_err("cancelled")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_statement_timeout_stop_a_long_select() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    // A driver's cancel request.
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={} user=t dbname=t", server.port),
        NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let client = std::sync::Arc::new(client);
    let running = {
        let c = client.clone();
        tokio::spawn(async move { c.simple_query(LONG_QUERY).await })
    };
    let e = cancel_until_done(&client, running).await;
    assert_eq!(sqlstate(&e), "57014");
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "canceling statement due to user request"
    );
    // The session goes on.
    let one: i64 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);

    // statement_timeout, in both protocols.
    client
        .batch_execute("SET statement_timeout = '300ms'")
        .await
        .unwrap();
    let e = client.simple_query(LONG_QUERY).await.unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.message()),
        Some("canceling statement due to statement timeout")
    );
    let e = client.query(LONG_QUERY, &[]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "57014");
    client
        .batch_execute("SET statement_timeout = 0")
        .await
        .unwrap();

    // psql's Ctrl-C.
    let printed = psql_ctrl_c(server.port, "ctrl_c_select", LONG_QUERY).await;
    assert!(
        printed.contains("canceling statement due to user request"),
        "{printed}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_flush_that_waits() {
    let tmp = tempfile::tempdir().unwrap();
    // Every micro-batch waits forever: a FLUSH waits with it.
    let server = TestServer::start(
        &tmp.path().join("data"),
        0,
        &[("TIDEMARK_PAUSE_AT", "batch_start")],
    )
    .await;
    let client = std::sync::Arc::new(connect(server.port).await);
    client
        .batch_execute(
            "CREATE STREAM ev (id BIGINT) WITH (connector = 'table');
             CREATE SINK ev_copy AS SELECT id FROM ev;
             INSERT INTO ev VALUES (1);",
        )
        .await
        .unwrap();
    let running = {
        let c = client.clone();
        tokio::spawn(async move { c.simple_query("FLUSH SINK ev_copy").await })
    };
    let e = cancel_until_done(&client, running).await;
    assert_eq!(sqlstate(&e), "57014", "{e}");
    let printed = psql_ctrl_c(server.port, "ctrl_c_flush", "FLUSH SINK ev_copy").await;
    assert!(
        printed.contains("canceling statement due to user request"),
        "{printed}"
    );
    // The paused batch never ends, so a graceful stop would wait for it.
    server.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_and_idle_session_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let server =
        TestServer::start_with(&tmp.path().join("data"), &[], &["--max-connections", "2"]).await;
    let first = connect(server.port).await;
    let _second = connect(server.port).await;
    let conn_str = format!("host=127.0.0.1 port={} user=x dbname=x", server.port);
    let e = tokio_postgres::connect(&conn_str, NoTls)
        .await
        .err()
        .unwrap();
    assert_eq!(sqlstate(&e), "53300");
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "sorry, too many clients already"
    );
    // A connection that ends gives its place back.
    drop(first);
    poll("a free connection slot", || async {
        tokio_postgres::connect(&conn_str, NoTls)
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    server.stop().await;

    let server = TestServer::start_with(
        &tmp.path().join("data2"),
        &[],
        &["--idle-session-timeout", "1"],
    )
    .await;
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={} user=x dbname=x", server.port),
        NoTls,
    )
    .await
    .unwrap();
    let ended = tokio::spawn(connection);
    // Taken before the statement: the server's idle clock starts after its answer.
    let started = Instant::now();
    client.batch_execute("SELECT 1").await.unwrap();
    let ended = tokio::time::timeout(DEADLINE, ended)
        .await
        .expect("the idle session was not closed")
        .unwrap();
    let e = ended.expect_err("closed with an error");
    assert_eq!(sqlstate(&e), "57P05", "{e}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    server.stop().await;
}

/// The one boolean `sql` answers.
async fn answer(client: &Client, sql: String) -> Result<bool, tokio_postgres::Error> {
    client
        .query_one(&sql, &[])
        .await
        .map(|r| r.get::<_, bool>(0))
}

/// A connection whose end (the error that ended it, if any) is kept, and its pid.
async fn watched_connection(
    port: u16,
    user: &str,
) -> (
    Client,
    i32,
    tokio::sync::oneshot::Receiver<Option<tokio_postgres::Error>>,
) {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user={user} password={user}-pw dbname=t"),
        NoTls,
    )
    .await
    .unwrap();
    let (ended, end) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = ended.send(connection.await.err());
    });
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (client, pid, end)
}

/// Superset's "stop query" and an administrator's: `pg_cancel_backend(pid)` stops another
/// session's running statement (57014) and the session goes on; `pg_terminate_backend(pid)`
/// ends it, idle or running, with `FATAL 57P01`. Another role may signal only its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_terminate_another_backend() {
    let tmp = tempfile::tempdir().unwrap();
    let server = TestServer::start(&tmp.path().join("data"), 0, &[]).await;
    let admin = connect(server.port).await;
    admin
        .batch_execute(
            "CREATE ROLE ann LOGIN PASSWORD 'ann-pw'; CREATE ROLE bob LOGIN PASSWORD 'bob-pw'",
        )
        .await
        .unwrap();
    let signal = |f: &'static str, pid: i32| format!("SELECT {f}({pid})");

    // A cancel: the running statement stops, the session goes on.
    let (victim, pid, victim_end) = watched_connection(server.port, "ann").await;
    let victim = std::sync::Arc::new(victim);
    let running = {
        let c = victim.clone();
        tokio::spawn(async move { c.simple_query(LONG_QUERY).await })
    };
    let deadline = Instant::now() + DEADLINE;
    while !running.is_finished() {
        assert!(
            Instant::now() < deadline,
            "pg_cancel_backend did not stop it"
        );
        assert!(
            answer(&admin, signal("pg_cancel_backend", pid))
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = running.await.unwrap().expect_err("cancelled");
    assert_eq!(sqlstate(&e), "57014", "{e}");
    let one: i64 = victim.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);

    // Another role may not signal ann's session; ann may signal her own.
    let (bob, _, _) = watched_connection(server.port, "bob").await;
    for f in ["pg_cancel_backend", "pg_terminate_backend"] {
        let e = answer(&bob, signal(f, pid)).await.unwrap_err();
        assert_eq!(sqlstate(&e), "42501", "{f}: {e}");
    }
    let (ann2, _, _) = watched_connection(server.port, "ann").await;
    assert!(
        answer(&ann2, signal("pg_cancel_backend", pid))
            .await
            .unwrap()
    );
    // No such session: false, as in Postgres.
    assert!(
        !answer(&admin, signal("pg_terminate_backend", 0))
            .await
            .unwrap()
    );

    // Terminating an idle session: its connection ends with 57P01.
    assert!(
        answer(&admin, signal("pg_terminate_backend", pid))
            .await
            .unwrap()
    );
    let e = tokio::time::timeout(DEADLINE, victim_end)
        .await
        .expect("the terminated connection ends")
        .unwrap()
        .expect("an error ends it");
    assert_eq!(sqlstate(&e), "57P01", "{e}");
    assert_eq!(
        e.as_db_error().unwrap().message(),
        "terminating connection due to administrator command"
    );
    assert!(victim.is_closed());

    // Terminating a session while its statement runs: the statement stops, then the
    // connection ends.
    let (busy, busy_pid, busy_end) = watched_connection(server.port, "bob").await;
    let busy = std::sync::Arc::new(busy);
    let running = {
        let c = busy.clone();
        tokio::spawn(async move { c.simple_query(LONG_QUERY).await })
    };
    poll("bob's statement to run", || async {
        let rows = admin
            .query(
                "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
                &[&busy_pid],
            )
            .await
            .unwrap();
        (!rows.is_empty()).then_some(())
    })
    .await;
    assert!(
        answer(&admin, signal("pg_terminate_backend", busy_pid))
            .await
            .unwrap()
    );
    let e = tokio::time::timeout(DEADLINE, running)
        .await
        .expect("the running statement ends")
        .unwrap()
        .expect_err("terminated");
    let ended = tokio::time::timeout(DEADLINE, busy_end)
        .await
        .expect("the connection ends")
        .unwrap();
    let codes: Vec<String> = [Some(&e), ended.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_db_error().map(|d| d.code().code().to_string()))
        .collect();
    assert!(codes.contains(&"57P01".to_string()), "{codes:?} {e}");
    // Gone from pg_stat_activity.
    poll(
        "the terminated sessions to leave pg_stat_activity",
        || async {
            let rows = admin
                .query(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = $1 OR pid = $2",
                    &[&pid, &busy_pid],
                )
                .await
                .unwrap();
            rows.is_empty().then_some(())
        },
    )
    .await;
    server.stop().await;
}
