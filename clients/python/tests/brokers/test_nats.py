"""redis_idem.nats against a real nats-server with JetStream: what
brokers/scenario.py does not see from outside (the heartbeat's in_progress
keeping a long work's message from redelivery, Busy given back with the
holder's lease left, the dead letter's copy and headers)."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
import pytest
import redis.asyncio as aioredis

import redis_idem as ri
from redis_idem.nats import JetStreamConsumer


@pytest.fixture
async def js(nats_server):  # type: ignore[no-untyped-def]
    nc = await nats.connect(nats_server["url"])
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
async def ar(server):  # type: ignore[no-untyped-def]
    client = aioredis.Redis(host="127.0.0.1", port=server.port)
    yield client
    await client.aclose()


@pytest.fixture
async def stream(js):  # type: ignore[no-untyped-def]
    name = f"S{uuid.uuid4().hex[:10]}"
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    return name


async def run_until(consumer, handler, done, timeout=30):  # type: ignore[no-untyped-def]
    task = asyncio.ensure_future(consumer.run(handler))
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    consumer.stop()
    await asyncio.wait_for(task, 30)


async def test_the_heartbeat_keeps_a_long_work_from_redelivery(js, ar, ns, stream):  # type: ignore[no-untyped-def]
    await js.publish(f"{stream}.in", b"long", headers={"Idem-Key": "k"})
    idem = ri.AsyncIdem(ar, prefix=ns, lease=1)  # ack wait 1 s, heartbeat every 1/3 s
    consumer = await JetStreamConsumer.subscribe(js, idem, f"{stream}.in", durable="d", stream=stream)
    # Another member of the same durable consumer: it would get the message
    # again if its ack wait ran out.
    rival = await JetStreamConsumer.subscribe(js, ri.AsyncIdem(ar, prefix=ns, lease=1, wait=0), f"{stream}.in",
                                              durable="d", stream=stream)
    works = []

    def long_work(who):  # type: ignore[no-untyped-def]
        async def long(msg, job):  # type: ignore[no-untyped-def]
            works.append((who, msg.metadata.num_delivered))
            await asyncio.sleep(3.5)  # more than three ack waits
            return "done"
        return long

    # Whichever member fetches it first works on it; the other must never
    # get it (the heartbeat's in_progress keeps the ack wait from running out).
    rival_task = asyncio.ensure_future(rival.run(long_work("rival")))
    await run_until(consumer, long_work("consumer"),
                    lambda: consumer.stats.acknowledged + rival.stats.acknowledged == 1)
    rival.stop()
    await rival_task
    assert [n for _, n in works] == [1]
    assert idem.stats.extends + rival.idem.stats.extends >= 6
    info = await js.consumer_info(stream, "d")
    assert info.num_redelivered == 0 and info.num_ack_pending == 0 and info.num_pending == 0


async def test_busy_is_given_back_for_the_holders_lease_left(js, ar, ns, stream):  # type: ignore[no-untyped-def]
    await js.publish(f"{stream}.in", b"x", headers={"Idem-Key": "k"})
    holder = await ri.AsyncIdemCommands(ar, prefix=ns).claim("k", 3)
    held_at = time.monotonic()
    deliveries = []
    consumer = await JetStreamConsumer.subscribe(
        js, ri.AsyncIdem(ar, prefix=ns, lease=5, wait=0), f"{stream}.in", durable="d", stream=stream,
        on_settled=lambda msg, verdict: deliveries.append((time.monotonic() - held_at, verdict)))
    await run_until(consumer, lambda msg, job: job.status.value, lambda: consumer.stats.acknowledged == 1)
    assert holder.status is ri.Status.NEW
    (_, busy), (done_at, done) = deliveries
    assert isinstance(busy.error, ri.BusyError) and 2.0 <= busy.delay <= 3.0
    assert done_at >= 2.8  # not before the holder's lease ran out: no spinning meanwhile
    assert done.outcome.value == "RETRY" and consumer.stats.held_back == 1


async def test_exhausted_is_copied_to_the_dead_letter_subject_and_terminated(js, ar, ns, stream):  # type: ignore[no-untyped-def]
    ack = await js.publish(f"{stream}.in", b"poison", headers={"Idem-Key": "p", "Trace": "t1"})
    await js.publish(f"{stream}.in", b"no key")
    consumer = await JetStreamConsumer.subscribe(js, ri.AsyncIdem(ar, prefix=ns, lease=5, max_tries=1),
                                                 f"{stream}.in", durable="d", stream=stream)

    async def fail(msg, job):  # type: ignore[no-untyped-def]
        raise RuntimeError("always fails")

    await run_until(consumer, fail, lambda: consumer.stats.dead_lettered == 2)
    dlq = await js.pull_subscribe(f"{stream}.dlq", durable=None, stream=stream)
    letters = sorted(await dlq.fetch(10, timeout=2), key=lambda m: m.data, reverse=True)
    assert [m.data for m in letters] == [b"poison", b"no key"]
    first = letters[0].headers
    assert first["Idem-Key"] == "p" and first["Trace"] == "t1"
    assert first["Idem-Original-Subject"] == f"{stream}.in"
    assert first["Idem-Original-Sequence"] == str(ack.seq)
    assert first["Idem-Error"].startswith("ExhaustedError: p: 1 tries used")
    assert letters[1].headers["Idem-Error"].startswith("MissingKeyError")
    info = await js.consumer_info(stream, "d")
    assert info.num_ack_pending == 0 and info.num_pending == 0
