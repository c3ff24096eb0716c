"""Each broker's part of a scenario run: its topology, the producer, what
is left unacknowledged and what reached the dead letter (brokers/README.md
names every queue, topic, header and field)."""

import asyncio
import json
import subprocess
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent


def body(message):
    return json.dumps({k: message[k] for k in ("key", "account", "seq", "kind")}).encode()


class Launched:
    """A broker started with brokers/launch.py for the whole run."""

    name = None

    def __init__(self, dir):
        self.dir = dir
        out = subprocess.run(["python3", str(HERE / "launch.py"), "start", self.name, "--dir", str(dir)],
                             check=True, capture_output=True, text=True)
        self.info = json.loads(out.stdout.strip().splitlines()[-1])

    def close(self):
        subprocess.run(["python3", str(HERE / "launch.py"), "stop", "--dir", str(self.dir)], check=False)


class Kafka(Launched):
    name = "kafka"
    partitions = 6

    def __init__(self, dir):
        super().__init__(dir)
        from confluent_kafka.admin import AdminClient
        self.admin = AdminClient({"bootstrap.servers": self.info["bootstrap"]})

    def setup(self, adapter, env, idem):
        from confluent_kafka.admin import NewTopic
        topic = env["IDEM_SOURCE"]
        futures = self.admin.create_topics([NewTopic(t, self.partitions, 1) for t in (topic, f"{topic}-dlt")])
        for f in futures.values():
            f.result()

    def produce(self, adapter, env, messages, idem):
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.info["bootstrap"], "enable.idempotence": True})
        for m in messages:
            p.produce(env["IDEM_SOURCE"], key=m["key"], value=body(m), partition=m["account"] % self.partitions)
        p.flush(60)

    def read_all(self, topic):
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": self.info["bootstrap"], "group.id": f"check-{uuid.uuid4()}",
                      "enable.auto.commit": False})
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(self.partitions)}
        c.assign([TopicPartition(topic, p, lo) for p, (lo, hi) in ends.items() if hi > lo])
        left = sum(hi - lo for lo, hi in ends.values())
        records = []
        while left > 0:
            r = c.poll(5)
            if r is None:
                break
            if not r.error():
                records.append(r)
                left -= 1
        c.close()
        return records

    def dead_letters(self, adapter, env, idem):
        out = []
        for r in self.read_all(f"{env['IDEM_SOURCE']}-dlt"):
            headers = {k: v for k, v in (r.headers() or [])}
            origin = all(f"kafka_dlt-original-{h}" in headers for h in ("topic", "partition", "offset"))
            out.append({"key": (r.key() or b"").decode(), "origin": origin and "kafka_dlt-exception-message" in headers})
        return out

    def unacked(self, adapter, env, idem):
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition, Consumer
        topic = env["IDEM_SOURCE"]
        group = ConsumerGroupTopicPartitions(env["IDEM_GROUP"], [TopicPartition(topic, p) for p in range(self.partitions)])
        committed = self.admin.list_consumer_group_offsets([group])[env["IDEM_GROUP"]].result().topic_partitions
        c = Consumer({"bootstrap.servers": self.info["bootstrap"], "group.id": f"check-{uuid.uuid4()}"})
        left = 0
        for tp in committed:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            left += hi - (tp.offset if tp.offset >= 0 else lo)
        c.close()
        return left and f"{left} records past the committed offsets"


class RocketMQ(Launched):
    """RocketMQ has no Python client here: the adapter's program produces and
    inspects (`produce`, `inspect`: brokers/README.md)."""

    name = "rocketmq"

    def tool(self, adapter, env, action, stdin=None):
        out = subprocess.run(adapter["command"] + [action], env=env, input=stdin, capture_output=True,
                             text=True, check=True, cwd=HERE.parent)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def setup(self, adapter, env, idem):
        pass

    def produce(self, adapter, env, messages, idem):
        self.tool(adapter, env, "produce", "".join(json.dumps(m) + "\n" for m in messages))

    def dead_letters(self, adapter, env, idem):
        return self.tool(adapter, env, "inspect")["dead_letters"]

    def unacked(self, adapter, env, idem):
        return self.tool(adapter, env, "inspect")["unacked"]


