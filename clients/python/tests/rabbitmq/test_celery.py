"""redis_idem.celery against a real RabbitMQ and real Celery workers
(tests/rabbitmq/celery_app.py, prefork and threads pools): what
brokers/scenario.py cannot see (the result backend of a re-sent task, a
Busy retry's delay, the dead letter's state, a pool child killed alone,
the threads pool, an async body)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

import redis_idem as ri
from rabbit import eventually

pytestmark = pytest.mark.brokers
HERE = Path(__file__).resolve().parent


class Worker:
    """`celery -A celery_app worker` with `pool`, on a queue and a key
    prefix of its own; `send(task, order)` sends a task to it."""

    def __init__(self, rabbitmq: Any, server: Any, pool: str, concurrency: int):
        from celery import Celery
        from kombu import Exchange, Queue

        tag = uuid.uuid4().hex[:8]
        self.rabbitmq, self.prefix, self.queue = rabbitmq, f"celery-{tag}:", f"celery-{tag}"
        rabbitmq.source(self.queue, quorum=False)  # Celery's classic queue, with its dead-letter exchange
        env = dict(os.environ, CELERY_TEST_BROKER=rabbitmq.url, CELERY_TEST_REDIS=server.url,
                   CELERY_TEST_PREFIX=self.prefix, CELERY_TEST_QUEUE=self.queue)
        self.log = Path(rabbitmq.dir) / f"worker-{pool}-{tag}.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_app", "worker", f"--pool={pool}",
             f"--concurrency={concurrency}", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel=INFO", f"--hostname={tag}@%h"],
            cwd=HERE, env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.app = Celery("idem-test-client", broker=rabbitmq.url, backend=server.url)
        self.app.conf.task_queues = [Queue(self.queue, Exchange(self.queue), routing_key=self.queue,
                                           queue_arguments={"x-dead-letter-exchange": f"{self.queue}.dlx"})]
        self.redis = server.client()
        eventually(lambda: b"ready." in self.log.read_bytes() or self.process.poll() is not None, 60,
                   "the worker to start")
        assert self.process.poll() is None, self.log.read_text()[-3000:]

    def send(self, task: str, order: dict) -> Any:
        return self.app.send_task(task, args=[order], queue=self.queue, routing_key=self.queue,
                                  task_id=str(uuid.uuid4()))

    def effects(self, key: str) -> list:
        return [int(a) for a in self.redis.lrange(f"{self.prefix}effects:{key}", 0, -1)]

    def started(self, key: str) -> list:
        return [int(p) for p in self.redis.lrange(f"{self.prefix}started:{key}", 0, -1)]

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.app.close()


@pytest.fixture(scope="module")
def prefork(rabbitmq, server) -> Iterator[Worker]:  # type: ignore[no-untyped-def]
    worker = Worker(rabbitmq, server, "prefork", 2)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def threads(rabbitmq, server) -> Iterator[Worker]:  # type: ignore[no-untyped-def]
    worker = Worker(rabbitmq, server, "threads", 4)
    yield worker
    worker.stop()


def test_a_re_sent_task_gets_the_stored_result_in_the_result_backend(prefork):  # type: ignore[no-untyped-def]
    first = prefork.send("t.record", {"id": "order-1", "n": 5})
    assert first.get(timeout=30) == {"id": "order-1", "n": 5}
    again = prefork.send("t.record", {"id": "order-1", "n": 5})  # a producer's retry: a new task id
    assert again.id != first.id and again.get(timeout=30) == {"id": "order-1", "n": 5}
    assert prefork.effects("order-1") == [1] and len(prefork.started("order-1")) == 1


def test_busy_is_a_retry_after_the_holders_lease_left(prefork, server):  # type: ignore[no-untyped-def]
    commands = ri.IdemCommands(server.client(), prefix=prefork.prefix)
    holder = commands.claim("order-2", 4, owner="elsewhere:1")
    sent = time.monotonic()
    result = prefork.send("t.record_nowait", {"id": "order-2"})
    eventually(lambda: result.state == "RETRY", what="the task retried")
    commands.done("order-2", holder.token, result=json.dumps({"from": "holder"}).encode())
    assert result.get(timeout=30) == {"from": "holder"}  # the replay, once the countdown was over
    assert time.monotonic() - sent >= 3.5 and prefork.started("order-2") == []


def test_a_failure_is_retried_and_runs_again(prefork):  # type: ignore[no-untyped-def]
    result = prefork.send("t.record", {"id": "order-3", "fail": 1})
    assert result.get(timeout=30) == {"id": "order-3", "n": None}
    assert prefork.effects("order-3") == [2] and len(prefork.started("order-3")) == 2


def test_exhausted_is_rejected_to_the_dead_letter(prefork, rabbitmq):  # type: ignore[no-untyped-def]
    result = prefork.send("t.always_fails", {"id": "poison"})  # max_retries=1: max_tries 2
    eventually(lambda: result.state == "FAILURE", what="the task failed")
    [(props, body)] = eventually(lambda: rabbitmq.take(f"{prefork.queue}.dlq"), what="the dead letter")
    death = props.headers["x-death"][0]
    assert (death["queue"], death["reason"]) == (prefork.queue, "rejected")
    assert json.loads(body)[0] == [{"id": "poison"}] and len(prefork.started("poison")) == 2


def test_a_task_without_a_key_is_rejected_and_never_run(prefork, rabbitmq):  # type: ignore[no-untyped-def]
    prefork.send("t.keyless", {"id": "order-4"})
    [(_, body)] = eventually(lambda: rabbitmq.take(f"{prefork.queue}.dlq"), what="the dead letter")
    assert json.loads(body)[0] == [{"id": "order-4"}] and prefork.started("order-4") == []


def test_a_pool_child_killed_mid_task_gives_the_task_back_and_the_effect_is_once(prefork):  # type: ignore[no-untyped-def]
    result = prefork.send("t.record", {"id": "order-5", "sleep": 3})
    [child] = eventually(lambda: prefork.started("order-5"), what="the task at work")
    os.kill(child, signal.SIGKILL)  # the child alone: WorkerLostError, reject_on_worker_lost requeues it
    assert result.get(timeout=60) == {"id": "order-5", "n": None}
    assert prefork.effects("order-5") == [2] and len(prefork.started("order-5")) == 2


def test_the_threads_pool_runs_each_key_once(threads):  # type: ignore[no-untyped-def]
    results = [threads.send("t.record", {"id": f"order-6-{i % 10}", "sleep": 0.2}) for i in range(20)]
    assert [r.get(timeout=60) for r in results] == [{"id": f"order-6-{i % 10}", "n": None} for i in range(20)]
    assert all(threads.effects(f"order-6-{i}") == [1] for i in range(10))


def test_an_async_body_runs_to_its_end_once(threads):  # type: ignore[no-untyped-def]
    results = [threads.send("t.arecord", {"id": "order-7"}) for _ in range(3)]
    assert [r.get(timeout=30) for r in results] == [{"id": "order-7", "async": True}] * 3
    assert threads.effects("order-7") == [1]


def test_the_counters_count_each_outcome_once(threads, rabbitmq):  # type: ignore[no-untyped-def]
    def counters() -> dict:
        return threads.send("t.stats", {}).get(timeout=30)

    before = counters()
    assert [threads.send("t.record", {"id": "order-8"}).get(timeout=30) for _ in range(3)] == [
        {"id": "order-8", "n": None}] * 3
    threads.send("t.keyless", {"id": "order-9"})
    eventually(lambda: rabbitmq.take(f"{threads.queue}.dlq"), what="the dead letter")
    after = eventually(lambda: (c := counters())["dead_lettered"] > before["dead_lettered"] and c,
                       what="the dead letter counted")
    delta = {name: after[name] - before[name] for name in ("acknowledged", "held_back", "dead_lettered",
                                                           "first_runs", "replays")}
    assert delta == {"acknowledged": 3, "held_back": 0, "dead_lettered": 1, "first_runs": 1, "replays": 2}
