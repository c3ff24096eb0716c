"""Every case of clients/conformance/cases.json that applies to the
session's edition, on a standalone server and (the module) a 3-node
cluster, with Idem and with AsyncIdem (the middleware cases once: the
middleware is asyncio). Nothing is skipped: this library has the
middleware and the runner has the proxy; cases of the other edition are
not collected."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from conformance import Runner, load_cases
from servers import Cluster

CASES = load_cases()


def pytest_generate_tests(metafunc):  # type: ignore[no-untyped-def]
    if "case" in metafunc.fixturenames:
        edition = metafunc.config.getoption("--edition")
        runs = [(c, flavour) for c in CASES if edition in c["editions"]
                for flavour in (["sync"] if "middleware" in c["needs"] else ["sync", "async"])]
        metafunc.parametrize("case,flavour", runs, ids=[f"{c['id']}-{f}" for c, f in runs])


@pytest.fixture(scope="session")
def conformance_cluster():  # type: ignore[no-untyped-def]
    cluster = Cluster("module")
    yield cluster
    cluster.stop()


def test_case(case, flavour, server, edition, request):  # type: ignore[no-untyped-def]
    module, asynchronous = edition == "module", flavour == "async"
    if case["topology"] == "cluster":
        cluster = request.getfixturevalue("conformance_cluster")
        raw = redis.RedisCluster(host="127.0.0.1", port=cluster.port)
        primaries = [n.client() for n in cluster.nodes]
        kind = redis.asyncio.RedisCluster if asynchronous else redis.RedisCluster
        runner = Runner(case, lambda port: kind(host="127.0.0.1", port=port), raw, primaries, cluster.port, module,
                        asynchronous)
    else:
        raw = server.client()
        kind = redis.asyncio.Redis if asynchronous else redis.Redis
        runner = Runner(case, lambda port: kind(host="127.0.0.1", port=port), raw, [raw], server.port, module,
                        asynchronous)
    try:
        runner.run()
    finally:
        raw.close()
