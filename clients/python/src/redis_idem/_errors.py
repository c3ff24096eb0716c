"""Typed exceptions, one per name of docs/clients.md's table. A server's
error reply is a redis.ResponseError subclass carrying the server's text,
so code that catches redis-py's errors keeps working; what the loop raises
about a record derives from IdemError too."""

from __future__ import annotations

from typing import Any, Optional, Union

import redis

KeyT = Union[str, bytes]


class IdemError(redis.ResponseError):
    """Base of every error of this library."""


# Server answers, as the typed commands raise them (and batch replies hold them).


class StaleError(IdemError):
    """STALE: another claim took the key since this token's claim."""


class WrongTypeError(IdemError):
    """WRONGTYPE: the key holds another type (or the other edition's record)."""


class ResultTooLargeError(IdemError):
    """The server refused RESULT: over idem.max-result (or proto-max-bulk-len)."""


class InvalidTokenError(IdemError):
    """ERR invalid token: longer than 32 bytes."""


class ModuleRequiredError(IdemError):
    """The Functions edition cannot do this (WAIT, BLOOM, the filters, the
    raw batch commands): refused before anything is sent."""


class LiveLeaseError(IdemError):
    """IDEM.REQUEUE refused: the record is processing with a live lease
    (its holder is still at work); nothing changed."""


class NotInstalledError(IdemError):
    """The server has neither the module nor the Functions library."""


# What the loop raises about one key's record.


class RecordError(IdemError):
    """An outcome of the loop for `key` (the fencing number in `attempt`)."""

    def __init__(self, key: KeyT, message: str, attempt: Optional[int] = None):
        name = key.decode(errors="replace") if isinstance(key, bytes) else key
        super().__init__(f"{name}: {message}")
        self.key = key
        self.attempt = attempt


class BusyError(RecordError):
    """Still held by another worker when the wait ended; `lease_left` is
    the seconds left on its lease, `owner` who holds it (the holder's
    OWNER, read with one IDEM.GET; None when it has none or the read
    failed)."""

    def __init__(self, key: KeyT, lease_left: float, attempt: Optional[int] = None, owner: Optional[str] = None):
        held_by = f"held by {owner}" if owner else "held by another worker"
        super().__init__(key, f"still {held_by} ({lease_left:.3f} s left on its lease)", attempt)
        self.lease_left = lease_left
        self.owner = owner


class MismatchError(RecordError):
    """The key was claimed before with another payload: reused for other content."""


class ExhaustedError(RecordError):
    """max_tries tries were used: dead-letter the message."""


class MissingKeyError(IdemError):
    """A broker adapter's key function found no key in the message (or
    raised): the message is never processed unclaimed; it goes to the dead
    letter, since no redelivery can give it a key. `message` is the
    broker's message, `cause` what the key function raised (or None)."""

    def __init__(self, message: Any, cause: Optional[BaseException] = None):
        why = f": {cause!r}" if cause is not None else ""
        super().__init__(f"the message has no idempotency key{why}")
        self.message = message
        self.cause = cause


class LeaseLostError(RecordError):
    """This worker's lease lapsed and another claimed the key: its result
    is not the one kept."""


class ResultNotStoredError(RecordError):
    """The record was completed without the result (the codec failed, or
    the result was over idem.max-result with oversize="error"). The work is
    done: do not run it again. `result` is the work's value, `cause` why."""

    def __init__(self, key: KeyT, result: Any, cause: BaseException, attempt: Optional[int] = None):
        super().__init__(key, f"completed, but its result was not stored: {cause}", attempt)
        self.result = result
        self.cause = cause


class HookError(RecordError):
    """A hook raised: on_run before the work (the claim was released), or
    on_done after it (the record is completed; `result` is the work's
    value). `cause` is what the hook raised."""

    def __init__(self, key: KeyT, hook: str, cause: BaseException, result: Any = None,
                 attempt: Optional[int] = None):
        super().__init__(key, f"{hook} raised: {cause!r}", attempt)
        self.hook = hook
        self.cause = cause
        self.result = result


class DoneUnconfirmedError(RecordError):
    """IDEM.DONE could not be confirmed after done_retries tries: do not
    acknowledge the message (its redelivery replays, or retries if the lease
    lapsed first). `result` is the work's value."""

    def __init__(self, key: KeyT, result: Any, cause: BaseException, attempt: Optional[int] = None):
        super().__init__(key, f"DONE not confirmed: {cause}", attempt)
        self.result = result
        self.cause = cause


class NotDurableError(RecordError):
    """`durable`: a WAIT (or WAITAOF) answered fewer acknowledgements than
    asked. `stage` "claim": the claim was released and the work never ran
    (the message is redelivered); "done": the record is done on the primary
    but not yet on enough replicas (do not acknowledge the message;
    `result` is the work's value). `acknowledged`: how many replicas did."""

    def __init__(self, key: KeyT, stage: str, acknowledged: int, wanted: int, result: Any = None,
                 attempt: Optional[int] = None, cause: Optional[BaseException] = None):
        why = f": {cause}" if cause is not None else ""
        super().__init__(key, f"{stage} acknowledged by {acknowledged} of {wanted} replicas{why}", attempt)
        self.stage = stage
        self.acknowledged = acknowledged
        self.result = result
        self.cause = cause


def translate(error: redis.ResponseError) -> redis.ResponseError:
    """The typed exception for a server error reply (the same text)."""
    if isinstance(error, IdemError):
        return error
    text = str(error)
    kind: Any = None
    if text.startswith("STALE"):
        kind = StaleError
    elif text.startswith("WRONGTYPE"):
        kind = WrongTypeError
    elif "idem.max-result" in text or "proto-max-bulk-len" in text:
        kind = ResultTooLargeError
    elif text.startswith("invalid token") or text.startswith("ERR invalid token"):
        kind = InvalidTokenError
    elif "processing with a live lease" in text:
        kind = LiveLeaseError
    elif "needs the redis-idem module" in text:
        kind = ModuleRequiredError
    if kind is None:
        return error
    typed = kind(text)
    typed.__cause__ = error
    return typed


#: Answers of a command the server did not run: sent again (a claim while
#: time is left; a DONE within done_retries). TRYAGAIN: writes paused or
#: the record moving; UNBLOCKED: a waiter woken by a failover, a resharding
#: or CLIENT UNBLOCK; READONLY: a demoted primary (Sentinel's client then
#: finds the new one); MASTERDOWN, LOADING: a replica promoted or loading;
#: MOVED, ASK, CLUSTERDOWN: a cluster node that no longer (or not yet) serves the slot.
NOT_RUN = ("TRYAGAIN", "UNBLOCKED", "READONLY", "MASTERDOWN", "LOADING", "MOVED", "ASK", "CLUSTERDOWN")
_NOT_RUN_TYPES = (redis.exceptions.TryAgainError, redis.exceptions.ReadOnlyError,
                  redis.exceptions.BusyLoadingError, redis.exceptions.MovedError,  # redis-py strips
                  redis.exceptions.AskError, redis.exceptions.ClusterDownError)  # the code from these


def not_run(error: BaseException) -> bool:
    """The server answered without running the command."""
    if isinstance(error, _NOT_RUN_TYPES):
        return True
    return isinstance(error, redis.ResponseError) and str(error).startswith(NOT_RUN)


def retryable_claim(error: BaseException) -> bool:
    """A CLAIM that wrote nothing, or whose connection was lost (a failover:
    the client below reconnects; a lost claim that was granted lapses with
    its lease, and this one waits on it): it may be sent again."""
    return not_run(error) or isinstance(error, (redis.ConnectionError, redis.TimeoutError))
