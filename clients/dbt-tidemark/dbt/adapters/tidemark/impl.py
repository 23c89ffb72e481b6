from dbt.adapters.postgres.impl import PostgresAdapter

from dbt.adapters.tidemark.connections import TidemarkConnectionManager
from dbt.adapters.tidemark.relation import TidemarkRelation


class TidemarkAdapter(PostgresAdapter):
    Relation = TidemarkRelation  # type: ignore[assignment]
    ConnectionManager = TidemarkConnectionManager

    @classmethod
    def type(cls) -> str:
        return "tidemark"
