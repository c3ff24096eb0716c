"""redis_idem.streams against the session's server: what brokers/scenario.py
cannot see from outside (one round trip for DONE and XACK, the delays a
pending entry is given, the XACK undone when DONE did not complete the
record, the dead letter's MULTI), sync and asyncio."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

import redis_idem as ri
from redis_idem.streams import ACK, DEAD, HOLD, AsyncStreamConsumer, StreamConsumer, StreamEntry
from servers import FUNCTIONS, Server


class Recording(redis.Connection):
    """A real connection that keeps what each write sent (one round trip each)."""

    sends: list = []

    def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        packed = command if isinstance(command, (bytes, bytearray)) else b"".join(bytes(c) for c in command)
        Recording.sends.append(bytes(packed))
        return super().send_packed_command(command, check_health)


@pytest.fixture
def stream(ns) -> str:  # type: ignore[no-untyped-def]
    return f"{ns}s"


def read(r, stream, consumer, group="g"):  # type: ignore[no-untyped-def]
    """One new entry, read as `consumer` (as run() would)."""
    reply = r.xreadgroup(group, consumer.consumer, {stream: ">"}, count=1)
    [(_, [(entry_id, fields)])] = reply
    return StreamEntry(stream, entry_id.decode(), fields)


def pending(r, stream, group="g"):  # type: ignore[no-untyped-def]
    return r.xpending_range(stream, group, "-", "+", 10)


def test_done_and_xack_go_in_one_round_trip_and_the_entry_is_acknowledged(server, stream):  # type: ignore[no-untyped-def]
    pool = redis.ConnectionPool(connection_class=Recording, host="127.0.0.1", port=server.port)
    r = redis.Redis(connection_pool=pool)
    r.xadd(stream, {"idem-key": f"{stream}:k", "body": "b"})
    r.xgroup_create(stream, "g", id="0")
    consumer = StreamConsumer(ri.Idem(r, lease=5), stream, "g", consumer="c1")
    entry = read(r, stream, consumer)
    Recording.sends.clear()
    verdict = consumer.handle(entry, lambda e, job: {"ok": e.field("body").decode()})
    assert verdict.action == ACK and not verdict.outcome.replayed
    with_xack = [s for s in Recording.sends if b"XACK" in s]
    assert len(with_xack) == 1, Recording.sends
    assert b"IDEM.DONE" in with_xack[0] or b"idem_done" in with_xack[0]
    assert with_xack[0].index(b"XACK") > max(with_xack[0].find(b"IDEM.DONE"), with_xack[0].find(b"idem_done"))
    assert pending(r, stream) == []
    assert consumer.stats.acknowledged == 1 and consumer.stats.as_dict()["completed"] == 1


def test_durable_xack_goes_between_done_and_its_wait(server, stream):  # type: ignore[no-untyped-def]
    pool = redis.ConnectionPool(connection_class=Recording, host="127.0.0.1", port=server.port)
    r = redis.Redis(connection_pool=pool)
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.xadd(stream, {"idem-key": f"{stream}:k"})
    consumer = StreamConsumer(ri.Idem(r, lease=5, durable=ri.Durable(replicas=0)), stream, "g", consumer="c1")
    entry = read(r, stream, consumer)
    Recording.sends.clear()
    assert consumer.handle(entry, lambda e, job: 1).action == ACK
    [sent] = [s for s in Recording.sends if b"XACK" in s]
    done = max(sent.find(b"IDEM.DONE"), sent.find(b"idem_done"))
    assert 0 <= done < sent.index(b"XACK") < sent.index(b"WAIT")
    assert pending(r, stream) == []


def test_a_replay_is_acknowledged_without_running_the_work(r, stream):  # type: ignore[no-untyped-def]
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    for _ in range(2):
        r.xadd(stream, {"idem-key": f"{stream}:k"})
    consumer = StreamConsumer(ri.Idem(r, lease=5), stream, "g", consumer="c1")
    runs = []
    verdicts = [consumer.handle(read(r, stream, consumer), lambda e, job: runs.append(e.id) or len(runs))
                for _ in range(2)]
    assert [v.action for v in verdicts] == [ACK, ACK] and verdicts[1].outcome.replayed
    assert len(runs) == 1 and verdicts[1].outcome.value == 1
    assert pending(r, stream) == [] and consumer.stats.acknowledged == 2


def test_a_failure_is_released_and_left_pending_to_come_again_after_the_retry_delay(r, stream):  # type: ignore[no-untyped-def]
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.xadd(stream, {"idem-key": f"{stream}:k"})
    idem = ri.Idem(r, lease=2)
    consumer = StreamConsumer(idem, stream, "g", consumer="c1", retry_delay=1.5)

    def fail(entry, job):  # type: ignore[no-untyped-def]
        raise RuntimeError("the work failed")

    started = time.monotonic()
    verdict = consumer.handle(read(r, stream, consumer), fail)
    assert verdict.action == HOLD and verdict.delay == 1.5 and isinstance(verdict.error, RuntimeError)
    [entry] = pending(r, stream)
    # Its idle time says: due for XAUTOCLAIM (after claim_idle = 2 s) in 1.5 s, so 500 ms when it
    # was left pending, since when at most `elapsed` passed (a loaded machine stalls).
    elapsed = (time.monotonic() - started) * 1000
    assert 300 <= entry["time_since_delivered"] <= 500 + elapsed
    assert r.xautoclaim(stream, "g", "c2", 2000, "0-0", count=10)[1] == []
    time.sleep(1.6)
    assert len(r.xautoclaim(stream, "g", "c2", 2000, "0-0", count=10)[1]) == 1
    assert idem.stats.released == 1 and consumer.stats.held_back == 1 and consumer.stats.acknowledged == 0


def test_busy_is_left_pending_for_the_holders_lease_left(r, ns, stream):  # type: ignore[no-untyped-def]
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.xadd(stream, {"idem-key": "k"})
    holder = ri.IdemCommands(r, prefix=ns).claim("k", 4)
    assert holder.status is ri.Status.NEW
    consumer = StreamConsumer(ri.Idem(r, prefix=ns, lease=6, wait=0), stream, "g", consumer="c1")
    verdict = consumer.handle(read(r, stream, consumer), lambda e, job: pytest.fail("ran while busy"))
    assert verdict.action == HOLD and isinstance(verdict.error, ri.BusyError)
    assert 3.0 <= verdict.delay <= 4.0
    [entry] = pending(r, stream)
    # claim_idle (the lease, 6 s) less the holder's lease left (about 4 s).
    assert 1500 <= entry["time_since_delivered"] <= 3200
    assert consumer.stats.held_back == 1 and consumer.stats.acknowledged == 0


def test_a_done_that_lost_its_lease_puts_the_xacked_entry_back_pending(r, ns, stream):  # type: ignore[no-untyped-def]
    """DONE answered STALE: the XACK that went with it ran too, and is undone."""
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    entry_id = r.xadd(stream, {"idem-key": "k"}).decode()
    idem = ri.Idem(r, prefix=ns, lease=1, heartbeat=0)
    consumer = StreamConsumer(idem, stream, "g", consumer="c1")
    cmds = ri.IdemCommands(r, prefix=ns)

    def outlived(entry, job):  # type: ignore[no-untyped-def]
        time.sleep(1.2)  # the lease lapses (no heartbeat) and another worker claims
        assert cmds.claim("k", 30).status is ri.Status.RETRY
        return "late"

    verdict = consumer.handle(read(r, stream, consumer), outlived)
    assert verdict.action == HOLD and isinstance(verdict.error, ri.LeaseLostError)
    assert [p["message_id"].decode() for p in pending(r, stream)] == [entry_id]
    assert consumer.stats.held_back == 1 and consumer.stats.acknowledged == 0
    assert idem.stats.leases_lost == 1


def test_exhausted_goes_to_the_dead_letter_stream_and_is_acknowledged(r, stream):  # type: ignore[no-untyped-def]
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    entry_id = r.xadd(stream, {"idem-key": f"{stream}:k", "body": "b"}).decode()
    consumer = StreamConsumer(ri.Idem(r, lease=1, max_tries=1), stream, "g", consumer="c1", claim_idle=1)

    def fail(entry, job):  # type: ignore[no-untyped-def]
        raise RuntimeError("poison")

    assert consumer.handle(read(r, stream, consumer), fail).action == HOLD
    time.sleep(0.2)
    _, entries, _ = r.xautoclaim(stream, "g", "c1", 0, "0-0", count=1)
    again = StreamEntry(stream, entries[0][0].decode(), entries[0][1])
    verdict = consumer.handle(again, fail)
    assert verdict.action == DEAD and isinstance(verdict.error, ri.ExhaustedError)
    [(_, letter)] = r.xrange(f"{stream}:dlq")
    assert letter[b"idem-key"] == f"{stream}:k".encode() and letter[b"body"] == b"b"
    assert letter[b"original-stream"] == stream.encode() and letter[b"original-id"] == entry_id.encode()
    assert letter[b"error"].startswith(b"ExhaustedError: ")
    assert pending(r, stream) == [] and consumer.stats.dead_lettered == 1


def test_an_entry_without_a_key_is_dead_lettered_never_run(r, stream):  # type: ignore[no-untyped-def]
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.xadd(stream, {"body": "no key"})
    consumer = StreamConsumer(ri.Idem(r, lease=5), stream, "g", consumer="c1")
    verdict = consumer.handle(read(r, stream, consumer), lambda e, job: pytest.fail("ran without a key"))
    assert verdict.action == DEAD and isinstance(verdict.error, ri.MissingKeyError)
    [(_, letter)] = r.xrange(f"{stream}:dlq")
    assert letter[b"body"] == b"no key" and letter[b"error"].startswith(b"MissingKeyError")
    assert pending(r, stream) == []


def test_run_takes_over_what_a_dead_consumer_left_pending(r, stream):  # type: ignore[no-untyped-def]
    r.xgroup_create(stream, "g", id="0", mkstream=True)
    r.xadd(stream, {"idem-key": f"{stream}:k"})
    r.xreadgroup("g", "dead", {stream: ">"}, count=1)  # read, never acknowledged
    consumer = StreamConsumer(ri.Idem(r, lease=1), stream, "g", consumer="live", block=0.1)
    runs = []
    threading.Timer(2.5, consumer.stop).start()
    consumer.run(lambda entry, job: runs.append(entry.id))
    assert len(runs) == 1 and pending(r, stream) == []
    assert consumer.stats.acknowledged == 1


@pytest.mark.parametrize("protocol", [2, 3])
def test_run_makes_the_group_and_settles_every_entry(server, stream, protocol):  # type: ignore[no-untyped-def]
    r = server.client(protocol=protocol)
    for i in range(12):
        r.xadd(stream, {"idem-key": f"{stream}:{i % 8}"})
    consumer = StreamConsumer(ri.Idem(r, lease=5), stream, "g", block=0.1)
    runs = []
    threading.Timer(1.5, consumer.stop).start()
    consumer.run(lambda entry, job: runs.append(entry.field("idem-key")))
    assert sorted(runs) == sorted({f"{stream}:{i}".encode() for i in range(8)})
    assert pending(r, stream) == [] and consumer.stats.acknowledged == 12
    assert consumer.stats.as_dict()["replays"] == 4


async def test_async_consumer_works_concurrently_and_settles_every_entry(server, stream):  # type: ignore[no-untyped-def]
    ar = aioredis.Redis(host="127.0.0.1", port=server.port)
    for i in range(24):
        await ar.xadd(stream, {"idem-key": f"{stream}:{i % 16}"})
    consumer = AsyncStreamConsumer(ri.AsyncIdem(ar, lease=5, wait=5), stream, "g", block=0.1, concurrency=4)
    runs, at_once, working = [], [], [0]

    async def work(entry, job):  # type: ignore[no-untyped-def]
        working[0] += 1
        at_once.append(working[0])
        await asyncio.sleep(0.05)
        working[0] -= 1
        runs.append(entry.field("idem-key"))
        return len(runs)

    asyncio.get_running_loop().call_later(2.0, consumer.stop)
    await consumer.run(work)
    assert sorted(runs) == sorted({f"{stream}:{i}".encode() for i in range(16)})
    assert max(at_once) > 1
    assert await ar.xpending(stream, "g") == {"pending": 0, "min": None, "max": None, "consumers": []}
    assert consumer.stats.acknowledged == 24
    await ar.aclose()


async def test_async_failure_and_dead_letter(server, stream):  # type: ignore[no-untyped-def]
    ar = aioredis.Redis(host="127.0.0.1", port=server.port)
    await ar.xgroup_create(stream, "g", id="0", mkstream=True)
    await ar.xadd(stream, {"idem-key": f"{stream}:k"})
    await ar.xadd(stream, {"body": "no key"})
    consumer = AsyncStreamConsumer(ri.AsyncIdem(ar, lease=1, max_tries=2), stream, "g", block=0.1,
                                   retry_delay=0.1)

    async def fail(entry, job):  # type: ignore[no-untyped-def]
        raise RuntimeError("poison")

    asyncio.get_running_loop().call_later(3.5, consumer.stop)
    await consumer.run(fail)
    letters = [fields for _, fields in await ar.xrange(f"{stream}:dlq")]
    assert sorted(f[b"error"].split(b":")[0] for f in letters) == [b"ExhaustedError", b"MissingKeyError"]
    assert (await ar.xpending(stream, "g"))["pending"] == 0
    assert consumer.stats.dead_lettered == 2 and consumer.stats.held_back == 2
    await ar.aclose()


def test_claim_idle_below_the_lease_is_refused(r, stream):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="claim_idle"):
        StreamConsumer(ri.Idem(r, lease=10), stream, "g", claim_idle=5)



def _restart(server) -> None:  # type: ignore[no-untyped-def]
    """The stopped server again, on its port."""
    os.makedirs(server.dir, exist_ok=True)
    assert server._start(), server.log()
    if server.edition == "functions":
        server.client().execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS.read_text())


def test_run_waits_for_a_redis_that_is_down_when_it_starts(edition, stream):  # type: ignore[no-untyped-def]
    own = Server(edition)
    own.stop()
    # redis-py's own retries off (they alone would outlast the second)
    consumer = StreamConsumer(ri.Idem(own.client(retry=Retry(NoBackoff(), 0)), lease=2), stream, "g",
                              consumer="c1")
    worked = []
    thread = threading.Thread(target=consumer.run, args=(lambda e, job: worked.append(e.id),), daemon=True)
    thread.start()
    try:
        time.sleep(1)
        assert thread.is_alive()  # not raised: waiting for the server
        _restart(own)
        own.client().xadd(stream, {"idem-key": f"{stream}:k"})
        deadline = time.monotonic() + 10
        while consumer.stats.acknowledged < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        consumer.stop()
        thread.join(10)
        own.stop()
    assert not thread.is_alive() and len(worked) == 1 and consumer.stats.acknowledged == 1


async def test_async_run_waits_for_a_redis_that_is_down_when_it_starts(edition, stream):  # type: ignore[no-untyped-def]
    own = Server(edition)
    own.stop()
    ar = aioredis.Redis(host="127.0.0.1", port=own.port, retry=AsyncRetry(NoBackoff(), 0))
    consumer = AsyncStreamConsumer(ri.AsyncIdem(ar, lease=2), stream, "g", consumer="c1")
    worked = []
    task = asyncio.ensure_future(consumer.run(lambda e, job: worked.append(e.id)))
    try:
        await asyncio.sleep(1)
        assert not task.done()  # not raised: waiting for the server
        _restart(own)
        own.client().xadd(stream, {"idem-key": f"{stream}:k"})
        deadline = time.monotonic() + 10
        while consumer.stats.acknowledged < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 10)
        await ar.aclose()
        own.stop()
    assert len(worked) == 1 and consumer.stats.acknowledged == 1
