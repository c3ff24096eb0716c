"""The consumer loop without I/O: its settings, counters, hooks and the
Job, and every decision of process() and process_many() written once, as
generators that yield what they need done (a command, a sleep, the work,
a heartbeat) and are given its answer (or have its error thrown in). The
sync and asyncio Idem only drive them (`_sync.py`, `_async.py`)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, List, NamedTuple, Optional, Sequence

import redis

from ._codecs import Codec, JsonCodec
from ._errors import (BusyError, DoneUnconfirmedError, ExhaustedError, HookError, KeyT, LeaseLostError,
                      MismatchError, ResultNotStoredError, ResultTooLargeError, StaleError, retryable_claim)
from ._protocol import whole_seconds
from ._replies import ClaimReply, DoneReply, RecordState, Status

OVERSIZE = ("complete", "error")
#: A connection lost before DONE's reply: DONE is sent again (the same token is safe to resend).
CONNECTION_LOST = (redis.ConnectionError, redis.TimeoutError)


@dataclass
class Settings:
    """The loop's settings (docs/clients.md's defaults), on Idem(...) and per call."""

    lease: int = 30  #: seconds a claim is held between heartbeats (whole, >= 1)
    wait: float = 10.0  #: seconds a duplicate waits for the copy in flight (0: BusyError at once)
    heartbeat: Optional[float] = None  #: seconds between EXTENDs (None: lease / 3; 0: none)
    max_tries: Optional[int] = None  #: MAXTRIES: ExhaustedError after that many tries
    retain: Optional[int] = None  #: seconds a done record is kept (None: the server's idem.retain)
    done_retries: int = 5  #: DONE sent again after a connection error (50 ms doubling)
    oversize: str = "complete"  #: a result over idem.max-result: "complete" without it, or "error"
    codec: Codec = field(default_factory=JsonCodec)
    bloom: Optional[str] = None  #: a BLOOM filter key for CLAIM and DONE (module only)

    def __post_init__(self) -> None:
        whole_seconds("lease", self.lease)
        if self.retain is not None:
            whole_seconds("retain", self.retain)
        if self.oversize not in OVERSIZE:
            raise ValueError(f"oversize: one of {OVERSIZE}")
        if self.wait < 0 or self.done_retries < 0:
            raise ValueError("wait and done_retries: 0 or more")

    @property
    def beat_every(self) -> float:
        return self.lease / 3.0 if self.heartbeat is None else self.heartbeat


COUNTERS = ("first_runs", "retries", "replays", "waits", "busy", "completed", "released", "leases_lost",
            "results_dropped", "mismatches", "exhausted", "extends")


class Stats:
    """The counters of docs/clients.md, as attributes (`stats.first_runs`);
    `as_dict()` gives them all. Thread-safe (the heartbeat counts too)."""

    __slots__ = COUNTERS + ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        for name in COUNTERS:
            setattr(self, name, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict:
        with self._lock:
            return {name: getattr(self, name) for name in COUNTERS}

    def __repr__(self) -> str:
        return f"Stats({self.as_dict()})"


@dataclass
class Hooks:
    """Callbacks. on_run and on_done raising is HookError; what the others
    raise is ignored (they are called once the outcome is settled)."""

    on_run: Optional[Callable[["Job"], None]] = None
    on_replay: Optional[Callable[[KeyT, int], None]] = None  #: key, attempt
    on_busy: Optional[Callable[[KeyT, float], None]] = None  #: key, seconds left on the holder's lease
    on_done: Optional[Callable[["Job", bool], None]] = None  #: job, result_stored
    on_release: Optional[Callable[["Job", BaseException], None]] = None
    on_lease_lost: Optional[Callable[["Job"], None]] = None
    on_result_dropped: Optional[Callable[["Job", str], None]] = None  #: reason: oversize, unserializable, memory


def _quiet(hook: Optional[Callable[..., None]], *args: Any) -> None:
    if hook is not None:
        try:
            hook(*args)
        except Exception:
            pass  # a notification: the outcome is settled already


class Job:
    """One claimed key, given to the work: `key`, `status` (NEW, SEEN,
    RETRY), `attempt` (the fencing number: pass it to your writes), `lost`
    (a heartbeat found the lease taken), `check()` (raise LeaseLostError
    if so), `payload`."""

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

    def check(self) -> None:
        if self.lost:
            raise LeaseLostError(self.key, "another worker claimed the key since this claim", self.attempt)

    def _lose(self) -> LeaseLostError:
        if not self.lost:  # counted once per job, by the heartbeat or by DONE
            self.lost = True
            self._stats.add("leases_lost")
            _quiet(self._hooks.on_lease_lost, self)
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
    """One key's answer of process_many(): `status` is processed, replayed,
    busy, failed, lost, mismatch, exhausted or error; `error` the exception
    (the work's own for failed; ResultNotStoredError for a processed key
    whose result could not be stored and the single call would raise)."""

    key: KeyT
    status: str = "error"
    value: Any = None
    error: Optional[BaseException] = None
    attempt: Optional[int] = None
    result_stored: bool = False


# What a flow yields; the driver answers each.


class Command(NamedTuple):
    name: str  #: a method of the typed commands
    args: tuple
    kwargs: dict


class Sleep(NamedTuple):
    seconds: float


class Work(NamedTuple):
    job: Job


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


def backoff(step: int, lease_left: float, remaining: float) -> float:
    """A poll's pause on the Functions edition: 10 ms doubling to 1 s,
    jittered, never past the holder's lease end (then we may take over)
    nor past the deadline."""
    pause = min(1.0, 0.01 * 2**step) * random.uniform(0.5, 1.0)
    return max(0.001, min(pause, lease_left + 0.001, remaining))


def wait_piece(remaining: float, socket_timeout: Optional[float]) -> float:
    """One WAIT: the time left, within the client's socket timeout (less a
    second for the reply's way back)."""
    if socket_timeout:
        remaining = min(remaining, socket_timeout - 1.0)
    return min(remaining, 3600.0)


