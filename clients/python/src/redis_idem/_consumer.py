"""The consumer loop, sync: `Idem(r).process(key, fn)` and its context
manager `Idem(r).job(key)`, a decorator, and a batch form."""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, TypeVar

import redis

from ._commands import IdemCommands, KeyT
from ._errors import LeaseLostError, ResultTooLargeError, StaleError
from ._loop import Hooks, JobCore, Settings, Stats, busy_timeout, fire, socket_timeout_of, wait_chunk_ms
from ._replies import DoneReply, Edition, Status

F = TypeVar("F", bound=Callable[..., Any])
LOST = (redis.ConnectionError, redis.TimeoutError)


class _Heartbeat:
    """EXTENDs the leases of `jobs` every `every` seconds in a daemon thread
    until stopped; a STALE answer marks that job's lease lost and stops
    renewing it."""

    def __init__(self, job: Any, every: float, jobs: Optional[List["Job"]] = None):
        self.jobs = [job] if jobs is None else jobs
        self.every = every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="redis-idem heartbeat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            for job in self.jobs:
                if job.lost or job._settled or self.stopped.is_set():
                    continue
                try:
                    job._idem.commands.extend(job.key, job.token, job.lease)
                    job._idem.stats.add("extends")
                except StaleError:
                    job._lose()
                except (redis.RedisError, OSError):
                    continue  # unreachable for now: try again next beat
            if all(job.lost for job in self.jobs):
                return

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not threading.current_thread():
            self.thread.join()


