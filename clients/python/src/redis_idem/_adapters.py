"""What every broker adapter shares (redis_idem.kafka, .nats, .streams):
a message's key, what one process() call's end means for the broker
(acknowledge it, give it back with a delay, or dead-letter it), and the
adapters' counters. The adapters only do what a Verdict says, each with its
broker's own verbs (docs/clients.md, "Consumers of brokers")."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional

from ._errors import (BusyError, DoneUnconfirmedError, ExhaustedError, HookError, KeyT, LeaseLostError,
                      MismatchError, MissingKeyError, NotDurableError, ResultNotStoredError)
from ._job import AfterDone, Job, Outcome
from ._settings import _Counters, quiet

#: What to do with a message once its process() call ended.
ACK = "ack"  #: its record is done (a first run or a replay): acknowledge it
HOLD = "hold"  #: give it back, not acknowledged, to come again after `delay`
DEAD = "dead"  #: to the dead letter (with the error), then acknowledge it


class Verdict(NamedTuple):
    action: str
    delay: float = 0.0  #: HOLD: seconds before it should be delivered again
    error: Optional[BaseException] = None  #: why it was held back or dead-lettered
    outcome: Optional[Outcome] = None  #: ACK: the call's Outcome (None when the record was completed by an error path)


ADAPTER_COUNTERS = ("acknowledged", "held_back", "dead_lettered")


class AdapterStats(_Counters):
    """An adapter's counters on top of its Idem's (`idem.stats`):
    `acknowledged` (records done, first runs and replays), `held_back`
    (given back unacknowledged: Busy, failures, DONE unconfirmed, lease
    lost), `dead_lettered`. `as_dict()` gives these and the Idem's."""

    __slots__ = ADAPTER_COUNTERS + ("_idem",)
    _names = ADAPTER_COUNTERS

    def __init__(self, idem_stats: Any):
        super().__init__()
        self._idem = idem_stats

    def as_dict(self) -> dict:
        return {**self._idem.as_dict(), **self._own()}

    def __repr__(self) -> str:
        return f"AdapterStats({self.as_dict()})"


def _present(key: Any) -> bool:
    return key is not None and not (isinstance(key, (str, bytes)) and not key)


class Policy:
    """One adapter's choices: `key(message)` (None or empty: MissingKey),
    `payload(message)` (optional, for MISMATCH), `settings(message)`
    (optional: process()'s settings for this message, as a dict), the delay
    before a failed message comes again (`retry_delay` seconds after the
    first try, doubling with each attempt up to `max_retry_delay`), and
    `on_settled(message, verdict)`, called once the broker was told."""

    def __init__(self, key: Callable[[Any], Optional[KeyT]], payload: Optional[Callable[[Any], Any]],
                 retry_delay: float, max_retry_delay: float,
                 settings: Optional[Callable[[Any], Dict[str, Any]]] = None,
                 on_settled: Optional[Callable[[Any, Verdict], None]] = None):
        for name, fn in (("payload", payload), ("settings", settings), ("on_settled", on_settled)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}=: a function of the message")
        if not callable(key):
            raise TypeError("key=: a function of the message (or the name of its field or header)")
        if not 0 < retry_delay <= max_retry_delay:
            raise ValueError("retry_delay: seconds, more than 0 and at most max_retry_delay")
        self.key = key
        self.payload = payload
        self.settings = settings
        self.on_settled = on_settled
        self.retry_delay = float(retry_delay)
        self.max_retry_delay = float(max_retry_delay)

    def settings_for(self, idem: Any, message: Any) -> Any:
        return idem.settings if self.settings is None else idem._settings(self.settings(message))

    def settled(self, message: Any, verdict: Verdict) -> None:
        quiet(self.on_settled, message, verdict)

    def key_of(self, message: Any) -> KeyT:
        try:
            key = self.key(message)
        except Exception as e:
            raise MissingKeyError(message, e) from e
        if not _present(key):
            raise MissingKeyError(message)
        if not isinstance(key, (str, bytes)):
            raise MissingKeyError(message, TypeError(f"the key function answered {type(key).__name__}, "
                                                     "not str or bytes"))
        return key

    def payload_of(self, message: Any) -> Any:
        return None if self.payload is None else self.payload(message)

    def failure_delay(self, attempt: Optional[int]) -> float:
        tries = max(1, attempt or 1)
        return min(self.max_retry_delay, self.retry_delay * 2 ** min(tries - 1, 30))

    def judge(self, error: BaseException, job: Optional[Job]) -> Verdict:
        """What an error out of process() means for the message."""
        if isinstance(error, ResultNotStoredError) or (isinstance(error, HookError) and error.hook == "on_done"):
            return Verdict(ACK, error=error)  # the record is completed: the work must not run again
        if isinstance(error, BusyError):
            return Verdict(HOLD, max(error.lease_left, self.retry_delay), error)
        if isinstance(error, (ExhaustedError, MismatchError, MissingKeyError)):
            return Verdict(DEAD, error=error)  # no redelivery can change it
        if isinstance(error, (LeaseLostError, DoneUnconfirmedError, NotDurableError)):
            return Verdict(HOLD, self.retry_delay, error)  # the redelivery replays, or fences
        return Verdict(HOLD, self.failure_delay(job.attempt if job is not None else None), error)


