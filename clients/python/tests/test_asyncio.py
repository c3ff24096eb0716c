"""The asyncio twins: AsyncIdemCommands and AsyncIdem on redis.asyncio."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

import redis_idem as ri
from redis_idem import Edition, RecordState, Status


@pytest.fixture
async def ar(server):  # type: ignore[no-untyped-def]
    client = aioredis.Redis(host="127.0.0.1", port=server.port)
    yield client
    await client.aclose()


async def test_commands(ar, ns, edition):  # type: ignore[no-untyped-def]
    cmds = ri.idem(ar, prefix=ns)
    assert isinstance(cmds, ri.AsyncIdemCommands) and await cmds.get_edition() is Edition(edition)
    c = await cmds.claim("a", 30, payload=b"p")
    assert c.status is Status.NEW
    assert (await cmds.claim("a", 30)).status is Status.BUSY
    assert await cmds.extend("a", c.token, 30)
    assert (await cmds.done("a", c.token, result=b"r")).completed
    assert (await cmds.claim("a", 30)).result == b"r"
    assert (await cmds.get("a")).state is RecordState.DONE
    with pytest.raises(ri.StaleError):
        await cmds.extend("a", c.token, 10)
    assert await cmds.once("o", 10) and not await cmds.once("o", 10)
    r2 = await cmds.claim("b", 30)
    assert await cmds.release("b", r2.token)
    claims = await cmds.claim_many(["m1", "m2"], 30)
    dones = await cmds.done_many([("m1", claims[0].token, b"x"), ("m2", claims[1].token, None)])
    assert all(d.completed for d in dones)
    assert [c.result for c in await cmds.claim_many(["m1", "m2"], 30)] == [b"x", None]


async def test_process_replay_release_and_hooks(ar, ns):  # type: ignore[no-untyped-def]
    replays = []
    idem = ri.AsyncIdem(ar, prefix=ns, lease=5, wait=5, hooks=ri.Hooks(on_replay=lambda j: replays.append(j.key)))

    async def work(job):  # type: ignore[no-untyped-def]
        return {"attempt": job.attempt}

    async def fail(job):  # type: ignore[no-untyped-def]
        raise RuntimeError("down")

    with pytest.raises(RuntimeError):
        await idem.process("k", fail)
    assert await idem.process("k", work) == {"attempt": 2}
    assert await idem.process("k", work) == {"attempt": 2}
    assert replays == ["k"] and idem.stats["released"] == 1 and idem.stats["runs"] == 2

    @idem.idempotent("dec:{0}")
    async def double(x):  # type: ignore[no-untyped-def]
        return x * 2

    assert await double(4) == 8 and await double(4) == 8
    async with idem.job("cm") as job:
        job.result = "set"
    async with idem.job("cm") as job:
        assert job.replayed and job.result == "set"


async def test_waits_for_the_copy_in_flight(ar, ns):  # type: ignore[no-untyped-def]
    idem = ri.AsyncIdem(ar, prefix=ns, lease=5, wait=5)
    started = asyncio.Event()

    async def slow(job):  # type: ignore[no-untyped-def]
        started.set()
        await asyncio.sleep(0.5)
        return "first"

    first = asyncio.ensure_future(idem.process("w", slow))
    await asyncio.wait_for(started.wait(), 10)
    # WAIT blocks this connection on the server: the second copy uses its own
    # client, as a second consumer would.
    other_client = aioredis.Redis(host=ar.connection_pool.connection_kwargs["host"],
                                  port=ar.connection_pool.connection_kwargs["port"])
    other = ri.AsyncIdem(other_client, prefix=ns, wait=5)
    ran = []
    assert await other.process("w", lambda job: ran.append(1)) == "first"
    assert await asyncio.wait_for(first, 10) == "first" and ran == []
    held = await other.commands.claim("held", 30)
    with pytest.raises(ri.BusyError):
        await other.process("held", slow, wait=0.2)
    assert held.claimed
    await other_client.aclose()


async def test_heartbeat_task_and_lost_lease(ar, ns):  # type: ignore[no-untyped-def]
    idem = ri.AsyncIdem(ar, prefix=ns, lease=1, wait=5)

    async def work(job):  # type: ignore[no-untyped-def]
        await asyncio.sleep(2.5)  # past the 1 s lease, kept by the task
        job.check()
        return "kept"

    assert await idem.process("hb", work) == "kept"
    assert idem.stats["extends"] >= 2

    slow = ri.AsyncIdem(ar, prefix=ns, lease=1, heartbeat=3600)
    fast = ri.AsyncIdem(ar, prefix=ns, lease=5, wait=5)
    gate = asyncio.Event()

    async def stuck(job):  # type: ignore[no-untyped-def]
        await asyncio.wait_for(gate.wait(), 10)
        return "late"

    async def takeover(job):  # type: ignore[no-untyped-def]
        gate.set()
        await asyncio.sleep(0.1)  # the stuck one's DONE comes while we hold it
        return ("took over", job.attempt)

    stuck_run = asyncio.ensure_future(slow.process("lost", stuck))
    await asyncio.sleep(1.1)
    assert await fast.process("lost", takeover) == ("took over", 2)  # its own value, not a replay
    with pytest.raises(ri.LeaseLostError):
        await asyncio.wait_for(stuck_run, 10)
    assert await fast.process("lost", takeover) == ["took over", 2]


async def test_process_many(ar, ns, edition):  # type: ignore[no-untyped-def]
    idem = ri.AsyncIdem(ar, prefix=ns, lease=5)

    async def work(job, item):  # type: ignore[no-untyped-def]
        if item is None:
            raise ValueError("no item")
        return item.upper()

    out = await idem.process_many({"a": "x", "b": None, "c": "z"}, work)
    assert out["a"] == "X" and out["c"] == "Z" and isinstance(out["b"], ValueError)
    again = await idem.process_many({"a": "q", "c": "q"}, work)
    assert again == {"a": "X", "c": "Z"}
    assert idem.stats["replays"] == 2
