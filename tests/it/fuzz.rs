//! Seeded fuzzing of the wire: mutated statements over a normal connection, and malformed
//! protocol messages over raw sockets. The server must answer every one with rows or an
//! error carrying a SQLSTATE, keep serving, and never panic (its log is checked).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{Rng, TestServer};

/// How many mutated statements and malformed messages each run sends.
const STATEMENTS: usize = 2_000;
const MESSAGES: usize = 2_000;
/// The run's seed: fixed, so a failure reproduces; `TIDEMARK_FUZZ_SEED` explores others.
fn seed(fixed: u64) -> u64 {
    std::env::var("TIDEMARK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s| *s != 0) // xorshift stays at 0 forever
        .unwrap_or(fixed)
}

/// Longer than any statement of the corpus takes; reaching it is a failure.
const STATEMENT_DEADLINE: Duration = Duration::from_secs(60);

/// Statements the mutations start from: the SQL a user and a BI tool send, Tidemark's own
/// statements, and session statements. None can run for long or allocate without bound
/// whatever a mutation does to its numbers (no `generate_series`, `repeat`, `lpad`).
const CORPUS: &[&str] = &[
    "SELECT 1",
    "SELECT page, count(*) AS n FROM clicks GROUP BY page ORDER BY n DESC LIMIT 3",
    "SELECT count(*), avg(x) FROM clicks WHERE page = 3",
    "SELECT * FROM clicks WHERE x > 1.5 AND page IN (1, 2, 3)",
    "SELECT name, id FROM users ORDER BY id",
    "SELECT u.name, c.x FROM clicks c JOIN users u ON u.id = c.page",
    "SELECT CAST('2020-01-01' AS DATE), '12'::int + 1, 1.5::text",
    "SELECT upper('abc') || lower('D'), length('xyz'), substr('hello', 2, 3)",
    "SELECT CASE WHEN x > 1 THEN 'big' ELSE 'small' END FROM clicks",
    "SELECT date_trunc('hour', TIMESTAMP '2024-01-01 10:30:00')",
    "SELECT window(TIMESTAMP '2024-01-01 10:30:00', '10 minutes')",
    "SELECT (SELECT max(x) FROM clicks), coalesce(NULL, 2)",
    "SELECT * FROM (VALUES (1, 'a'), (2, 'b')) AS t(a, b) WHERE a <> 2",
    "SELECT relname, relkind FROM pg_catalog.pg_class WHERE relnamespace = 2200",
    "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' ORDER BY 1",
    "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_name = 'clicks'",
    "SELECT t.oid, t.typname FROM pg_type t WHERE t.typname = 'int4'",
    "SELECT current_database(), current_schema(), version()",
    "SELECT format_type(23, -1), pg_table_is_visible(1259)",
    "SHOW server_version",
    "SHOW search_path",
    "SET application_name = 'fuzz'",
    "SET extra_float_digits = 3",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s1",
    "RELEASE SAVEPOINT s1",
    "EXPLAIN SELECT count(*) FROM clicks",
    "INSERT INTO clicks VALUES (7, 7.5)",
    "INSERT INTO users VALUES (9, 'nine')",
    "UPDATE users SET name = 'x' WHERE id = 9",
    "DELETE FROM users WHERE id = 9",
    "MERGE INTO users t USING (SELECT 9 AS id, 'n' AS name) s ON t.id = s.id \
     WHEN MATCHED THEN UPDATE SET name = s.name WHEN NOT MATCHED THEN INSERT (id, name) VALUES (s.id, s.name)",
    "CREATE STREAM f1 (page INT, ts TIMESTAMP) WITH (format = 'json', watermark = 'ts - INTERVAL 10 SECONDS')",
    "CREATE SINK s1 WITH (trigger = 'once', output_mode = 'append') AS SELECT page FROM clicks",
    "CREATE MATERIALIZED VIEW v1 AS SELECT page, count(*) AS n FROM clicks GROUP BY page",
    "CREATE TABLE t1 (id BIGINT PRIMARY KEY, v TEXT)",
    "DROP STREAM IF EXISTS f1",
    "DROP SINK IF EXISTS s1",
    "DROP TABLE IF EXISTS t1",
    "SHOW STREAMS",
    "SHOW SINKS",
    "SHOW QUERIES",
    "SHOW OPTIONS",
    "SHOW MATERIALIZED VIEWS",
    "STOP SINK s1",
    "START SINK s1",
    "OPTIMIZE users",
    "EXPLAIN CREATE SINK s2 AS SELECT page, count(*) FROM clicks GROUP BY page",
    "SELECT * FROM tidemark.progress",
];

/// Tokens mutations insert or substitute.
const POOL: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "(",
    ")",
    ",",
    "'",
    "''",
    "\"",
    "NULL",
    "-1",
    "0",
    "1e308",
    "9223372036854775808",
    "'x'",
    "::int",
    "::text",
    "::regclass",
    "::date",
    "$1",
    "*",
    "/",
    "%",
    "||",
    "AND",
    "OR",
    "NOT",
    "GROUP BY",
    "ORDER BY",
    "LIMIT",
    "OFFSET",
    "UNION",
    "JOIN",
    "ON",
    "CAST(",
    "AS",
    "WITH",
    "(trigger = 'once')",
    "WINDOW",
    "window(",
    "INTERVAL '1 second'",
    "E'\\x'",
    "$$",
    "[",
    "]",
    "{",
    "}",
    ";",
    "--",
    "/*",
    "*/",
    "true",
    "ARRAY[",
    "->",
    "1/0",
    "SHOW",
    "SET",
    "=",
    "TABLE",
    "STREAM",
    "SINK",
    "VIEW",
    "DROP",
    "CREATE",
    "IF",
    "EXISTS",
    "WITH (",
    "watermark",
    "output_mode",
    "'complete'",
    "é",
    "\\",
    "LATERAL",
    "OVER (",
];