class _Work:
    """The work given to process(): the user's handler with the message,
    and the job it ran with (for the failure's delay)."""

    __slots__ = ("handler", "message", "on_job", "job")

    def __init__(self, handler: Callable[..., Any], message: Any, on_job: Optional[Callable[[Job], None]]):
        self.handler = handler
        self.message = message
        self.on_job = on_job
        self.job: Optional[Job] = None

    def __call__(self, job: Job) -> Any:
        self.job = job
        if self.on_job is not None:
            self.on_job(job)
        return self.handler(self.message, job)


def _prepare(idem: Any, policy: Policy, message: Any) -> tuple:
    """The message's key, payload and settings; a Verdict DEAD when the key
    or payload cannot be made (no key, a malformed message: no redelivery
    helps). A settings function that raises is a bug: it goes up."""
    try:
        key, payload = policy.key_of(message), policy.payload_of(message)
    except Exception as e:
        return None, None, None, Verdict(DEAD, error=e)
    return key, payload, policy.settings_for(idem, message), None


def settle(idem: Any, policy: Policy, message: Any, handler: Callable[[Any, Job], Any],
           after: Optional[Callable[[KeyT], Optional[AfterDone]]] = None,
           on_job: Optional[Callable[[Job], None]] = None) -> Verdict:
    """One message through an Idem's loop: its Verdict. `after(key)` gives
    the commands that ride with DONE (or None)."""
    key, payload, settings, refused = _prepare(idem, policy, message)
    if refused is not None:
        return refused
    work = _Work(handler, message, on_job)
    try:
        outcome = idem._process_after(key, work, payload, after and after(key), settings)
    except Exception as e:
        return policy.judge(e, work.job)
    return Verdict(ACK, outcome=outcome)


async def settle_async(idem: Any, policy: Policy, message: Any, handler: Callable[[Any, Job], Any],
                       after: Optional[Callable[[KeyT], Optional[AfterDone]]] = None,
                       on_job: Optional[Callable[[Job], None]] = None) -> Verdict:
    """settle() on an AsyncIdem; the handler may be async."""
    key, payload, settings, refused = _prepare(idem, policy, message)
    if refused is not None:
        return refused
    work = _Work(handler, message, on_job)
    try:
        outcome = await idem._process_after(key, work, payload, after and after(key), settings)
    except Exception as e:
        return policy.judge(e, work.job)
    return Verdict(ACK, outcome=outcome)


def error_text(error: Optional[BaseException]) -> str:
    """The error as a dead letter carries it: its type and message."""
    if error is None:
        return ""
    return f"{type(error).__name__}: {error}"


def qualified_name(error: Optional[BaseException]) -> str:
    if error is None:
        return ""
    kind = type(error)
    module = "redis_idem" if kind.__module__.startswith("redis_idem.") else kind.__module__
    return f"{module}.{kind.__qualname__}"


__all__: List[str] = []
