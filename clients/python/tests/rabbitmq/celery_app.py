"""The Celery app the Celery tests run workers of (`celery -A celery_app
worker`), configured from the environment: CELERY_TEST_BROKER,
CELERY_TEST_REDIS (the records, the result backend and the effects),
CELERY_TEST_PREFIX, CELERY_TEST_QUEUE."""

import asyncio
import os
import time

import redis
from celery import Celery
from kombu import Exchange, Queue

from redis_idem.celery import IdempotentTask, stats_for

REDIS, PREFIX, QUEUE = os.environ["CELERY_TEST_REDIS"], os.environ["CELERY_TEST_PREFIX"], os.environ["CELERY_TEST_QUEUE"]

app = Celery("idem_test", broker=os.environ["CELERY_TEST_BROKER"], backend=REDIS)
app.conf.update(
    task_queues=[Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE,
                       queue_arguments={"x-dead-letter-exchange": f"{QUEUE}.dlx"})],
    task_default_queue=QUEUE,
    worker_prefetch_multiplier=1,
    broker_transport_options={"confirm_publish": True},
    redis_idem_url=REDIS,
    redis_idem_options={"prefix": PREFIX, "lease": 2},
)
side = redis.Redis.from_url(REDIS)
by_id = {"idem_key": lambda order: order["id"], "default_retry_delay": 1}


def _record(task, order):
    side.rpush(f"{PREFIX}started:{order['id']}", os.getpid())
    if order.get("fail") and side.incr(f"{PREFIX}fails:{order['id']}") <= order["fail"]:
        raise RuntimeError("boom")
    time.sleep(order.get("sleep", 0))
    side.rpush(f"{PREFIX}effects:{order['id']}", task.idem_job.attempt)
    return {"id": order["id"], "n": order.get("n")}


@app.task(base=IdempotentTask, bind=True, name="t.record", **by_id)
def record(self, order):
    return _record(self, order)


@app.task(base=IdempotentTask, bind=True, name="t.record_nowait", idem_settings={"wait": 0}, **by_id)
def record_nowait(self, order):
    return _record(self, order)


@app.task(base=IdempotentTask, bind=True, name="t.always_fails", max_retries=1, **by_id)
def always_fails(self, order):
    side.rpush(f"{PREFIX}started:{order['id']}", os.getpid())
    raise RuntimeError("poison")


@app.task(base=IdempotentTask, bind=True, name="t.arecord", **by_id)
async def arecord(self, order):
    await asyncio.sleep(0.01)
    side.rpush(f"{PREFIX}effects:{order['id']}", self.idem_job.attempt)
    return {"id": order["id"], "async": True}


@app.task(base=IdempotentTask, name="t.keyless", idem_key=lambda order: order.get("missing"))
def keyless(order):
    side.rpush(f"{PREFIX}started:{order['id']}", os.getpid())


@app.task(name="t.stats")
def stats(_order=None):
    """This worker process's counters (a plain task: not counted itself)."""
    return stats_for(app).as_dict()
