"""What the loop hands out (Job, Outcome, BatchItem), the effects a flow
yields for its driver to do, and the heartbeat's schedule: all without I/O."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, NamedTuple, Optional, Sequence, Tuple

from ._errors import KeyT, LeaseLostError
from ._replies import ClaimReply, Status
from ._settings import Hooks, Stats, quiet
from ._wire import Group


class Job:
    """One claimed key, given to the work: `key` (as the caller gave it,
    without the instance's prefix), `status` (NEW, SEEN, RETRY), `attempt`
    (the fencing number: pass it to your writes), `lost` (a heartbeat found
    the lease taken), `check()` (raise LeaseLostError if so), `payload`."""

    __slots__ = ("key", "status", "attempt", "token", "lease", "payload", "lost", "_stats", "_hooks", "_on_extend")

    def __init__(self, key: KeyT, reply: ClaimReply, lease: int, payload: Any, stats: Stats, hooks: Hooks):
        self.key = key
        self.status: Status = reply.status
        self.attempt: int = reply.attempt
        self.token: str = reply.token or ""
        self.lease = lease
        self.payload = payload
        self.lost = False
        self._stats = stats
        self._hooks = hooks
        #: Called after each EXTEND that kept the lease (a broker adapter
        #: keeps the broker's own deadline with it: JetStream's in_progress).
        self._on_extend: Optional[Callable[[], Any]] = None

    def check(self) -> None:
        if self.lost:
            raise LeaseLostError(self.key, "another worker claimed the key since this claim", self.attempt)

    def _lose(self) -> LeaseLostError:
        if not self.lost:  # counted once per job, by the heartbeat or by DONE
            self.lost = True
            self._stats.add("leases_lost")
            quiet(self._hooks.on_lease_lost, self)
        return LeaseLostError(self.key, "another worker claimed the key after this lease lapsed: its outcome "
                              "is the one kept", self.attempt)

    def __repr__(self) -> str:
        return f"Job(key={self.key!r}, status={self.status.value}, attempt={self.attempt}, lost={self.lost})"


@dataclass
class Outcome:
    """What process_outcome() answers: `value` (the work's own object on a
    first run, the codec's decoding of the stored result on a replay),
    `replayed`, `status` (how the claim was granted; None for a replay),
    `attempt`, `result_stored`."""

    key: KeyT
    value: Any
    replayed: bool
    status: Optional[Status]
    attempt: int
    result_stored: bool


@dataclass
class BatchItem:
    """One key's answer of process_many(): `status` a BatchStatus
    (processed, replayed, busy, failed, lost, mismatch, exhausted,
    not_durable, error); `error` the exception (the work's own for failed;
    ResultNotStoredError for a processed key whose result could not be
    stored and the single call would raise; NotDurableError for
    not_durable, DoneUnconfirmedError for an unconfirmed DONE)."""

    key: KeyT
    status: str = "error"
    value: Any = None
    error: Optional[BaseException] = None
    attempt: Optional[int] = None
    result_stored: bool = False


# What a flow yields; the driver answers each.


class Command(NamedTuple):
    """A typed command's method, through the client as any call (its own retries)."""

    name: str
    args: tuple
    kwargs: dict


class Send(NamedTuple):
    """Commands sent once, each group pipelined on one connection (`_wire`):
    answered with one reply or error per call."""

    groups: Sequence[Group]
    timeout: float


class Done(NamedTuple):
    """One DONE without durability, sent once: answered with its DoneReply
    or error. With `batch` on, concurrent ones share one IDEM.MDONE."""

    item: Tuple[KeyT, str, Any]  #: key, token, result
    retain: Optional[int]
    bloom: Optional[str]
    timeout: float


class Sleep(NamedTuple):
    seconds: float


class Notify(NamedTuple):
    """Call `fn()` (and await what it answers, under asyncio)."""

    fn: Callable[[], Any]


class AfterDone:
    """Commands an adapter sends after one process() call's DONE, on the
    same connection in the same round trip (Streams' XACK), before the
    durable WAIT. They run whatever DONE answers: `sent` says whether they
    went out at all, `replies` holds their answers to the last DONE sent
    (an error for a lost connection), so the adapter can undo them when the
    record was not completed by this call."""

    __slots__ = ("calls", "sent", "replies")

    def __init__(self, calls: List[Any]):
        self.calls = calls
        self.sent = False
        self.replies: Optional[List[Any]] = None


class Work(NamedTuple):
    job: "Job"


class StartBeat(NamedTuple):
    jobs: List[Job]
    every: float


class StopBeat(NamedTuple):
    beat: Any  #: what StartBeat answered


def cmd(name: str, *args: Any, **kwargs: Any) -> Command:
    return Command(name, args, kwargs)


Flow = Generator[Any, Any, Any]


def advance(flow: Flow, answer: Any, error: Optional[BaseException]) -> tuple:
    """One step of a flow: send it the last effect's answer (or throw in its
    error); (True, the flow's value) when it ended, else (False, its next effect)."""
    try:
        return False, flow.send(answer) if error is None else flow.throw(error)
    except StopIteration as stop:
        return True, stop.value


class Beats:
    """The heartbeat's schedule for one instance: the jobs running now and
    when each is next due an EXTEND. A driver keeps one thread (or task)
    that sleeps until `next_due()` and extends what `due(now)` gives; a
    job shorter than its `every` costs a dict entry, nothing else."""

    def __init__(self) -> None:
        self._jobs: Dict[int, Tuple[Job, float]] = {}
        self._heap: List[Tuple[float, int]] = []
        self._ids = itertools.count()

    def add(self, jobs: List[Job], every: float, now: float) -> List[int]:
        handles = []
        for job in jobs:
            handle = next(self._ids)
            self._jobs[handle] = (job, every)
            heapq.heappush(self._heap, (now + every, handle))
            handles.append(handle)
        return handles

    def remove(self, handles: List[int]) -> None:
        for handle in handles:
            self._jobs.pop(handle, None)  # its heap entry is skipped when it comes up

    def next_due(self) -> Optional[float]:
        while self._heap and self._heap[0][1] not in self._jobs:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> List[Job]:
        """The jobs whose EXTEND is due now, each rescheduled a period later
        (a lost one is dropped)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            _, handle = heapq.heappop(self._heap)
            entry = self._jobs.get(handle)
            if entry is None or entry[0].lost:
                continue
            out.append(entry[0])
            heapq.heappush(self._heap, (now + entry[1], handle))
        return out
