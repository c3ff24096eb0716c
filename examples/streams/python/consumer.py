"""Orders from a Redis stream, each charged once however often it is
delivered (redis_idem.streams). Needs a Redis with the redis-idem module
(or functions/idem.lua loaded) and `pip install "redis-idem[streams]"`
(from a checkout: `pip install "./clients/python[streams]"`).

    python consumer.py produce    # XADD 5 orders, the third one twice
    python consumer.py            # charge them; Ctrl-C to stop

REDIS_URL picks the server (default redis://localhost:6379)."""

import json
import os
import signal
import sys

import redis
import redis_idem
from redis_idem.streams import StreamConsumer

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://localhost:6379"))

if sys.argv[1:] == ["produce"]:
    for n in (1, 2, 3, 3, 4, 5):  # a producer's retry: order 3 again, a new entry id
        r.xadd("orders", {"idem-key": f"order:{n}", "body": json.dumps({"id": n, "cents": 100 * n})})
    sys.exit()

idem = redis_idem.Idem(r, lease=30, max_tries=5)
consumer = StreamConsumer(idem, "orders", "billing", consumer="worker-1",
                          on_settled=lambda entry, verdict: print(entry.id, verdict.action, verdict.error or ""))
signal.signal(signal.SIGINT, lambda *_: consumer.stop())
signal.signal(signal.SIGTERM, lambda *_: consumer.stop())


def charge(entry, job):
    order = json.loads(entry.field("body"))
    print(f"charging order {order['id']}: {order['cents']} cents (attempt {job.attempt})")
    return {"charged": order["cents"]}  # stored by IDEM.DONE; a duplicate replays it


consumer.run(charge)
print(consumer.stats.as_dict())