fn mutate(rng: &mut Rng, statement: &str) -> String {
    let mut words: Vec<String> = statement.split(' ').map(str::to_string).collect();
    let pick = |rng: &mut Rng| POOL[rng.below(POOL.len() as u64) as usize].to_string();
    for _ in 0..=rng.below(3) {
        let at = rng.below(words.len() as u64 + 1) as usize;
        match rng.below(6) {
            0 if words.len() > 1 => {
                words.remove(at.min(words.len() - 1));
            }
            1 if !words.is_empty() => {
                let w = words[at.min(words.len() - 1)].clone();
                words.insert(at.min(words.len()), w);
            }
            2 if !words.is_empty() => {
                let i = at.min(words.len() - 1);
                words[i] = pick(rng);
            }
            3 => {
                let text = words.join(" ");
                let cut = rng.below(text.len() as u64 + 1) as usize;
                let cut = (0..=cut)
                    .rev()
                    .find(|i| text.is_char_boundary(*i))
                    .unwrap_or(0);
                words = text[..cut].split(' ').map(str::to_string).collect();
            }
            4 if !words.is_empty() => {
                // One character replaced inside a word.
                let i = at.min(words.len() - 1);
                let chars: Vec<char> = words[i].chars().collect();
                if !chars.is_empty() {
                    let c = rng.below(chars.len() as u64) as usize;
                    let with = b"'\"()[];:,.$%\\-+*/0x9 "[rng.below(21) as usize] as char;
                    let mut chars = chars;
                    chars[c] = with;
                    words[i] = chars.into_iter().collect();
                }
            }
            _ => words.insert(at, pick(rng)),
        }
    }
    words.join(" ")
}

async fn setup(server: &TestServer) {
    let client = server.connect().await;
    client
        .batch_execute(
            "CREATE STREAM clicks (page INT, x DOUBLE PRECISION);
             INSERT INTO clicks VALUES (1, 1.0), (2, 2.5), (3, 0.5);
             CREATE TABLE users (id BIGINT, name TEXT);
             INSERT INTO users VALUES (1, 'one'), (2, 'two');",
        )
        .await
        .unwrap();
}

