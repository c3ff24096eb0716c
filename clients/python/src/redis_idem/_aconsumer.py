"""The consumer loop for asyncio: `AsyncIdem(r).process(key, fn)` with an
async fn, `async with AsyncIdem(r).job(key)`, a decorator, a batch form.
The heartbeat is a task."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, TypeVar

import redis

from ._commands import AsyncIdemCommands, KeyT
from ._errors import LeaseLostError, ResultTooLargeError, StaleError
from ._loop import Hooks, JobCore, Settings, Stats, busy_timeout, fire, socket_timeout_of, wait_chunk_ms
from ._replies import DoneReply, Edition, Status

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
LOST = (redis.ConnectionError, redis.TimeoutError)


class AsyncJob(JobCore):
    """Job for asyncio: `async with idem.job(key) as job:`; the same
    attributes and rules as the sync Job."""

    def __init__(self, idem: "AsyncIdem", key: KeyT, payload: Any, settings: Settings):
        self._idem = idem
        self.key = key
        self.payload = payload
        self.settings = settings
        self.lease = settings.lease
        self.status: Optional[Status] = None
        self.token: Optional[str] = None
        self.attempt = 0
        self.replayed = False
        self.result: Any = None
        self.result_stored = True
        self.done_reply: Optional[DoneReply] = None
        self.lost = False
        self._settled = False
        self._heartbeat: Optional[asyncio.Task] = None

    def check(self) -> None:
        if self.lost:
            raise LeaseLostError(self.key, "another worker claimed the key since our claim", self.attempt)

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            self._idem.stats.add("lost")
            fire(self._idem.hooks.on_lost, self)

    async def __aenter__(self) -> "AsyncJob":
        idem, s = self._idem, self.settings
        wait_module = (await idem.commands.get_edition()) is Edition.MODULE
        deadline = time.monotonic() + s.wait
        step = 0
        while True:
            remaining = deadline - time.monotonic()
            wait_ms = wait_chunk_ms(remaining, idem.socket_timeout) if wait_module and remaining > 0 else None
            try:
                reply = await idem.commands.claim(self.key, s.lease, payload=self.payload, maxtries=s.maxtries,
                                                  bloom=s.bloom, wait_ms=wait_ms or None)
            except redis.ResponseError as e:
                if str(e).startswith("TRYAGAIN") and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                raise
            if self._take(reply):
                return self
            idem.stats.add("busy")
            fire(idem.hooks.on_busy, self, reply.ms_left or 0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise busy_timeout(self.key, reply, idem.stats)
            idem.stats.add("waits")
            if not wait_module or not wait_ms:
                await asyncio.sleep(s.backoff(step, reply.ms_left or 0, remaining))
                step += 1

    def _start_heartbeat(self) -> None:
        self._heartbeat = asyncio.ensure_future(_beat([self], self.settings.heartbeat_every(self.lease)))

    async def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            try:
                await self._heartbeat
            except (asyncio.CancelledError, Exception):
                pass

    async def __aexit__(self, kind: Any, error: Any, tb: Any) -> None:
        if self.replayed:
            return
        await self._stop_heartbeat()
        if error is not None:
            await self._release(error)  # and the error goes on
            return
        await self._complete()

    async def _release(self, error: BaseException) -> None:
        idem = self._idem
        self._settled = True
        if not isinstance(error, LeaseLostError):
            try:
                if await idem.commands.release(self.key, self.token):
                    idem.stats.add("released")
            except (redis.RedisError, OSError):
                pass
        fire(idem.hooks.on_release, self, error)

    async def _complete(self) -> None:
        idem, s = self._idem, self.settings
        self._settled = True
        data = s.serializer.dumps(self.result)
        oversize = False
        reply: Optional[DoneReply] = None
        for tries in range(s.done_retries + 1):
            try:
                try:
                    reply = await idem.commands.done(self.key, self.token, result=None if oversize else data,
                                                     retain=s.retain, bloom=s.bloom)
                except ResultTooLargeError:
                    oversize = True
                    reply = await idem.commands.done(self.key, self.token, retain=s.retain, bloom=s.bloom)
                break
            except StaleError:
                self._lose()
                raise LeaseLostError(self.key, "another worker claimed the key since our claim: its DONE was "
                                     "refused (STALE)", self.attempt) from None
            except LOST:
                if tries == s.done_retries:
                    raise
                await asyncio.sleep(min(0.05 * 2**tries, 1.0))
        assert reply is not None
        self._settle(reply, tries, oversize, len(data))


async def _beat(jobs: List[AsyncJob], every: float) -> None:
    """The heartbeat task: EXTEND each job's lease every `every` seconds."""
    while True:
        await asyncio.sleep(every)
        for job in jobs:
            if job.lost or job._settled:
                continue
            try:
                await job._idem.commands.extend(job.key, job.token, job.lease)
                job._idem.stats.add("extends")
            except StaleError:
                job._lose()
            except (redis.RedisError, OSError):
                continue
        if all(job.lost or job._settled for job in jobs):
            return


