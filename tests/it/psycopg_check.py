"""psycopg 3 against a running tidemark: parameters, Tidemark statements, SQLSTATEs, binary.

Usage: python3 psycopg_check.py PORT LANDING_DIR   (run by tests/it/wire.rs)
"""
import sys

import psycopg

port, landing = sys.argv[1], sys.argv[2]
with psycopg.connect(f"host=127.0.0.1 port={port} user=py dbname=py") as conn:
    # The version libpq reads from the server_version parameter status agrees with version().
    assert conn.info.parameter_status("server_version") == "17.6", conn.info.parameter_status("server_version")
    assert conn.info.server_version == 170006, conn.info.server_version
    assert conn.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 17.6 ")
    # SHOW over the extended protocol, as pgjdbc and psycopg send it.
    assert conn.execute("SHOW TRANSACTION ISOLATION LEVEL").fetchone()[0] == "read committed"
    # psycopg opens a transaction (BEGIN) and sends parameters with the extended protocol.
    assert conn.execute("SELECT 1 + %s AS x", (41,)).fetchone()[0] == 42
    conn.execute(
        "CREATE STREAM py_clicks (user_id TEXT, duration_s DOUBLE PRECISION) "
        f"WITH (format = 'json', path = '{landing}')"
    )
    rows = conn.execute("SELECT user_id, duration_s FROM py_clicks").fetchall()
    assert rows == [("u1", 12.5)], rows
    names = [r[0] for r in conn.execute("SHOW STREAMS").fetchall()]
    assert "py_clicks" in names, names
    try:
        conn.execute("SELECT * FROM nope")
        raise SystemExit("expected an error")
    except psycopg.errors.UndefinedTable:
        pass
    conn.rollback()
    with conn.cursor(binary=True) as cur:
        cur.execute("SELECT CAST(2 AS BIGINT), 'x', CAST(1.5 AS DOUBLE PRECISION)")
        assert cur.fetchone() == (2, "x", 1.5)
# Tables over the extended protocol: INSERT with parameters, the command tags' row counts,
# and a clear refusal of parameters where they are not supported yet.
with psycopg.connect(f"host=127.0.0.1 port={port} user=py dbname=py", autocommit=True) as conn:
    conn.execute("CREATE TABLE py_users (id BIGINT, name TEXT, visits INT)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO py_users VALUES (%s, %s, %s)",
                        [(1, "ann", 1), (2, "bob", 2), (3, "cy", 3)])
        cur.execute("UPDATE py_users SET visits = visits * 10 WHERE id >= 2")
        assert cur.rowcount == 2, cur.rowcount
        cur.execute("MERGE INTO py_users AS t USING (SELECT 3 AS id, 'cy' AS name, 1 AS visits "
                    "UNION ALL SELECT 4, 'dee', 1) AS s ON t.id = s.id "
                    "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *")
        assert cur.rowcount == 2, cur.rowcount
        cur.execute("DELETE FROM py_users WHERE name = 'ann'")
        assert cur.rowcount == 1, cur.rowcount
        want = conn.execute(
            "SELECT id, name, visits FROM (VALUES (2, 'bob', 20), (4, 'dee', 1)) "
            "AS v(id, name, visits) ORDER BY id").fetchall()
        got = conn.execute("SELECT id, name, visits FROM py_users ORDER BY id").fetchall()
        assert [tuple(r) for r in got] == [tuple(r) for r in want], (got, want)
        try:
            cur.execute("UPDATE py_users SET visits = %s WHERE id = 2", (5,))
            raise SystemExit("expected an error")
        except psycopg.errors.FeatureNotSupported:
            pass
# A query with parameters answers in PostgreSQL's text, as one without them does: a float
# without a trailing ".0", a timestamp without six zero decimals.
with psycopg.connect(f"host=127.0.0.1 port={port} user=py dbname=py", autocommit=True) as conn:
    from psycopg.types.string import TextLoader
    for name in ("float8", "timestamp"):
        conn.adapters.register_loader(name, TextLoader)
    sql = ("SELECT CAST(12 AS DOUBLE PRECISION) AS x, TIMESTAMP '2026-01-01 10:00:00' AS t "
           "WHERE 1 = {}")
    plain = conn.execute(sql.format("1")).fetchone()
    bound = conn.execute(sql.format("%s"), (1,)).fetchone()
    assert plain == ("12", "2026-01-01 10:00:00"), plain
    assert bound == plain, (bound, plain)
    # A view read by its key, past psycopg's prepare threshold (five runs): the server
    # answers those from the view without planning.
    conn.execute("CREATE MATERIALIZED VIEW py_totals AS "
                 "SELECT user_id, sum(duration_s) AS total FROM py_clicks GROUP BY user_id")
    conn.execute("FLUSH MATERIALIZED VIEW py_totals")
    for _ in range(8):
        got = conn.execute("SELECT user_id, total FROM py_totals WHERE user_id = %s",
                           ("u1",)).fetchall()
        assert got == [("u1", "12.5")], got
        assert conn.execute("SELECT total FROM py_totals WHERE user_id = %s",
                            ("u2",)).fetchall() == []
print("psycopg ok")
