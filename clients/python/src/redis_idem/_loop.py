"""The consumer loop without I/O: every decision of process() written once,
as generators that yield what they need done (a command, a sleep, the
work, a heartbeat) and are given its answer (or have its error thrown in).
The sync and asyncio Idem only drive them (`_sync.py`, `_async.py`); the
batch flow (`_batch.py`) shares these steps."""

from __future__ import annotations

import random
import time
from typing import Any, List, Optional, Tuple

import redis

from ._errors import (BusyError, DoneUnconfirmedError, ExhaustedError, HookError, KeyT, MismatchError,
                      NotDurableError, ResultNotStoredError, ResultTooLargeError, StaleError, not_run,
                      retryable_claim)
from ._job import AfterDone, Done, Flow, Job, Notify, Outcome, Send, Sleep, StartBeat, StopBeat, Work, cmd
from ._protocol import Protocol
from ._replies import ClaimReply, Edition, RecordState, Status
from ._settings import Durable, Hooks, Settings, Stats, quiet
from ._wire import Group

#: A connection lost (or no reply in time) before DONE's reply: DONE is sent again.
CONNECTION_LOST = (redis.ConnectionError, redis.TimeoutError)


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


def resend_pause(tries: int) -> float:
    return min(0.05 * 2**tries, 1.0)


def lease_left(reply: ClaimReply) -> float:
    return reply.lease_left or 0.0


