"""NATS JetStream pull consumers on the loop (nats-py, asyncio):
`JetStreamConsumer` runs each message's work once per key with an
AsyncIdem (docs/clients.md, "Consumers of brokers"). `pip install
redis-idem[nats]`.

    import nats, redis.asyncio, redis_idem
    from redis_idem.nats import JetStreamConsumer

    idem = redis_idem.AsyncIdem(redis.asyncio.Redis(), lease=30, max_tries=5)
    js = (await nats.connect()).jetstream()
    consumer = await JetStreamConsumer.subscribe(js, idem, "orders.in", durable="billing", stream="orders")
    await consumer.run(handle)          # async def handle(msg, job): ...

- The key is the header `Idem-Key` (or a function of the message), never
  the stream sequence: a publisher's retry gets a new one.
- The durable consumer's ack wait is the Idem's lease, and each heartbeat
  that keeps the lease also sends `in_progress()`: the ack wait follows
  the lease, so a member that stops (dies, is paused) loses both together.
- Acknowledged only once the record is done (a first run or a replay),
  with `ack_sync()`: the server confirms the ack (JetStream's double ack).
- Busy: `nak(delay=<the holder's lease left>)`; a failure: released by the
  loop and `nak(delay=<retry delay>)`; DONE unconfirmed, lease lost, not
  durable: `nak` too. Never acknowledged, never spun on.
- Exhausted (max_tries), Mismatch, MissingKey: the message copied to
  `<stream>.dlq` (a subject the stream must take: `<stream>.>`), headers
  `Idem-Key`, `Idem-Original-Subject`, `Idem-Original-Sequence`,
  `Idem-Error`, confirmed by the stream and deduplicated by it (its
  `Nats-Msg-Id`), then `term()`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, Optional

import nats.errors
from nats.js import api

from ._adapters import ACK, DEAD, HOLD, AdapterStats, Policy, Verdict, error_text, settle_async
from ._errors import RecordError
from ._job import Job
from ._pump import pump

KEY_HEADER = "Idem-Key"
#: After a connection error, wait this long before fetching again.
RECONNECT_PAUSE = 0.2
#: A header value carries no line breaks, and a dead letter's error is cut to this.
MAX_HEADER = 1024


def _header(value: str) -> str:
    return " ".join(str(value).split())[:MAX_HEADER]


def default_key(header: str) -> Callable[[Any], Any]:
    return lambda msg: (msg.headers or {}).get(header)


class JetStreamConsumer:
    """A pull subscription's messages through an AsyncIdem. Make it with
    `await JetStreamConsumer.subscribe(js, idem, subject, durable=...,
    stream=...)` (the durable consumer made with the ack wait it needs), or
    from a pull subscription of yours (`JetStreamConsumer(sub, idem, js=js)`:
    give it an ack wait of at least the lease).

    `handler(msg, job)`: the work, async (a plain function will do); what
    it returns is the stored result. Options: `key` (a header name, or a
    function of the message; default `Idem-Key`), `payload` (a function of
    the message, for MISMATCH), `settings` (a function of the message
    answering process()'s settings for it, as a dict), `on_settled(msg,
    verdict)` (called once the message was acked, given back or
    dead-lettered), `dead_letter` (a function of the message
    answering the subject; default `<stream>.dlq`), `concurrency`
    (messages at work at once; 1), `fetch_timeout` (seconds a fetch waits; 1),
    `ack_timeout` (seconds an ack_sync waits for the server; 5),
    `retry_delay` and `max_retry_delay` (a failed message comes again after
    0.1 s, doubling each attempt, up to 30 s)."""

    def __init__(self, sub: Any, idem: Any, *, js: Any, key: Any = KEY_HEADER,
                 payload: Optional[Callable[[Any], Any]] = None,
                 settings: Optional[Callable[[Any], Dict[str, Any]]] = None,
                 on_settled: Optional[Callable[[Any, Verdict], None]] = None,
                 dead_letter: Optional[Callable[[Any], str]] = None, concurrency: int = 1,
                 fetch_timeout: float = 1.0, ack_timeout: float = 5.0, retry_delay: float = 0.1,
                 max_retry_delay: float = 30.0):
        if concurrency < 1:
            raise ValueError("concurrency: 1 or more")
        self.sub = sub
        self.js = js
        self.idem = idem
        self.policy = Policy(default_key(key) if isinstance(key, str) else key, payload, retry_delay,
                             max_retry_delay, settings, on_settled)
        self.dead_letter = dead_letter or (lambda msg: f"{msg.metadata.stream}.dlq")
        self.concurrency = concurrency
        self.fetch_timeout = fetch_timeout
        self.ack_timeout = ack_timeout
        self.stats = AdapterStats(idem.stats)
        self._stopping = False
        self._owns_sub = False

    @classmethod
    async def subscribe(cls, js: Any, idem: Any, subject: str, *, durable: str, stream: Optional[str] = None,
                        config: Optional[api.ConsumerConfig] = None, **options: Any) -> "JetStreamConsumer":
        """`js.pull_subscribe(subject, durable=..., stream=...)` with a
        consumer config whose `ack_wait` is the Idem's lease (unless
        `config` sets one) and `max_deliver` unlimited (unless set: Busy
        and failures are deliveries too; `max_tries` is what ends a poison
        message)."""
        config = config or api.ConsumerConfig()
        if config.ack_wait is None:
            config.ack_wait = float(idem.settings.lease)
        if config.max_deliver is None:
            config.max_deliver = -1
        sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        consumer = cls(sub, idem, js=js, **options)
        consumer._owns_sub = True
        return consumer

    def stop(self) -> None:
        """Stop fetching: run() returns once the messages in hand are settled
        (loop.add_signal_handler(signal.SIGTERM, consumer.stop))."""
        self._stopping = True

    async def run(self, handler: Callable[[Any, Job], Any]) -> None:
        """Fetch and settle messages until stop(); then a subscription
        made by subscribe() is unsubscribed (the durable consumer stays),
        so that `nc.drain()` does not wait on it."""

        async def fetch(count: int) -> list:
            try:
                return await self.sub.fetch(count, timeout=self.fetch_timeout)
            except asyncio.TimeoutError:  # nats-py raises its own subclass, or asyncio's
                return []
            except nats.errors.Error:
                await asyncio.sleep(RECONNECT_PAUSE)
                return []

        await pump(fetch, lambda msg: self.handle(msg, handler), self.concurrency, lambda: self._stopping)
        if self._owns_sub:
            await self.sub.unsubscribe()

    async def handle(self, msg: Any, handler: Callable[[Any, Job], Any]) -> Verdict:
        """One message, to its end: acknowledged, given back (nak) or
        dead-lettered (then term)."""

        def on_job(job: Job) -> None:
            job._on_extend = msg.in_progress  # the ack wait follows the lease

        verdict = await settle_async(self.idem, self.policy, msg, handler, on_job=on_job)
        try:
            if verdict.action == ACK:
                await msg.ack_sync(timeout=self.ack_timeout)
                self.stats.add("acknowledged")
            elif verdict.action == DEAD:
                try:
                    await self.js.publish(self.dead_letter(msg), msg.data, headers=self._dead_headers(msg, verdict))
                except (nats.errors.Error, asyncio.TimeoutError) as e:
                    verdict = Verdict(HOLD, self.policy.retry_delay, e)  # not stored: try again later
                    await msg.nak(delay=verdict.delay)
                    self.stats.add("held_back")
                    self.policy.settled(msg, verdict)
                    return verdict
                await msg.term()
                self.stats.add("dead_lettered")
            else:
                await msg.nak(delay=verdict.delay)
                self.stats.add("held_back")
        except (nats.errors.Error, asyncio.TimeoutError):
            # Not acknowledged (or not dead-lettered): the ack wait brings
            # it back, to replay (or to go to the dead letter then).
            return verdict
        self.policy.settled(msg, verdict)
        return verdict

    def _dead_headers(self, msg: Any, verdict: Verdict) -> Dict[str, str]:
        meta = msg.metadata
        headers = dict(msg.headers or {})
        if isinstance(verdict.error, RecordError):
            key = verdict.error.key
            headers[KEY_HEADER] = key.decode(errors="replace") if isinstance(key, bytes) else key
        headers["Idem-Original-Subject"] = msg.subject
        headers["Idem-Original-Sequence"] = str(meta.sequence.stream)
        headers["Idem-Error"] = _header(error_text(verdict.error))
        # The stream keeps one copy however often this message is dead-lettered.
        headers["Nats-Msg-Id"] = f"idem-dlq:{meta.stream}:{meta.sequence.stream}"
        return headers


__all__ = ["ACK", "DEAD", "HOLD", "JetStreamConsumer", "KEY_HEADER", "Verdict"]
