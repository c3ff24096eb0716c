"""redis_idem.kafka against a real Kafka: what brokers/scenario.py does not
see from outside (a Busy partition paused while the others go on, the
commit on revoke, Spring Kafka's dead-letter headers)."""

from __future__ import annotations

import struct
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import redis_idem as ri
from redis_idem.kafka import KafkaConsumer
from servers import wait_for


@pytest.fixture
def topic(kafka):  # type: ignore[no-untyped-def]
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": kafka["bootstrap"]})
    for f in admin.create_topics([NewTopic(name, 2, 1), NewTopic(f"{name}-dlt", 2, 1)]).values():
        f.result()
    return name


def produce(kafka, topic, records, producer=None):  # type: ignore[no-untyped-def]
    p = producer or Producer({"bootstrap.servers": kafka["bootstrap"]})
    for partition, key, value in records:
        p.produce(topic, key=key, value=value, partition=partition)
    p.flush(30)


def config(kafka, group, **extra):  # type: ignore[no-untyped-def]
    return {"bootstrap.servers": kafka["bootstrap"], "group.id": group, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, **extra}


def committed(kafka, topic, group, partitions=2):  # type: ignore[no-untyped-def]
    c = Consumer({"bootstrap.servers": kafka["bootstrap"], "group.id": group})
    try:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)]
    finally:
        c.close()


def run_until(consumer, handler, done, what, timeout=60):  # type: ignore[no-untyped-def]
    """run() in a thread until done() (else a failure after the timeout); then stop and join."""
    thread = threading.Thread(target=consumer.run, args=(handler,))
    thread.start()
    try:
        wait_for(done, what, timeout)
    finally:
        consumer.stop()
        thread.join(60)
    assert not thread.is_alive()


def test_a_busy_partition_waits_for_the_holders_lease_while_the_others_go_on(kafka, topic, r, ns):  # type: ignore[no-untyped-def]
    idem = ri.Idem(r, prefix=ns, lease=5, wait=0)
    consumer = KafkaConsumer(config(kafka, f"g-{topic}"), idem, [topic])
    seen, clock = [], {}
    thread = threading.Thread(target=consumer.run, args=(
        lambda m, job: seen.append((m.value(), time.monotonic() - clock.get("held", 0.0), job.status)),))
    thread.start()
    try:
        # The group joins and the producer gets its id first (seconds on a loaded machine, once
        # 10 s), so that the holder's lease below is measured against this consumer alone.
        producer = Producer({"bootstrap.servers": kafka["bootstrap"]})
        produce(kafka, topic, [(1, b"warm", b"warm-up")], producer)
        wait_for(lambda: len(seen) == 1, "the warm-up record worked", 60)
        holder = ri.IdemCommands(r, prefix=ns).claim(b"held", 8)  # another worker, its lease 8 s
        clock["held"] = time.monotonic()
        produce(kafka, topic, [(0, b"held", b"p0-1"), (0, b"a", b"p0-2"), (1, b"b", b"p1-1"), (1, b"c", b"p1-2")],
                producer)
        wait_for(lambda: len(seen) == 5, "the four records worked", 60)
    finally:
        consumer.stop()
        thread.join(60)
    assert not thread.is_alive()
    seen = seen[1:]
    order = [v for v, _, _ in seen]
    at = {v: t for v, t, _ in seen}
    assert holder.status is ri.Status.NEW
    # Partition 1 went on at once; partition 0 waited for the holder's lease, then kept its order.
    assert at[b"p1-1"] < 7 and at[b"p1-2"] < 7
    assert at[b"p0-1"] >= 7.5 and order.index(b"p0-1") < order.index(b"p0-2")
    assert dict((v, s) for v, _, s in seen)[b"p0-1"] is ri.Status.RETRY
    assert consumer.stats.held_back >= 1 and consumer.stats.acknowledged == 5
    assert committed(kafka, topic, f"g-{topic}") == [2, 3]