class Loop:
    """The flows of one Idem: `stats`, `hooks`, and what the driver sets
    once: `protocol` (the edition and prefix), `cluster`, the client's
    `socket_timeout`."""

    def __init__(self, stats: Stats, hooks: Hooks):
        self.stats = stats
        self.hooks = hooks
        self.protocol = Protocol(Edition.MODULE)
        self.cluster = False
        self.socket_timeout: Optional[float] = None

    @property
    def module(self) -> bool:
        return self.protocol.module

    # -- process(key, work) ------------------------------------------------

    def process(self, key: KeyT, payload: Any, s: Settings, after: Optional[AfterDone] = None) -> Flow:
        """`after`: a broker adapter's commands that ride with DONE (AfterDone)."""
        deadline = time.monotonic() + s.wait
        claim = dict(payload=payload, max_tries=s.max_tries, bloom=s.bloom, owner=s.owner_name)
        # No WAIT first: a busy key is seen, and counted, once.
        reply, acked = yield from self.claim(key, s, claim, deadline)
        if reply.status is Status.BUSY:
            reply, acked = yield from self._wait(key, s, claim, deadline, reply)
        if reply.status is Status.DONE:
            return self.replay(key, reply, s, acked)
        self.refuse(key, reply)
        job = yield from self.granted(key, reply, s, payload, acked)
        try:
            self.run_hook(job)
        except HookError as e:
            yield from self.release([job], e, s)
            raise
        beat = (yield StartBeat([job], s.beat_every)) if s.beat_every > 0 else None
        try:
            value = yield Work(job)
        except BaseException as e:
            yield StopBeat(beat)
            yield from self.release([job], e, s)
            raise
        yield StopBeat(beat)
        # The work returned: from here on the record is completed, whatever fails.
        return (yield from self._complete(job, value, s, after))

    def claim(self, key: KeyT, s: Settings, claim: dict, deadline: float, wait: Optional[float] = None) -> Flow:
        """One claim, sent again while it wrote nothing (docs/clients.md:
        TRYAGAIN, UNBLOCKED, READONLY, MASTERDOWN, LOADING, a lost
        connection) and time is left: (reply, the durable WAIT's answer)."""
        tries = 0
        while True:
            try:
                if s.durable is None:
                    return (yield cmd("claim", key, s.lease, wait=wait, **claim)), None
                answers = yield Send([self._group(key, [self.protocol.claim(key, s.lease, wait=wait, **claim)],
                                                  s.durable)], self._claim_timeout(wait, s.durable))
                if isinstance(answers[0], Exception):
                    raise answers[0]
                return answers[0], answers[1]
            except (redis.ResponseError, redis.ConnectionError, redis.TimeoutError) as e:
                # A claim resent after its connection closed may meet its own
                # claim as BUSY: it waits, and that orphan lapses with its lease.
                if not retryable_claim(e) or (time.monotonic() >= deadline and tries >= 3):
                    raise
                yield Sleep(resend_pause(min(tries, 2)))
                tries += 1
                if wait is not None:  # a WAIT no longer than what is left of the deadline
                    wait = wait_piece(deadline - time.monotonic(), self.socket_timeout)
                    wait = wait if wait >= 0.001 else None

    def _claim_timeout(self, wait: Optional[float], durable: Durable) -> float:
        return (wait or 0.0) + durable.timeout + (self.socket_timeout or 5.0)

    def _group(self, key: KeyT, calls: list, durable: Optional[Durable]) -> Group:
        if durable is not None:
            calls = calls + [(durable.command(), lambda reply: reply)]
        return Group(self.protocol.key(key), calls)

    def _wait(self, key: KeyT, s: Settings, claim: dict, deadline: float, reply: ClaimReply) -> Flow:
        quiet(self.hooks.on_busy, key, lease_left(reply))
        if s.wait > 0:
            self.stats.add("waits")
        step = 0
        acked = None
        while reply.status is Status.BUSY:
            remaining = deadline - time.monotonic()
            if self.module:
                piece = wait_piece(remaining, self.socket_timeout)
                if piece < 0.001:
                    break
                reply, acked = yield from self.claim(key, s, claim, deadline, wait=piece)
            else:
                if remaining <= 0:
                    break
                yield Sleep(backoff(step, lease_left(reply), remaining))
                step += 1
                reply, acked = yield from self.claim(key, s, claim, deadline)
        if reply.status is Status.BUSY:
            self.stats.add("busy")
            owner = yield from self._holder(key)
            raise BusyError(key, lease_left(reply), reply.attempt, owner)
        return reply, acked

    def _holder(self, key: KeyT) -> Flow:
        """The busy key's owner: one IDEM.GET, on this error path only."""
        try:
            record = yield cmd("get", key)
        except (redis.RedisError, OSError):
            return None
        return None if record is None else record.owner

    def replay(self, key: KeyT, reply: ClaimReply, s: Settings, acked: Any = None) -> Outcome:
        """The stored result; under `durable` only once the claim's WAIT
        acknowledged it too (the completion read may not have reached the
        replicas: a primary that has just lost its role keeps answering):
        fewer is NotDurableError at the done stage, carrying the result."""
        stored = reply.result
        value = None if stored is None else s.codec.decode(stored)
        if s.durable is not None:
            enough, count = s.durable.acknowledged(acked)
            if not enough:
                self.stats.add("not_durable")
                raise NotDurableError(key, "done", count, s.durable.replicas, result=value, attempt=reply.attempt,
                                      cause=acked if isinstance(acked, BaseException) else None)
        self.stats.add("replays")
        quiet(self.hooks.on_replay, key, reply.attempt)
        return Outcome(key, value, True, None, reply.attempt, stored is not None)

    def refuse(self, key: KeyT, reply: ClaimReply) -> None:
        if reply.status is Status.MISMATCH:
            self.stats.add("mismatches")
            raise MismatchError(key, "claimed before with another payload: the key was reused for other content",
                                reply.attempt)
        if reply.status is Status.EXHAUSTED:
            self.stats.add("exhausted")
            raise ExhaustedError(key, f"{reply.attempt} tries used (max_tries): dead-letter it", reply.attempt)

    def granted(self, key: KeyT, reply: ClaimReply, s: Settings, payload: Any, acked: Any) -> Flow:
        """The job of a granted claim; under `durable`, only once the claim
        is acknowledged (else released at once: NotDurableError, no work)."""
        job = Job(key, reply, s.lease, payload, self.stats, self.hooks)
        if s.durable is not None:
            enough, count = s.durable.acknowledged(acked)
            if not enough:
                yield from self.release([job], None, s)
                self.stats.add("not_durable")
                raise NotDurableError(key, "claim", count, s.durable.replicas, attempt=reply.attempt,
                                      cause=acked if isinstance(acked, BaseException) else None)
        self.stats.add("first_runs" if reply.status is Status.NEW else "retries")
        return job

    def run_hook(self, job: Job) -> None:
        if self.hooks.on_run is not None:
            try:
                self.hooks.on_run(job)
            except Exception as e:
                raise HookError(job.key, "on_run", e, attempt=job.attempt) from e

    def release(self, jobs: List[Job], errors: Any, s: Settings) -> Flow:
        """Give the claims back at once (a waiting duplicate takes over):
        sent once, within done_timeout, never again; a RELEASE that fails
        leaves the claim to lapse with its lease. `released` counts a 1;
        `on_release` is called once per job either way (not for a claim
        given back because it was not durable: `errors` None)."""
        if not jobs:
            return
        if len(jobs) == 1:  # IDEM.RELEASE, the single call's command
            call = self.protocol.release(jobs[0].key, jobs[0].token)
            released = yield Send([self._group(jobs[0].key, [call], None)], s.done_timeout)
        else:
            batch = self.protocol.release_many([(j.key, j.token) for j in jobs], self.cluster)
            released = batch.finish((yield Send(self.groups(batch, [j.key for j in jobs], None), s.done_timeout)))
        errs = errors if isinstance(errors, list) else [errors] * len(jobs)
        for job, err, answer in zip(jobs, errs, released):
            if answer is True:
                if err is not None:
                    self.stats.add("released")
            if err is not None:
                quiet(self.hooks.on_release, job, err)

    def groups(self, batch: Any, keys: List[KeyT], durable: Optional[Durable]) -> List[Group]:
        """A batch plan's calls as connections: standalone, all on one
        (pipelined, one WAIT at the end); in a cluster one per call (each is
        one slot's), each with its WAIT."""
        if not batch.calls:
            return []
        if not self.cluster:
            return [self._group(keys[0], list(batch.calls), durable)]
        return [self._group(keys[batch.answers[i][0]], [call], durable) for i, call in enumerate(batch.calls)]

    @staticmethod
    def encode(value: Any, s: Settings) -> tuple:
        try:
            return s.codec.encode(value), None
        except Exception as e:
            return None, e

    def _send_done(self, job: Job, data: Any, s: Settings, after: Optional[AfterDone] = None) -> Flow:
        """One DONE, sent once: (its answer, the durable WAIT's answer).
        `after`'s commands go on its connection behind it, before the WAIT
        (which then covers them too)."""
        if s.durable is None and after is None:
            return (yield Done((job.key, job.token, data), s.retain, s.bloom, s.done_timeout)), None
        calls = [self.protocol.done(job.key, job.token, data, s.retain, s.bloom)]
        if after is not None:
            calls += after.calls
            after.sent = True
        timeout = s.done_timeout + (s.durable.timeout if s.durable is not None else 0.0)
        answers = yield Send([self._group(job.key, calls, s.durable)], timeout)
        if after is not None:
            after.replies = answers[1 : 1 + len(after.calls)]
        return answers[0], (answers[-1] if s.durable is not None else None)

    def _complete(self, job: Job, value: Any, s: Settings, after: Optional[AfterDone] = None) -> Flow:
        data, unencodable = self.encode(value, s)
        too_large: Optional[BaseException] = None
        tries = 0
        while True:
            reply, acked = yield from self._send_done(job, data, s, after)
            if isinstance(reply, ResultTooLargeError) and data is not None:
                data, too_large = None, reply  # refused before anything changed: complete without it
                continue
            if isinstance(reply, StaleError):
                raise job._lose() from None
            if isinstance(reply, CONNECTION_LOST) or (isinstance(reply, redis.ResponseError) and not_run(reply)):
                if tries >= s.done_retries:
                    raise DoneUnconfirmedError(job.key, value, reply, job.attempt) from reply
                yield Sleep(resend_pause(tries))
                tries += 1
                continue
            if isinstance(reply, Exception):
                raise reply  # WRONGTYPE, ...: the record was not completed
            break
        stored = data is not None and reply.result_stored
        if reply.already_done:
            # 0 to a resent DONE is ours when the record shows this job's
            # attempt; to the first, another worker's completion.
            own = yield from self.own_completion(job, value, s) if tries else _none()
            if own is None:
                raise job._lose()
            stored = data is not None and own.result is not None
        self.stats.add("completed")
        self.dropped(job, unencodable, too_large, stored)
        self.done_hook(job, value, stored)
        if s.durable is not None:
            enough, count = s.durable.acknowledged(acked)
            if not enough:
                self.stats.add("not_durable")
                raise NotDurableError(job.key, "done", count, s.durable.replicas, value, job.attempt,
                                      acked if isinstance(acked, BaseException) else None)
        if unencodable is not None:
            raise ResultNotStoredError(job.key, value, unencodable, job.attempt)
        if too_large is not None and s.oversize == "error":
            raise ResultNotStoredError(job.key, value, too_large, job.attempt)
        return Outcome(job.key, value, False, job.status, job.attempt, stored)

    def dropped(self, job: Job, unencodable: Any, too_large: Any, stored: bool) -> None:
        reason = "unserializable" if unencodable else "oversize" if too_large else None if stored else "memory"
        if reason is not None:
            self.stats.add("results_dropped")
            quiet(self.hooks.on_result_dropped, job, reason)

    def own_completion(self, job: Job, value: Any, s: Settings) -> Flow:
        """The record, when it shows this job's completion (done, this
        attempt: nobody can have claimed in between), else None."""
        for tries in range(s.done_retries + 1):
            try:
                record = yield cmd("get", job.key)
                break
            except CONNECTION_LOST as e:
                if tries == s.done_retries:
                    raise DoneUnconfirmedError(job.key, value, e, job.attempt) from e
                yield Sleep(resend_pause(tries))
        ours = record is not None and record.state is RecordState.DONE and record.attempt == job.attempt
        return record if ours else None

    def done_hook(self, job: Job, value: Any, stored: bool) -> None:
        if self.hooks.on_done is not None:
            try:
                self.hooks.on_done(job, stored)
            except Exception as e:
                raise HookError(job.key, "on_done", e, result=value, attempt=job.attempt) from e

    # -- the heartbeat ---------------------------------------------------

    def extend(self, job: Job) -> Flow:
        """One heartbeat EXTEND; STALE marks the job lost (no more EXTENDs).
        An EXTEND that kept the lease then tells the job's broker
        (`_on_extend`), so that its deadline follows the lease."""
        try:
            yield cmd("extend", job.key, job.token, job.lease)
            self.stats.add("extends")
        except StaleError:
            job._lose()
            return
        except (redis.RedisError, OSError):
            return  # unreachable for now: try again next beat
        if job._on_extend is not None:
            try:
                yield Notify(job._on_extend)
            except Exception:
                pass  # the broker is told again at the next beat


def _none() -> Flow:
    return None
    yield  # a generator that yields nothing

