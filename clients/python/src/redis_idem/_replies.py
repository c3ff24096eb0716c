"""Typed replies of the redis-idem commands (docs/commands.md)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, List, Mapping, NamedTuple, Optional, Union

Value = Union[bytes, str]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Edition(str, enum.Enum):
    """Which edition of redis-idem a server runs."""

    MODULE = "module"  #: the Rust module (IDEM.* commands)
    FUNCTIONS = "functions"  #: functions/idem.lua (FCALL idem_*)


class Status(str, enum.Enum):
    """The first element of IDEM.CLAIM's reply."""

    NEW = "NEW"
    SEEN = "SEEN"
    RETRY = "RETRY"
    DONE = "DONE"
    BUSY = "BUSY"
    MISMATCH = "MISMATCH"
    EXHAUSTED = "EXHAUSTED"

    @property
    def claimed(self) -> bool:
        """True for NEW, SEEN and RETRY: the caller now holds the claim."""
        return self in (Status.NEW, Status.SEEN, Status.RETRY)


@dataclass(frozen=True)
class ClaimReply:
    """`[status, value, attempt]` of IDEM.CLAIM (and of each key of MCLAIM)."""

    status: Status
    value: Any  #: token, stored result, ms left on the lease, or None
    attempt: int

    @classmethod
    def parse(cls, reply: Any) -> "ClaimReply":
        status, value, attempt = reply
        known = _STATUSES.get(status)  # a dict look-up: this runs once per message
        return cls(Status(_text(status)) if known is None else known, value, int(attempt))

    @property
    def claimed(self) -> bool:
        return self.status.claimed

    @property
    def token(self) -> Optional[str]:
        """The claim's token for NEW, SEEN and RETRY, else None."""
        return _text(self.value) if self.claimed else None

    @property
    def result(self) -> Optional[Value]:
        """The stored result for DONE (None when none was stored), else None."""
        return self.value if self.status is Status.DONE else None

    @property
    def lease_left(self) -> Optional[float]:
        """Seconds left on the holder's lease for BUSY, else None."""
        return int(self.value) / 1000.0 if self.status is Status.BUSY else None


_STATUSES = {**{s.value.encode(): s for s in Status}, **{s.value: s for s in Status}}


@dataclass(frozen=True)
class DoneReply:
    """IDEM.DONE's integer decoded: 1, 3, 5 or 7 completed the record now
    (3 and 7: the RESULT was not stored, 5 and 7: the BLOOM add was not
    made), 0: it was done already and nothing changed."""

    code: int

    @property
    def completed(self) -> bool:
        """This call completed the record."""
        return bool(self.code & 1)

    @property
    def already_done(self) -> bool:
        return self.code == 0

    @property
    def result_stored(self) -> bool:
        """This call completed the record and stored its RESULT (if one was given)."""
        return self.completed and not self.code & 2

    @property
    def bloom_added(self) -> bool:
        """This call completed the record and made its BLOOM add (if one was asked)."""
        return self.completed and not self.code & 4

    def __bool__(self) -> bool:
        return self.completed


class RecordState(str, enum.Enum):
    PROCESSING = "processing"
    EXPIRED = "expired"
    RELEASED = "released"
    DONE = "done"


def _pairs(reply: Any) -> Mapping[str, Any]:
    """A RESP3 map (dict) or a RESP2 flat field-value array, as a dict."""
    if isinstance(reply, Mapping):
        return {_text(k): v for k, v in reply.items()}
    items = list(reply)
    return {_text(items[i]): items[i + 1] for i in range(0, len(items), 2)}


@dataclass(frozen=True)
class Record:
    """IDEM.GET's reply."""

    state: RecordState
    attempt: int
    lease_ms: int
    pttl: int
    claimed_at: int
    done_at: int
    result: Optional[Value]
    fingerprint: Optional[str]
    #: Claims since the latest requeue (what MAXTRIES counts); None from a
    #: server older than IDEM.REQUEUE.
    tries: Optional[int] = None
    #: Who holds (or last held) the claim: the latest claim's OWNER; None
    #: when it sent none, the record is done, or the server is older.
    owner: Optional[str] = None

    @classmethod
    def parse(cls, reply: Any) -> Optional["Record"]:
        if reply is None:
            return None
        f = _pairs(reply)
        fingerprint = f.get("fingerprint")
        return cls(
            state=RecordState(_text(f["state"])),
            attempt=int(f["attempt"]),
            lease_ms=int(f["lease_ms"]),
            pttl=int(f["pttl"]),
            claimed_at=int(f["claimed_at"]),
            done_at=int(f["done_at"]),
            result=f.get("result"),
            fingerprint=None if fingerprint is None else _text(fingerprint),
            tries=int(f["tries"]) if "tries" in f else None,
            owner=None if f.get("owner") is None else _text(f["owner"]),
        )


@dataclass(frozen=True)
class ShardInfo:
    start: int  #: Unix seconds
    items: int
    filters: int
    bytes: int


@dataclass(frozen=True)
class FilterInfo:
    """IDEM.BF.INFO's reply."""

    error_rate: float
    capacity: int
    window: int
    shard: int  #: period in seconds
    expansion: int
    items: int
    bytes: int
    shards: List[ShardInfo] = field(default_factory=list)

    @classmethod
    def parse(cls, reply: Any) -> Optional["FilterInfo"]:
        if reply is None:
            return None
        f = _pairs(reply)
        shards = []
        for s in f.get("shards") or []:
            p = _pairs(s)
            shards.append(ShardInfo(int(p["start"]), int(p["items"]), int(p["filters"]), int(p["bytes"])))
        return cls(
            error_rate=float(_text(f["error_rate"])),
            capacity=int(f["capacity"]),
            window=int(f["window"]),
            shard=int(f["shard"]),
            expansion=int(f["expansion"]),
            items=int(f["items"]),
            bytes=int(f["bytes"]),
            shards=shards,
        )


class DoneItem(NamedTuple):
    """One item of `done_many` (a plain `(key, token)` or `(key, token,
    result)` tuple will do too): `result` bytes or str, or None for none."""

    key: Union[str, bytes]
    token: Any
    result: Optional[Value] = None


class ReleaseItem(NamedTuple):
    """One item of `release_many` (a plain `(key, token)` tuple will do too)."""

    key: Union[str, bytes]
    token: Any


class BatchStatus:
    """`BatchItem.status` of process_many, as str constants."""

    PROCESSED = "processed"  #: the work ran and its record is done
    REPLAYED = "replayed"  #: a stored completion: `value` is its decoded result
    BUSY = "busy"  #: held by another worker: not waited for
    FAILED = "failed"  #: the work (or on_run) raised: released; `error` is that
    LOST = "lost"  #: the lease lapsed and another worker claimed: LeaseLostError
    MISMATCH = "mismatch"
    EXHAUSTED = "exhausted"
    NOT_DURABLE = "not_durable"  #: durable: the claim (or DONE) was not acknowledged: NotDurableError
    ERROR = "error"  #: the key's own error (WrongTypeError, DoneUnconfirmedError, ...)
