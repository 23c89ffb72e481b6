from dataclasses import dataclass

from dbt.adapters.events.logging import AdapterLogger
from dbt.adapters.postgres.connections import PostgresConnectionManager, PostgresCredentials

logger = AdapterLogger("Tidemark")


@dataclass
class TidemarkCredentials(PostgresCredentials):
    """The profile of dbt-postgres (host, port, user, password, dbname, schema, sslmode and
    the rest) under `type: tidemark`."""

    @property
    def type(self):
        return "tidemark"


class TidemarkConnectionManager(PostgresConnectionManager):
    TYPE = "tidemark"

    def add_query(self, sql, auto_begin=True, bindings=None, abridge_sql_log=False, *args, **kwargs):
        """Runs the statement as dbt-postgres does, then logs the server's NOTICEs: what a
        `CREATE OR REPLACE SINK | MATERIALIZED VIEW` did (kept the running query, altered
        its options in place, or replaced its query over the checkpoint)."""
        connection, cursor = super().add_query(
            sql, auto_begin, bindings, abridge_sql_log, *args, **kwargs
        )
        notices = getattr(connection.handle, "notices", None)
        if notices:
            for notice in notices:
                logger.info(notice.strip())
            del notices[:]
        return connection, cursor
