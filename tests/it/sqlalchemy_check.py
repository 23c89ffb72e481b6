"""SQLAlchemy 2 (over psycopg 3) against a running tidemark: it connects (psycopg's type
lookup, savepoints), its inspector finds the materialized view `page_views` made by
tests/it/wire.rs apart from the tables, and the view reads as a table.

Not yet: `get_columns` (its query has correlated scalar subqueries inside CASE, which
DataFusion does not plan).

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
print("sqlalchemy ok")
