"""The consumer loop for asyncio: `await AsyncIdem(r).process(key, work)`.
It drives the flows of `_loop` with awaits; the heartbeat is a task."""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Callable, List, Optional, Sequence

from ._commands import AsyncIdemCommands
from ._errors import KeyT
from ._idem import IdemBase
from ._loop import BatchItem, advance, Command, Flow, Job, Outcome, Sleep, StartBeat, StopBeat, Work
from ._replies import Edition


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


class AsyncIdem(IdemBase):
    """The consumer loop on a redis.asyncio.Redis or RedisCluster client;
    the work is an async function (a plain one will do too)."""

    _commands_class = AsyncIdemCommands
    commands: AsyncIdemCommands

    async def get_edition(self) -> Edition:
        return await self.commands.get_edition()

    async def process(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None, **settings: Any) -> Any:
        """As Idem.process, with `await work(job)`."""
        return (await self.process_outcome(key, work, payload=payload, **settings)).value

    async def process_outcome(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None,
                              **settings: Any) -> Outcome:
        flow = await self._flow(lambda loop, s: loop.process(key, payload, s), settings)
        return await self._run(flow, work)

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
        flow = await self._flow(lambda loop, s: loop.process_many(keys, payloads, s), settings)
        return await self._run(flow, work)

    async def _flow(self, make: Callable[[Any, Any], Flow], settings: Any) -> Flow:
        self._loop.module = (await self.get_edition()) is Edition.MODULE
        return make(self._loop, self._settings(settings))

    async def _command(self, effect: Command) -> Any:
        return await getattr(self.commands, effect.name)(*effect.args, **effect.kwargs)

    async def _beat(self, jobs: List[Job], every: float) -> None:
        async def act(effect: Any) -> Any:
            if isinstance(effect, Sleep):
                return await asyncio.sleep(effect.seconds)
            return await self._command(effect)

        await _drive(self._loop.heartbeat(jobs, every), act)

    async def _run(self, flow: Flow, work: Callable[[Job], Any]) -> Any:
        async def act(effect: Any) -> Any:
            if isinstance(effect, Command):
                return await self._command(effect)
            if isinstance(effect, Work):
                value = work(effect.job)
                return await value if inspect.isawaitable(value) else value
            if isinstance(effect, Sleep):
                return await asyncio.sleep(effect.seconds)
            if isinstance(effect, StartBeat):
                return asyncio.ensure_future(self._beat(effect.jobs, effect.every))
            if isinstance(effect, StopBeat):
                if effect.beat is not None:
                    effect.beat.cancel()
                    await asyncio.gather(effect.beat, return_exceptions=True)
                return None
            raise TypeError(effect)

        return await _drive(flow, act)
