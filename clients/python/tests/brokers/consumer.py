"""The Python adapters' consumer program for brokers/scenario.py
(brokers/README.md, "Writing a consumer program"): python-kafka,
python-nats and python-streams, each written as the library's README
shows, configured from the environment the scenario gives."""

import asyncio
import json
import os
import signal
import time

import redis
import redis.asyncio

import redis_idem

env = os.environ
LEASE = int(env["IDEM_LEASE_S"])
MAX_TRIES = int(env["IDEM_MAX_TRIES"])
SOURCE, GROUP, MEMBER = env["IDEM_SOURCE"], env["IDEM_GROUP"], env["IDEM_MEMBER"]
BROKER = json.loads(env["BROKER"])


def pause_for(kind):
    return int(env["IDEM_SLOW_WORK_MS" if kind == "slow" else "IDEM_WORK_MS"]) / 1000


# The work: its start and its effect, fenced by the attempt, in the side store.

side = redis.Redis.from_url(env["SIDE_REDIS_URL"])


def work(body, job):
    if side.evalsha(env["SIDE_START_SHA"], 1, body["key"], body["kind"], MEMBER) == b"fail":
        raise RuntimeError(f"{body['key']}: the work failed")
    time.sleep(pause_for(body["kind"]))
    side.evalsha(env["SIDE_EFFECT_SHA"], 1, body["key"], job.attempt, body["account"], body["seq"], MEMBER)
    return {"n": body["seq"]}


async def work_async(side, body, job):
    if await side.evalsha(env["SIDE_START_SHA"], 1, body["key"], body["kind"], MEMBER) == b"fail":
        raise RuntimeError(f"{body['key']}: the work failed")
    await asyncio.sleep(pause_for(body["kind"]))
    await side.evalsha(env["SIDE_EFFECT_SHA"], 1, body["key"], job.attempt, body["account"], body["seq"], MEMBER)
    return {"n": body["seq"]}


# One consumer per adapter.


def kafka():
    from redis_idem.kafka import KafkaConsumer

    idem = redis_idem.Idem(redis.Redis.from_url(env["IDEM_REDIS_URL"]), lease=LEASE, max_tries=MAX_TRIES)
    # The session no longer than the lease: a member that stops loses its
    # partitions when it loses its leases, and their new owner is done with
    # a record before the stopped one can wake to write it late.
    consumer = KafkaConsumer({"bootstrap.servers": BROKER["bootstrap"], "group.id": GROUP,
                              "auto.offset.reset": "earliest", "session.timeout.ms": LEASE * 1000,
                              "heartbeat.interval.ms": LEASE * 1000 // 4}, idem, [SOURCE])
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    consumer.run(lambda message, job: work(json.loads(message.value()), job))


def streams():
    from redis_idem.streams import StreamConsumer

    idem = redis_idem.Idem(redis.Redis.from_url(env["IDEM_REDIS_URL"]), lease=LEASE, max_tries=MAX_TRIES)
    consumer = StreamConsumer(idem, SOURCE, GROUP, consumer=f"member-{MEMBER}")
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    consumer.run(lambda entry, job: work(json.loads(entry.field("body")), job))


async def nats():
    import nats as nats_py

    from redis_idem.nats import JetStreamConsumer

    nc = await nats_py.connect(BROKER["url"])
    idem = redis_idem.AsyncIdem(redis.asyncio.Redis.from_url(env["IDEM_REDIS_URL"]), lease=LEASE,
                                max_tries=MAX_TRIES)
    consumer = await JetStreamConsumer.subscribe(nc.jetstream(), idem, f"{SOURCE}.in", durable=GROUP, stream=SOURCE)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
    side = redis.asyncio.Redis.from_url(env["SIDE_REDIS_URL"])
    await consumer.run(lambda msg, job: work_async(side, json.loads(msg.data), job))
    await nc.drain()


if __name__ == "__main__":
    adapter = env["IDEM_ADAPTER"]
    if adapter == "python-kafka":
        kafka()
    elif adapter == "python-streams":
        streams()
    elif adapter == "python-nats":
        asyncio.run(nats())
    else:
        raise SystemExit(f"consumer.py: no adapter {adapter}")
