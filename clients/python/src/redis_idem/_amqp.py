"""What redis_idem.rabbitmq's two consumers (pika's and aio-pika's) share:
the default key, the retry queues a message is given back through, a
given-back copy's headers, and their options."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, Optional

from ._broker import DEAD, HOLD, AdapterStats, Backoff, Verdict, error_text, key_of

log = logging.getLogger("redis_idem.rabbitmq")

#: The header a given-back copy carries its failure's error in (read it in the dead letter).
ERROR_HEADER = "idem-error"
#: How long a retry queue may stay unused (no declare) before the broker removes it.
RETRY_QUEUE_EXPIRES_S = 600
#: Header a quorum queue counts redeliveries in: not carried over to a copy.
DELIVERY_COUNT = "x-delivery-count"


def message_id(message: Any) -> Any:
    """The default key: the message's `message_id` property."""
    return message.message_id


def header_key(name: str) -> Callable[[Any], Any]:
    """A key function: the message's header `name` (bytes decoded as UTF-8)."""
    def key(message: Any) -> Any:
        value = (message.headers or {}).get(name)
        return value.decode() if isinstance(value, bytes) else value
    return key


class RetryQueues:
    """The retry queues of `queue`: one per delay in whole seconds, named
    `<queue>.retry.<n>s`, each a durable queue with a message TTL of n
    seconds dead-lettering back to `queue` through the default exchange,
    removed by the broker after RETRY_QUEUE_EXPIRES_S without a declare
    (the consumer declares it before each copy it sends, so a queue is
    never removed with a copy in it). `arguments` adds queue arguments
    (x-queue-type quorum, for a cluster)."""

    def __init__(self, queue: str, arguments: Optional[Dict[str, Any]] = None):
        self.queue = queue
        self.extra = dict(arguments or {})

    def for_delay(self, delay: float) -> "tuple[str, Dict[str, Any]]":
        seconds = max(1, math.ceil(delay - 1e-6))
        arguments = {**self.extra, "x-message-ttl": seconds * 1000, "x-dead-letter-exchange": "",
                     "x-dead-letter-routing-key": self.queue,
                     "x-expires": max(RETRY_QUEUE_EXPIRES_S, 4 * seconds) * 1000}
        return f"{self.queue}.retry.{seconds}s", arguments


def copy_headers(headers: Optional[Dict[str, Any]], error: Optional[BaseException], busy: bool) -> Dict[str, Any]:
    """A given-back copy's headers: the original's, without the quorum
    queue's delivery count, with the failure's error (a Busy keeps the
    last one)."""
    out = {k: v for k, v in (headers or {}).items() if k != DELIVERY_COUNT}
    if error is not None and not busy:
        out[ERROR_HEADER] = error_text(error)
    return out


class Options:
    """What both consumers check and keep."""

    def __init__(self, idem: Any, queue: str, key: Callable[[Any], Any], payload: Optional[Callable[[Any], Any]],
                 retry_delay: float, max_retry_delay: float, retry_queue_arguments: Optional[Dict[str, Any]],
                 delivery_limit: Optional[int]):
        if not callable(key) or (payload is not None and not callable(payload)):
            raise TypeError("key= and payload= take functions of the message")
        max_tries = idem.settings.max_tries
        if delivery_limit is not None and max_tries is not None and delivery_limit <= max_tries:
            raise ValueError(f"the queue's delivery-limit ({delivery_limit}) must be above max_tries ({max_tries}): "
                             "else the broker dead-letters a message before its record is exhausted")
        self.idem = idem
        self.queue = queue
        self.key = key
        self.payload = payload
        self.backoff = Backoff(retry_delay, max_retry_delay)
        self.retries = RetryQueues(queue, retry_queue_arguments)
        self.stats = AdapterStats(idem.stats)

    def begin(self, message: Any) -> "tuple[Any, Any]":
        """The message's key and payload (MissingKeyError without a key)."""
        return key_of(self.key, message, message), None if self.payload is None else self.payload(message)

    def report(self, message: Any, verdict: Verdict, routing: str) -> None:
        self.stats.count(verdict)
        if verdict.action == DEAD:
            log.warning("dead-lettered a message of %s: %s", routing, error_text(verdict.error))
        elif verdict.action == HOLD:
            log.info("gave back a message of %s for %.0f s: %s", routing, verdict.delay, error_text(verdict.error))
