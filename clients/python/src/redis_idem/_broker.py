"""What the RabbitMQ and Celery adapters share (redis_idem.rabbitmq,
redis_idem.celery): a message's key, what the end of one process() call
means for its message (acknowledge it, give it back after a delay, or
dead-letter it), and the adapters' counters (docs/clients.md, "Consumers
of brokers"). Each adapter then does what a Verdict says with its
broker's own verbs."""

from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple, Optional

from ._errors import (BusyError, DoneUnconfirmedError, ExhaustedError, HookError, KeyT, LeaseLostError,
                      MismatchError, MissingKeyError, NotDurableError, ResultNotStoredError)
from ._job import Job, Outcome

ACK = "ack"  #: the record is done (a first run or a replay): acknowledge the message
HOLD = "hold"  #: give it back unacknowledged, to come again after `delay` seconds
DEAD = "dead"  #: to the dead letter (no redelivery can change the answer), then acknowledged


class Verdict(NamedTuple):
    action: str
    delay: float = 0.0  #: HOLD: seconds before the message should come again
    error: Optional[BaseException] = None  #: why it was held back or dead-lettered
    outcome: Optional[Outcome] = None  #: ACK after a process() that returned
    value: Any = None  #: ACK: the value the caller gets (the work's, or a replay's)


ADAPTER_COUNTERS = ("acknowledged", "held_back", "dead_lettered")


class AdapterStats:
    """An adapter's counters on top of its Idem's: `acknowledged` (records
    done: first runs and replays), `held_back` (given back unacknowledged:
    Busy, failures, DONE unconfirmed, a lost lease), `dead_lettered`; the
    Idem's read through (`stats.replays`). `as_dict()` gives them all."""

    __slots__ = ADAPTER_COUNTERS + ("_lock", "_idem")

    def __init__(self, idem_stats: Any):
        self._lock = threading.Lock()
        self._idem = idem_stats
        for name in ADAPTER_COUNTERS:
            setattr(self, name, 0)

    def __getattr__(self, name: str) -> Any:  # the Idem's counters
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._idem, name)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def count(self, verdict: Verdict) -> None:
        self.add({ACK: "acknowledged", HOLD: "held_back", DEAD: "dead_lettered"}[verdict.action])

    def as_dict(self) -> dict:
        with self._lock:
            mine = {name: getattr(self, name) for name in ADAPTER_COUNTERS}
        return {**self._idem.as_dict(), **mine}

    def __repr__(self) -> str:
        return f"AdapterStats({self.as_dict()})"


def key_of(key: Callable[..., Any], message: Any, *args: Any, **kwargs: Any) -> KeyT:
    """`key(*args, **kwargs)` as an idempotency key: MissingKeyError (for
    `message`) when it raises or answers None, an empty key or not a str
    or bytes."""
    try:
        found = key(*args, **kwargs)
    except Exception as e:
        raise MissingKeyError(message, e) from e
    if found is None or (isinstance(found, (str, bytes)) and not found):
        raise MissingKeyError(message)
    if not isinstance(found, (str, bytes)):
        raise MissingKeyError(message, TypeError(f"the key function answered {type(found).__name__}, "
                                                 "not str or bytes"))
    return found


class Backoff:
    """The delay before a failed message comes again: `retry_delay`
    seconds after the first try, doubling with each attempt up to
    `max_retry_delay`."""

    def __init__(self, retry_delay: float, max_retry_delay: float):
        if not 0 < retry_delay <= max_retry_delay:
            raise ValueError("retry_delay: seconds, more than 0 and at most max_retry_delay")
        self.retry_delay = float(retry_delay)
        self.max_retry_delay = float(max_retry_delay)

    def after(self, attempt: Optional[int]) -> float:
        tries = max(1, attempt or 1)
        return min(self.max_retry_delay, self.retry_delay * 2 ** min(tries - 1, 30))


def judge(error: BaseException, job: Optional[Job], backoff: Backoff) -> Verdict:
    """What an error out of process() means for its message."""
    if isinstance(error, ResultNotStoredError):
        return Verdict(ACK, error=error, value=error.result)  # completed: the work must not run again
    if isinstance(error, HookError) and error.hook == "on_done":
        return Verdict(ACK, error=error, value=error.result)
    if isinstance(error, BusyError):
        return Verdict(HOLD, max(error.lease_left, backoff.retry_delay), error)
    if isinstance(error, (ExhaustedError, MismatchError, MissingKeyError)):
        return Verdict(DEAD, error=error)
    if isinstance(error, (LeaseLostError, DoneUnconfirmedError, NotDurableError)):
        return Verdict(HOLD, backoff.retry_delay, error)  # the redelivery replays, or fences
    return Verdict(HOLD, backoff.after(job.attempt if job is not None else None), error)  # released by the loop


class Work:
    """The work given to process(): the user's handler with the message,
    keeping the job it ran with (for the failure's backoff)."""

    __slots__ = ("handler", "message", "job")

    def __init__(self, handler: Callable[..., Any], message: Any):
        self.handler = handler
        self.message = message
        self.job: Optional[Job] = None

    def __call__(self, job: Job) -> Any:
        self.job = job
        return self.handler(self.message, job)


def error_text(error: Optional[BaseException], limit: int = 1000) -> str:
    """The error as a message's header carries it: its type and text."""
    if error is None:
        return ""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