def test_exhausted_and_keyless_records_go_to_the_dead_letter_topic_with_springs_headers(kafka, topic, r, ns):  # type: ignore[no-untyped-def]
    produce(kafka, topic, [(1, b"poison", b"v1"), (1, None, b"no key"), (1, b"ok", b"v3")])
    idem = ri.Idem(r, prefix=ns, lease=5, max_tries=2)
    consumer = KafkaConsumer(config(kafka, f"g-{topic}"), idem, [topic], retry_delay=0.1)
    tries = []

    def work(message, job):  # type: ignore[no-untyped-def]
        tries.append(message.key())
        if message.key() == b"poison":
            raise RuntimeError("always fails")
        return "ok"

    run_until(consumer, work, lambda: consumer.stats.dead_lettered == 2 and consumer.stats.acknowledged == 1,
              "two dead letters, one record acknowledged")
    assert tries == [b"poison", b"poison", b"ok"]  # max_tries 2, then Exhausted; the keyless one never ran
    assert committed(kafka, topic, f"g-{topic}") == [-1001, 3]
    reader = Consumer({"bootstrap.servers": kafka["bootstrap"], "group.id": f"dlt-{topic}",
                       "auto.offset.reset": "earliest"})
    reader.assign([TopicPartition(f"{topic}-dlt", 1, 0)])
    letters = []
    deadline = time.monotonic() + 20
    while len(letters) < 2 and time.monotonic() < deadline:
        m = reader.poll(1)
        if m is not None and not m.error():
            letters.append(m)
    reader.close()
    assert [(m.key(), m.value(), m.partition()) for m in letters] == [(b"poison", b"v1", 1), (None, b"no key", 1)]
    headers = [dict(m.headers()) for m in letters]
    for offset, h in enumerate(headers):
        assert h["kafka_dlt-original-topic"] == topic.encode()
        assert struct.unpack(">i", h["kafka_dlt-original-partition"]) == (1,)
        assert struct.unpack(">q", h["kafka_dlt-original-offset"]) == (offset,)
        assert len(h["kafka_dlt-original-timestamp"]) == 8
        assert h["kafka_dlt-original-consumer-group"] == f"g-{topic}".encode()
    assert headers[0]["kafka_dlt-exception-fqcn"] == b"redis_idem.ExhaustedError"
    assert headers[0]["kafka_dlt-exception-message"].startswith(b"ExhaustedError: poison: 2 tries used")
    assert headers[1]["kafka_dlt-exception-fqcn"] == b"redis_idem.MissingKeyError"


def test_a_records_dead_letter_is_sent_once_even_when_its_commit_is_lost(kafka, topic, r, ns):  # type: ignore[no-untyped-def]
    produce(kafka, topic, [(0, b"poison", b"v1"), (0, b"ok", b"v2")])

    def work(message, job):  # type: ignore[no-untyped-def]
        if message.key() == b"poison":
            raise RuntimeError("always fails")
        return "ok"

    first = KafkaConsumer(config(kafka, f"g-{topic}"), ri.Idem(r, prefix=ns, lease=5, max_tries=1), [topic])
    run_until(first, work, lambda: first.stats.dead_lettered == 1 and first.stats.acknowledged == 1,
              "the first group past both records")
    # Another group from the topic's start, as the partition's next owner after a lost commit.
    ran = []
    again = KafkaConsumer(config(kafka, f"again-{topic}"), ri.Idem(r, prefix=ns, lease=5, max_tries=1), [topic])
    run_until(again, lambda m, job: ran.append(m.key()),
              lambda: again.stats.dead_lettered == 1 and again.stats.acknowledged == 1, "the second group past both records")
    assert ran == [] and again.stats.dead_lettered == 1 and again.stats.acknowledged == 1
    assert ri.IdemCommands(r, prefix=ns).get(f"kafka-dead-letter:{topic}:0:0").state is ri.RecordState.DONE
    low, high = Consumer({"bootstrap.servers": kafka["bootstrap"], "group.id": f"w-{topic}"}).get_watermark_offsets(
        TopicPartition(f"{topic}-dlt", 0), timeout=10)
    assert high - low == 1  # one dead letter


def test_a_revoked_partition_commits_what_is_done_before_it_goes(kafka, topic, r, ns):  # type: ignore[no-untyped-def]
    produce(kafka, topic, [(p, f"k{p}-{i}".encode(), b"v") for p in (0, 1) for i in range(5)])
    group = f"g-{topic}"
    idem = ri.Idem(r, prefix=ns, lease=5)
    # No periodic commit within the test: only a revoke (or stop) commits.
    first = KafkaConsumer(config(kafka, group), idem, [topic], commit_interval=3600)
    done = []
    thread = threading.Thread(target=first.run, args=(lambda m, job: done.append(m.key()),))
    thread.start()
    deadline = time.monotonic() + 60
    while len(done) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(done) == 10
    time.sleep(0.5)
    assert committed(kafka, topic, group) == [-1001, -1001]
    # A second member joins: the rebalance revokes the first one's partitions,
    # which commits them before they go.
    second = KafkaConsumer(config(kafka, group), ri.Idem(r, prefix=ns, lease=5), [topic])
    again = []
    other = threading.Thread(target=second.run, args=(lambda m, job: again.append(m.key()),))
    other.start()
    deadline = time.monotonic() + 60
    while committed(kafka, topic, group) != [5, 5] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert committed(kafka, topic, group) == [5, 5]
    for c, t in ((second, other), (first, thread)):
        c.stop()
        t.join(60)
    assert first.stats.acknowledged == 10 and second.stats.acknowledged == 0 and again == []