/// No panic message in the server's log, and it still answers.
async fn assert_alive_without_panics(server: &TestServer) {
    let client = server.connect().await;
    let rows = client.simple_query("SELECT 41 + 1").await.unwrap();
    assert!(rows.iter().any(
        |m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(r) if r.get(0) == Some("42"))
    ));
    let log = server.log();
    let panics = log.matches("panicked at").count();
    assert_eq!(panics, 0, "the server panicked {panics} times; log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_statements_get_rows_or_an_error_with_a_sqlstate() {
    // Both protocols: even statements as simple queries, odd ones prepared and executed.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    setup(&server).await;
    let mut client = server.connect().await;
    let mut rng = Rng(seed(0x5eed_0001));
    let (mut ok, mut errors) = (0, 0);
    for i in 0..STATEMENTS {
        let base = CORPUS[rng.below(CORPUS.len() as u64) as usize];
        let statement = mutate(&mut rng, base);
        // Every other statement goes through the extended protocol (Parse, Bind, Execute).
        let run = async {
            if i % 2 == 0 {
                return client.simple_query(&statement).await.map(|_| ());
            }
            let prepared = client.prepare(&statement).await?;
            if prepared.params().is_empty() {
                client.query(&prepared, &[]).await?;
            }
            Ok(())
        };
        let outcome = tokio::time::timeout(STATEMENT_DEADLINE, run)
            .await
            .unwrap_or_else(|_| panic!("statement {i} did not finish: {statement}"));
        match outcome {
            Ok(()) => ok += 1,
            Err(e) => {
                let Some(db) = e.as_db_error() else {
                    panic!(
                        "statement {i} ended without an ErrorResponse ({e}): {statement}\nlog:\n{}",
                        server.log()
                    );
                };
                let code = db.code().code();
                assert!(
                    code.len() == 5 && code != "XX000",
                    "statement {i} answered {code} ({}): {statement}",
                    db.message()
                );
                errors += 1;
            }
        }
        // A mutated BEGIN may leave a block open (or failed); end it so the next statement
        // is judged on its own.
        if client.is_closed() {
            panic!("the connection closed after statement {i}: {statement}");
        }
        let _ = client.simple_query("ROLLBACK").await;
        if i % 500 == 499 {
            // A fresh session now and then, as a pool would give.
            client = server.connect().await;
        }
    }
    assert_eq!(ok + errors, STATEMENTS);
    assert!(
        errors > STATEMENTS / 4,
        "too few errors ({errors}): the mutations are too mild"
    );
    assert!(
        ok > STATEMENTS / 50,
        "too few successes ({ok}): the corpus is broken"
    );
    assert_alive_without_panics(&server).await;
    server.stop().await;
}

/// A frontend message: its type byte, then its length and body.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend(((body.len() + 4) as i32).to_be_bytes());
    m.extend(body);
    m
}

fn startup_packet() -> Vec<u8> {
    let mut body = 196_608i32.to_be_bytes().to_vec();
    body.extend(b"user\0tidemark\0database\0tidemark\0\0");
    let mut m = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    m.extend(body);
    m
}

/// Well-formed messages the malformed ones are made from.
fn seeds() -> Vec<Vec<u8>> {
    let bind = {
        let mut b = b"\0s1\0\0\x01\0\0\0\x02".to_vec();
        b.extend(2i32.to_be_bytes());
        b.extend(b"42");
        b.extend((-1i32).to_be_bytes());
        b.extend(b"\0\x01\0\x01");
        b
    };
    vec![
        message(b'Q', b"SELECT 1\0"),
        message(
            b'P',
            b"s1\0SELECT $1::int, $2::text\0\0\x02\0\0\0\x17\0\0\0\x19",
        ),
        message(b'B', &bind),
        message(b'D', b"Ss1\0"),
        message(b'D', b"P\0"),
        message(b'E', b"\0\0\0\0\0"),
        message(b'C', b"Ss1\0"),
        message(b'H', b""),
        message(b'S', b""),
        message(b'd', b"1\t2\n"),
        message(b'c', b""),
        message(b'f', b"stop\0"),
        message(b'F', b"\0\0\0\x01"),
        startup_packet(),
    ]
}