class Job(JobCore):
    """One claim of one key, as a context manager. After entering:
    `replayed` (the record was done: `result` is its stored result,
    deserialised) or a claim this worker holds (`status` NEW, SEEN or RETRY,
    `attempt` the fencing number) whose work the body does, setting
    `result`. Leaving normally completes the record with `result`; leaving
    on an exception releases the claim and lets the exception through.
    While the body runs, a thread keeps the lease alive (EXTEND)."""

    def __init__(self, idem: "Idem", key: KeyT, payload: Any, settings: Settings):
        self._idem = idem
        self.key = key
        self.payload = payload
        self.settings = settings
        self.lease = settings.lease
        self.status: Optional[Status] = None
        self.token: Optional[str] = None
        self.attempt: int = 0
        self.replayed = False
        self.result: Any = None
        self.result_stored = True  #: False: completed (or replayed) without its result
        self.done_reply: Optional[DoneReply] = None
        self._lost = threading.Event()
        self._heartbeat: Optional[_Heartbeat] = None
        self._settled = False  # released or completed: no more EXTENDs

    # -- for the work --------------------------------------------------

    @property
    def lost(self) -> bool:
        """True once an EXTEND answered STALE: another worker claimed the key."""
        return self._lost.is_set()

    def check(self) -> None:
        """Raise LeaseLostError if the lease was lost: call it between steps
        of long work, before effects that the fencing number does not guard."""
        if self.lost:
            raise LeaseLostError(self.key, "another worker claimed the key since our claim", self.attempt)

    def _lose(self) -> None:
        if not self._lost.is_set():
            self._lost.set()
            self._idem.stats.add("lost")
            fire(self._idem.hooks.on_lost, self)

    # -- the claim -----------------------------------------------------

    def __enter__(self) -> "Job":
        idem, s = self._idem, self.settings
        wait_module = idem.commands.edition is Edition.MODULE
        deadline = time.monotonic() + s.wait
        step = 0
        while True:
            remaining = deadline - time.monotonic()
            wait_ms = wait_chunk_ms(remaining, idem.socket_timeout) if wait_module and remaining > 0 else None
            try:
                reply = idem.commands.claim(self.key, s.lease, payload=self.payload, maxtries=s.maxtries,
                                            bloom=s.bloom, wait_ms=wait_ms or None)
            except redis.ResponseError as e:
                if str(e).startswith("TRYAGAIN") and time.monotonic() < deadline:
                    time.sleep(0.05)  # writes paused, or the record moved: claim again
                    continue
                raise
            if self._take(reply):
                return self
            # BUSY
            idem.stats.add("busy")
            fire(idem.hooks.on_busy, self, reply.ms_left or 0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise busy_timeout(self.key, reply, idem.stats)
            idem.stats.add("waits")
            if not wait_module or not wait_ms:
                time.sleep(s.backoff(step, reply.ms_left or 0, remaining))
                step += 1

    def _start_heartbeat(self) -> None:
        self._heartbeat = _Heartbeat(self, self.settings.heartbeat_every(self.lease))

    # -- the outcome ---------------------------------------------------

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if self.replayed:
            return
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if error is not None:
            self._release(error)  # and the error goes on
            return
        self._complete()

    def _release(self, error: BaseException) -> None:
        idem = self._idem
        self._settled = True
        if not isinstance(error, LeaseLostError):
            try:
                if idem.commands.release(self.key, self.token):
                    idem.stats.add("released")
            except (redis.RedisError, OSError):
                pass  # the lease lapses on its own: the next claim answers RETRY
        fire(idem.hooks.on_release, self, error)

    def _complete(self) -> None:
        idem, s = self._idem, self.settings
        self._settled = True
        data = s.serializer.dumps(self.result)
        oversize = False
        reply: Optional[DoneReply] = None
        for tries in range(s.done_retries + 1):
            try:
                try:
                    reply = idem.commands.done(self.key, self.token, result=data if not oversize else None,
                                               retain=s.retain, bloom=s.bloom)
                except ResultTooLargeError:
                    oversize = True  # complete it without the result (checked before anything changed)
                    reply = idem.commands.done(self.key, self.token, retain=s.retain, bloom=s.bloom)
                break
            except StaleError:
                self._lose()
                raise LeaseLostError(self.key, "another worker claimed the key since our claim: its DONE was "
                                     "refused (STALE)", self.attempt) from None
            except LOST:
                if tries == s.done_retries:
                    raise
                time.sleep(min(0.05 * 2**tries, 1.0))  # DONE again with the same token is safe
        assert reply is not None
        self._settle(reply, tries, oversize, len(data))


class Idem:
    """The consumer loop on a redis.Redis or redis.RedisCluster client.

    `prefix` goes before every key (one namespace per tenant or app); the
    other keywords are the Settings defaults, each of which `job()`,
    `process()` and `idempotent()` take per call too."""

    def __init__(self, client: Any, *, prefix: str = "", edition: Optional[str] = None,
                 hooks: Optional[Hooks] = None, **settings: Any):
        self.client = client
        self.commands = IdemCommands(client, prefix=prefix, edition=edition)
        self.settings = Settings(**settings)
        self.hooks = hooks or Hooks()
        self.stats = Stats()
        self.socket_timeout = socket_timeout_of(client)

    @property
    def edition(self) -> Edition:
        return self.commands.edition

    def _settings(self, overrides: Mapping[str, Any]) -> Settings:
        return replace(self.settings, **overrides) if overrides else self.settings

    def job(self, key: KeyT, *, payload: Any = None, **settings: Any) -> Job:
        """The claim of `key` as a context manager (see Job)."""
        return Job(self, key, payload, self._settings(settings))

    def process(self, key: KeyT, fn: Callable[[Job], Any], *, payload: Any = None, **settings: Any) -> Any:
        """Run `fn(job)` once for `key`, whoever else runs it: claims (waiting
        while another worker holds it), runs fn with the lease kept alive
        (`job.attempt` is the fencing number), completes the record with
        fn's result, or releases it if fn raises. A key already done
        returns the stored result instead (deserialised) without running fn.

        Raises MismatchError, ExhaustedError, BusyError (still held after
        `wait` seconds), LeaseLostError (another worker took over: ours
        must not count), and whatever fn raises."""
        with self.job(key, payload=payload, **settings) as job:
            if not job.replayed:
                job.result = fn(job)
        return job.result

    def idempotent(self, key: Any, *, payload: Optional[Callable[..., Any]] = None, pass_job: bool = False,
                   **settings: Any) -> Callable[[F], F]:
        """A decorator: each call runs through process(). `key` is a format
        string filled with the call's arguments (`"order:{0}"`,
        `"order:{order_id}"`) or a function of them; `payload` a function of
        them too. With pass_job, the function gets `job=` (for job.attempt)."""

        def decorate(fn: F) -> F:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                k = key(*args, **kwargs) if callable(key) else key.format(*args, **kwargs)
                p = payload(*args, **kwargs) if payload is not None else None

                def run(job: Job) -> Any:
                    return fn(*args, job=job, **kwargs) if pass_job else fn(*args, **kwargs)

                return self.process(k, run, payload=p, **settings)

            return wrapper  # type: ignore[return-value]

        return decorate

    def process_many(self, items: Mapping[KeyT, Any], fn: Callable[[Job, Any], Any], *,
                     payloads: Optional[Mapping[KeyT, Any]] = None, **settings: Any) -> Dict[KeyT, Any]:
        """Process many keys with batch commands: one MCLAIM per slot (and
        per 10000 keys), `fn(job, item)` for each key claimed, one MDONE
        for their results. A key done before gives its stored result; BUSY,
        MISMATCH, EXHAUSTED, a failure of fn (released) and a lost lease
        give an exception as that key's value. Returns {key: result or
        exception}. On the Functions edition the calls are single ones."""
        s = self._settings(settings)
        keys = list(items)
        replies = self.commands.claim_many(keys, s.lease, payloads=None if payloads is None else
                                           [payloads.get(k) for k in keys], maxtries=s.maxtries, bloom=s.bloom)
        out: Dict[KeyT, Any] = {}
        held = []
        for key, reply in zip(keys, replies):
            job = Job(self, key, None, s)
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
            except Exception as e:  # MISMATCH, EXHAUSTED
                out[key] = e
        beat = _Heartbeat(None, s.heartbeat_every(s.lease), jobs=list(held)) if held else None
        finished = []
        try:
            for job in held:
                try:
                    job.result = fn(job, items[job.key])
                    finished.append(job)
                except Exception as e:
                    job._release(e)
                    out[job.key] = e
        finally:
            if beat is not None:
                beat.stop()
        done = self.commands.done_many([(j.key, j.token, s.serializer.dumps(j.result)) for j in finished],
                                       retain=s.retain, bloom=s.bloom)
        for job, reply in zip(finished, done):
            job._settled = True
            if isinstance(reply, StaleError):
                job._lose()
                out[job.key] = LeaseLostError(job.key, "DONE refused (STALE)", job.attempt)
            elif isinstance(reply, ResultTooLargeError):
                try:
                    job.done_reply = self.commands.done(job.key, job.token, retain=s.retain, bloom=s.bloom)
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
