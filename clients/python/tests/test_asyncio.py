"""AsyncIdemCommands on redis.asyncio (AsyncIdem runs the conformance cases)."""

from __future__ import annotations

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
