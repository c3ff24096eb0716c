"""redis_idem.celery's IdempotentTask: a task sent twice charges once.

Start a worker, then send tasks (`pip install "redis-idem[celery]"`; the
Redis has the module loaded, or functions/idem.lua):

    AMQP=amqp://guest:guest@127.0.0.1:5672/ REDIS=redis://127.0.0.1:6379 \
        celery -A tasks worker --pool=threads --concurrency=4
    AMQP=... REDIS=... python tasks.py 10

`python tasks.py N` sends orders 0..N-1 twice each (a producer's retry: a
new task id, the same order) and prints each result: the second of each
pair is the first's stored result, and the worker's log shows one charge
per order.
"""

import os
import sys
import time

from celery import Celery
from kombu import Exchange, Queue

from redis_idem.celery import IdempotentTask

QUEUE = "example-celery-orders"
app = Celery("example", broker=os.environ["AMQP"], backend=os.environ["REDIS"])
app.conf.update(
    redis_idem_url=os.environ["REDIS"], redis_idem_options={"prefix": "example-celery:", "lease": 30},
    broker_transport_options={"confirm_publish": True},
    task_queues=[Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE)],
    task_default_queue=QUEUE, worker_prefetch_multiplier=1)


@app.task(base=IdempotentTask, bind=True, name="example.charge", max_retries=4,
          idem_key=lambda order: f"order-{order['id']}")
def charge(self, order):
    print(f"charging order {order['id']} (attempt {self.idem_job.attempt})", flush=True)
    return {"order": order["id"], "charged_at": time.time()}


if __name__ == "__main__":
    run = int(time.time())
    results = [charge.delay({"id": f"{run}-{i}"}) for i in range(int(sys.argv[1])) for _ in range(2)]
    for first, again in zip(results[::2], results[1::2]):
        a, b = first.get(timeout=60), again.get(timeout=60)
        print(f"{a['order']}: {'the same result' if a == b else 'two results: ' + repr((a, b))}")
