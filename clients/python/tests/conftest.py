"""Fixtures: one server for the session (the module by default;
`--edition functions` or REDIS_IDEM_EDITION=functions: a server without the
module, with functions/idem.lua loaded), a fresh key namespace per test."""

from __future__ import annotations

import os
import uuid

import pytest
import redis

from servers import Server


def pytest_addoption(parser):  # type: ignore[no-untyped-def]
    parser.addoption("--edition", default=os.environ.get("REDIS_IDEM_EDITION", "module"),
                     choices=["module", "functions"], help="which edition the session's server runs")
    parser.addoption("--run-long", action="store_true", default=os.environ.get("REDIS_IDEM_LONG") == "1",
                     help="also run the 30-second heartbeat test")
    parser.addoption("--run-failover", action="store_true", default=os.environ.get("REDIS_IDEM_FAILOVER") == "1",
                     help="also run the planned failover test (a 6-node cluster)")
    parser.addoption("--run-brokers", action="store_true", default=os.environ.get("REDIS_IDEM_BROKERS") == "1",
                     help="also run the broker adapters' tests against real brokers (tests/rabbitmq, tests/brokers: "
                          "brokers/launch.py, `make brokers` first; the adapters' extras installed)")


def pytest_ignore_collect(collection_path, config):  # type: ignore[no-untyped-def]
    """tests/brokers needs real brokers and the adapters' extras: only with --run-brokers."""
    return collection_path.name == "brokers" and not config.getoption("--run-brokers")


def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line("markers", "long: takes 30 s; runs with --run-long")
    config.addinivalue_line("markers", "failover: a 6-node cluster failed over; runs with --run-failover")
    config.addinivalue_line("markers", "module_only: needs the module's WAIT, BLOOM, batch or filters")
    config.addinivalue_line("markers", "brokers: starts a real broker; runs with --run-brokers")


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    if not config.getoption("--run-long"):
        skip = pytest.mark.skip(reason="30 s: run with --run-long (client.mk runs it on one server)")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip)
    if not config.getoption("--run-failover"):
        skip = pytest.mark.skip(reason="a 6-node cluster: run with --run-failover (client.mk runs it on one server)")
        for item in items:
            if "failover" in item.keywords:
                item.add_marker(skip)
    if not config.getoption("--run-brokers"):
        skip = pytest.mark.skip(reason="a RabbitMQ node: run with --run-brokers (client.mk runs it on two servers)")
        for item in items:
            if "brokers" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def edition(pytestconfig) -> str:  # type: ignore[no-untyped-def]
    return pytestconfig.getoption("--edition")


@pytest.fixture(scope="session")
def server(edition):  # type: ignore[no-untyped-def]
    s = Server(edition)
    yield s
    s.stop()


@pytest.fixture
def r(server) -> redis.Redis:  # type: ignore[no-untyped-def]
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def ns() -> str:
    """A key namespace of this test's own."""
    return f"t:{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def module(edition) -> bool:  # type: ignore[no-untyped-def]
    return edition == "module"
