"""The consumer loop, sync: `Idem(r).process(key, work)`. It drives the
flows of `_loop` with blocking calls; the heartbeat is a daemon thread."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

from ._commands import IdemCommands
from ._errors import KeyT
from ._idem import IdemBase
from ._loop import BatchItem, advance, Command, Flow, Job, Outcome, Sleep, StartBeat, StopBeat, Work
from ._replies import Edition


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
    def __init__(self, idem: "Idem", jobs: List[Job], every: float):
        self.stopped = threading.Event()
        flow = idem._loop.heartbeat(jobs, every)
        self.thread = threading.Thread(target=self._run, args=(idem, flow), name="redis-idem heartbeat", daemon=True)
        self.thread.start()

    def _run(self, idem: "Idem", flow: Flow) -> None:
        def act(effect: Any) -> Any:
            if isinstance(effect, Sleep):
                if self.stopped.wait(effect.seconds):
                    raise GeneratorExit
                return None
            return idem._command(effect)

        try:
            _drive(flow, act)
        except GeneratorExit:
            pass

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


class Idem(IdemBase):
    """The consumer loop on a redis.Redis or redis.RedisCluster client."""

    _commands_class = IdemCommands
    commands: IdemCommands

    @property
    def edition(self) -> Edition:
        return self.commands.edition

    def process(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None, **settings: Any) -> Any:
        """Run `work(job)` once for `key`, whoever else runs it, and return
        its value (a replay: the stored result, decoded, without running it).
        Raises BusyError, MismatchError, ExhaustedError, LeaseLostError,
        ResultNotStoredError, HookError, DoneUnconfirmedError, and what the
        work raises (the claim released)."""
        return self.process_outcome(key, work, payload=payload, **settings).value

    def process_outcome(self, key: KeyT, work: Callable[[Job], Any], *, payload: Any = None,
                        **settings: Any) -> Outcome:
        """process(), answering an Outcome (value, replayed, status, attempt, result_stored)."""
        return self._run(self._flow(lambda loop, s: loop.process(key, payload, s), settings), work)

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
        return self._run(self._flow(lambda loop, s: loop.process_many(keys, payloads, s), settings), work)

    def _flow(self, make: Callable[[Any, Any], Flow], settings: Any) -> Flow:
        self._loop.module = self.edition is Edition.MODULE
        return make(self._loop, self._settings(settings))

    def _command(self, effect: Command) -> Any:
        return getattr(self.commands, effect.name)(*effect.args, **effect.kwargs)

    def _run(self, flow: Flow, work: Callable[[Job], Any]) -> Any:
        def act(effect: Any) -> Any:
            if isinstance(effect, Command):
                return self._command(effect)
            if isinstance(effect, Work):
                return work(effect.job)
            if isinstance(effect, Sleep):
                return time.sleep(effect.seconds)
            if isinstance(effect, StartBeat):
                return _Heartbeat(self, effect.jobs, effect.every)
            if isinstance(effect, StopBeat):
                return effect.beat.stop() if effect.beat is not None else None
            raise TypeError(effect)

        return _drive(flow, act)
