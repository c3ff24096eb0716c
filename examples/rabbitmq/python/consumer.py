"""redis_idem.rabbitmq's PikaConsumer on a queue that gets every order twice.

Usage: python consumer.py amqp://guest:guest@127.0.0.1:5672/ redis://127.0.0.1:6379 [orders]
(`pip install "redis-idem[rabbitmq]"`; the Redis has the module loaded, or
functions/idem.lua.)

It declares a quorum queue `example-orders` with its dead letter
(`example-orders.dlx` into `example-orders.dlq`), publishes each order and
then each again (a producer's retry: the same message_id), consumes them
with two worker threads until the queue is empty, and prints the
consumer's counters: every order charged once, its copy a replay, and the
one order without a message_id in the dead letter.
"""

import json
import sys
import threading
import time

import pika
import redis

import redis_idem
from redis_idem.rabbitmq import PikaConsumer

AMQP, REDIS = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 20
QUEUE = "example-orders"

connection = pika.BlockingConnection(pika.URLParameters(AMQP))
channel = connection.channel()
channel.exchange_declare(f"{QUEUE}.dlx", "fanout", durable=True)
channel.queue_declare(f"{QUEUE}.dlq", durable=True)
channel.queue_bind(f"{QUEUE}.dlq", f"{QUEUE}.dlx")
channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 20,
                                                      "x-dead-letter-exchange": f"{QUEUE}.dlx"})
channel.confirm_delivery()
run = int(time.time())
for copy in range(2):
    for i in range(N):
        channel.basic_publish("", QUEUE, json.dumps({"order": i, "cents": 100 * i}).encode(),
                              pika.BasicProperties(message_id=f"order-{run}-{i}", delivery_mode=2))
channel.basic_publish("", QUEUE, b'{"order": "no id"}', pika.BasicProperties(delivery_mode=2))

charged = []


def charge(message, job):
    order = json.loads(message.body)
    charged.append(order["order"])  # a real charge would pass job.attempt as its fence
    return {"charged": order["cents"]}


idem = redis_idem.Idem(redis.Redis.from_url(REDIS), prefix="example:", lease=10, max_tries=3)
consumer = PikaConsumer(idem, connection, QUEUE, workers=2, delivery_limit=20)
total = 2 * N + 1


def stop_when_done():
    while consumer.stats.acknowledged + consumer.stats.dead_lettered < total:
        time.sleep(0.1)
    consumer.stop()


threading.Thread(target=stop_when_done, daemon=True).start()
consumer.run(charge)
connection.close()
print(f"charged {len(charged)} of {N} orders ({len(set(charged))} distinct); {consumer.stats.as_dict()}")
