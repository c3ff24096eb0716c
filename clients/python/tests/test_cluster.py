"""A 3-node cluster the test starts: commands routed by key, batches split
by slot, the loop on RedisCluster (sync and asyncio)."""

from __future__ import annotations

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.crc import key_slot

import redis_idem as ri
from redis_idem import Edition, Status
from servers import Cluster


@pytest.fixture(scope="module")
def cluster(edition):  # type: ignore[no-untyped-def]
    c = Cluster(edition)
    yield c
    c.stop()


@pytest.fixture
def rc(cluster):  # type: ignore[no-untyped-def]
    client = RedisCluster(host="127.0.0.1", port=cluster.port)
    yield client
    client.close()


def _mclaim_calls(cluster):  # type: ignore[no-untyped-def]
    total = 0
    for node in cluster.nodes:
        stats = node.client().info("commandstats").get("cmdstat_IDEM.MCLAIM")
        total += stats["calls"] if stats else 0
    return total


def test_commands_and_loop_route_by_key(rc, ns, edition):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(rc, prefix=ns)
    assert cmds.edition is Edition(edition)
    keys = [f"order:{i}" for i in range(20)]
    assert len({key_slot((ns + k).encode()) for k in keys}) > 1
    for k in keys:
        c = cmds.claim(k, 30)
        assert c.status is Status.NEW
        assert cmds.done(k, c.token, result=k.encode()).completed
        assert cmds.claim(k, 30).result == k.encode()
    idem = ri.Idem(rc, prefix=ns, lease=5, wait=5)
    assert idem.process("p", lambda job: job.attempt) == 1
    assert idem.process("p", lambda job: 99) == 1


def test_batches_split_by_slot(rc, cluster, ns, module):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(rc, prefix=ns)
    keys = [f"k{i}" for i in range(300)] + [f"{{same}}:k{i}" for i in range(50)]
    slots = {key_slot((ns + k).encode()) for k in keys}
    before = _mclaim_calls(cluster)
    claims = cmds.claim_many(keys, 30)
    assert [c.status for c in claims] == [Status.NEW] * len(keys)
    if module:
        assert _mclaim_calls(cluster) - before == len(slots)  # one MCLAIM per slot
    dones = cmds.done_many([(k, c.token, b"v") for k, c in zip(keys, claims)])
    assert all(d.completed for d in dones)
    assert all(c.status is Status.DONE for c in cmds.claim_many(keys, 30))
    items = ri.Idem(rc, prefix=ns + "pm:").process_many(keys[:40], lambda job: job.key)
    assert [(i.key, i.status, i.value) for i in items] == [(k, "processed", k) for k in keys[:40]]


def test_module_options_in_the_cluster(rc, ns, module):  # type: ignore[no-untyped-def]
    cmds = ri.IdemCommands(rc, prefix=ns)
    if not module:
        with pytest.raises(ri.ModuleRequiredError):
            cmds.claim("{t}:a", 30, bloom="{t}:seen")
        return
    c = cmds.claim("{t}:a", 30, bloom="{t}:seen")
    assert cmds.done("{t}:a", c.token, bloom="{t}:seen").bloom_added
    assert cmds.bf_exists("{t}:seen", (ns + "{t}:a").encode())
    with pytest.raises((redis.RedisError, RedisClusterException), match="same key slot|CROSSSLOT"):
        cmds.claim("{t}:b", 30, bloom="{u}:seen")  # refused by redis-py before sending, or by the server


async def test_asyncio_cluster(cluster, ns, edition):  # type: ignore[no-untyped-def]
    client = AsyncRedisCluster(host="127.0.0.1", port=cluster.port)
    try:
        idem = ri.AsyncIdem(client, prefix=ns, lease=5, wait=5)
        assert await idem.get_edition() is Edition(edition)

        async def work(job):  # type: ignore[no-untyped-def]
            return job.attempt

        assert [await idem.process(f"a{i}", work) for i in range(10)] == [1] * 10
        claims = await idem.commands.claim_many([f"a{i}" for i in range(10)] + ["fresh"], 30)
        assert [c.status for c in claims] == [Status.DONE] * 10 + [Status.NEW]
    finally:
        await client.aclose()
