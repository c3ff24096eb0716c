"""The RabbitMQ adapters' consumer program for brokers/scenario.py
(brokers/README.md, "Writing a consumer program"): python-pika and
python-aio-pika, each written as clients/python/README.md shows,
configured from the environment the scenario gives."""

import asyncio
import logging
import json
import os
import signal
import time

import redis
import redis.asyncio

import redis_idem

env = os.environ
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
LEASE, MAX_TRIES = int(env["IDEM_LEASE_S"]), int(env["IDEM_MAX_TRIES"])
SOURCE, MEMBER = env["IDEM_SOURCE"], env["IDEM_MEMBER"]
URL = json.loads(env["BROKER"])["url"]
DELIVERY_LIMIT = 20  # the scenario's queue: x-delivery-limit 20


def pause_for(kind):
    return int(env["IDEM_SLOW_WORK_MS" if kind == "slow" else "IDEM_WORK_MS"]) / 1000


# The work: its start and its effect, fenced by the attempt, in the side store.

def work(side, body, job):
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


def pika_consumer():
    import pika

    from redis_idem.rabbitmq import PikaConsumer

    idem = redis_idem.Idem(redis.Redis.from_url(env["IDEM_REDIS_URL"]), lease=LEASE, max_tries=MAX_TRIES)
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    consumer = PikaConsumer(idem, connection, SOURCE, delivery_limit=DELIVERY_LIMIT)
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    side = redis.Redis.from_url(env["SIDE_REDIS_URL"])
    consumer.run(lambda message, job: work(side, json.loads(message.body), job))
    connection.close()


async def aio_pika_consumer():
    import aio_pika

    from redis_idem.rabbitmq import AioPikaConsumer

    idem = redis_idem.AsyncIdem(redis.asyncio.Redis.from_url(env["IDEM_REDIS_URL"]), lease=LEASE,
                                max_tries=MAX_TRIES)
    connection = await aio_pika.connect(URL)
    consumer = AioPikaConsumer(idem, connection, SOURCE, prefetch=1, delivery_limit=DELIVERY_LIMIT)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, consumer.stop)
    side = redis.asyncio.Redis.from_url(env["SIDE_REDIS_URL"])
    await consumer.run(lambda message, job: work_async(side, json.loads(message.body), job))
    await connection.close()


if __name__ == "__main__":
    adapter = env["IDEM_ADAPTER"]
    if adapter == "python-pika":
        pika_consumer()
    elif adapter == "python-aio-pika":
        asyncio.run(aio_pika_consumer())
    else:
        raise SystemExit(f"rabbitmq_consumer.py: no adapter {adapter}")
