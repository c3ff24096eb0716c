"""A planned failover in a cluster of 3 primaries with a replica each: the
loop goes on through `CLUSTER FAILOVER` on every primary's replica in turn.
Worker threads with Idem and asyncio tasks with AsyncIdem (each with its
own cluster client, as worker processes would have) take keys over all slots, each delivered twice at once, so the
duplicate waits in IDEM.CLAIM ... WAIT on the primary that is failed over
(Redis answers it UNBLOCKED, which the library resends to the new primary;
Valkey redirects it with MOVED); every 25th work outlives its lease, so
only its heartbeat keeps it through the failovers; a batch of keys with one
hash tag is delivered twice too, during the failover of its primary.
Module only (WAIT); runs with --run-failover (client.mk runs it once, on
Redis 7.0)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import Counter
from typing import List

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

import redis_idem as ri
from redis_idem import RecordState
from servers import Cluster

pytestmark = pytest.mark.failover

THREADS = 4  # Idem workers
TASKS = 4  # AsyncIdem workers, on an event loop of their own thread
WORKERS = THREADS + TASKS
MIN_KEYS = 300
WORK_SECONDS = 0.1
LEASE = 2
SLOW_WORK_SECONDS = 2.5  # every 25th key: longer than the lease, so only the heartbeat keeps it
TAG = "{batch}"


@pytest.fixture(scope="module")
def cluster(edition):  # type: ignore[no-untyped-def]
    if edition != "module":
        pytest.skip("the duplicates wait with IDEM.CLAIM ... WAIT: module only")
    c = Cluster(edition, replicas=1)
    yield c
    c.stop()


def _primary_of(cluster: Cluster, slot: int) -> int:
    for lo, hi, primary, *_ in cluster.nodes[0].client().execute_command("CLUSTER", "SLOTS"):
        if lo <= slot <= hi:
            return int(primary[1])
    raise AssertionError(slot)


def _unblocked(cluster: Cluster) -> int:
    """Waiting claims woken by a failover: Redis answers them UNBLOCKED;
    Valkey (8+) redirects them with MOVED (counted with any other MOVED)."""
    valkey = cluster.nodes[0].client().info("server").get("server_name") == "valkey"
    codes = ("UNBLOCKED", "MOVED") if valkey else ("UNBLOCKED",)
    stats = [n.client().info("errorstats") for n in cluster.nodes]
    return sum(s.get(f"errorstat_{code}", {}).get("count", 0) for s in stats for code in codes)


def test_planned_failover_of_every_primary(cluster, ns):  # type: ignore[no-untyped-def]
    runs: Counter = Counter()
    lock = threading.Lock()
    errors: List[str] = []
    deliveries: "queue.Queue" = queue.Queue()
    clients = [RedisCluster(host="127.0.0.1", port=cluster.port) for _ in range(THREADS + 2)]
    idems = [ri.Idem(c, prefix=ns, lease=LEASE, wait=30) for c in clients]

    def work(job):  # type: ignore[no-untyped-def]
        with lock:
            runs[job.key] += 1
        time.sleep(SLOW_WORK_SECONDS if job.key.startswith("slow") else WORK_SECONDS)
        return job.key

    def worker(idem: ri.Idem) -> None:
        while (key := deliveries.get()) is not None:
            try:
                assert idem.process(key, work) == key
            except BaseException as e:  # what reached the caller
                errors.append(f"{key}: {type(e).__name__}: {e}")

    async def async_work(job):  # type: ignore[no-untyped-def]
        with lock:
            runs[job.key] += 1
        await asyncio.sleep(SLOW_WORK_SECONDS if job.key.startswith("slow") else WORK_SECONDS)
        return job.key

    async_idems: List[ri.AsyncIdem] = []

    async def async_worker() -> None:
        client = AsyncRedisCluster(host="127.0.0.1", port=cluster.port)
        idem = ri.AsyncIdem(client, prefix=ns, lease=LEASE, wait=30)
        async_idems.append(idem)
        loop = asyncio.get_running_loop()
        try:
            while (key := await loop.run_in_executor(None, deliveries.get)) is not None:
                try:
                    assert await idem.process(key, async_work) == key
                except BaseException as e:  # what reached the caller
                    errors.append(f"{key} (asyncio): {type(e).__name__}: {e}")
        finally:
            await client.aclose()

    async def async_workers() -> None:
        await asyncio.gather(*(async_worker() for _ in range(TASKS)))

    batch_keys = [f"{TAG}:{i}" for i in range(20)]
    batch_items: List[ri.BatchItem] = []

    def batch(idem: ri.Idem) -> None:
        try:
            batch_items.extend(idem.process_many(batch_keys, work))
        except BaseException as e:
            errors.append(f"batch: {type(e).__name__}: {e}")

    failovers_done = threading.Event()
    fed: List[str] = []

    def feed() -> None:  # a pair of deliveries every 30 ms until the failovers are over
        while not failovers_done.is_set() or len(fed) < MIN_KEYS:
            key = f"{'slow' if len(fed) % 25 == 0 else 'k'}{len(fed)}"
            fed.append(key)
            deliveries.put(key)
            deliveries.put(key)
            time.sleep(0.03)
        for _ in range(WORKERS):
            deliveries.put(None)

    threads = [threading.Thread(target=worker, args=(idem,)) for idem in idems[:THREADS]]
    threads.append(threading.Thread(target=asyncio.run, args=(async_workers(),)))
    threads.append(threading.Thread(target=feed))
    for t in threads:
        t.start()
    unblocked_before = _unblocked(cluster)
    batchers = []
    try:
        while len(runs) < 30:
            time.sleep(0.01)
        primaries = [n.port for n in cluster.nodes[:3]]
        tag_primary = _primary_of(cluster, key_slot((ns + batch_keys[0]).encode()))
        for primary in primaries:
            replica = next(n for n in cluster.nodes
                           if n.client().info("replication").get("master_port") == primary)
            if primary == tag_primary:  # the batch, twice at once, as its primary fails over
                batchers = [threading.Thread(target=batch, args=(idem,)) for idem in idems[THREADS:]]
                for t in batchers:
                    t.start()
                time.sleep(WORK_SECONDS)
            cluster.failover(replica)
            time.sleep(0.3)
    finally:
        failovers_done.set()
        for t in threads + batchers:
            t.join(120)

    assert errors == [], errors
    # the primaries really did change, and waiting claims were unblocked by it
    assert {n.port for n in cluster.nodes[3:]} == {
        n.port for n in cluster.nodes if n.client().info("replication")["role"] == "master"}
    assert _unblocked(cluster) > unblocked_before
    assert len(fed) >= MIN_KEYS
    # a batch's key another batch held is busy (not waited for): delivered again, it replays
    statuses = Counter(item.status for item in batch_items)
    assert statuses["processed"] == len(batch_keys), statuses
    assert set(statuses) <= {"processed", "replayed", "busy"}, statuses
    for item in batch_items:
        if item.status == "busy":
            assert idems[0].process(item.key, work) == item.key
    every_key = fed + batch_keys
    assert {k: runs[k] for k in every_key if runs[k] != 1} == {}
    assert set(runs) == set(every_key)
    cmds = ri.IdemCommands(clients[0], prefix=ns)
    states = Counter(cmds.get(k).state for k in every_key)
    assert states == Counter({RecordState.DONE: len(every_key)})
    assert len(async_idems) == TASKS
    assert all(i.stats.first_runs + i.stats.replays > 0 for i in idems[:THREADS] + async_idems)  # every worker took part
    assert sum(i.stats.waits for i in idems + async_idems) > 0
    assert sum(i.stats.extends for i in idems + async_idems) > 0  # the slow works' heartbeats, through the failovers
    for c in clients:
        c.close()
