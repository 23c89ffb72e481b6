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
    assert!(
        mismatches.is_empty(),
        "errors differ from PostgreSQL's:\n{}",
        mismatches.join("\n")
    );
    server.stop().await;
}
