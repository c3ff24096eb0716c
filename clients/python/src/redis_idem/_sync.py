"""The consumer loop, sync: `Idem(r).process(key, work)`. It drives the
flows of `_loop` and `_batch` with blocking calls; the heartbeat is one
daemon thread per Idem, asleep until a job has run `heartbeat`."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import redis

from . import _batch
from ._coalesce import SyncBatcher
from ._commands import IdemCommands
from ._errors import KeyT
from ._idem import IdemBase
from ._job import (AfterDone, BatchItem, Beats, Command, Done, Flow, Job, Notify, Outcome, Send, Sleep, StartBeat,
                   StopBeat, Work, advance)
from ._wire import Group, send_sync

#: The heartbeat thread ends after this long without jobs (made again by the next).
IDLE_EXIT_S = 60.0
#: Commands of the typed commands' batch helpers (the rest are single commands).
_PLANS = ("claim_many", "done_many", "release_many")


def _drive(flow: Flow, act: Callable[[Any], Any]) -> Any:
    """Run a flow: each effect it yields is done by `act`, whose answer is
    sent back in (or its error thrown in)."""
    answer: Any = None
    error: Optional[BaseException] = None
    while True:
        ended, effect = advance(flow, answer, error)
        if ended:
            return effect
        answer, error = None, None
        try:
            answer = act(effect)
        except BaseException as e:  # thrown into the flow, which decides
            error = e


class _Heartbeat:
    """One thread for every job of an Idem: it sleeps until the first job
    is due an EXTEND (a job shorter than `heartbeat` costs a schedule
    entry, no thread, no wake-up), and ends after a minute without jobs."""

    def __init__(self, idem: "Idem"):
        self.idem = idem
        self.cond = threading.Condition()
        self.beats = Beats()
        self.thread: Optional[threading.Thread] = None
        self.wake_at: Optional[float] = None
        self.idle_period = float("inf")  #: the shortest period asked: when idle it wakes that often

    def start(self, jobs: List[Job], every: float) -> List[int]:
        now = time.monotonic()
        with self.cond:
            handles = self.beats.add(jobs, every, now)
            self.idle_period = min(self.idle_period, every)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="redis-idem heartbeat", daemon=True)
                self.thread.start()
            elif self.wake_at is None or now + every < self.wake_at:
                self.cond.notify()
        return handles

    def stop(self, handles: List[int]) -> None:
        with self.cond:
            self.beats.remove(handles)

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self.cond:
                while True:
                    now = time.monotonic()
                    due = self.beats.next_due()
                    if due is not None and due <= now:
                        jobs = self.beats.due(now)
                        break
                    if due is None:
                        if now - idle_since >= IDLE_EXIT_S:
                            self.thread, self.wake_at = None, None
                            return
                        due = now + min(self.idle_period, IDLE_EXIT_S)
                    else:
                        idle_since = now
                    self.wake_at = due
                    self.cond.wait(due - now)
            for job in jobs:
                _drive(self.idem._loop.extend(job), self.idem._beat_act)
            idle_since = time.monotonic()


class Idem(IdemBase):
    """The consumer loop on a redis.Redis, a redis.RedisCluster, or a
    Sentinel's `master_for(name)` client."""

    _commands_class = IdemCommands
    commands: IdemCommands

    def __init__(self, client: Any, **kwargs: Any):
        super().__init__(client, **kwargs)
        self._heartbeat = _Heartbeat(self)
        self._batcher = SyncBatcher()

    @property
    def edition(self) -> Any:
        return self.commands.edition

    def process(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None, **settings: Any) -> Any:
        """Run `work(job)` once for `key`, whoever else runs it, and return
        its value (a replay: the stored result, decoded, without running it).
        Raises BusyError, MismatchError, ExhaustedError, LeaseLostError,
        ResultNotStoredError, HookError, DoneUnconfirmedError,
        NotDurableError, and what the work raises (the claim released)."""
        return self.process_outcome(key, work, payload=payload, **settings).value

    def process_outcome(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None,
                        **settings: Any) -> Outcome:
        """process(), answering an Outcome (value, replayed, status, attempt, result_stored)."""
        s = self._settings(settings)
        if not self._ready:
            self._resolved(self.commands.edition)
        return self._run(self._loop.process(key, payload, s), work)

    def _process_after(self, key: KeyT, work: Callable[[Job], Any], payload: Any, after: Optional[AfterDone],
                       settings: Any) -> Outcome:
        """process_outcome() with a broker adapter's commands riding with
        DONE (AfterDone); `settings` a Settings."""
        if not self._ready:
            self._resolved(self.commands.edition)
        return self._run(self._loop.process(key, payload, settings, after), work)

    def idempotent(self, *, key: Callable[..., KeyT], payload: Optional[Callable[..., Any]] = None,
                   **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A decorator: each call of the function is `process(key(*args,
        **kwargs), ...)` with the function as the work (it gets its own
        arguments, not the job), and returns its value (a replay's decoded
        result); it raises what process() raises. `settings` as process()'s."""
        call_key = self._call_key(key, payload, settings)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                k, p = call_key(*args, **kwargs)
                return self.process(k, lambda job: fn(*args, **kwargs), payload=p, **settings)
            return call
        return decorate

    def process_many(self, keys: Sequence[KeyT], work: Callable[[Job], Any],
                     payloads: Optional[Sequence[Any]] = None, **settings: Any) -> List[BatchItem]:
        """Claim the keys in batches, run `work(job)` for each granted key
        (one heartbeat for the batch), complete the successes in one DONE
        batch and release the failures in one RELEASE batch: one BatchItem
        per key, in order. A busy key is not waited for."""
        s = self._settings(settings)
        if not self._ready:
            self._resolved(self.commands.edition)
        return self._run(_batch.process_many(self._loop, keys, payloads, s), work)

    def _command(self, effect: Command) -> Any:
        if self.batch and effect.name == "claim":
            lane = self._claim_lane(effect)
            if lane is not None:
                answer = self._batcher.submit(lane, (effect.args[0], effect.kwargs.get("payload")),
                                              lambda entries: self._send_claims(lane, entries))
                if isinstance(answer, BaseException):
                    raise answer
                return answer
        if effect.name in _PLANS:
            return getattr(self.commands, effect.name)(*effect.args, **effect.kwargs)
        # A single command: built by the loop's protocol (its edition and prefix resolved once).
        return self.commands._execute(getattr(self._loop.protocol, effect.name)(*effect.args, **effect.kwargs))

    def _beat_act(self, effect: Any) -> Any:
        return effect.fn() if type(effect) is Notify else self._command(effect)

    def _send_claims(self, lane: Any, entries: list) -> List[Any]:
        if len(entries) == 1:
            try:
                return [self.commands._execute(self._one_claim(lane, entries[0]))]
            except redis.RedisError as e:
                return [e]
        batch = self._claims_plan(lane, entries)
        return self.commands._run_batch(batch, pipelined=not batch.multi and not self.commands.cluster)

    def _send(self, groups: Sequence[Group], timeout: float) -> List[Any]:
        return send_sync(self.client, self.commands.cluster, groups, timeout)

    def _done(self, effect: Done) -> Any:
        key, token, result = effect.item
        if not self.batch:
            call = self._loop.protocol.done(key, token, result, effect.retain, effect.bloom)
            return self._send([Group(self._loop.protocol.key(key), [call])], effect.timeout)[0]
        lane = ("done", effect.retain, effect.bloom, effect.timeout)
        return self._batcher.submit(lane, effect.item, lambda items: self._send_dones(effect, items))

    def _send_dones(self, effect: Done, items: list) -> List[Any]:
        if len(items) == 1:
            key, token, result = items[0]
            call = self._loop.protocol.done(key, token, result, effect.retain, effect.bloom)
            return self._send([Group(self._loop.protocol.key(key), [call])], effect.timeout)
        batch, groups = self._dones_plan(items, effect.retain, effect.bloom)
        return batch.finish(self._send(groups, effect.timeout))

    def _run(self, flow: Flow, work: Callable[[Job], Any]) -> Any:
        def act(effect: Any) -> Any:
            kind = type(effect)
            if kind is Command:
                return self._command(effect)
            if kind is Done:
                return self._done(effect)
            if kind is Send:
                return self._send(effect.groups, effect.timeout)
            if kind is Work:
                return work(effect.job)
            if kind is StartBeat:
                return self._heartbeat.start(effect.jobs, effect.every)
            if kind is StopBeat:
                return self._heartbeat.stop(effect.beat) if effect.beat is not None else None
            if kind is Sleep:
                return time.sleep(effect.seconds)
            raise TypeError(effect)

        return _drive(flow, act)
