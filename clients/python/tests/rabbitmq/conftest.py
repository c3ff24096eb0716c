"""A RabbitMQ node of the session's own for the RabbitMQ and Celery tests
(every test module here is marked `brokers`: run with --run-brokers)."""

from __future__ import annotations

import uuid

import pytest
from rabbit import REPO, Broker


@pytest.fixture(scope="session")
def rabbitmq():  # type: ignore[no-untyped-def]
    broker = Broker(REPO / "target" / "client-python-rabbitmq" / uuid.uuid4().hex[:8])
    yield broker
    broker.stop()


@pytest.fixture
def queue(rabbitmq, ns) -> str:  # type: ignore[no-untyped-def]
    name = f"q-{ns.strip(':').replace(':', '-')}"
    rabbitmq.source(name)
    return name
