"""Values in text format through the extended protocol (Parse/Bind/Execute with text
results, libpq's PQexecParams through psycopg's low-level connection), compared byte for
byte between Tidemark and PostgreSQL.

    python3 values_check.py TIDEMARK_DSN POSTGRES_DSN < queries (one per line)

Exits 1 and prints the differences when a value differs.
"""
import sys

import psycopg


def values(dsn, queries, setup):
    conn = psycopg.connect(dsn, autocommit=True)
    for s in setup:
        conn.execute(s)
    out = []
    for q in queries:
        # Extended protocol (even without parameters), results as text.
        res = conn.pgconn.exec_params(q.encode(), [], result_format=0)
        if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
            out.append("error: %s" % res.error_message.decode().strip())
            continue
        out.append([res.get_value(0, c) for c in range(res.nfields)])
    conn.close()
    return out


def main():
    tidemark, postgres = sys.argv[1], sys.argv[2]
    queries = [line.strip() for line in sys.stdin if line.strip()]
    ours = values(tidemark, queries, [])
    theirs = values(postgres, queries, ["SET TIME ZONE 'UTC'"])
    bad = [(q, t, o) for q, t, o in zip(queries, theirs, ours) if t != o]
    for q, t, o in bad:
        print("%s\n  postgres: %r\n  tidemark: %r" % (q, t, o))
    print("%d of %d values differ" % (len(bad), len(queries)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