class RabbitMQ(Launched):
    name = "rabbitmq"

    def channel(self):
        import pika
        connection = pika.BlockingConnection(pika.URLParameters(self.info["url"]))
        return connection, connection.channel()

    def setup(self, adapter, env, idem):
        q = env["IDEM_SOURCE"]
        connection, ch = self.channel()
        ch.exchange_declare(f"{q}.dlx", "fanout", durable=True)
        ch.queue_declare(f"{q}.dlq", durable=True)
        ch.queue_bind(f"{q}.dlq", f"{q}.dlx")
        ch.queue_declare(q, durable=True, arguments=self.queue_arguments(q))
        connection.close()

    def queue_arguments(self, q):
        return {"x-queue-type": "quorum", "x-dead-letter-exchange": f"{q}.dlx", "x-delivery-limit": 20}

    def produce(self, adapter, env, messages, idem):
        import pika
        connection, ch = self.channel()
        # In transactions of 500: each commit answers once its messages are
        # in the queue, as a confirm does for one (a confirm per message, on
        # a blocking channel, cost 3.5 ms each: 26 s of a run's 70).
        ch.tx_select()
        for i, m in enumerate(messages, 1):
            ch.basic_publish("", env["IDEM_SOURCE"], body(m),
                             pika.BasicProperties(message_id=m["key"], delivery_mode=2,
                                                  content_type="application/json"))
            if i % 500 == 0:
                ch.tx_commit()
        ch.tx_commit()
        connection.close()

    def dead_letters(self, adapter, env, idem):
        connection, ch = self.channel()
        out = []
        while True:
            method, props, payload = ch.basic_get(f"{env['IDEM_SOURCE']}.dlq", auto_ack=False)
            if method is None:
                break
            key = props.message_id or self.body_key(payload)
            out.append({"key": key, "origin": bool((props.headers or {}).get("x-death"))})
        connection.close()  # unacknowledged: back in the queue
        return out

    def body_key(self, payload):
        return json.loads(payload).get("key")

    def unacked(self, adapter, env, idem):
        import launch
        settings, renv = launch.rabbitmq_env(self.dir)
        # list_queues asks each queue in turn: a message moving from a retry
        # queue to the queue listed before it is in neither answer. Moves
        # take a moment; two listings in a row do not both miss one.
        left = {}
        for _ in range(2):
            out = subprocess.run([launch.rabbitmq_script("rabbitmqctl"), "-n", settings["node"], "-q",
                                  "list_queues", "name", "messages", "messages_unacknowledged"],
                                 env=renv, capture_output=True, text=True, check=True)
            for line in out.stdout.splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0].startswith(env["IDEM_SOURCE"]) and not parts[0].endswith(".dlq"):
                    if int(parts[1]) or int(parts[2]):
                        left[parts[0]] = (int(parts[1]), int(parts[2]))
            if left:
                break
        return left and f"messages (ready, unacknowledged) left in {left}"


class Celery(RabbitMQ):
    """Celery over RabbitMQ: tasks `scenario.work` sent to the queue
    IDEM_SOURCE (a classic queue: Celery's defaults), each re-sent task a
    new task id."""

    def queue_arguments(self, q):
        return {"x-dead-letter-exchange": f"{q}.dlx"}

    def body_key(self, payload):
        # Celery's message protocol 2: the body is [args, kwargs, embed], the task's argument the JSON body.
        return json.loads(json.loads(payload)[0][0]).get("key")

    def produce(self, adapter, env, messages, idem):
        from celery import Celery as App
        from kombu import Exchange, Queue
        q = env["IDEM_SOURCE"]
        app = App("scenario-producer", broker=self.info["url"])
        app.conf.task_queues = [Queue(q, Exchange(q), routing_key=q, queue_arguments=self.queue_arguments(q))]
        for m in messages:
            app.send_task("scenario.work", args=[body(m).decode()], queue=q, routing_key=q,
                          task_id=str(uuid.uuid4()))
        app.close()


