"""Through a real Sentinel failover with work in flight: a primary, its
replica and a Sentinel (`redis-server --sentinel`); 4 worker threads with
Idem and 4 asyncio tasks with AsyncIdem on redis-py's Sentinel clients
(`master_for`) take keys each delivered twice at once (the duplicate
waits: IDEM.CLAIM ... WAIT on the module, polling on the Functions
edition), while SENTINEL FAILOVER moves the primary and back. Claims
answered READONLY or UNBLOCKED, or lost with their connection, are sent
again to the new primary. A forced Sentinel failover loses the writes the
old primary took after its replica was promoted, so the workers run with
`durable` (WAIT 1): a NotDurableError is not acknowledged and the message
is delivered again, as a consumer would. Every record ends done on the
final primary, no other error reaches a caller, and a work runs twice
only where its DONE was reported NotDurable (its record may be gone)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import Counter
from typing import List

import pytest
import redis.asyncio.sentinel
import redis.sentinel

import redis_idem as ri
from redis_idem import RecordState
from servers import Sentineled

THREADS = 4
TASKS = 4
MIN_KEYS = 150
WORK_SECONDS = 0.05


@pytest.fixture
def topology(edition):  # type: ignore[no-untyped-def]
    t = Sentineled(edition)
    yield t
    t.stop()


def test_a_sentinel_failover_with_work_in_flight(topology, ns):  # type: ignore[no-untyped-def]
    runs: Counter = Counter()
    lock = threading.Lock()
    errors: List[str] = []
    deliveries: "queue.Queue" = queue.Queue()
    sentinel = redis.sentinel.Sentinel(topology.sentinels, socket_timeout=5)
    durable = ri.Durable(replicas=1, timeout=1.0)
    idems = [ri.Idem(sentinel.master_for(Sentineled.NAME), prefix=ns, lease=5, wait=30, durable=durable)
             for _ in range(THREADS)]
    unacknowledged: Counter = Counter()  # stage -> NotDurableErrors
    done_unacknowledged: set = set()

    def not_durable(key: str, e: ri.NotDurableError) -> None:
        with lock:
            unacknowledged[e.stage] += 1
            if e.stage == "done":
                done_unacknowledged.add(key)
        deliveries.put(key)  # not acknowledged: the broker delivers it again

    def work(job):  # type: ignore[no-untyped-def]
        with lock:
            runs[job.key] += 1
        time.sleep(WORK_SECONDS)
        return job.key

    def worker(idem: ri.Idem) -> None:
        while (key := deliveries.get()) is not None:
            try:
                assert idem.process(key, work) == key
            except ri.NotDurableError as e:
                not_durable(key, e)
            except BaseException as e:  # what reached the caller
                errors.append(f"{key}: {type(e).__name__}: {e}")

    async def async_work(job):  # type: ignore[no-untyped-def]
        with lock:
            runs[job.key] += 1
        await asyncio.sleep(WORK_SECONDS)
        return job.key

    async_idems: List[ri.AsyncIdem] = []

    async def async_worker() -> None:
        client = redis.asyncio.sentinel.Sentinel(topology.sentinels, socket_timeout=5).master_for(Sentineled.NAME)
        idem = ri.AsyncIdem(client, prefix=ns, lease=5, wait=30, durable=durable)
        async_idems.append(idem)
        loop = asyncio.get_running_loop()
        try:
            while (key := await loop.run_in_executor(None, deliveries.get)) is not None:
                try:
                    assert await idem.process(key, async_work) == key
                except ri.NotDurableError as e:
                    not_durable(key, e)
                except BaseException as e:
                    errors.append(f"{key} (asyncio): {type(e).__name__}: {e}")
        finally:
            await client.aclose()

    async def async_workers() -> None:
        await asyncio.gather(*(async_worker() for _ in range(TASKS)))

    failovers_done = threading.Event()
    fed: List[str] = []

    def feed() -> None:  # a pair of deliveries every 20 ms until the failovers are over
        while not failovers_done.is_set() or len(fed) < MIN_KEYS:
            key = f"k{len(fed)}"
            fed.append(key)
            deliveries.put(key)
            deliveries.put(key)
            time.sleep(0.02)
        time.sleep(3)  # the last redeliveries of NotDurable messages
        for _ in range(THREADS + TASKS):
            deliveries.put(None)

    threads = [threading.Thread(target=worker, args=(idem,)) for idem in idems]
    threads.append(threading.Thread(target=asyncio.run, args=(async_workers(),)))
    threads.append(threading.Thread(target=feed))
    for t in threads:
        t.start()
    primaries = []
    try:
        while len(runs) < 20:
            time.sleep(0.01)
        for _ in range(2):  # there and back
            topology.failover()
            primaries.append(topology.primary().port)
            time.sleep(0.5)
    finally:
        failovers_done.set()
        for t in threads:
            t.join(120)

    assert errors == [], errors
    assert primaries[0] != primaries[1]  # the primary really moved, twice
    assert len(fed) >= MIN_KEYS
    twice = {k: n for k, n in runs.items() if n != 1}
    assert all(k in done_unacknowledged and n == 2 for k, n in twice.items()), (twice, unacknowledged)
    assert set(runs) == set(fed)
    cmds = ri.IdemCommands(sentinel.master_for(Sentineled.NAME), prefix=ns)
    assert Counter(cmds.get(k).state for k in fed) == Counter({RecordState.DONE: len(fed)})
    assert all(i.stats.first_runs + i.stats.replays > 0 for i in idems + async_idems)  # every worker took part
    assert sum(i.stats.waits for i in idems + async_idems) > 0
