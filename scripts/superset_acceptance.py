"""Apache Superset against a running Tidemark: connect, sync the schema, run a chart query.

Not part of CI (Superset is a large install, and pins its own SQLAlchemy): run it by hand
in a virtualenv of its own, against a Tidemark server started as the README says.

    python3 -m venv /tmp/superset-venv
    # Superset 6.1's wheel misses rich and cachetools, and breaks with flask-caching 2.5.
    /tmp/superset-venv/bin/pip install apache-superset psycopg2-binary \
        rich cachetools 'flask-caching==2.3.0'
    cargo run --release            # in another terminal: Tidemark on 127.0.0.1:5433
    /tmp/superset-venv/bin/python scripts/superset_acceptance.py --port 5433

It makes a table `superset_orders` in Tidemark (over psycopg2, as Superset connects), then
drives Superset's own code as its UI does when a user adds the database, adds a dataset and
opens a chart: the connection test, the schema and table lists, the dataset's column sync
(SQLAlchemy's inspector), a grouped `COUNT(*)`/`SUM` chart query with a filter, and the
SQL Lab cost estimate (`EXPLAIN`). Every answer is checked against the rows inserted; it
exits non-zero at the first difference.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROWS = [
    (1, "eu", 10.0),
    (2, "eu", 5.5),
    (3, "us", 7.0),
    (4, "apac", 1.25),
    (5, "us", 3.0),
]


def check(what, ok, detail=""):
    print(("ok  " if ok else "FAIL") + f" {what} {detail}".rstrip())
    if not ok:
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5433)
    parser.add_argument("--user", default="tidemark")
    parser.add_argument("--password", default="")
    parser.add_argument("--database", default="tidemark")
    args = parser.parse_args()
    auth = args.user + (f":{args.password}" if args.password else "")
    uri = f"postgresql+psycopg2://{auth}@{args.host}:{args.port}/{args.database}"

    import psycopg2

    conn = psycopg2.connect(
        host=args.host, port=args.port, user=args.user,
        password=args.password or None, dbname=args.database,
    )
    conn.autocommit = True
    with conn.cursor() as cur:
        # PURGE: a plain DROP TABLE keeps the Delta table, which CREATE TABLE would register
        # again with its rows (docs/sql.md, "Tables").
        cur.execute("DROP TABLE IF EXISTS superset_orders PURGE")
        cur.execute(
            "CREATE TABLE superset_orders (id BIGINT PRIMARY KEY, region TEXT, "
            "amount DOUBLE PRECISION)"
        )
        cur.executemany("INSERT INTO superset_orders VALUES (%s, %s, %s)", ROWS)
    conn.close()

    # Superset's own metadata database and settings, in a directory of their own.
    home = tempfile.mkdtemp(prefix="superset-")
    config = os.path.join(home, "superset_config.py")
    with open(config, "w") as f:
        f.write(
            f"SECRET_KEY = 'tidemark-acceptance-{os.getpid()}'\n"
            f"SQLALCHEMY_DATABASE_URI = 'sqlite:///{home}/superset.db'\n"
            "WTF_CSRF_ENABLED = False\n"
        )
    os.environ["SUPERSET_CONFIG_PATH"] = config
    os.environ["SUPERSET_HOME"] = home
    superset = os.path.join(os.path.dirname(sys.executable), "superset")
    subprocess.run([superset, "db", "upgrade"], check=True, capture_output=True)

    from superset.app import create_app

    app = create_app()
    with app.app_context():
        from superset import db
        from superset.connectors.sqla.models import SqlaTable
        from superset.models.core import Database

        database = Database(database_name="tidemark", sqlalchemy_uri=uri)
        db.session.add(database)
        db.session.commit()

        # "Test connection".
        with database.get_sqla_engine() as engine:
            with engine.connect() as c:
                version = c.exec_driver_sql("SELECT version()").scalar()
        check("connection", "PostgreSQL" in version, version)

        # The schema and table lists of "add dataset".
        schemas = database.get_all_schema_names()
        check("schemas", "public" in schemas, sorted(schemas))
        tables = {t[0] for t in database.get_all_table_names_in_schema(None, "public")}
        check("tables", "superset_orders" in tables, sorted(tables))

        # The dataset: its columns and types synced from the inspector.
        table = SqlaTable(table_name="superset_orders", schema="public", database=database)
        db.session.add(table)
        table.fetch_metadata()
        db.session.commit()
        types = {c.column_name: str(c.type).upper() for c in table.columns}
        check(
            "dataset columns",
            set(types) == {"id", "region", "amount"}
            and types["id"] == "BIGINT"
            and "DOUBLE" in types["amount"]
            and types["region"] in ("TEXT", "VARCHAR"),
            types,
        )

        # A bar chart: rows and total amount by region, amount > 2, largest first.
        query_obj = {
            "granularity": None,
            "from_dttm": None,
            "to_dttm": None,
            "is_timeseries": False,
            "columns": ["region"],
            "groupby": ["region"],
            "metrics": [
                {"expressionType": "SQL", "sqlExpression": "COUNT(*)", "label": "n"},
                {"expressionType": "SQL", "sqlExpression": "SUM(amount)", "label": "total"},
            ],
            "filter": [{"col": "amount", "op": ">", "val": 2}],
            "extras": {},
            "row_limit": 100,
            "orderby": [({"expressionType": "SQL", "sqlExpression": "SUM(amount)", "label": "total"}, False)],
        }
        result = table.query(query_obj)
        check("chart query ran", result.status == "success", result.error_message or "")
        got = sorted((r["region"], int(r["n"]), float(r["total"])) for _, r in result.df.iterrows())
        expected = {}
        for _, region, amount in ROWS:
            if amount > 2:
                n, total = expected.get(region, (0, 0.0))
                expected[region] = (n + 1, total + amount)
        want = sorted((k, n, t) for k, (n, t) in expected.items())
        check("chart rows", got == want, f"got {got}, want {want}")
        print(result.query)

        # SQL Lab's cost estimate: EXPLAIN, its first line's cost=.
        with database.get_raw_connection() as raw:
            cursor = raw.cursor()
            cost = database.db_engine_spec.estimate_statement_cost(
                database, "SELECT * FROM superset_orders WHERE amount > 2", cursor
            )
        check(
            "cost estimate",
            "Start-up cost" in cost and "Total cost" in cost,
            cost,
        )
    print("Superset acceptance: all checks passed")


if __name__ == "__main__":
    main()
