"""What the sync and asyncio consumer loops share: their settings, counters,
hooks, and the decisions on each CLAIM and DONE reply (JobCore)."""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ._errors import BusyError, ExhaustedError, LeaseLostError, MismatchError, ResultNotStoredError
from ._replies import ClaimReply, DoneReply, Status
from .serializers import JsonSerializer, Serializer

#: What happens to a result too large for the server (over idem.max-result):
#: "complete" completes the record without it (replays then give None, with
#: `result_stored` False) and counts it; "raise" does the same, then raises
#: ResultNotStoredError. Neither re-opens the work.
OVERSIZE_POLICIES = ("complete", "raise")


@dataclass
class Settings:
    lease: int = 30  #: seconds a claim is held between heartbeats
    wait: float = 30.0  #: seconds a duplicate waits on BUSY before BusyError (0: raise at once)
    maxtries: Optional[int] = None  #: MAXTRIES: EXHAUSTED after this many attempts
    retain: Optional[int] = None  #: RETAIN of done records (None: the server's idem.retain)
    bloom: Optional[str] = None  #: a BLOOM filter key for CLAIM and DONE (module only)
    heartbeat: Optional[float] = None  #: seconds between EXTENDs (None: lease / 3)
    serializer: Serializer = field(default_factory=JsonSerializer)
    on_oversize: str = "complete"
    done_retries: int = 5  #: DONE again after a lost connection (safe: same token)
    poll_min: float = 0.02  #: backoff of BUSY polling (Functions edition), seconds
    poll_max: float = 1.0

    def __post_init__(self) -> None:
        if self.on_oversize not in OVERSIZE_POLICIES:
            raise ValueError(f"on_oversize must be one of {OVERSIZE_POLICIES}")
        if self.lease < 1:
            raise ValueError("lease: whole seconds, at least 1")

    def heartbeat_every(self, lease: int) -> float:
        return self.heartbeat if self.heartbeat is not None else lease / 3.0

    def backoff(self, step: int, ms_left: int, remaining: float) -> float:
        """Seconds to sleep before polling a BUSY claim again: doubling from
        poll_min to poll_max, jittered, never past the holder's lease end
        (when it lapses we may take over) nor past our own deadline."""
        pause = min(self.poll_max, self.poll_min * (2**step)) * random.uniform(0.5, 1.0)
        return max(0.001, min(pause, ms_left / 1000.0 + 0.001, remaining))


@dataclass
class Hooks:
    """Callbacks, each given the Job (and what the name says). They tell a
    first run from a replay: on_run for NEW/SEEN/RETRY, on_replay for DONE."""

    on_run: Optional[Callable[[Any], None]] = None
    on_replay: Optional[Callable[[Any], None]] = None
    on_busy: Optional[Callable[[Any, int], None]] = None  # job, ms left on the holder's lease
    on_done: Optional[Callable[[Any, DoneReply], None]] = None
    on_release: Optional[Callable[[Any, BaseException], None]] = None
    on_lost: Optional[Callable[[Any], None]] = None
    on_result_dropped: Optional[Callable[[Any, int], None]] = None  # job, result size


