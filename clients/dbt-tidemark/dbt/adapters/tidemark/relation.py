from dataclasses import dataclass, field
from typing import Optional, Type

from dbt.adapters.contracts.relation import Policy
from dbt.adapters.postgres.relation import PostgresRelation
from dbt.adapters.utils import classproperty
from dbt_common.dataclass_schema import StrEnum


class TidemarkRelationType(StrEnum):
    """dbt's relation types plus Tidemark's streaming objects."""

    Table = "table"
    View = "view"
    CTE = "cte"
    MaterializedView = "materialized_view"
    External = "external"
    Ephemeral = "ephemeral"
    Stream = "stream"
    Sink = "sink"


@dataclass(frozen=True, eq=False, repr=False)
class TidemarkRelation(PostgresRelation):
    type: Optional[TidemarkRelationType] = None  # type: ignore[assignment]
    # `schema.name`: DataFusion resolves `public.t` but not `"db"."public"."t"` in queries
    # yet (Tidemark's own statements take both).
    include_policy: Policy = field(default_factory=lambda: Policy(database=False))

    @classproperty
    def get_relation_type(cls) -> Type[TidemarkRelationType]:
        return TidemarkRelationType

    @property
    def is_stream(self) -> bool:
        return self.type == TidemarkRelationType.Stream

    @property
    def is_sink(self) -> bool:
        return self.type == TidemarkRelationType.Sink
