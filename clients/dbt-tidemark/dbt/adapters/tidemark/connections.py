from dataclasses import dataclass

from dbt.adapters.postgres.connections import PostgresConnectionManager, PostgresCredentials


@dataclass
class TidemarkCredentials(PostgresCredentials):
    """The profile of dbt-postgres (host, port, user, password, dbname, schema, sslmode and
    the rest) under `type: tidemark`."""

    @property
    def type(self):
        return "tidemark"


class TidemarkConnectionManager(PostgresConnectionManager):
    TYPE = "tidemark"
