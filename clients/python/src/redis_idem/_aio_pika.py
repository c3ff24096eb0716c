"""redis_idem.rabbitmq's consumer for aio-pika (asyncio), with an AsyncIdem:
the same rules as PikaConsumer's (see redis_idem.rabbitmq)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, Optional

from ._amqp import Options, copy_headers, message_id
from ._broker import ACK, DEAD, HOLD, Verdict, Work, judge
from ._errors import BusyError, MissingKeyError
from ._job import Job

log = logging.getLogger("redis_idem.rabbitmq")


class AioPikaConsumer:
    """A consumer of `queue` on an aio-pika connection, with an AsyncIdem.

    `await run(handler)` consumes until stop(): each delivered message is
    its own task (aio-pika's), up to `prefetch` at once (the channel's
    QoS), running `await handler(message, job)` (an
    `aio_pika.abc.AbstractIncomingMessage`; a plain function will do too)
    in `idem.process`. `callback(handler)` is the same as a callback for
    `await queue.consume(...)` on a queue of the user's (that channel's
    QoS is then the user's). Give-backs are published on a channel of the
    consumer's own with publisher confirms.

    The options are PikaConsumer's (redis_idem.rabbitmq); `stats` has the
    AsyncIdem's counters and `acknowledged`, `held_back`,
    `dead_lettered`."""

    def __init__(self, idem: Any, connection: Any, queue: str, *, key: Callable[[Any], Any] = message_id,
                 payload: Optional[Callable[[Any], Any]] = None, prefetch: int = 10, retry_delay: float = 1.0,
                 max_retry_delay: float = 60.0, retry_queue_arguments: Optional[Dict[str, Any]] = None,
                 delivery_limit: Optional[int] = None):
        if prefetch < 1:
            raise ValueError("prefetch: 1 or more")
        self._s = Options(idem, queue, key, payload, retry_delay, max_retry_delay,
                            retry_queue_arguments, delivery_limit)
        self.stats = self._s.stats
        self.connection = connection
        self.prefetch = prefetch
        self._publisher: Any = None
        self._publisher_lock: Optional[asyncio.Lock] = None
        self._in_flight = 0
        self._stopping = False
        self._stopped: Optional[asyncio.Event] = None
        self._drained: Optional[asyncio.Event] = None

    async def run(self, handler: Callable[[Any, Job], Any]) -> None:
        """Consume `queue` on a channel of its own until stop() (then the
        messages in hand finish, and their acknowledgements are sent)."""
        self._events()
        channel = await self.connection.channel()
        try:
            await channel.set_qos(prefetch_count=self.prefetch)
            queue = await channel.get_queue(self._s.queue, ensure=False)
            tag = await queue.consume(self.callback(handler))
            assert self._stopped is not None and self._drained is not None
            await self._stopped.wait()
            await queue.cancel(tag)
            if self._in_flight:
                self._drained.clear()
                await self._drained.wait()
        finally:
            for ch in (channel, self._publisher):
                if ch is not None and not ch.is_closed:
                    await ch.close()

    def stop(self) -> None:
        """Stop taking messages: the ones in hand finish, the ones not
        started go back to the queue, and run() returns. Call it on the
        event loop's thread (loop.add_signal_handler(SIGTERM, consumer.stop))."""
        self._stopping = True
        self._events()
        assert self._stopped is not None
        self._stopped.set()

    def callback(self, handler: Callable[[Any, Job], Any]) -> Callable[[Any], Any]:
        async def on_message(message: Any) -> None:
            self._events()
            self._in_flight += 1
            try:
                if self._stopping:
                    await message.nack(requeue=True)
                    return
                verdict = await self._verdict(handler, message)
                await self._finish(message, verdict)
            except Exception as e:  # a closed channel: the broker redelivers the message itself
                log.warning("could not settle a message of %s: %r", self._s.queue, e)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0 and self._drained is not None:
                    self._drained.set()
        return on_message

    def _events(self) -> None:
        if self._stopped is None:
            self._stopped, self._drained = asyncio.Event(), asyncio.Event()
            if self._stopping:
                self._stopped.set()

    async def _verdict(self, handler: Callable[[Any, Job], Any], message: Any) -> Verdict:
        work = Work(handler, message)
        try:
            key, payload = self._s.begin(message)
            outcome = await self._s.idem.process_outcome(key, work, payload=payload)
        except MissingKeyError as e:
            return Verdict(DEAD, error=e)
        except Exception as e:
            return judge(e, work.job, self._s.backoff)
        return Verdict(ACK, outcome=outcome, value=outcome.value)

    async def _finish(self, message: Any, verdict: Verdict) -> None:
        if verdict.action == ACK:
            await message.ack()
        elif verdict.action == DEAD:
            await message.reject(requeue=False)
        elif verdict.action == HOLD:
            await self._give_back(message, verdict)
        self._s.report(message, verdict, message.routing_key)

    async def _give_back(self, message: Any, verdict: Verdict) -> None:
        import aio_pika

        name, arguments = self._s.retries.for_delay(verdict.delay)
        copy = aio_pika.Message(
            message.body, headers=copy_headers(message.headers, verdict.error, isinstance(verdict.error, BusyError)),
            content_type=message.content_type, content_encoding=message.content_encoding,
            delivery_mode=message.delivery_mode, priority=message.priority, correlation_id=message.correlation_id,
            reply_to=message.reply_to, expiration=message.expiration, message_id=message.message_id,
            timestamp=message.timestamp, type=message.type, app_id=message.app_id)
        try:
            publisher = await self._publishing_channel()
            await publisher.declare_queue(name, durable=True, arguments=arguments)
            await publisher.default_exchange.publish(copy, routing_key=name, mandatory=True)  # confirmed, or raises
        except Exception:
            await message.nack(requeue=True)  # given back at once
            raise
        await message.ack()

    async def _publishing_channel(self) -> Any:
        if self._publisher_lock is None:
            self._publisher_lock = asyncio.Lock()
        async with self._publisher_lock:
            if self._publisher is None or self._publisher.is_closed:
                self._publisher = await self.connection.channel(publisher_confirms=True)
            return self._publisher