class Stats:
    """Counters, thread-safe: runs (first runs and retries: NEW, SEEN,
    RETRY), retries, seen, replays (DONE), busy (BUSY replies seen), waits,
    completed, already_done, released, lost, mismatch, exhausted,
    busy_timeout, results_dropped, extends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._counts)

    def __repr__(self) -> str:
        return f"Stats({self.snapshot()})"


def fire(hook: Optional[Callable[..., None]], *args: Any) -> None:
    if hook is not None:
        hook(*args)


def refuse(key: Any, reply: ClaimReply, stats: Stats) -> None:
    """Raise for MISMATCH and EXHAUSTED."""
    if reply.status is Status.MISMATCH:
        stats.add("mismatch")
        raise MismatchError(key, "claimed before with another payload: the key was reused for other content",
                            reply.attempt)
    if reply.status is Status.EXHAUSTED:
        stats.add("exhausted")
        raise ExhaustedError(key, f"{reply.attempt} attempts used (MAXTRIES): dead-letter it", reply.attempt)


def busy_timeout(key: Any, reply: ClaimReply, stats: Stats) -> BusyError:
    stats.add("busy_timeout")
    return BusyError(key, reply.ms_left or 0, reply.attempt)


def wait_chunk_ms(remaining: float, socket_timeout: Optional[float]) -> int:
    """The WAIT of one CLAIM: the time left, within the client's socket
    timeout (less a second for the reply's way back)."""
    ms = int(remaining * 1000)
    if socket_timeout:
        ms = min(ms, int((socket_timeout - 1.0) * 1000))
    return max(0, min(ms, 3_600_000))


def socket_timeout_of(client: Any) -> Optional[float]:
    for holder in (getattr(client, "connection_pool", None), getattr(client, "nodes_manager", None)):
        kwargs = getattr(holder, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            return kwargs.get("socket_timeout")
    timeout = getattr(client, "socket_timeout", None)  # asyncio RedisCluster, ...
    return timeout if isinstance(timeout, (int, float)) else None


class JobCore:
    """What a sync Job and an AsyncJob do alike, with no I/O: acting on a
    CLAIM reply and on DONE's. Each subclass starts its own heartbeat (a
    thread, a task) and keeps its own lost flag behind `lost` and `_lose`."""

    _idem: Any
    key: Any
    settings: Settings
    lease: int
    status: Optional[Status]
    token: Optional[str]
    attempt: int
    replayed: bool
    result: Any
    result_stored: bool
    done_reply: Optional[DoneReply]

    def _start_heartbeat(self) -> None:
        raise NotImplementedError

    def _lose(self) -> None:
        raise NotImplementedError

    def _take(self, reply: ClaimReply, heartbeat: bool = True) -> bool:
        """Act on a reply other than BUSY; False for BUSY."""
        idem = self._idem
        self.status, self.attempt = reply.status, reply.attempt
        if reply.claimed:
            self.token = reply.token
            idem.stats.add("runs")
            if reply.status is Status.RETRY:
                idem.stats.add("retries")
            if reply.status is Status.SEEN:
                idem.stats.add("seen")
            if heartbeat:
                self._start_heartbeat()
            fire(idem.hooks.on_run, self)
            return True
        if reply.status is Status.DONE:
            self.replayed = True
            stored = reply.result
            self.result_stored = stored is not None
            self.result = None if stored is None else self.settings.serializer.loads(stored)
            idem.stats.add("replays")
            fire(idem.hooks.on_replay, self)
            return True
        refuse(self.key, reply, idem.stats)
        return False

    def _settle(self, reply: DoneReply, tries: int, oversize: bool, size: int) -> None:
        """Act on DONE's reply, sent `tries` + 1 times, of a result of `size`
        bytes (left out when `oversize`)."""
        idem = self._idem
        self.done_reply = reply
        if reply.already_done and tries == 0:
            # Done by another worker (whose claim came after our lease
            # lapsed) before our DONE: ours ran twice and must not count.
            # (0 after a retry is our own first DONE, whose reply was lost.)
            idem.stats.add("already_done")
            self._lose()
            raise LeaseLostError(self.key, "another worker claimed the key since our claim and completed it",
                                 self.attempt)
        idem.stats.add("completed" if reply.completed else "already_done")
        self.result_stored = not oversize and reply.result_stored
        if not self.result_stored and reply.completed:
            idem.stats.add("results_dropped")
            fire(idem.hooks.on_result_dropped, self, size)
        fire(idem.hooks.on_done, self, reply)
        if oversize and self.settings.on_oversize == "raise":
            raise ResultNotStoredError(self.key, size, self.result)