class Loop:
    """The flows of one Idem: `stats`, `hooks`, `module` (the edition) and
    the client's `socket_timeout`, which the driver sets."""

    def __init__(self, stats: Stats, hooks: Hooks):
        self.stats = stats
        self.hooks = hooks
        self.module = True
        self.socket_timeout: Optional[float] = None

    # -- process(key, work) ------------------------------------------------

    def process(self, key: KeyT, payload: Any, s: Settings) -> Flow:
        deadline = time.monotonic() + s.wait
        claim = dict(payload=payload, max_tries=s.max_tries, bloom=s.bloom)
        reply = yield from self._claim(key, s.lease, claim, deadline)  # no WAIT: a busy key is seen, and counted once
        if reply.status is Status.BUSY:
            reply = yield from self._wait(key, s, claim, deadline, reply)
        if reply.status is Status.DONE:
            return self._replay(key, reply, s).outcome()
        self._refuse(key, reply)
        job = self._granted(key, reply, s.lease, payload)
        try:
            self._run_hook(job)
        except HookError as e:
            yield from self._release([job], e)
            raise
        beat = (yield StartBeat([job], s.beat_every)) if s.beat_every > 0 else None
        try:
            value = yield Work(job)
        except BaseException as e:
            yield StopBeat(beat)
            yield from self._release([job], e)
            raise
        yield StopBeat(beat)
        # The work returned: from here on the record is completed, whatever fails.
        return (yield from self._complete(job, value, s))

    def _claim(self, key: KeyT, lease: int, claim: dict, deadline: float, wait: Optional[float] = None) -> Flow:
        tries = 0
        unblocked = False
        while True:
            try:
                return (yield cmd("claim", key, lease, wait=wait, **claim))
            except (redis.ResponseError, redis.ConnectionError) as e:
                # TRYAGAIN / UNBLOCKED wrote nothing: send it again while time is left.
                # Redis closes the connection it answered UNBLOCKED on, and the
                # resend can meet it closed (redis-py's asyncio cluster client
                # raises that): send it again too. A claim resent is safe even
                # if the lost one was granted (it lapses; this one gets RETRY).
                closed = unblocked and isinstance(e, redis.ConnectionError)
                unblocked = str(e).startswith("UNBLOCKED")
                if not (retryable_claim(e) or closed) or (time.monotonic() >= deadline and tries >= 3):
                    raise
                tries += 1
                yield Sleep(0.05)
                if wait is not None:  # a WAIT no longer than what is left of the deadline
                    wait = wait_piece(deadline - time.monotonic(), self.socket_timeout)
                    wait = wait if wait >= 0.001 else None

    def _wait(self, key: KeyT, s: Settings, claim: dict, deadline: float, reply: ClaimReply) -> Flow:
        _quiet(self.hooks.on_busy, key, _lease_left(reply))
        if s.wait > 0:
            self.stats.add("waits")
        step = 0
        while reply.status is Status.BUSY:
            remaining = deadline - time.monotonic()
            if self.module:
                piece = wait_piece(remaining, self.socket_timeout)
                if piece < 0.001:
                    break
                reply = yield from self._claim(key, s.lease, claim, deadline, wait=piece)
            else:
                if remaining <= 0:
                    break
                yield Sleep(backoff(step, _lease_left(reply), remaining))
                step += 1
                reply = yield from self._claim(key, s.lease, claim, deadline)
        if reply.status is Status.BUSY:
            self.stats.add("busy")
            raise BusyError(key, _lease_left(reply), reply.attempt)
        return reply

    def _replay(self, key: KeyT, reply: ClaimReply, s: Settings) -> "_Replay":
        self.stats.add("replays")
        stored = reply.result
        _quiet(self.hooks.on_replay, key, reply.attempt)
        return _Replay(key, None if stored is None else s.codec.decode(stored), reply.attempt, stored is not None)

    def _refuse(self, key: KeyT, reply: ClaimReply) -> None:
        if reply.status is Status.MISMATCH:
            self.stats.add("mismatches")
            raise MismatchError(key, "claimed before with another payload: the key was reused for other content",
                                reply.attempt)
        if reply.status is Status.EXHAUSTED:
            self.stats.add("exhausted")
            raise ExhaustedError(key, f"{reply.attempt} tries used (max_tries): dead-letter it", reply.attempt)

    def _granted(self, key: KeyT, reply: ClaimReply, lease: int, payload: Any) -> Job:
        self.stats.add("first_runs" if reply.status is Status.NEW else "retries")
        return Job(key, reply, lease, payload, self.stats, self.hooks)

    def _run_hook(self, job: Job) -> None:
        if self.hooks.on_run is not None:
            try:
                self.hooks.on_run(job)
            except Exception as e:
                raise HookError(job.key, "on_run", e, attempt=job.attempt) from e

    def _release(self, jobs: List[Job], errors: Any) -> Flow:
        """Give the claims back at once (a waiting duplicate takes over);
        `errors` is one error for all or one per job. A release that fails
        on the connection is left to the lease, which lapses on its own."""
        errs = errors if isinstance(errors, list) else [errors] * len(jobs)
        try:
            answers = yield cmd("release_many", [(j.key, j.token) for j in jobs])
        except (redis.RedisError, OSError):
            answers = [False] * len(jobs)
        for job, err, released in zip(jobs, errs, answers):
            if released is True:
                self.stats.add("released")
            _quiet(self.hooks.on_release, job, err)

    def _encode(self, value: Any, s: Settings) -> tuple:
        try:
            return s.codec.encode(value), None
        except Exception as e:
            return None, e

    def _complete(self, job: Job, value: Any, s: Settings) -> Flow:
        data, unencodable = self._encode(value, s)
        too_large: Optional[BaseException] = None
        tries = 0
        while True:
            try:
                reply = yield cmd("done", job.key, job.token, result=data, retain=s.retain, bloom=s.bloom)
                break
            except ResultTooLargeError as e:  # refused before anything changed: complete without it
                data, too_large = None, e
            except StaleError:
                raise job._lose() from None
            except CONNECTION_LOST as e:
                if tries >= s.done_retries:
                    raise DoneUnconfirmedError(job.key, value, e, job.attempt) from e
                yield Sleep(min(0.05 * 2**tries, 1.0))
                tries += 1
        stored = data is not None and reply.result_stored
        if reply.already_done:
            # 0 to a resent DONE is ours when the record shows this job's
            # attempt; to the first, another worker's completion, which the
            # record shows with a later attempt. Checked every time: redis-py
            # may have resent DONE itself after a connection error.
            own = yield from self._own_completion(job, value, s)
            if own is None:
                raise job._lose()
            stored = data is not None and own.result is not None
        self.stats.add("completed")
        reason = "unserializable" if unencodable else "oversize" if too_large else None if stored else "memory"
        if reason is not None:
            self.stats.add("results_dropped")
            _quiet(self.hooks.on_result_dropped, job, reason)
        self._done_hook(job, value, stored)
        if unencodable is not None:
            raise ResultNotStoredError(job.key, value, unencodable, job.attempt)
        if too_large is not None and s.oversize == "error":
            raise ResultNotStoredError(job.key, value, too_large, job.attempt)
        return Outcome(job.key, value, False, job.status, job.attempt, stored)

    def _own_completion(self, job: Job, value: Any, s: Settings) -> Flow:
        for tries in range(s.done_retries + 1):
            try:
                record = yield cmd("get", job.key)
                break
            except CONNECTION_LOST as e:
                if tries == s.done_retries:
                    raise DoneUnconfirmedError(job.key, value, e, job.attempt) from e
                yield Sleep(min(0.05 * 2**tries, 1.0))
        ours = record is not None and record.state is RecordState.DONE and record.attempt == job.attempt
        return record if ours else None

    def _done_hook(self, job: Job, value: Any, stored: bool) -> None:
        if self.hooks.on_done is not None:
            try:
                self.hooks.on_done(job, stored)
            except Exception as e:
                raise HookError(job.key, "on_done", e, result=value, attempt=job.attempt) from e

    # -- process_many(keys, work) ------------------------------------------

    def process_many(self, keys: Sequence[KeyT], payloads: Optional[Sequence[Any]], s: Settings) -> Flow:
        keys = list(keys)
        if payloads is not None and len(payloads) != len(keys):
            raise ValueError("payloads: one per key")
        replies = yield cmd("claim_many", keys, s.lease, payloads=payloads, max_tries=s.max_tries, bloom=s.bloom)
        items = [BatchItem(key) for key in keys]
        held: List[tuple] = []  # (job, item)
        refused: List[tuple] = []  # on_run raised: released with the failures
        for i, (item, reply) in enumerate(zip(items, replies)):
            if isinstance(reply, Exception):
                item.error = reply
                continue
            item.attempt = reply.attempt
            try:
                if reply.status is Status.DONE:
                    replay = self._replay(item.key, reply, s)
                    item.status, item.value, item.result_stored = "replayed", replay.value, replay.result_stored
                elif reply.status is Status.BUSY:  # not waited for
                    self.stats.add("busy")
                    _quiet(self.hooks.on_busy, item.key, _lease_left(reply))
                    item.status, item.error = "busy", BusyError(item.key, _lease_left(reply), reply.attempt)
                else:
                    self._refuse(item.key, reply)
                    job = self._granted(item.key, reply, s.lease, None if payloads is None else payloads[i])
                    try:
                        self._run_hook(job)
                        held.append((job, item))
                    except HookError as e:
                        item.status, item.error = "failed", e
                        refused.append((job, item))
            except MismatchError as e:
                item.status, item.error = "mismatch", e
            except ExhaustedError as e:
                item.status, item.error = "exhausted", e
            except Exception as e:  # a stored result the codec cannot decode
                item.error = e
        beat = (yield StartBeat([j for j, _ in held], s.beat_every)) if held and s.beat_every > 0 else None
        finished: List[tuple] = []
        failed: List[tuple] = list(refused)
        interrupted: Optional[BaseException] = None  # KeyboardInterrupt, cancellation: the rest do not run
        for job, item in held:
            if interrupted is not None:
                item.status, item.error = "failed", interrupted
                failed.append((job, item))
                continue
            try:
                item.value = yield Work(job)
                finished.append((job, item))
            except BaseException as e:
                item.status, item.error = "failed", e
                failed.append((job, item))
                if not isinstance(e, Exception):
                    interrupted = e
        if beat is not None:
            yield StopBeat(beat)
        # Settled before an interruption goes on: the claims given back, the works that returned completed.
        if failed:
            yield from self._release([j for j, _ in failed], [it.error for _, it in failed])
        if finished:
            yield from self._complete_many(finished, s)
        if interrupted is not None:
            raise interrupted
        return items

    def _complete_many(self, finished: List[tuple], s: Settings) -> Flow:
        """Complete the works that returned in one DONE batch; those whose
        result the server refuses as too large go again without it."""
        encoded = [self._encode(item.value, s) for _, item in finished]
        todo = list(range(len(finished)))
        results = [data for data, _ in encoded]
        too_large: dict = {}
        answers: dict = {}
        tries = 0
        while todo:
            batch = [(finished[i][0].key, finished[i][0].token, results[i]) for i in todo]
            try:
                replies = yield cmd("done_many", batch, retain=s.retain, bloom=s.bloom)
            except CONNECTION_LOST as e:
                if tries >= s.done_retries:
                    for i in todo:
                        job, item = finished[i]
                        item.status, item.error = "error", DoneUnconfirmedError(job.key, item.value, e, job.attempt)
                    return
                yield Sleep(min(0.05 * 2**tries, 1.0))
                tries += 1
                continue
            again = []
            for i, reply in zip(todo, replies):
                if isinstance(reply, ResultTooLargeError) and results[i] is not None:
                    results[i], too_large[i] = None, reply
                    again.append(i)
                else:
                    answers[i] = reply
            todo = again
        for i, (job, item) in enumerate(finished):
            reply = answers[i]
            if isinstance(reply, DoneReply) and reply.already_done:  # ours, if resent (see _complete)
                record = yield from self._own_completion(job, item.value, s)
                if record is not None:
                    reply = DoneReply(1 if record.result is not None or results[i] is None else 3)
            if isinstance(reply, StaleError) or (isinstance(reply, DoneReply) and reply.already_done):
                item.status, item.error = "lost", job._lose()
                continue
            if isinstance(reply, Exception):
                item.status, item.error = "error", reply
                continue
            unencodable = encoded[i][1]
            item.status = "processed"
            item.result_stored = results[i] is not None and reply.result_stored
            self.stats.add("completed")
            reason = ("unserializable" if unencodable else "oversize" if i in too_large
                      else None if item.result_stored else "memory")
            if reason is not None:
                self.stats.add("results_dropped")
                _quiet(self.hooks.on_result_dropped, job, reason)
            try:
                self._done_hook(job, item.value, item.result_stored)
            except HookError as e:
                item.error = e
                continue
            if unencodable is not None:
                item.error = ResultNotStoredError(job.key, item.value, unencodable, job.attempt)
            elif i in too_large and s.oversize == "error":
                item.error = ResultNotStoredError(job.key, item.value, too_large[i], job.attempt)

    # -- the heartbeat ---------------------------------------------------

    def heartbeat(self, jobs: List[Job], every: float) -> Flow:
        """EXTEND each job's lease every `every` seconds until stopped; a
        STALE answer marks that job lost and stops renewing it."""
        while any(not job.lost for job in jobs):
            yield Sleep(every)
            for job in jobs:
                if job.lost:
                    continue
                try:
                    yield cmd("extend", job.key, job.token, job.lease)
                    self.stats.add("extends")
                except StaleError:
                    job._lose()
                except (redis.RedisError, OSError):
                    pass  # unreachable for now: try again next beat


@dataclass
class _Replay:
    key: KeyT
    value: Any
    attempt: int
    result_stored: bool

    def outcome(self) -> Outcome:
        return Outcome(self.key, self.value, True, None, self.attempt, self.result_stored)


def _lease_left(reply: ClaimReply) -> float:
    return reply.lease_left or 0.0
