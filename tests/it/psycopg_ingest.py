"""psycopg 3 against a table stream: executemany (pipelined extended-protocol INSERTs)
and cursor.copy (COPY FROM STDIN, rows written one by one). Usage: psycopg_ingest.py PORT"""
import datetime
import sys

import psycopg

port = int(sys.argv[1])
ts = datetime.datetime(2026, 6, 10, 10, 0, 0)
with psycopg.connect(f"host=127.0.0.1 port={port} user=tidemark dbname=tidemark",
                     autocommit=True) as conn:
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO events VALUES (%s, %s, %s)",
                        [(i, ts, i * 0.5) for i in range(1000, 1100)])
        with cur.copy("COPY events (id, ts, v) FROM STDIN") as copy:
            for i in range(2000, 2300):
                copy.write_row((i, ts, None))
        cur.execute("SELECT count(*) FROM events WHERE id >= 1000")
        (n,) = cur.fetchone()
        assert n == 400, n
print("psycopg ingest ok")
