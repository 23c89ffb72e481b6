"""psycopg 2 against Tidemark: types both ways, transactions, SQLSTATEs, executemany and
COPY into a table stream. Run by tests/it/clients.rs as `python3 psycopg2_check.py PORT`
after it made `orders` (a table) and `clicks` (a table stream)."""
import datetime
import io
import sys

import psycopg2
import psycopg2.errors

port = sys.argv[1]
conn = psycopg2.connect(host="127.0.0.1", port=port, user="tidemark", dbname="shop")
assert conn.server_version >= 170000, conn.server_version
cur = conn.cursor()

# Parameters are sent inline by psycopg2 (client-side binding): typed literals.
cur.execute(
    "SELECT %s::bigint AS i, %s::double precision AS f, %s::text AS t, %s::boolean AS b",
    (7, 2.5, "it's", True),
)
assert cur.fetchone() == (7, 2.5, "it's", True)
assert [d.name for d in cur.description] == ["i", "f", "t", "b"]
# 20 = int8, 701 = float8, 25 = text, 16 = bool.
assert [d.type_code for d in cur.description] == [20, 701, 25, 16], cur.description
cur.execute("SELECT TIMESTAMP '2026-06-10 10:01:00' AS ts, NULL::text AS n")
assert cur.fetchone() == (datetime.datetime(2026, 6, 10, 10, 1), None)

cur.execute("SELECT id, amount, note FROM orders ORDER BY id")
assert cur.fetchall() == [(1, 9.5, "a"), (2, 20.0, None)]
conn.commit()

# An error has Postgres's SQLSTATE and class; the transaction then needs a rollback.
try:
    cur.execute("SELECT * FROM nope")
    raise AssertionError("expected an error")
except psycopg2.errors.UndefinedTable as e:
    assert e.pgcode == "42P01", e.pgcode
conn.rollback()
try:
    cur.execute("SELECT 1/0")
    raise AssertionError("expected an error")
except psycopg2.errors.DivisionByZero:
    pass
conn.rollback()

# Rows into a table stream: executemany, then COPY FROM STDIN.
cur.executemany(
    "INSERT INTO clicks VALUES (%s, %s)",
    [("u1", datetime.datetime(2026, 6, 10, 10, 0)), ("u2", datetime.datetime(2026, 6, 10, 10, 5))],
)
conn.commit()
cur.copy_expert(
    "COPY clicks FROM STDIN",
    io.StringIO("u3\t2026-06-10 10:07:00\nu1\t2026-06-10 10:09:00\n"),
)
conn.commit()
cur.execute("SELECT user_id, count(*) FROM clicks GROUP BY user_id ORDER BY user_id")
assert cur.fetchall() == [("u1", 2), ("u2", 1), ("u3", 1)], "clicks"
conn.close()
print("psycopg2 ok")
