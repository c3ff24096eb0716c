"""Typed exceptions. Every server error is a redis.ResponseError subclass, so
code that catches redis-py's errors keeps working; the server's text is
passed through unchanged as the message."""

from __future__ import annotations

from typing import Any, Optional, Union

import redis


class IdemError(redis.ResponseError):
    """An error reply of a redis-idem command."""


class StaleError(IdemError):
    """STALE: another claim took the key since this token's claim."""


class WrongTypeError(IdemError):
    """WRONGTYPE: the key holds another type (or the other edition's record)."""


class ResultTooLargeError(IdemError):
    """The RESULT is over idem.max-result (or would make the record larger
    than proto-max-bulk-len)."""


class InvalidTokenError(IdemError):
    """ERR invalid token: longer than 32 bytes."""


class UnsupportedError(IdemError):
    """What the server's edition cannot do (WAIT, BLOOM, the batch commands
    and the filters on the Functions edition). Raised before anything is
    sent, or passed through from the server's own refusal."""


class NotInstalledError(redis.RedisError):
    """The server has neither the module nor the Functions library."""


# What the consumer loop raises.


class ProcessError(Exception):
    """Base of what `process()` raises about a record (not a server error)."""

    def __init__(self, key: Union[str, bytes], message: str, attempt: Optional[int] = None):
        name = key.decode(errors="replace") if isinstance(key, bytes) else key
        super().__init__(f"{name}: {message}")
        self.key = key
        self.attempt = attempt


class MismatchError(ProcessError):
    """The key was claimed before with another PAYLOAD: reused for other content."""


class ExhaustedError(ProcessError):
    """MAXTRIES attempts were used: dead-letter it."""


class BusyError(ProcessError):
    """Another worker still holds a live lease after the whole wait."""

    def __init__(self, key: Union[str, bytes], ms_left: int, attempt: int):
        super().__init__(key, f"still held by another worker ({ms_left} ms left on its lease)", attempt)
        self.ms_left = ms_left


class LeaseLostError(ProcessError):
    """Another worker claimed the key since our claim (STALE on EXTEND or
    DONE): it finishes the work; ours must not take effect."""


class ResultNotStoredError(ProcessError):
    """The record was completed, but the result was too large to store (the
    `on_oversize="raise"` policy). The work is done: do not run it again."""

    def __init__(self, key: Union[str, bytes], size: int, result: Any):
        super().__init__(key, f"completed, but its {size}-byte result was not stored (over idem.max-result)")
        self.size = size
        self.result = result


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
    elif "needs the redis-idem module" in text:
        kind = UnsupportedError
    if kind is None:
        return error
    typed = kind(text)
    typed.__cause__ = error
    return typed
