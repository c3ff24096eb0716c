"""Kafka consumers on the loop (confluent-kafka): `KafkaConsumer` is a
poll loop helper around `confluent_kafka.Consumer` that runs each record's
work once per key with an Idem (docs/clients.md, "Consumers of brokers").
`pip install redis-idem[kafka]`.

    import redis, redis_idem
    from redis_idem.kafka import KafkaConsumer

    idem = redis_idem.Idem(redis.Redis(), lease=30, max_tries=5)
    consumer = KafkaConsumer({"bootstrap.servers": "localhost:9092", "group.id": "billing"}, idem, ["orders"])
    consumer.run(lambda message, job: charge(message.value(), fence=job.attempt))

- The key is the record's key (or a function of the record), never its
  offset: a producer's retry gets a new one.
- Offsets are committed by the helper (auto commit off), per partition up
  to the lowest offset not yet done: a record is done once its record in
  Redis is (a first run or a replay) or it is in the dead-letter topic.
  Commits go every `commit_interval`, and before a partition is revoked
  (after waiting up to `revoke_wait` for the record at work on it).
- A partition's records are worked on one at a time, in order; `workers`
  partitions at once. The poll loop keeps polling meanwhile (so
  `max.poll.interval.ms` is never exceeded, and rebalances are served).
- Busy after the Idem's wait: the partition is sought back to that record
  and paused for the holder's lease left; a failure (released by the
  loop), DONE unconfirmed, a lost lease: the same, for the retry delay.
  The other partitions go on.
- Exhausted (max_tries), Mismatch, MissingKey: produced to `<topic>-dlt`
  (Spring Kafka's name), same partition, with Spring's headers
  (`kafka_dlt-original-topic`, `-partition` (4-byte int), `-offset`
  (8-byte long), `-timestamp`, `-timestamp-type`, `-consumer-group`,
  `kafka_dlt-exception-fqcn`, `-message`), confirmed by the broker; then
  done. The produce runs through the Idem under
  `kafka-dead-letter:<topic>:<partition>:<offset>` (as the Java adapter
  does): a next owner that reads the record again because the commit
  after its letter was lost finds the letter done and sends none.
- After the poll loop was held up (the process stopped or starved), no
  record is started before a synchronous commit confirms this member
  still owns its partitions: a member the group gave up on does not work
  ahead of the partitions' new owners.
- Keep `session.timeout.ms` no longer than the lease (where the broker's
  `group.min.session.timeout.ms` allows): a member that stops then loses
  its partitions when it loses its leases, and their new owner is done
  with a record before the stopped member can wake to write it late.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from ._adapters import ACK, DEAD, HOLD, AdapterStats, Policy, Verdict, error_text, qualified_name, settle
from ._codecs import JsonCodec
from ._job import Job

#: The poll loop sleeps at most this long when it has nothing to do.
POLL_S = 0.1
#: A loop iteration that took longer than this means the process was held up.
STALL_S = 1.0
#: Producer settings taken from the consumer's config for the dead-letter producer.
_SHARED = ("bootstrap.servers", "security.protocol", "client.id", "client.rack", "broker.address.family",
           "socket.", "sasl.", "ssl.")

TP = Tuple[str, int]


def dead_letter_topic(topic: str) -> str:
    """Spring Kafka 4's default name."""
    return f"{topic}-dlt"


class _Partition:
    """One assigned partition: records fetched and not started, the one at
    work, where its done records end, whether it is held back."""

    __slots__ = ("queue", "working", "future", "done_to", "committed", "held_until", "paused", "expect")

    def __init__(self) -> None:
        self.queue: Deque[Any] = deque()
        self.working: Any = None  #: the record at work
        self.future: Optional[Future] = None
        self.done_to: Optional[int] = None  #: every record below this offset is done
        self.committed: Optional[int] = None
        self.held_until: Optional[float] = None
        self.paused = False
        self.expect = -1  #: records below this offset are stale (fetched before a seek)

    def safe_offset(self) -> Optional[int]:
        """The lowest offset not yet done (as far as this member knows)."""
        if self.working is not None:
            return self.working.offset()
        if self.queue:
            return self.queue[0].offset()
        return self.done_to


