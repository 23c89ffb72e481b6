"""pgcli against Tidemark: the catalog queries pgcli runs on connect to build its
completions (its own PGExecute), and a statement run by `pgcli -f`. Run by
tests/it/clients.rs as `python3 pgcli_check.py PORT` after it made `orders` (a table),
`clicks` (a table stream) and `per_user` (a materialized view)."""
import os
import subprocess
import sys
import tempfile

from pgcli.pgexecute import PGExecute

port = sys.argv[1]
e = PGExecute("shop", "tidemark", None, "127.0.0.1", port, None)

assert "public" in list(e.schemata())
tables = [t for t in e.tables() if t[0] == "public"]
assert tables == [("public", "clicks"), ("public", "orders")], tables
views = [v for v in e.views() if v[0] == "public"]
assert views == [("public", "per_user")], views
columns = [c[:4] for c in e.table_columns() if c[0] == "public"]
assert columns == [
    ("public", "clicks", "user_id", "text"),
    ("public", "clicks", "event_time", "timestamp without time zone"),
    ("public", "orders", "id", "bigint"),
    ("public", "orders", "amount", "double precision"),
    ("public", "orders", "note", "text"),
], columns
view_columns = [c[:4] for c in e.view_columns() if c[0] == "public"]
assert view_columns == [
    ("public", "per_user", "user_id", "text"),
    ("public", "per_user", "n", "bigint"),
], view_columns
assert "shop" in list(e.databases())
assert list(e.search_path())[0] == "public"
# Functions, with their argument types by name (pg_proc's oid lists through regtype[]).
functions = list(e.functions())
abs_types = sorted(tuple(f.arg_types) for f in functions if f.func_name == "abs")
assert ("double precision",) in abs_types, abs_types
assert list(e.datatypes()) == []  # no user-defined types, as in a fresh Postgres database

# pgcli itself, non-interactively.
with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
    f.write("SELECT sum(amount) AS total FROM orders;\n")
out = subprocess.run(
    ["pgcli", "--less-chatty", "-h", "127.0.0.1", "-p", port, "-U", "tidemark", "-d", "shop", "-f", f.name],
    capture_output=True,
    text=True,
    timeout=120,
    env={**os.environ, "PGCLI_CONFIG_DIR": tempfile.mkdtemp()},
)
os.unlink(f.name)
assert out.returncode == 0, out.stderr
assert "29.5" in out.stdout and "total" in out.stdout, out.stdout + out.stderr
print("pgcli ok")
