"""psycopg 3 logs in with a password (SCRAM-SHA-256 or md5), optionally over TLS.

Run by tests/it/security.rs as `python3 psycopg_login.py CONNINFO EXPECT` where EXPECT is
`plain` (logged in without TLS), `tls` (logged in over TLS) or text the failed login's
message must contain (libpq gives no SQLSTATE for a refused connection).
"""
import sys

import psycopg

conninfo, expect = sys.argv[1], sys.argv[2]
try:
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT 41 + 1").fetchone()[0] == 42
        got = "tls" if conn.pgconn.ssl_in_use else "plain"
except psycopg.OperationalError as e:
    got = str(e)
    assert expect not in ("plain", "tls") and expect in got, f"expected {expect}, got {got}"
    got = expect
assert got == expect, f"expected {expect}, got {got}"
print("psycopg login", got)
