"""dbt's adapter test suite (dbt-tests-adapter) against a real Tidemark server.

The server is the binary at $TIDEMARK_BIN (tests/it/dbt.rs passes cargo's), started on port
0 with a fresh data directory for the whole session; its port is read back from the line
it prints. Tidemark has one schema, `public`: every test class runs in it, and the suite's
`drop_schema` after each class drops every object there (the adapter's
`tidemark__drop_schema`).
"""

import os
import re
import subprocess
import tempfile
import time

import pytest

pytest_plugins = ["dbt.tests.fixtures.project"]


@pytest.fixture(scope="session")
def tidemark_port():
    binary = os.environ.get("TIDEMARK_BIN")
    if not binary:
        raise RuntimeError("TIDEMARK_BIN must name the tidemark binary")
    data = tempfile.mkdtemp(prefix="tidemark-dbt-")
    log = open(os.path.join(data, "server.log"), "w")
    server = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--http", "off", "--data-dir", data + "/data"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    deadline = time.monotonic() + 120
    port = None
    while port is None:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"tidemark exited before listening; see {log.name}")
        found = re.match(r"listening on .*:(\d+)$", line.strip())
        if found:
            port = int(found.group(1))
        if time.monotonic() > deadline:
            raise RuntimeError("tidemark did not start listening within 120 s")
    yield port
    server.terminate()
    server.wait(timeout=60)


@pytest.fixture(scope="class")
def dbt_profile_target(tidemark_port):
    return {
        "type": "tidemark",
        "host": "127.0.0.1",
        "port": tidemark_port,
        "user": "tidemark",
        "pass": "",
        "dbname": "tidemark",
        "threads": 1,
    }


@pytest.fixture(scope="class")
def unique_schema(request, prefix) -> str:
    # The only schema Tidemark has.
    return "public"