class KafkaConsumer:
    """A consumer-group member that runs `handler(message, job)` for each
    record (a confluent_kafka.Message and the Job: pass `job.attempt` to
    your writes); what it returns is the stored result.

    `config` is confluent-kafka's Consumer config (`group.id` required);
    the helper sets `enable.auto.commit` and `enable.auto.offset.store`
    false. Options: `key` (a function of the record; default its key),
    `payload` (a function of the record, for MISMATCH), `settings` (a
    function of the record answering process()'s settings for it, as a
    dict), `on_settled(message, verdict)` (called on the poll thread once
    the record is done, dead-lettered or held back), `producer` (for
    the dead letters; default one made from the config's connection
    settings), `dead_letter` (a function of the topic; default
    `<topic>-dlt`), `workers` (partitions at work at once; 1),
    `commit_interval` (seconds; 1), `revoke_wait` (seconds a rebalance
    waits for the record at work on a revoked partition; default the
    Idem's wait), `max_buffered` (records fetched per partition before it
    is paused; 500), `retry_delay` and `max_retry_delay` (a failed record
    comes again after 0.1 s, doubling each attempt, up to 30 s)."""

    def __init__(self, config: Dict[str, Any], idem: Any, topics: Sequence[str], *,
                 key: Optional[Callable[[Any], Any]] = None, payload: Optional[Callable[[Any], Any]] = None,
                 settings: Optional[Callable[[Any], Dict[str, Any]]] = None,
                 on_settled: Optional[Callable[[Any, Verdict], None]] = None,
                 producer: Optional[Producer] = None, dead_letter: Callable[[str], str] = dead_letter_topic,
                 workers: int = 1, commit_interval: float = 1.0, revoke_wait: Optional[float] = None,
                 max_buffered: int = 500, retry_delay: float = 0.1, max_retry_delay: float = 30.0):
        if "group.id" not in config:
            raise ValueError("config: a group.id (the consumer group)")
        for name in ("enable.auto.commit", "enable.auto.offset.store"):
            if str(config.get(name, "false")).lower() not in ("false", "0"):
                raise ValueError(f"config: {name} must be false: the helper commits what is done")
        if workers < 1 or max_buffered < 1:
            raise ValueError("workers and max_buffered: 1 or more")
        self.idem = idem
        self.topics = list(topics)
        self.group = str(config["group.id"])
        self.policy = Policy(key or (lambda message: message.key()), payload, retry_delay, max_retry_delay,
                             settings, on_settled)
        self.consumer = Consumer({**config, "enable.auto.commit": False, "enable.auto.offset.store": False})
        shared = {k: v for k, v in config.items() if k.startswith(_SHARED)}
        self.producer = producer or Producer({**shared, "enable.idempotence": True, "acks": "all"})
        self.dead_letter = dead_letter
        self._letters = _letters_idem(idem)
        self.workers = workers
        self.commit_interval = commit_interval
        self.revoke_wait = float(idem.settings.wait if revoke_wait is None else revoke_wait)
        self.max_buffered = max_buffered
        self.stats = AdapterStats(idem.stats)
        self._parts: Dict[TP, _Partition] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._fenced = False  #: after a stall: nothing starts before a commit confirms the assignment
        self._commit_at = 0.0
        self._last_loop = time.monotonic()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._handler: Any = None
        self._fresh: List[TopicPartition] = []  #: assigned, to be resumed once the assignment is in force

    def stop(self) -> None:
        """Stop taking records: run() returns once the records at work are
        done and committed, and the consumer has left the group (safe from a
        signal handler)."""
        self._stopping = True
        self._wake.set()

    def run(self, handler: Callable[[Any, Job], Any]) -> None:
        """Subscribe, poll and settle records until stop(); then close."""
        self._handler = handler
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="redis-idem kafka")
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        try:
            while not self._stopping:
                self._step()
            while any(p.future is not None for p in self._parts.values()):
                self._poll(POLL_S)
                self._settle_finished()
            self._commit(force=True)
        finally:
            self.consumer.close()  # leaves the group: on_revoke commits what is done
            self._pool.shutdown(wait=True)
            self.producer.flush(5)

    # -- the poll loop ---------------------------------------------------

    def _step(self) -> None:
        now = time.monotonic()
        if now - self._last_loop > STALL_S:
            self._fenced = True
        working = sum(1 for p in self._parts.values() if p.future is not None)
        busy = working > 0
        if busy:  # a worker finishing wakes it; with a worker free, new records are looked for sooner
            self._wake.wait(POLL_S if working >= self.workers else 0.01)
            self._wake.clear()
        self._poll(0 if busy else POLL_S)
        if self._fresh:
            self._resume_assigned()
        self._settle_finished()
        self._resume_due()
        if self._fenced:
            self._fenced = not self._confirm()
        if not self._fenced:
            self._dispatch()
        self._commit()
        self._last_loop = time.monotonic()

    def _poll(self, timeout: float) -> None:
        for message in self.consumer.consume(num_messages=self.max_buffered, timeout=timeout):
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                continue  # informational (partition EOF, a broker's transient error)
            part = self._parts.get((message.topic(), message.partition()))
            if part is None or message.offset() < part.expect:
                continue  # not ours any more, or fetched before a seek
            part.expect = message.offset() + 1
            part.queue.append(message)
            if len(part.queue) >= self.max_buffered and not part.paused:
                self._pause(message.topic(), message.partition(), part)

    def _dispatch(self) -> None:
        free = self.workers - sum(1 for p in self._parts.values() if p.future is not None)
        for (topic, partition), part in self._parts.items():
            if free <= 0:
                return
            if part.future is None and part.held_until is None and part.queue:
                part.working = part.queue.popleft()
                part.future = self._pool.submit(self._work, part.working)  # type: ignore[union-attr]
                part.future.add_done_callback(lambda _: self._wake.set())
                free -= 1
            if part.paused and part.held_until is None and len(part.queue) < self.max_buffered // 2:
                self._resume(topic, partition, part)

    def _work(self, message: Any) -> Verdict:
        """In a worker thread: the record through the loop, and a dead
        letter produced and confirmed."""
        verdict = settle(self.idem, self.policy, message, self._handler)
        if verdict.action == DEAD:
            try:
                self._produce_dead_letter(message, verdict)
            except Exception as e:  # not in the dead-letter topic: not done
                return Verdict(HOLD, self.policy.retry_delay, e)
        return verdict

    def _settle_finished(self) -> None:
        for (topic, partition), part in list(self._parts.items()):
            if part.future is not None and part.future.done():
                self._apply(topic, partition, part, part.future.result())

    def _apply(self, topic: str, partition: int, part: _Partition, verdict: Verdict) -> None:
        message, part.working, part.future = part.working, None, None
        offset = message.offset()
        if verdict.action in (ACK, DEAD):
            part.done_to = offset + 1
            self.stats.add("acknowledged" if verdict.action == ACK else "dead_lettered")
            self.policy.settled(message, verdict)
            return
        # Held back: from that record again, once the delay has passed.
        self.stats.add("held_back")
        part.queue.clear()
        part.expect = offset
        part.done_to = offset
        part.held_until = time.monotonic() + verdict.delay
        try:
            self._pause(topic, partition, part)
            self.consumer.seek(TopicPartition(topic, partition, offset))
        except KafkaException:
            pass  # the partition is going away: its next owner starts from the committed offset
        self.policy.settled(message, verdict)

    def _resume_due(self) -> None:
        now = time.monotonic()
        for (topic, partition), part in self._parts.items():
            if part.held_until is not None and part.held_until <= now:
                part.held_until = None
                if len(part.queue) < self.max_buffered // 2:
                    self._resume(topic, partition, part)

    def _pause(self, topic: str, partition: int, part: _Partition) -> None:
        if not part.paused:
            self.consumer.pause([TopicPartition(topic, partition)])
            part.paused = True

    def _resume(self, topic: str, partition: int, part: _Partition) -> None:
        if part.paused:
            self.consumer.resume([TopicPartition(topic, partition)])
            part.paused = False

    # -- commits -----------------------------------------------------------

    def _offsets(self, parts: Dict[TP, _Partition], all_known: bool = False) -> List[TopicPartition]:
        out = []
        for (topic, partition), part in parts.items():
            offset = part.safe_offset() if all_known else part.done_to
            if offset is not None and (all_known or offset != part.committed):
                out.append(TopicPartition(topic, partition, offset))
        return out

    def _commit(self, force: bool = False, parts: Optional[Dict[TP, _Partition]] = None) -> bool:
        now = time.monotonic()
        if not force and now < self._commit_at:
            return True
        self._commit_at = now + self.commit_interval
        parts = self._parts if parts is None else parts
        offsets = self._offsets(parts)
        if not offsets:
            return True
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            return False  # a rebalance, a lost member: tried again (or by the next owner)
        for tp in offsets:
            part = parts.get((tp.topic, tp.partition))
            if part is not None:
                part.committed = tp.offset
        return True

    def _confirm(self) -> bool:
        """After a stall: a synchronous commit of every partition's lowest
        offset not done, which the group coordinator refuses from a member
        it no longer counts (its generation is stale)."""
        offsets = self._offsets(self._parts, all_known=True)
        unknown = [TopicPartition(t, p) for (t, p), part in self._parts.items() if part.safe_offset() is None]
        try:
            if unknown:
                offsets += [tp for tp in self.consumer.committed(unknown, timeout=10) if tp.offset >= 0]
            if offsets:
                self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException:
            return False
        return True

    # -- rebalances (called inside consume(), on the poll thread) ------------

    def _on_assign(self, consumer: Any, partitions: List[TopicPartition]) -> None:
        for tp in partitions:
            self._parts.setdefault((tp.topic, tp.partition), _Partition())
        self._fresh += [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        self._fenced = False  # a fresh assignment: this member is in the group now

    def _resume_assigned(self) -> None:
        """librdkafka keeps a partition paused across a rebalance that gives
        it back: a partition this member held back before is resumed."""
        fresh, self._fresh = self._fresh, []
        try:
            self.consumer.resume([tp for tp in fresh if not self._paused(tp)])
        except KafkaException:
            pass

    def _paused(self, tp: TopicPartition) -> bool:
        part = self._parts.get((tp.topic, tp.partition))
        return part is None or part.paused

    def _on_revoke(self, consumer: Any, partitions: List[TopicPartition]) -> None:
        """Wait a while for the records at work on these partitions, then
        commit what is done before they go."""
        gone = {(tp.topic, tp.partition): self._parts[(tp.topic, tp.partition)]
                for tp in partitions if (tp.topic, tp.partition) in self._parts}
        deadline = time.monotonic() + self.revoke_wait
        for (topic, partition), part in gone.items():
            if part.future is not None:
                try:
                    verdict = part.future.result(timeout=max(0.0, deadline - time.monotonic()))
                except Exception:
                    continue  # still at work: its outcome is the next owner's to see (a replay)
                if verdict.action in (ACK, DEAD):  # held back: nothing to do on a partition that goes
                    self._apply(topic, partition, part, verdict)
        self._commit(force=True, parts=gone)
        self._forget(gone)
        self._last_loop = time.monotonic()  # waiting here was not a stall

    def _on_lost(self, consumer: Any, partitions: List[TopicPartition]) -> None:
        """Lost (this member was given up on): others own them; commit nothing."""
        self._forget({(tp.topic, tp.partition): self._parts[(tp.topic, tp.partition)]
                      for tp in partitions if (tp.topic, tp.partition) in self._parts})

    def _forget(self, parts: Dict[TP, _Partition]) -> None:
        for tp in parts:
            self._parts.pop(tp, None)  # a record still at work finishes; nobody commits it here

    # -- dead letters ------------------------------------------------------

    def _produce_dead_letter(self, message: Any, verdict: Verdict) -> None:
        kind, stamp = message.timestamp()
        headers = list(message.headers() or []) + [
            ("kafka_dlt-original-topic", message.topic().encode()),
            ("kafka_dlt-original-partition", struct.pack(">i", message.partition())),
            ("kafka_dlt-original-offset", struct.pack(">q", message.offset())),
            ("kafka_dlt-original-timestamp", struct.pack(">q", stamp)),
            ("kafka_dlt-original-timestamp-type", b"LogAppendTime" if kind == 2 else b"CreateTime"),
            ("kafka_dlt-original-consumer-group", self.group.encode()),
            ("kafka_dlt-exception-fqcn", qualified_name(verdict.error).encode()),
            ("kafka_dlt-exception-message", error_text(verdict.error).encode()),
        ]

        def produce(_: Job) -> None:
            delivered: List[Any] = []
            self.producer.produce(self.dead_letter(message.topic()), value=message.value(), key=message.key(),
                                  partition=message.partition(), headers=headers,
                                  on_delivery=lambda err, _: delivered.append(err))
            self.producer.flush(30)
            if not delivered or delivered[0] is not None:
                raise KafkaException(delivered[0] if delivered else KafkaError(KafkaError._MSG_TIMED_OUT))

        key = "kafka-dead-letter:%s:%d:%d" % (message.topic(), message.partition(), message.offset())
        self._letters.process(key, produce)


def _letters_idem(idem: Any) -> Any:
    """An Idem for the dead letters' produces, on the same client and
    prefix: the Idem's settings but no max_tries nor bloom, JSON, no hooks,
    counters of its own."""
    settings = {f.name: getattr(idem.settings, f.name) for f in dataclasses.fields(idem.settings)}
    settings.update(max_tries=None, bloom=None, codec=JsonCodec())
    return type(idem)(idem.client, prefix=idem.commands.prefix, batch=idem.batch, **settings)


__all__ = ["ACK", "DEAD", "HOLD", "KafkaConsumer", "Verdict", "dead_letter_topic"]
