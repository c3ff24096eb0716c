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
from servers import Cluster, Replicated, Sentineled

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


@pytest.fixture(scope="session")
def replicated(edition):  # type: ignore[no-untyped-def]
    pair = Replicated(edition)
    yield pair
    pair.stop()


def test_case(case, flavour, server, edition, request):  # type: ignore[no-untyped-def]
    module, asynchronous = edition == "module", flavour == "async"
    if case["topology"] == "sentinel":
        return run_sentinel_case(case, edition, asynchronous)
    if case["topology"] == "replicated":
        pair = request.getfixturevalue("replicated")
        raw = pair.primary.client()
        kind = redis.asyncio.Redis if asynchronous else redis.Redis
        runner = Runner(case, lambda port: kind(host="127.0.0.1", port=port), raw, [raw], pair.port, module,
                        asynchronous, topology=pair)
    elif case["topology"] == "cluster":
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


def run_sentinel_case(case, edition, asynchronous):  # type: ignore[no-untyped-def]
    """A fresh primary, replica and Sentinel (the case fails them over);
    the library's client and the runner's own both from redis-py's
    Sentinel support, so both follow the primary."""
    import redis.asyncio.sentinel
    import redis.sentinel

    topology = Sentineled(edition)
    raw = redis.sentinel.Sentinel(topology.sentinels, socket_timeout=5).master_for(Sentineled.NAME)
    try:
        if asynchronous:
            factory = lambda port: redis.asyncio.sentinel.Sentinel(  # noqa: E731
                topology.sentinels, socket_timeout=5).master_for(Sentineled.NAME)
        else:
            factory = lambda port: redis.sentinel.Sentinel(  # noqa: E731
                topology.sentinels, socket_timeout=5).master_for(Sentineled.NAME)
        Runner(case, factory, raw, [], topology.primary().port, edition == "module", asynchronous,
               topology=topology).run()
    finally:
        raw.close()
        topology.stop()
