"""A Python driver logs in with a password (SCRAM-SHA-256 or md5), optionally over TLS.

Run by tests/it/security.rs as

    python3 driver_login.py DRIVER PORT USER PASSWORD CA EXPECT

- DRIVER: `psycopg` (3), `psycopg2` or `asyncpg`;
- CA: `-` to connect without TLS (to 127.0.0.1), or the CA's PEM file to connect over TLS
  to `localhost`, the server's certificate verified (sslmode=verify-full);
- EXPECT: `plain` (logged in without TLS), `tls` (logged in over TLS), or the SQLSTATE the
  refused login must carry (28P01). libpq's drivers give no SQLSTATE for a refused
  connection, so for them the message must be Postgres's for that code.
"""
import asyncio
import ssl
import sys

driver, port, user, password, ca, expect = sys.argv[1:7]
port = int(port)
host = "127.0.0.1" if ca == "-" else "localhost"
MESSAGES = {"28P01": f'password authentication failed for user "{user}"'}


def libpq_conninfo():
    tls = "sslmode=disable" if ca == "-" else f"sslmode=verify-full sslrootcert={ca}"
    return f"host={host} port={port} user={user} password={password} dbname=tidemark {tls}"


def with_psycopg():
    import psycopg

    try:
        with psycopg.connect(libpq_conninfo()) as conn:
            assert conn.execute("SELECT 41 + 1").fetchone()[0] == 42
            return "tls" if conn.pgconn.ssl_in_use else "plain"
    except psycopg.OperationalError as e:
        return refusal(str(e))


def with_psycopg2():
    import psycopg2

    try:
        conn = psycopg2.connect(libpq_conninfo())
    except psycopg2.OperationalError as e:
        return refusal(str(e))
    with conn.cursor() as cur:
        cur.execute("SELECT 41 + 1")
        assert cur.fetchone()[0] == 42
    got = "tls" if conn.info.ssl_in_use else "plain"
    conn.close()
    return got


def with_asyncpg():
    import asyncpg

    async def run():
        if ca == "-":
            context = False
        else:
            context = ssl.create_default_context(cafile=ca)
        try:
            conn = await asyncpg.connect(
                host=host, port=port, user=user, password=password,
                database="tidemark", ssl=context,
            )
        except asyncpg.PostgresError as e:
            return e.sqlstate
        assert await conn.fetchval("SELECT 41 + 1") == 42
        got = "plain" if conn._transport.get_extra_info("ssl_object") is None else "tls"
        await conn.close()
        return got

    return asyncio.run(run())


def refusal(message):
    """A libpq driver's refused login: the SQLSTATE whose message it carries."""
    for code, text in MESSAGES.items():
        if text in message:
            return code
    return message


got = {"psycopg": with_psycopg, "psycopg2": with_psycopg2, "asyncpg": with_asyncpg}[driver]()
assert got == expect, f"{driver}: expected {expect}, got {got}"
print(driver, "login", got)
