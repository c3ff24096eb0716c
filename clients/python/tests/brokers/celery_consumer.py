"""The Celery adapter's consumer program for brokers/scenario.py
(brokers/README.md, "Writing a consumer program"): python-celery, a Celery
worker written as clients/python/README.md shows, configured from the
environment the scenario gives.

The worker runs in this process (app.worker_main), its prefork pool's
children forked from it: the scenario's signals go to the whole process
group, so a SIGKILL kills the worker and the child running the task at
once (its connection closes and RabbitMQ requeues the message: acks_late),
and SIGTERM is Celery's warm shutdown (the task in hand finishes)."""

import json
import os
import time

import redis
from celery import Celery
from kombu import Exchange, Queue

from redis_idem.celery import IdempotentTask

env = os.environ
SOURCE, MEMBER = env["IDEM_SOURCE"], env["IDEM_MEMBER"]
POOL = {"python-celery": "prefork", "python-celery-threads": "threads"}[env["IDEM_ADAPTER"]]

app = Celery("scenario", broker=json.loads(env["BROKER"])["url"])
app.conf.update(
    task_queues=[Queue(SOURCE, Exchange(SOURCE), routing_key=SOURCE,
                       queue_arguments={"x-dead-letter-exchange": f"{SOURCE}.dlx"})],
    task_default_queue=SOURCE,
    worker_prefetch_multiplier=1,
    broker_transport_options={"confirm_publish": True},
    redis_idem_url=env["IDEM_REDIS_URL"],
    redis_idem_options={"lease": int(env["IDEM_LEASE_S"]), "max_tries": int(env["IDEM_MAX_TRIES"])},
)
side = redis.Redis.from_url(env["SIDE_REDIS_URL"])


@app.task(base=IdempotentTask, name="scenario.work", bind=True, idem_key=lambda body: json.loads(body)["key"],
          default_retry_delay=1)
def work(self, body):
    body = json.loads(body)
    if side.evalsha(env["SIDE_START_SHA"], 1, body["key"], body["kind"], MEMBER) == b"fail":
        raise RuntimeError(f"{body['key']}: the work failed")
    time.sleep(int(env["IDEM_SLOW_WORK_MS" if body["kind"] == "slow" else "IDEM_WORK_MS"]) / 1000)
    side.evalsha(env["SIDE_EFFECT_SHA"], 1, body["key"], self.idem_job.attempt, body["account"], body["seq"],
                 MEMBER)
    return {"n": body["seq"]}


if __name__ == "__main__":
    app.worker_main(["worker", f"--pool={POOL}", "--concurrency=1", "--without-gossip", "--without-mingle",
                     "--without-heartbeat", "--loglevel=WARNING", f"--hostname=member{MEMBER}@%h"])
