"""dbt's adapter for Tidemark: dbt-postgres's connection and SQL, plus Tidemark's streams,
sinks, MERGE sinks and materialized views as materializations."""

from dbt.adapters.base import AdapterPlugin

from dbt.adapters.tidemark.connections import TidemarkConnectionManager, TidemarkCredentials
from dbt.adapters.tidemark.impl import TidemarkAdapter
from dbt.adapters.tidemark.relation import TidemarkRelation
from dbt.include import tidemark

__all__ = [
    "Plugin",
    "TidemarkAdapter",
    "TidemarkConnectionManager",
    "TidemarkCredentials",
    "TidemarkRelation",
]

Plugin = AdapterPlugin(
    adapter=TidemarkAdapter,  # type: ignore[arg-type]
    credentials=TidemarkCredentials,
    include_path=tidemark.PACKAGE_PATH,
    dependencies=["postgres"],
)
