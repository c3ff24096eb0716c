"""The consumer loop for asyncio: `await AsyncIdem(r).process(key, work)`.
It drives the flows of `_loop` and `_batch` with awaits; the heartbeat is
one task per AsyncIdem (per event loop), asleep until a job has run
`heartbeat`."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from typing import Any, Callable, List, Optional, Sequence

import redis

from . import _batch
from ._coalesce import AsyncBatcher
from ._commands import AsyncIdemCommands
from ._errors import KeyT
from ._idem import IdemBase
from ._job import (AfterDone, BatchItem, Beats, Command, Done, Flow, Job, Notify, Outcome, Send, Sleep, StartBeat,
                   StopBeat, Work, advance)
from ._replies import Edition
from ._wire import Group, send_async

IDLE_EXIT_S = 60.0
#: Commands of the typed commands' batch helpers (the rest are single commands).
_PLANS = ("claim_many", "done_many", "release_many")


async def _drive(flow: Flow, act: Callable[[Any], Any]) -> Any:
    """Run a flow: each effect it yields is done by `await act(effect)`,
    whose answer is sent back in (or its error thrown in)."""
    answer: Any = None
    error: Optional[BaseException] = None
    while True:
        ended, effect = advance(flow, answer, error)
        if ended:
            return effect
        answer, error = None, None
        try:
            answer = await act(effect)
        except BaseException as e:  # thrown into the flow, which decides
            error = e


class _Heartbeat:
    """One task for every job of an AsyncIdem on its event loop: asleep
    until the first job is due an EXTEND; it ends after a minute without
    jobs (and is made again by the next)."""

    def __init__(self, idem: "AsyncIdem"):
        self.idem = idem
        self.beats = Beats()
        self.task: Optional[asyncio.Task] = None
        self.wake: Optional[asyncio.Event] = None
        self.wake_at: Optional[float] = None
        self.idle_period = float("inf")

    def start(self, jobs: List[Job], every: float) -> List[int]:
        now = time.monotonic()
        handles = self.beats.add(jobs, every, now)
        self.idle_period = min(self.idle_period, every)
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.wake = asyncio.Event()
            self.task = loop.create_task(self._run())
        elif self.wake is not None and (self.wake_at is None or now + every < self.wake_at):
            self.wake.set()
        return handles

    def stop(self, handles: List[int]) -> None:
        self.beats.remove(handles)

    async def _run(self) -> None:
        idle_since = time.monotonic()
        wake = self.wake
        assert wake is not None
        while True:
            now = time.monotonic()
            due = self.beats.next_due()
            if due is not None and due <= now:
                for job in self.beats.due(now):
                    await _drive(self.idem._loop.extend(job), self.idem._beat_act)
                idle_since = time.monotonic()
                continue
            if due is None:
                if now - idle_since >= IDLE_EXIT_S:
                    self.wake_at = None
                    return
                due = now + min(self.idle_period, IDLE_EXIT_S)
            else:
                idle_since = now
            self.wake_at = due
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), due - now)
            except asyncio.TimeoutError:
                pass


class AsyncIdem(IdemBase):
    """The consumer loop on a redis.asyncio.Redis, RedisCluster, or a
    redis.asyncio.sentinel Sentinel's `master_for(name)` client; the work
    is an async function (a plain one will do too)."""

    _commands_class = AsyncIdemCommands
    commands: AsyncIdemCommands

    def __init__(self, client: Any, **kwargs: Any):
        super().__init__(client, **kwargs)
        self._heartbeat = _Heartbeat(self)
        self._batcher = AsyncBatcher()

    async def get_edition(self) -> Edition:
        return await self.commands.get_edition()

    async def process(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None, **settings: Any) -> Any:
        """As Idem.process, with `await work(job)`."""
        return (await self.process_outcome(key, work, payload=payload, **settings)).value

    async def process_outcome(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None,
                              **settings: Any) -> Outcome:
        s = self._settings(settings)
        if not self._ready:
            self._resolved(await self.commands.get_edition())
        return await self._run(self._loop.process(key, payload, s), work)

    async def _process_after(self, key: KeyT, work: Callable[[Job], Any], payload: Any,
                             after: Optional[AfterDone], settings: Any) -> Outcome:
        """As Idem._process_after."""
        if not self._ready:
            self._resolved(await self.commands.get_edition())
        return await self._run(self._loop.process(key, payload, settings, after), work)

    def idempotent(self, *, key: Callable[..., KeyT], payload: Optional[Callable[..., Any]] = None,
                   **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """As Idem.idempotent, for an async function: the decorated one is a
        coroutine function, `await`ed as process() would await the work."""
        call_key = self._call_key(key, payload, settings)

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            async def call(*args: Any, **kwargs: Any) -> Any:
                k, p = call_key(*args, **kwargs)
                return await self.process(k, lambda job: fn(*args, **kwargs), payload=p, **settings)
            return call
        return decorate

    async def process_many(self, keys: Sequence[KeyT], work: Callable[[Job], Any],
                           payloads: Optional[Sequence[Any]] = None, **settings: Any) -> List[BatchItem]:
        """As Idem.process_many; the works run one after the other."""
        s = self._settings(settings)
        if not self._ready:
            self._resolved(await self.commands.get_edition())
        return await self._run(_batch.process_many(self._loop, keys, payloads, s), work)

    async def _command(self, effect: Command) -> Any:
        if self.batch and effect.name == "claim":
            lane = self._claim_lane(effect)
            if lane is not None:
                answer = await self._batcher.submit(lane, (effect.args[0], effect.kwargs.get("payload")),
                                                    lambda entries: self._send_claims(lane, entries))
                if isinstance(answer, BaseException):
                    raise answer
                return answer
        if effect.name in _PLANS:
            return await getattr(self.commands, effect.name)(*effect.args, **effect.kwargs)
        # A single command: built by the loop's protocol (its edition and prefix resolved once).
        return await self.commands._execute(getattr(self._loop.protocol, effect.name)(*effect.args, **effect.kwargs))

    async def _beat_act(self, effect: Any) -> Any:
        if type(effect) is Notify:
            value = effect.fn()
            return await value if inspect.isawaitable(value) else value
        return await self._command(effect)

    async def _send_claims(self, lane: Any, entries: list) -> List[Any]:
        if len(entries) == 1:
            try:
                return [await self.commands._execute(self._one_claim(lane, entries[0]))]
            except redis.RedisError as e:
                return [e]
        batch = self._claims_plan(lane, entries)
        return await self.commands._run_batch(batch, pipelined=not batch.multi and not self.commands.cluster)

    async def _send(self, groups: Sequence[Group], timeout: float) -> List[Any]:
        return await send_async(self.client, self.commands.cluster, groups, timeout)

    async def _done(self, effect: Done) -> Any:
        key, token, result = effect.item
        if not self.batch:
            call = self._loop.protocol.done(key, token, result, effect.retain, effect.bloom)
            return (await self._send([Group(self._loop.protocol.key(key), [call])], effect.timeout))[0]
        lane = ("done", effect.retain, effect.bloom, effect.timeout)
        return await self._batcher.submit(lane, effect.item, lambda items: self._send_dones(effect, items))

    async def _send_dones(self, effect: Done, items: list) -> List[Any]:
        if len(items) == 1:
            key, token, result = items[0]
            call = self._loop.protocol.done(key, token, result, effect.retain, effect.bloom)
            return await self._send([Group(self._loop.protocol.key(key), [call])], effect.timeout)
        batch, groups = self._dones_plan(items, effect.retain, effect.bloom)
        return batch.finish(await self._send(groups, effect.timeout))

    async def _run(self, flow: Flow, work: Callable[[Job], Any]) -> Any:
        async def act(effect: Any) -> Any:
            kind = type(effect)
            if kind is Command:
                return await self._command(effect)
            if kind is Done:
                return await self._done(effect)
            if kind is Send:
                return await self._send(effect.groups, effect.timeout)
            if kind is Work:
                value = work(effect.job)
                return await value if inspect.isawaitable(value) else value
            if kind is StartBeat:
                return self._heartbeat.start(effect.jobs, effect.every)
            if kind is StopBeat:
                return self._heartbeat.stop(effect.beat) if effect.beat is not None else None
            if kind is Sleep:
                return await asyncio.sleep(effect.seconds)
            raise TypeError(effect)

        return await _drive(flow, act)
