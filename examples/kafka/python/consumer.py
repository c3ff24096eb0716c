"""Orders from a Kafka topic, each charged once however often it is
delivered (redis_idem.kafka). Needs a Redis with the redis-idem module (or
functions/idem.lua loaded), a Kafka broker, and `pip install
"redis-idem[kafka]"` (from a checkout: `pip install
"./clients/python[kafka]"`; `python3 brokers/launch.py start kafka --dir
/tmp/kafka` starts a broker and prints its address).

    python consumer.py produce    # 5 orders, the third one twice
    python consumer.py            # charge them; Ctrl-C to stop

REDIS_URL and KAFKA (bootstrap servers) pick the servers."""

import json
import os
import signal
import sys

import redis
import redis_idem
from confluent_kafka import Producer
from redis_idem.kafka import KafkaConsumer

KAFKA = os.environ.get("KAFKA", "localhost:9092")

if sys.argv[1:] == ["produce"]:
    producer = Producer({"bootstrap.servers": KAFKA})
    for n in (1, 2, 3, 3, 4, 5):  # a producer's retry: order 3 again, a new offset
        producer.produce("orders", key=f"order:{n}", value=json.dumps({"id": n, "cents": 100 * n}))
    producer.flush(30)
    sys.exit()

idem = redis_idem.Idem(redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379")),
                       lease=30, max_tries=5)
consumer = KafkaConsumer({"bootstrap.servers": KAFKA, "group.id": "billing", "auto.offset.reset": "earliest",
                          "session.timeout.ms": 30000}, idem, ["orders"],
                         on_settled=lambda m, verdict: print(m.partition(), m.offset(), verdict.action,
                                                             verdict.error or ""))
signal.signal(signal.SIGINT, lambda *_: consumer.stop())
signal.signal(signal.SIGTERM, lambda *_: consumer.stop())


def charge(message, job):
    order = json.loads(message.value())
    print(f"charging order {order['id']}: {order['cents']} cents (attempt {job.attempt})")
    return {"charged": order["cents"]}  # stored by IDEM.DONE; a duplicate replays it


consumer.run(charge)  # until stop(): commits what is done, leaves the group
print(consumer.stats.as_dict())