/// A malformed variant of `seed`: cut short, its length wrong, bytes changed or added.
fn malform(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut m = seed.to_vec();
    let typed = m[0].is_ascii_alphabetic();
    let len_at = usize::from(typed);
    match rng.below(6) {
        0 => {
            // Body cut short, length kept consistent: the decoder must not read past it.
            let cut = len_at + 4 + rng.below((m.len() - len_at - 4) as u64 + 1) as usize;
            m.truncate(cut);
            let len = (m.len() - len_at) as i32;
            m[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
        }
        1 => {
            // A length that lies: smaller, negative, huge.
            let lie: i32 = match rng.below(4) {
                0 => rng.below(4) as i32,
                1 => -(rng.below(1000) as i32) - 1,
                2 => 0x4000_0000,
                _ => i32::MAX,
            };
            m[len_at..len_at + 4].copy_from_slice(&lie.to_be_bytes());
        }
        2 => {
            // Random bytes flipped in the body.
            for _ in 0..=rng.below(4) {
                if m.len() > len_at + 4 {
                    let i = len_at + 4 + rng.below((m.len() - len_at - 4) as u64) as usize;
                    m[i] = rng.next() as u8;
                }
            }
        }
        3 => {
            // Counts and lengths inside the body set to extremes.
            if m.len() > len_at + 6 {
                let i = len_at + 4 + rng.below((m.len() - len_at - 6) as u64) as usize;
                let v: [u8; 2] = match rng.below(3) {
                    0 => [0xff, 0xff],
                    1 => [0x7f, 0xff],
                    _ => [0x00, 0x05],
                };
                m[i..i + 2].copy_from_slice(&v);
            }
        }
        4 => {
            // Garbage appended inside the declared length.
            for _ in 0..=rng.below(16) {
                m.push(rng.next() as u8);
            }
            let len = (m.len() - len_at) as i32;
            m[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
        }
        _ => {
            // An unknown or wrong type byte.
            if typed {
                m[0] = rng.next() as u8;
            } else {
                m[len_at + 4] = rng.next() as u8;
            }
        }
    }
    m
}

/// Reads backend messages until the server closes the connection (or `deadline`), and
/// returns each error's SQLSTATE; `None` for an ErrorResponse without one.
async fn read_until_closed(socket: &mut TcpStream) -> Result<Vec<Option<String>>, String> {
    let mut data = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut data)).await;
    match read {
        Err(_) => return Err("the server neither answered nor closed within 30 s".into()),
        Ok(Err(e)) if e.kind() != std::io::ErrorKind::ConnectionReset => {
            return Err(format!("reading: {e}"));
        }
        _ => {}
    }
    let mut codes = Vec::new();
    let mut at = 0;
    while at + 5 <= data.len() {
        let tag = data[at];
        let len = i32::from_be_bytes(data[at + 1..at + 5].try_into().unwrap()) as usize;
        let end = (at + 1 + len).min(data.len());
        if tag == b'E' {
            let fields = &data[at + 5..end];
            let code = fields
                .split(|b| *b == 0)
                .find(|f| f.first() == Some(&b'C'))
                .map(|f| String::from_utf8_lossy(&f[1..]).into_owned());
            codes.push(code);
        }
        at = at + 1 + len;
    }
    Ok(codes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_get_a_protocol_error_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"), 0, &[]).await;
    setup(&server).await;
    let seeds = seeds();
    let mut rng = Rng(seed(0x5eed_0002));
    let mut protocol_errors = 0;
    for i in 0..MESSAGES {
        let seed = &seeds[rng.below(seeds.len() as u64) as usize];
        let bad = malform(&mut rng, seed);
        let mut socket = TcpStream::connect(("127.0.0.1", server.port))
            .await
            .unwrap();
        let is_startup = !seed[0].is_ascii_alphabetic();
        if is_startup {
            socket.write_all(&bad).await.unwrap();
        } else {
            socket.write_all(&startup_packet()).await.unwrap();
            // A prepared statement for the Bind, Describe and Execute to find.
            socket.write_all(&seeds[1]).await.unwrap();
            socket.write_all(&message(b'S', b"")).await.unwrap();
            socket.write_all(&bad).await.unwrap();
            socket.write_all(&message(b'S', b"")).await.unwrap();
        }
        // No more input: the server must answer what it has and close.
        let _ = socket.shutdown().await;
        let codes = read_until_closed(&mut socket)
            .await
            .unwrap_or_else(|e| panic!("message {i} ({bad:?}): {e}"));
        for code in &codes {
            let code = code
                .as_deref()
                .unwrap_or_else(|| panic!("message {i} ({bad:?}): an error without a SQLSTATE"));
            assert!(
                code.len() == 5 && code != "XX000",
                "message {i} ({bad:?}) answered {code}"
            );
            if code == "08P01" {
                protocol_errors += 1;
            }
        }
    }
    assert!(
        protocol_errors > MESSAGES / 4,
        "only {protocol_errors} protocol violations reported: the mutations are too mild"
    );
    assert_alive_without_panics(&server).await;
    server.stop().await;
}
