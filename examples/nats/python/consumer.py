"""Orders from a NATS JetStream stream, each charged once however often it
is delivered (redis_idem.nats). Needs a Redis with the redis-idem module
(or functions/idem.lua loaded), a nats-server with JetStream (`-js`), and
`pip install "redis-idem[nats]"` (from a checkout: `pip install
"./clients/python[nats]"`).

    python consumer.py produce    # the stream, and 5 orders, the third one twice
    python consumer.py            # charge them; Ctrl-C to stop

REDIS_URL and NATS_URL pick the servers."""

import asyncio
import json
import os
import signal
import sys

import nats
import redis.asyncio
import redis_idem
from redis_idem.nats import JetStreamConsumer

NATS_URL = os.environ.get("NATS_URL", "nats://localhost:4222")


async def produce():
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    await js.add_stream(name="orders", subjects=["orders.>"])  # orders.in, and orders.dlq for dead letters
    for n in (1, 2, 3, 3, 4, 5):  # a producer's retry: order 3 again, a new sequence
        await js.publish("orders.in", json.dumps({"id": n, "cents": 100 * n}).encode(),
                         headers={"Idem-Key": f"order:{n}"})
    await nc.close()


async def charge(msg, job):
    order = json.loads(msg.data)
    print(f"charging order {order['id']}: {order['cents']} cents (attempt {job.attempt})")
    return {"charged": order["cents"]}  # stored by IDEM.DONE; a duplicate replays it


async def main():
    idem = redis_idem.AsyncIdem(redis.asyncio.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379")),
                                lease=30, max_tries=5)
    nc = await nats.connect(NATS_URL)
    consumer = await JetStreamConsumer.subscribe(
        nc.jetstream(), idem, "orders.in", durable="billing", stream="orders",
        on_settled=lambda msg, verdict: print(msg.metadata.sequence.stream, verdict.action, verdict.error or ""))
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, consumer.stop)
    await consumer.run(charge)
    await nc.drain()
    print(consumer.stats.as_dict())


asyncio.run(produce() if sys.argv[1:] == ["produce"] else main())
