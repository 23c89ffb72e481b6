"""asyncpg against a table stream: copy_records_to_table (binary COPY, after preparing
`SELECT cols FROM table LIMIT 1` to learn the column types) and executemany. Every type a
stream column can have in binary COPY, NULLs included; the rows read back must be the
rows sent. Usage: asyncpg_ingest.py PORT"""
import asyncio
import datetime
import decimal
import sys

import asyncpg

port = int(sys.argv[1])


async def main():
    conn = await asyncpg.connect(host="127.0.0.1", port=port, user="tidemark",
                                 database="tidemark")
    await conn.execute(
        "CREATE STREAM typed (i2 SMALLINT, i4 INTEGER, i8 BIGINT NOT NULL, f4 REAL, "
        "f8 DOUBLE PRECISION, b BOOLEAN, t TEXT, d DATE, ts TIMESTAMP, tz TIMESTAMPTZ, "
        "n NUMERIC(12, 3))")
    utc = datetime.timezone.utc
    rows = []
    for i in range(5000):
        rows.append((
            i % 30000 - 15000, i * 7 - 20000, i * 1_000_000_007, i / 4.0, i / 3.0,
            i % 2 == 0, f"row {i} é",
            datetime.date(2026, 6, 10) + datetime.timedelta(days=i % 400 - 200),
            datetime.datetime(2026, 6, 10, 10, 0, 0) + datetime.timedelta(microseconds=i * 12_345_678),
            datetime.datetime(2026, 6, 10, 10, 0, 0, tzinfo=utc) + datetime.timedelta(seconds=i),
            decimal.Decimal(i * 1001 - 2_000_000) / 1000,
        ))
    rows.append((None, None, -1, None, None, None, None, None, None, None, None))
    status = await conn.copy_records_to_table("typed", records=rows)
    assert status == f"COPY {len(rows)}", status
    # A column list, as copy_records_to_table sends it.
    status = await conn.copy_records_to_table("typed", records=[(7, 8)], columns=["i8", "i4"])
    assert status == "COPY 1", status
    # A NULL into the NOT NULL column rejects the whole COPY.
    try:
        await conn.copy_records_to_table("typed", records=[(1,), (None,)], columns=["i8"])
        raise AssertionError("a NULL in a NOT NULL column was accepted")
    except asyncpg.PostgresError as e:
        assert e.sqlstate == "23502", (e.sqlstate, str(e))
    await conn.executemany("INSERT INTO typed (i8, t) VALUES ($1, $2)",
                           [(100_000 + i, f"many {i}") for i in range(50)])

    got = await conn.fetch("SELECT i2, i4, i8, f4, f8, b, t, d, ts, tz, n FROM typed "
                           "WHERE i8 <> 7 AND (t IS NULL OR t NOT LIKE 'many %') ORDER BY i8")
    want = sorted(rows, key=lambda r: r[2])
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        assert tuple(g) == w, (tuple(g), w)
    (n,) = await conn.fetchrow("SELECT count(*) FROM typed")
    assert n == len(rows) + 1 + 50, n
    (t,) = await conn.fetchrow("SELECT i4 FROM typed WHERE i8 = 7")
    assert t == 8, t
    await conn.close()
    print("asyncpg ingest ok")


asyncio.run(main())
