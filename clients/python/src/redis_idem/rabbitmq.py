"""RabbitMQ consumers on the loop: `PikaConsumer` (pika's
BlockingConnection, with an Idem) and `AioPikaConsumer` (aio-pika, with an
AsyncIdem) run each message's work once per key (docs/clients.md,
"Consumers of brokers"). `pip install redis-idem[rabbitmq]` (pika) or
`redis-idem[aio-pika]`.

    import pika, redis, redis_idem
    from redis_idem.rabbitmq import PikaConsumer

    idem = redis_idem.Idem(redis.Redis(), lease=30, max_tries=5)
    connection = pika.BlockingConnection(pika.URLParameters("amqp://localhost/"))
    consumer = PikaConsumer(idem, connection, "orders")
    consumer.run(lambda message, job: charge(message.body, fence=job.attempt))

- The key is the message's `message_id` property (or a function of the
  message: `key=header_key("order-id")`), never its delivery tag.
- Manual acknowledgement: a message is acknowledged once its record is
  done (its work ran and DONE was confirmed, or it was a replay).
- Busy after the Idem's wait, and failures (released by the loop), DONE
  unconfirmed, a lost lease: given back after a delay without spinning. A
  copy goes to a retry queue `<queue>.retry.<n>s` (declared by the
  consumer: a message TTL of n seconds, dead-lettering back to `<queue>`
  through the default exchange), confirmed by the broker, and only then is
  the original acknowledged. The delay is the holder's lease left for
  Busy, `retry_delay` doubling per attempt up to `max_retry_delay` for a
  failure, rounded up to whole seconds (one queue per delay, each removed
  by the broker after 10 minutes unused). RabbitMQ has no delayed requeue
  of its own (the delayed-message exchange is a plugin); a nack with
  requeue would come back at once, and on a quorum queue it would spend
  the broker's delivery-limit.
- Exhausted (max_tries), Mismatch, MissingKey: rejected without requeue,
  so the broker moves the message to the queue's dead-letter exchange
  (`x-death` says where from; `idem-error` carries the last failure's
  error when there was one). A queue without `x-dead-letter-exchange`
  drops it, as RabbitMQ does.
- Quorum queues: give-backs are new messages, so the broker's
  `x-delivery-count` counts only deliveries lost with a channel (a crash,
  a consumer stopped); give `delivery_limit=` (the queue's
  `x-delivery-limit`) and it is checked to be above max_tries, so the
  record's Exhausted, not the broker, decides the dead letter.
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, NamedTuple, Optional

from ._aio_pika import AioPikaConsumer
from ._amqp import ERROR_HEADER, Options, RetryQueues, copy_headers, header_key, message_id
from ._broker import ACK, DEAD, HOLD, Verdict, Work, judge
from ._errors import BusyError, MissingKeyError
from ._job import Job

log = logging.getLogger("redis_idem.rabbitmq")

#: Not a verdict: a message not started when the consumer stopped, returned to its queue.
_RETURN = "return"


class Delivery(NamedTuple):
    """A message as PikaConsumer gives it to the key function and the
    handler: pika's `channel`, `method` (Basic.Deliver: delivery_tag,
    routing_key, redelivered), `properties` (BasicProperties) and `body`."""

    channel: Any
    method: Any
    properties: Any
    body: bytes

    @property
    def message_id(self) -> Optional[str]:
        return self.properties.message_id

    @property
    def headers(self) -> Dict[str, Any]:
        return self.properties.headers or {}


class PikaConsumer:
    """A consumer of `queue` for pika's BlockingConnection, with an Idem.

    `run(handler)` consumes until stop(): each message is handed to one of
    `workers` threads, which runs `handler(message, job)` (a Delivery) in
    `idem.process`; every channel operation happens on the connection's
    thread (pika is not thread-safe), which meanwhile keeps serving the
    connection (its AMQP heartbeats) however long the work takes.
    `callback(handler)` is the same as an `on_message_callback` for a
    channel of that connection (`channel.basic_consume(queue,
    consumer.callback(handler))`, `channel.start_consuming()`).

    `prefetch` (default: `workers`) is the channel's QoS; `key(message)`
    and `payload(message)` as for process(); `retry_delay`,
    `max_retry_delay`, `retry_queue_arguments`, `delivery_limit` as the
    module says. `stats` has the Idem's counters and `acknowledged`,
    `held_back`, `dead_lettered`."""

    def __init__(self, idem: Any, connection: Any, queue: str, *, key: Callable[[Any], Any] = message_id,
                 payload: Optional[Callable[[Any], Any]] = None, workers: int = 1, prefetch: Optional[int] = None,
                 retry_delay: float = 1.0, max_retry_delay: float = 60.0,
                 retry_queue_arguments: Optional[Dict[str, Any]] = None, delivery_limit: Optional[int] = None):
        if workers < 1 or (prefetch is not None and prefetch < 1):
            raise ValueError("workers and prefetch: 1 or more")
        self._s = Options(idem, queue, key, payload, retry_delay, max_retry_delay, retry_queue_arguments,
                            delivery_limit)
        self.stats = self._s.stats
        self.connection = connection
        self.workers = workers
        self.prefetch = prefetch or workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="redis-idem rabbitmq")
        self._publisher: Any = None
        self._channels: Dict[int, "tuple[Any, set]"] = {}  # channel number: (channel, consumer tags)
        self._in_flight = 0
        self._stopping = threading.Event()

    def run(self, handler: Callable[[Delivery, Job], Any]) -> None:
        """Consume `queue` on a channel of its own until stop() (then the
        messages in hand finish, and their acknowledgements are sent)."""
        channel = self.connection.channel()
        channel.basic_qos(prefetch_count=self.prefetch)
        tag = channel.basic_consume(self._s.queue, self.callback(handler))
        self._channels[channel.channel_number] = (channel, {tag})
        try:
            if not self._stopping.is_set():
                channel.start_consuming()  # returns once stop() cancelled the consumer
            self.drain()
        finally:
            self._pool.shutdown(wait=True)
            for ch in (channel, self._publisher):
                if ch is not None and ch.is_open:
                    ch.close()

    def drain(self) -> None:
        """Serve the connection until every message handed to a worker is
        settled (acknowledged, given back or dead-lettered): after stop(),
        for a user's own start_consuming() with callback()."""
        while self._in_flight > 0 and self.connection.is_open:
            self.connection.process_data_events(time_limit=0.2)

    def stop(self) -> None:
        """Stop taking messages: the ones in hand finish, the ones not
        started go back to the queue, and run() returns. Thread-safe, and
        safe from a signal handler."""
        self._stopping.set()
        try:
            self.connection.add_callback_threadsafe(self._cancel)
        except Exception:  # the connection is closed: nothing to stop
            pass

    def callback(self, handler: Callable[[Delivery, Job], Any]) -> Callable[..., None]:
        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            self._channels.setdefault(channel.channel_number, (channel, set()))[1].add(method.consumer_tag)
            self._in_flight += 1
            self._pool.submit(self._work, handler, Delivery(channel, method, properties, body))
        return on_message

    # On a worker thread.

    def _work(self, handler: Callable[[Delivery, Job], Any], message: Delivery) -> None:
        verdict = Verdict(_RETURN) if self._stopping.is_set() else self._verdict(handler, message)
        try:
            self.connection.add_callback_threadsafe(functools.partial(self._finish, message, verdict))
        except Exception:  # the connection is gone: the broker gives the message back itself
            log.info("connection closed before a message's outcome could be sent: it is redelivered")

    def _verdict(self, handler: Callable[[Delivery, Job], Any], message: Delivery) -> Verdict:
        work = Work(handler, message)
        try:
            key, payload = self._s.begin(message)
            outcome = self._s.idem.process_outcome(key, work, payload=payload)
        except MissingKeyError as e:
            return Verdict(DEAD, error=e)
        except Exception as e:
            return judge(e, work.job, self._s.backoff)
        return Verdict(ACK, outcome=outcome, value=outcome.value)

    # On the connection's thread.

    def _finish(self, message: Delivery, verdict: Verdict) -> None:
        channel, tag = message.channel, message.method.delivery_tag
        try:
            if verdict.action == ACK:
                channel.basic_ack(tag)
            elif verdict.action == DEAD:
                channel.basic_reject(tag, requeue=False)
            elif verdict.action == HOLD:
                self._give_back(message, verdict)
            else:
                channel.basic_nack(tag, requeue=True)
        except Exception as e:  # a closed channel: the broker redelivers the message itself
            log.warning("could not settle a message of %s: %r", self._s.queue, e)
        else:
            if verdict.action != _RETURN:
                self._s.report(message, verdict, message.method.routing_key)
        self._in_flight -= 1

    def _give_back(self, message: Delivery, verdict: Verdict) -> None:
        import pika

        name, arguments = self._s.retries.for_delay(verdict.delay)
        p = message.properties
        copy = pika.BasicProperties(
            content_type=p.content_type, content_encoding=p.content_encoding,
            headers=copy_headers(p.headers, verdict.error, isinstance(verdict.error, BusyError)),
            delivery_mode=p.delivery_mode, priority=p.priority, correlation_id=p.correlation_id,
            reply_to=p.reply_to, expiration=p.expiration, message_id=p.message_id, timestamp=p.timestamp,
            type=p.type, app_id=p.app_id)
        try:
            publisher = self._publishing_channel()
            publisher.queue_declare(name, durable=True, arguments=arguments)
            publisher.basic_publish("", name, message.body, copy, mandatory=True)  # confirmed, or raises
        except Exception:
            if self._publisher is not None and not self._publisher.is_open:
                self._publisher = None
            message.channel.basic_nack(message.method.delivery_tag, requeue=True)  # given back at once
            raise
        message.channel.basic_ack(message.method.delivery_tag)

    def _publishing_channel(self) -> Any:
        if self._publisher is None:
            self._publisher = self.connection.channel()
            self._publisher.confirm_delivery()
        return self._publisher

    def _cancel(self) -> None:
        """Cancel every consumer this one's callback served (pika nacks
        what they had delivered and not yet dispatched): start_consuming()
        returns once its channel has none left."""
        for channel, tags in self._channels.values():
            for tag in list(tags):
                if channel.is_open:
                    channel.basic_cancel(tag)
                tags.discard(tag)


__all__ = ["AioPikaConsumer", "Delivery", "ERROR_HEADER", "PikaConsumer", "RetryQueues", "header_key", "message_id"]
