"""The loop's settings, counters and hooks (docs/clients.md's defaults),
resolved once when an Idem is made."""

from __future__ import annotations

import inspect
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple, Union

from ._codecs import Codec, JsonCodec
from ._errors import KeyT
from ._protocol import whole_seconds

OVERSIZE = ("complete", "error")


class _DefaultOwner:
    """`owner`'s default: host:pid, the host name as gethostname(2) gives
    it; read again in a forked child (a worker pool's processes each have
    their own)."""

    _value: Optional[str] = None

    def value(self) -> str:
        if self._value is None:
            pid = str(os.getpid())
            host = socket.gethostname().encode()[: 63 - len(pid)].decode(errors="ignore")  # OWNER: 64 bytes at most
            self._value = f"{host}:{pid}"
        return self._value

    def forget(self) -> None:
        self._value = None

    def __repr__(self) -> str:
        return "DEFAULT_OWNER"


#: `owner=DEFAULT_OWNER` (the default): host:pid.
DEFAULT_OWNER = _DefaultOwner()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=DEFAULT_OWNER.forget)


@dataclass(frozen=True)
class Durable:
    """`durable=Durable(replicas=1)`: every claim that grants work, and
    every DONE, is followed on the same connection by `WAIT replicas
    timeout` (with `fsync`: `WAITAOF 1 replicas timeout`, Redis 7.2+ and
    Valkey 8+ with appendonly). `timeout` in seconds (> 0)."""

    replicas: int = 1
    timeout: float = 1.0
    fsync: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise ValueError(f"Durable.replicas: 0 or more (got {self.replicas!r})")
        if not self.timeout > 0:
            raise ValueError(f"Durable.timeout: seconds, more than 0 (got {self.timeout!r})")

    def command(self) -> list:
        ms = max(1, int(self.timeout * 1000))
        return ["WAITAOF", 1, self.replicas, ms] if self.fsync else ["WAIT", self.replicas, ms]

    def acknowledged(self, reply: Any) -> tuple:
        """(enough, how many acknowledged) from WAIT's or WAITAOF's reply."""
        if isinstance(reply, BaseException):
            return False, 0
        if self.fsync:
            local, replicas = (int(x) for x in reply)
            return local >= 1 and replicas >= self.replicas, replicas
        return int(reply) >= self.replicas, int(reply)


@dataclass
class Settings:
    """The loop's settings (docs/clients.md's defaults), on Idem(...) and per call."""

    lease: int = 30  #: seconds a claim is held between heartbeats (whole, >= 1)
    wait: float = 10.0  #: seconds a duplicate waits for the copy in flight (0: BusyError at once)
    heartbeat: Optional[float] = None  #: seconds between EXTENDs (None: lease / 3; 0: none)
    max_tries: Optional[int] = None  #: MAXTRIES: ExhaustedError after that many tries
    retain: Optional[int] = None  #: seconds a done record is kept (None: the server's idem.retain)
    done_retries: int = 5  #: DONE sent again after a connection error (50 ms doubling)
    done_timeout: float = 5.0  #: seconds one DONE (and its WAIT) may take before it counts as lost
    oversize: str = "complete"  #: a result over idem.max-result: "complete" without it, or "error"
    codec: Codec = field(default_factory=JsonCodec)
    bloom: Optional[str] = None  #: a BLOOM filter key for CLAIM and DONE (module only)
    #: OWNER sent with every claim: DEFAULT_OWNER is host:pid; None sends none.
    owner: Union[str, _DefaultOwner, None] = DEFAULT_OWNER
    durable: Optional[Durable] = None  #: WAIT / WAITAOF after each claim and DONE (off: None)

    def __post_init__(self) -> None:
        whole_seconds("lease", self.lease)
        if self.retain is not None:
            whole_seconds("retain", self.retain)
        if self.oversize not in OVERSIZE:
            raise ValueError(f"oversize: one of {OVERSIZE}")
        if self.wait < 0 or self.done_retries < 0:
            raise ValueError("wait and done_retries: 0 or more")
        if not self.done_timeout > 0:
            raise ValueError("done_timeout: seconds, more than 0")
        if isinstance(self.owner, str) and not 1 <= len(self.owner.encode()) <= 64:
            raise ValueError("owner: 1 to 64 bytes")
        if self.durable is not None and not isinstance(self.durable, Durable):
            raise TypeError("durable: a Durable(replicas=..., timeout=..., fsync=...)")

    @property
    def beat_every(self) -> float:
        return self.lease / 3.0 if self.heartbeat is None else self.heartbeat

    @property
    def owner_name(self) -> Optional[str]:
        return self.owner.value() if isinstance(self.owner, _DefaultOwner) else self.owner


COUNTERS = ("first_runs", "retries", "replays", "waits", "busy", "completed", "released", "leases_lost",
            "results_dropped", "mismatches", "exhausted", "extends", "not_durable")


class _Counters:
    """Counters named by `_names`, as attributes, added under one lock."""

    __slots__ = ("_lock",)
    _names: Tuple[str, ...] = ()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        for name in self._names:
            setattr(self, name, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def _own(self) -> dict:
        with self._lock:
            return {name: getattr(self, name) for name in self._names}


class Stats(_Counters):
    """The counters of docs/clients.md, as attributes (`stats.first_runs`);
    `as_dict()` gives them all. Thread-safe (the heartbeat counts too)."""

    __slots__ = COUNTERS
    _names = COUNTERS

    def as_dict(self) -> dict:
        return self._own()

    def __repr__(self) -> str:
        return f"Stats({self.as_dict()})"


@dataclass
class Hooks:
    """Callbacks. on_run and on_done raising is HookError; what the others
    raise is ignored (they are called once the outcome is settled)."""

    on_run: Optional[Callable[[Any], None]] = None  #: job
    on_replay: Optional[Callable[[KeyT, int], None]] = None  #: key, attempt
    on_busy: Optional[Callable[[KeyT, float], None]] = None  #: key, seconds left on the holder's lease
    on_done: Optional[Callable[[Any, bool], None]] = None  #: job, result_stored
    on_release: Optional[Callable[[Any, BaseException], None]] = None  #: job, the work's (or hook's) error
    on_lease_lost: Optional[Callable[[Any], None]] = None  #: job
    on_result_dropped: Optional[Callable[[Any, str], None]] = None  #: job, reason: oversize, unserializable, memory

    def __setattr__(self, name: str, value: Any) -> None:
        # The loop calls hooks from its shared, synchronous core, AsyncIdem's
        # too: a coroutine function's coroutine would never be awaited, so
        # the hook would silently not run.
        if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(getattr(value, "__call__", None)):
            raise TypeError(f"Hooks.{name}: a hook is called, never awaited (AsyncIdem's too): give a plain "
                            "function; one that needs the event loop can start a task "
                            "(asyncio.get_running_loop().create_task(...))")
        super().__setattr__(name, value)


def quiet(hook: Optional[Callable[..., None]], *args: Any) -> None:
    if hook is not None:
        try:
            hook(*args)
        except Exception:
            pass  # a notification: the outcome is settled already
