"""SQLAlchemy 2 (over psycopg 3) against a running tidemark: it connects (psycopg's type
lookup, savepoints), its inspector finds the materialized view `page_views` made by
tests/it/wire.rs apart from the tables, reflects the columns of the view and of the
stream `clicks` (names, types, nullability, no defaults: checked against the server's own
`information_schema.columns` and `pg_attribute`), and the view reads as a table. A table
it makes, with a two-column primary key, reflects with that key (as Postgres answers:
`<table>_pkey`, columns in key order, no other index or unique constraint).

Usage: python3 sqlalchemy_check.py PORT   (run by tests/it/wire.rs)
"""
import sys

from sqlalchemy import create_engine, inspect, text

port = sys.argv[1]
engine = create_engine(f"postgresql+psycopg://sa@127.0.0.1:{port}/sa")
insp = inspect(engine)
views = insp.get_materialized_view_names()
assert views == ["page_views"], views
assert "page_views" not in insp.get_table_names(), insp.get_table_names()
assert "clicks" in insp.get_table_names(), insp.get_table_names()
with engine.connect() as conn:
    rows = conn.execute(text("SELECT page, views FROM page_views")).all()
    assert [tuple(r) for r in rows] == [("/home", 1)], rows
    # The NULL defaults, identities and collations below are right only if the catalog
    # says no column has one.
    flags = conn.execute(text(
        "SELECT count(*) FROM pg_catalog.pg_attribute "
        "WHERE atthasdef OR attidentity <> '' OR attcollation <> 0")).scalar()
    assert flags == 0, flags
    # The types as the CREATE statements in tests/it/wire.rs declare them.
    declared = {
        "page_views": ["TEXT", "BIGINT"],
        "clicks": ["TEXT", "TEXT", "TIMESTAMP", "DOUBLE PRECISION"],
    }
    for table in ["page_views", "clicks"]:
        expected = conn.execute(text(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = :t ORDER BY ordinal_position"), {"t": table}).all()
        assert expected, table
        cols = insp.get_columns(table)
        got = [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in cols]
        assert [g[0] for g in got] == [e[0] for e in expected], (got, expected)
        assert [g[2] for g in got] == [e[2] == "YES" for e in expected], (got, expected)
        assert all(g[3] is None for g in got), got
        assert [g[1] for g in got] == declared[table], got
        print(table, got)
with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
    conn.execute(text("CREATE TABLE sa_keys (a BIGINT, b TEXT, c INT, PRIMARY KEY (c, a))"))
insp = inspect(engine)
pk = insp.get_pk_constraint("sa_keys")
assert (pk["name"], pk["constrained_columns"]) == ("sa_keys_pkey", ["c", "a"]), pk
assert insp.get_pk_constraint("clicks")["constrained_columns"] == [], "a stream has no key"
assert insp.get_indexes("sa_keys") == [], insp.get_indexes("sa_keys")
assert insp.get_unique_constraints("sa_keys") == []
assert insp.get_foreign_keys("sa_keys") == []
# The key's rows join the other catalogs as in Postgres: its schema, its table, its index.
with engine.connect() as conn:
    joined = conn.execute(text(
        "SELECT n.nspname, t.relname, i.indkey FROM pg_catalog.pg_constraint c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.connamespace "
        "JOIN pg_catalog.pg_class t ON t.oid = c.conrelid "
        "JOIN pg_catalog.pg_index i ON i.indexrelid = c.conindid "
        "WHERE c.conname = 'sa_keys_pkey'")).all()
    assert [tuple(r) for r in joined] == [("public", "sa_keys", "3 1")], joined
# reflect() takes the tables on the search path: not `tidemark.options`.
from sqlalchemy import MetaData

reflected = MetaData()
reflected.reflect(engine)
assert "sa_keys" in reflected.tables and "options" not in reflected.tables, sorted(reflected.tables)
assert reflected.tables["sa_keys"].primary_key.columns.keys() == ["c", "a"]
print("sqlalchemy ok")
