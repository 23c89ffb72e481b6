"""psycopg 3 against a running tidemark: parameters, Tidemark statements, SQLSTATEs, binary.

Usage: python3 psycopg_check.py PORT LANDING_DIR   (run by tests/it/wire.rs)
"""
import sys

import psycopg

port, landing = sys.argv[1], sys.argv[2]
with psycopg.connect(f"host=127.0.0.1 port={port} user=py dbname=py") as conn:
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
print("psycopg ok")
