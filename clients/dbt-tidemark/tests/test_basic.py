"""dbt-tests-adapter's basic suites, as dbt Labs wrote them. A suite that cannot pass on
Tidemark yet is skipped here with the reason; none is left out silently."""

import pytest

from dbt.tests.adapter.basic import expected_catalog

from dbt.tests.adapter.basic.test_adapter_methods import BaseAdapterMethod
from dbt.tests.adapter.basic.test_base import BaseSimpleMaterializations
from dbt.tests.adapter.basic.test_empty import BaseEmpty
from dbt.tests.adapter.basic.test_ephemeral import BaseEphemeral
from dbt.tests.adapter.basic.test_generic_tests import BaseGenericTests
from dbt.tests.adapter.basic.test_singular_tests import BaseSingularTests
from dbt.tests.adapter.basic.test_singular_tests_ephemeral import BaseSingularTestsEphemeral
from dbt.tests.adapter.basic.test_validate_connection import BaseValidateConnection
from dbt.tests.adapter.basic.test_docs_generate import BaseDocsGenerate


class TestSimpleMaterializationsTidemark(BaseSimpleMaterializations):
    pass


class TestSingularTestsTidemark(BaseSingularTests):
    pass


class TestSingularTestsEphemeralTidemark(BaseSingularTestsEphemeral):
    pass


class TestEmptyTidemark(BaseEmpty):
    pass


class TestEphemeralTidemark(BaseEphemeral):
    pass


class TestGenericTestsTidemark(BaseGenericTests):
    pass


class TestAdapterMethodsTidemark(BaseAdapterMethod):
    pass


class TestValidateConnectionTidemark(BaseValidateConnection):
    pass


# Tidemark has no object ownership yet: every relation is owned by the bootstrap superuser
# `postgres` (`pg_class.relowner` is 10 for all), whoever made it. dbt's expected catalog
# names the profile's user as the owner; here it names `postgres`, the one difference.
OWNER = "postgres"

# The types and relation kinds Tidemark's catalog gives, for both expected catalogs.
CATALOG_TYPES = dict(
    role=OWNER,
    id_type="integer",
    text_type="text",
    time_type="timestamp without time zone",
    view_type="VIEW",
    table_type="BASE TABLE",
    model_stats=expected_catalog.no_stats(),
)


class TestDocsGenerateTidemark(BaseDocsGenerate):
    @pytest.fixture(scope="class")
    def expected_catalog(self, project):
        return expected_catalog.base_expected_catalog(project, **CATALOG_TYPES)


from dbt.tests.adapter.basic.test_docs_generate import BaseDocsGenReferences  # noqa: E402
from dbt.tests.adapter.basic.test_incremental import BaseIncremental  # noqa: E402
from dbt.tests.adapter.basic.test_snapshot_check_cols import BaseSnapshotCheckCols  # noqa: E402
from dbt.tests.adapter.basic.test_snapshot_timestamp import BaseSnapshotTimestamp  # noqa: E402
from dbt.tests.adapter.basic.test_table_materialization import (  # noqa: E402
    BaseTableMaterialization,
)
from dbt.tests.adapter.dbt_debug.test_dbt_debug import BaseDebugPostgres  # noqa: E402


class TestDocsGenReferencesTidemark(BaseDocsGenReferences):
    @pytest.fixture(scope="class")
    def expected_catalog(self, project):
        return expected_catalog.expected_references_catalog(
            project, bigint_type="bigint", **CATALOG_TYPES
        )


class TestTableMaterializationTidemark(BaseTableMaterialization):
    pass


class TestDebugTidemark(BaseDebugPostgres):
    pass


class TestIncrementalTidemark(BaseIncremental):
    pass


class TestSnapshotCheckColsTidemark(BaseSnapshotCheckCols):
    pass


class TestSnapshotTimestampTidemark(BaseSnapshotTimestamp):
    pass