class AsyncIdem:
    """Idem for redis.asyncio.Redis and redis.asyncio.RedisCluster."""

    def __init__(self, client: Any, *, prefix: str = "", edition: Optional[str] = None,
                 hooks: Optional[Hooks] = None, **settings: Any):
        self.client = client
        self.commands = AsyncIdemCommands(client, prefix=prefix, edition=edition)
        self.settings = Settings(**settings)
        self.hooks = hooks or Hooks()
        self.stats = Stats()
        self.socket_timeout = socket_timeout_of(client)

    async def get_edition(self) -> Edition:
        return await self.commands.get_edition()

    def _settings(self, overrides: Mapping[str, Any]) -> Settings:
        return replace(self.settings, **overrides) if overrides else self.settings

    def job(self, key: KeyT, *, payload: Any = None, **settings: Any) -> AsyncJob:
        return AsyncJob(self, key, payload, self._settings(settings))

    async def process(self, key: KeyT, fn: Callable[[AsyncJob], Awaitable[Any]], *, payload: Any = None,
                      **settings: Any) -> Any:
        """As Idem.process, with `await fn(job)`."""
        async with self.job(key, payload=payload, **settings) as job:
            if not job.replayed:
                job.result = await fn(job)
        return job.result

    def idempotent(self, key: Any, *, payload: Optional[Callable[..., Any]] = None, pass_job: bool = False,
                   **settings: Any) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            @functools.wraps(fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                k = key(*args, **kwargs) if callable(key) else key.format(*args, **kwargs)
                p = payload(*args, **kwargs) if payload is not None else None

                async def run(job: AsyncJob) -> Any:
                    return await (fn(*args, job=job, **kwargs) if pass_job else fn(*args, **kwargs))

                return await self.process(k, run, payload=p, **settings)

            return wrapper  # type: ignore[return-value]

        return decorate

    async def process_many(self, items: Mapping[KeyT, Any], fn: Callable[[AsyncJob, Any], Awaitable[Any]], *,
                           payloads: Optional[Mapping[KeyT, Any]] = None, **settings: Any) -> Dict[KeyT, Any]:
        """As Idem.process_many, with `await fn(job, item)` (one at a time)."""
        s = self._settings(settings)
        keys = list(items)
        replies = await self.commands.claim_many(keys, s.lease, payloads=None if payloads is None else
                                                 [payloads.get(k) for k in keys], maxtries=s.maxtries, bloom=s.bloom)
        out: Dict[KeyT, Any] = {}
        held: List[AsyncJob] = []
        for key, reply in zip(keys, replies):
            job = AsyncJob(self, key, None, s)
            if isinstance(reply, Exception):
                out[key] = reply
                continue
            try:
                if job._take(reply, heartbeat=False):
                    if job.replayed:
                        out[key] = job.result
                    else:
                        held.append(job)
                else:
                    self.stats.add("busy")
                    out[key] = busy_timeout(key, reply, self.stats)
            except Exception as e:
                out[key] = e
        beat = asyncio.ensure_future(_beat(list(held), s.heartbeat_every(s.lease))) if held else None
        finished = []
        try:
            for job in held:
                try:
                    job.result = await fn(job, items[job.key])
                    finished.append(job)
                except Exception as e:
                    await job._release(e)
                    out[job.key] = e
        finally:
            if beat is not None:
                beat.cancel()
                try:
                    await beat
                except (asyncio.CancelledError, Exception):
                    pass
        done = await self.commands.done_many([(j.key, j.token, s.serializer.dumps(j.result)) for j in finished],
                                             retain=s.retain, bloom=s.bloom)
        for job, reply in zip(finished, done):
            job._settled = True
            if isinstance(reply, StaleError):
                job._lose()
                out[job.key] = LeaseLostError(job.key, "DONE refused (STALE)", job.attempt)
            elif isinstance(reply, ResultTooLargeError):
                try:
                    job.done_reply = await self.commands.done(job.key, job.token, retain=s.retain, bloom=s.bloom)
                    job.result_stored = False
                    self.stats.add("completed")
                    self.stats.add("results_dropped")
                    out[job.key] = job.result
                except redis.ResponseError as e:
                    out[job.key] = e
            elif isinstance(reply, Exception):
                out[job.key] = reply
            else:
                job.done_reply = reply
                self.stats.add("completed" if reply.completed else "already_done")
                fire(self.hooks.on_done, job, reply)
                out[job.key] = job.result
        return out