class Nats(Launched):
    """JetStream: the stream IDEM_SOURCE, subjects `<stream>.>`; messages on
    `<stream>.in` with the header `Idem-Key`; dead letters on `<stream>.dlq`."""

    name = "nats"

    def run(self, coro):
        return asyncio.run(coro)

    async def connect(self):
        import nats
        nc = await nats.connect(self.info["url"])
        return nc, nc.jetstream()

    def setup(self, adapter, env, idem):
        async def go():
            nc, js = await self.connect()
            s = env["IDEM_SOURCE"]
            await js.add_stream(name=s, subjects=[f"{s}.>"])
            await nc.close()
        self.run(go())

    def produce(self, adapter, env, messages, idem):
        async def go():
            nc, js = await self.connect()
            s = env["IDEM_SOURCE"]
            for m in messages:
                await js.publish(f"{s}.in", body(m), headers={"Idem-Key": m["key"]})
            await nc.close()
        self.run(go())

    def dead_letters(self, adapter, env, idem):
        async def go():
            import nats.errors
            nc, js = await self.connect()
            s = env["IDEM_SOURCE"]
            sub = await js.pull_subscribe(f"{s}.dlq", durable=None, stream=s)
            out = []
            while True:
                try:
                    msgs = await sub.fetch(100, timeout=1)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nats-py 2.16 raises either
                    break
                for m in msgs:
                    h = m.headers or {}
                    out.append({"key": h.get("Idem-Key"),
                                "origin": bool(h.get("Idem-Original-Subject") and h.get("Idem-Original-Sequence"))})
            await nc.close()
            return out
        return self.run(go())

    def unacked(self, adapter, env, idem):
        async def go():
            nc, js = await self.connect()
            info = await js.consumer_info(env["IDEM_SOURCE"], env["IDEM_GROUP"])
            await nc.close()
            return info.num_pending + info.num_ack_pending
        left = self.run(go())
        return left and f"{left} messages pending or awaiting an ack"


class Streams:
    """Redis Streams on the records' own server: the stream IDEM_SOURCE, the
    group IDEM_GROUP, entries with the fields `idem-key` and `body`, dead
    letters in `<stream>:dlq`."""

    def __init__(self, dir):
        self.info = {}

    def close(self):
        pass

    def setup(self, adapter, env, idem):
        idem.client.xgroup_create(env["IDEM_SOURCE"], env["IDEM_GROUP"], id="0", mkstream=True)

    def produce(self, adapter, env, messages, idem):
        pipe = idem.client.pipeline(transaction=False)
        for m in messages:
            pipe.xadd(env["IDEM_SOURCE"], {"idem-key": m["key"], "body": body(m)})
        pipe.execute()

    def dead_letters(self, adapter, env, idem):
        out = []
        for _, fields in idem.client.xrange(f"{env['IDEM_SOURCE']}:dlq"):
            out.append({"key": fields.get(b"idem-key", b"").decode(),
                        "origin": bool(fields.get(b"original-id") and fields.get(b"error") is not None)})
        return out

    def unacked(self, adapter, env, idem):
        # One MULTI: a read between two calls would pass both (nothing
        # pending before it, nothing undelivered after it).
        pipe = idem.client.pipeline(transaction=True)
        pipe.xpending(env["IDEM_SOURCE"], env["IDEM_GROUP"])
        pipe.xinfo_groups(env["IDEM_SOURCE"])
        summary, infos = pipe.execute()
        pending = summary["pending"]
        groups = {g["name"].decode(): g for g in infos}
        lag = groups[env["IDEM_GROUP"]].get("lag") or 0
        return (pending or lag) and f"{pending} entries pending, {lag} never delivered"


BROKERS = {"kafka": Kafka, "rocketmq": RocketMQ, "rabbitmq": RabbitMQ, "celery": Celery, "nats": Nats,
           "streams": Streams}
