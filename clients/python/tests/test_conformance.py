"""Every case of clients/conformance/cases.json that applies to the
session's edition, on a standalone server and (the module) a 3-node
cluster. Nothing is skipped: this library has the middleware and the runner
has the proxy; cases of the other edition are not collected."""

from __future__ import annotations

import pytest
import redis

from conformance import Runner, load_cases
from servers import Cluster

CASES = load_cases()


def pytest_generate_tests(metafunc):  # type: ignore[no-untyped-def]
    if "case" in metafunc.fixturenames:
        edition = metafunc.config.getoption("--edition")
        cases = [c for c in CASES if edition in c["editions"]]
        metafunc.parametrize("case", cases, ids=[c["id"] for c in cases])


@pytest.fixture(scope="session")
def conformance_cluster():  # type: ignore[no-untyped-def]
    cluster = Cluster("module")
    yield cluster
    cluster.stop()


def test_case(case, server, edition, request):  # type: ignore[no-untyped-def]
    module = edition == "module"
    if case["topology"] == "cluster":
        cluster = request.getfixturevalue("conformance_cluster")
        raw = redis.RedisCluster(host="127.0.0.1", port=cluster.port)
        primaries = [n.client() for n in cluster.nodes]
        runner = Runner(case, lambda port: redis.RedisCluster(host="127.0.0.1", port=port), raw, primaries,
                        cluster.port, module)
    else:
        raw = server.client()
        runner = Runner(case, lambda port: redis.Redis(host="127.0.0.1", port=port), raw, [raw], server.port, module)
    try:
        runner.run()
    finally:
        raw.close()
