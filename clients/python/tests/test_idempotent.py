"""The decorator: `@idem.idempotent(key=..., payload=...)` on Idem (a plain
function) and AsyncIdem (a coroutine function), on a real server."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

import redis_idem as ri
from redis_idem import RecordState


def test_a_decorated_function_runs_once_per_key_and_replays(r, ns):  # type: ignore[no-untyped-def]
    idem = ri.Idem(r, prefix=ns, lease=5, wait=5)
    calls = []

    @idem.idempotent(key=lambda order_id, amount, **kw: f"charge:{order_id}",
                     payload=lambda order_id, amount, **kw: f"{order_id}:{amount}")
    def charge(order_id, amount, currency="EUR"):  # type: ignore[no-untyped-def]
        """Charges an order."""
        calls.append((order_id, amount, currency))
        return (amount, currency)

    assert charge.__name__ == "charge" and charge.__doc__ == "Charges an order."
    assert charge(1, 10, currency="USD") == (10, "USD")  # the function's own value
    assert charge(1, 10) == [10, "USD"]  # a replay: the stored result, decoded, not run again
    assert charge(2, 5) == (5, "EUR")
    assert calls == [(1, 10, "USD"), (2, 5, "EUR")]
    assert idem.commands.get("charge:1").state is RecordState.DONE
    with pytest.raises(ri.MismatchError):  # the key again with another payload
        charge(1, 99)


def test_what_the_function_raises_goes_on_and_the_claim_is_given_back(r, ns):  # type: ignore[no-untyped-def]
    idem = ri.Idem(r, prefix=ns, lease=5, wait=5)
    tries = []

    @idem.idempotent(key=lambda job_id: job_id, max_tries=2)
    def flaky(job_id):  # type: ignore[no-untyped-def]
        tries.append(job_id)
        raise RuntimeError("down")

    with pytest.raises(RuntimeError, match="down"):
        flaky("j")
    assert idem.commands.get("j").state is RecordState.RELEASED  # at once, not after the lease
    with pytest.raises(RuntimeError):
        flaky("j")
    with pytest.raises(ri.ExhaustedError):  # the decorator's settings are process()'s
        flaky("j")
    assert tries == ["j", "j"]


def test_a_bad_decorator_fails_when_it_is_made(r, ns):  # type: ignore[no-untyped-def]
    idem = ri.Idem(r, prefix=ns)
    with pytest.raises(TypeError):
        idem.idempotent(key=lambda: "k", lease_ms=5)
    with pytest.raises(TypeError):
        idem.idempotent(key="k")  # type: ignore[arg-type]


async def test_the_asyncio_decorator(server, ns):  # type: ignore[no-untyped-def]
    client = aioredis.Redis(host="127.0.0.1", port=server.port)
    try:
        idem = ri.AsyncIdem(client, prefix=ns, lease=5, wait=5)
        calls = []

        @idem.idempotent(key=lambda msg: msg["id"], payload=lambda msg: msg["body"])
        async def handle(msg):  # type: ignore[no-untyped-def]
            calls.append(msg["id"])
            return {"handled": msg["body"]}

        assert handle.__name__ == "handle"
        assert await handle({"id": "m1", "body": "hello"}) == {"handled": "hello"}
        assert await handle({"id": "m1", "body": "hello"}) == {"handled": "hello"}
        assert calls == ["m1"]
        assert (await idem.commands.get("m1")).state is RecordState.DONE

        @idem.idempotent(key=lambda msg: msg["id"])
        async def failing(msg):  # type: ignore[no-untyped-def]
            raise ValueError(msg["id"])

        with pytest.raises(ValueError, match="m2"):
            await failing({"id": "m2"})
        assert (await idem.commands.get("m2")).state is RecordState.RELEASED
    finally:
        await client.aclose()
