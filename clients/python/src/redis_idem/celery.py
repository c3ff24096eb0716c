"""Celery tasks on the loop: `base=IdempotentTask` runs a task's body once
per key, whoever runs it and however often its message comes (docs/
clients.md, "Consumers of brokers"). `pip install redis-idem[celery]`.

    from celery import Celery
    from redis_idem.celery import IdempotentTask

    app = Celery("shop", broker="amqp://localhost/")
    app.conf.redis_idem_url = "redis://localhost:6379/0"
    app.conf.broker_transport_options = {"confirm_publish": True}

    @app.task(base=IdempotentTask, bind=True, idem_key=lambda order: order["id"])
    def charge(self, order):
        return payments.charge(order, fence=self.idem_job.attempt)

- The key is `idem_key(*args, **kwargs)`, a function of the task's
  arguments (default: the task's name and a SHA-256 of its arguments as
  JSON), never the task id: a task sent again gets a new one.
- `acks_late`: the message is acknowledged once the record is done (the
  body ran and DONE was confirmed, or it was a replay: the stored result
  is the task's return value, so the result backend has it for the new
  task id too). `reject_on_worker_lost`: a pool process that dies
  mid-task gives its message back (its claim lapses with its lease and
  the redelivery takes over); a whole worker killed closes its
  connection, and the broker does the same.
- Busy after the Idem's wait: `self.retry(countdown=<the holder's lease
  left>)`, never acknowledged as done nor run. A body that raises:
  released by the loop, then `self.retry(countdown=...)` with
  `default_retry_delay` doubling per attempt up to `retry_backoff_max`;
  DONE unconfirmed, a lost lease: a retry after `default_retry_delay`.
  These retries do not count against Celery's `max_retries`: the record's
  `max_tries` (default `max_retries + 1`) decides.
- Exhausted, Mismatch, MissingKey: `Reject(requeue=False)`, so the broker
  moves the message to the queue's dead-letter exchange (`x-death`).
- A failure of the retry itself (or of this adapter) is not acknowledged
  either (`acks_on_failure` off): the message is rejected to the dead
  letter.

Counters: `stats_for(app)` (or `self.idem_stats` in a bound task) has this
process's Idem counters and `acknowledged`, `held_back` (retries: Busy,
failures, DONE unconfirmed, a lost lease), `dead_lettered`; a prefork
pool's children count each their own.

Configuration (app.conf): `redis_idem_url` (or `redis_idem_factory`, a
function making the Idem, for a cluster or Sentinel) and
`redis_idem_options` (the Idem's keywords: prefix, lease, wait, max_tries,
...); each process makes its own Idem on its first task. Task options:
`idem_key`, `idem_payload` (a function of the arguments, sent as PAYLOAD),
`idem_settings` (process() settings for this task: lease, wait, ...).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict, Optional

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from ._broker import ACK, DEAD, AdapterStats, Backoff, Verdict, judge, key_of
from ._errors import MissingKeyError
from ._job import Job

_lock = threading.Lock()
_loops = threading.local()


def default_key(task: Task, args: tuple, kwargs: dict) -> str:
    """`<task name>:<SHA-256 of [args, kwargs] as JSON>`: the same call, the same key."""
    text = json.dumps([list(args), kwargs], sort_keys=True, separators=(",", ":"), default=str)
    return f"{task.name}:{hashlib.sha256(text.encode()).hexdigest()}"


def idem_for(app: Any) -> Any:
    """This process's Idem for `app` (made on first use, again after a fork)."""
    return _made(app)[1]


def stats_for(app: Any) -> AdapterStats:
    """This process's counters for `app`'s IdempotentTasks: the Idem's and
    acknowledged, held_back, dead_lettered."""
    return _made(app)[2]


def _made(app: Any) -> "tuple[int, Any, AdapterStats]":
    made = getattr(app, "_redis_idem", None)
    if made is None or made[0] != os.getpid():
        with _lock:
            made = getattr(app, "_redis_idem", None)
            if made is None or made[0] != os.getpid():
                idem = _make_idem(app.conf)
                made = (os.getpid(), idem, AdapterStats(idem.stats))
                app._redis_idem = made
                _check_confirms(app.conf)
    return made


def _make_idem(conf: Any) -> Any:
    factory = conf.get("redis_idem_factory")
    if factory is not None:
        return factory()
    url = conf.get("redis_idem_url")
    if not url:
        raise RuntimeError("redis_idem.celery: set app.conf.redis_idem_url (or redis_idem_factory)")
    import redis

    from ._sync import Idem

    return Idem(redis.Redis.from_url(url), **dict(conf.get("redis_idem_options") or {}))


def _check_confirms(conf: Any) -> None:
    url = str(conf.get("broker_url") or "")
    if url.startswith(("amqp", "pyamqp")) and not (conf.get("broker_transport_options") or {}).get("confirm_publish"):
        warnings.warn("redis_idem.celery: without broker_transport_options={'confirm_publish': True} a retry's "
                      "message is not confirmed by the broker before the original is acknowledged", stacklevel=3)


def _static(task: Any, name: str) -> Optional[Callable[..., Any]]:
    """A task option holding a function, as given (a plain function set as a
    class attribute would otherwise come back bound to the task)."""
    value = inspect.getattr_static(task, name, None)
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return value


def _complete(value: Any) -> Any:
    """An async body's coroutine, run to its end on this thread's event
    loop (kept between tasks, so clients bound to it stay usable)."""
    if not inspect.isawaitable(value):
        return value
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop.run_until_complete(value)


class IdempotentTask(Task):
    """A Celery task whose body runs once per key (see redis_idem.celery)."""

    acks_late = True
    reject_on_worker_lost = True
    acks_on_failure_or_timeout = False
    acks_on_failure = False
    acks_on_timeout = False

    #: A function of the task's arguments giving its key (None: default_key).
    idem_key: Optional[Callable[..., Any]] = None
    #: A function of the task's arguments giving its PAYLOAD (a Mismatch is dead-lettered).
    idem_payload: Optional[Callable[..., Any]] = None
    #: process() settings for this task (lease, wait, max_tries, heartbeat, ...).
    idem_settings: Dict[str, Any] = {}

    @property
    def idem(self) -> Any:
        """This process's Idem (app.conf.redis_idem_url or redis_idem_factory)."""
        return idem_for(self.app)

    @property
    def idem_stats(self) -> AdapterStats:
        """This process's counters (stats_for(app))."""
        return stats_for(self.app)

    @property
    def idem_job(self) -> Optional[Job]:
        """The running body's Job (`attempt`: the fencing number to pass to its writes)."""
        return getattr(self.request, "idem_job", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:  # a plain call, not a task: Celery runs the body as it is
            return super().__call__(*args, **kwargs)
        idem = self.idem
        settings = self._settings(idem)
        first = self.default_retry_delay or 1
        backoff = Backoff(first, max(first, getattr(self, "retry_backoff_max", None) or 600))
        job: list = []

        def work(j: Job) -> Any:
            job.append(j)
            self.request.idem_job = j
            return _complete(self.run(*args, **kwargs))

        try:
            key = self._key(args, kwargs)
            payload = self._payload(args, kwargs)
            outcome = idem.process_outcome(key, work, payload=payload, **settings)
            self.idem_stats.count(Verdict(ACK))
            return outcome.value
        except (Retry, Reject, Ignore):
            raise  # the body's own (its claim was released): Celery's to handle
        except MissingKeyError as e:
            verdict = Verdict(DEAD, error=e)
        except Exception as e:
            verdict = judge(e, job[0] if job else None, backoff)
        self.idem_stats.count(verdict)
        if verdict.action == ACK:
            return verdict.value
        if verdict.action == DEAD:
            raise Reject(verdict.error, requeue=False)
        # Given back: a retry that Celery's max_retries does not end (the record's max_tries does).
        raise self.retry(exc=verdict.error, countdown=verdict.delay, max_retries=sys.maxsize)

    def _settings(self, idem: Any) -> Dict[str, Any]:
        settings = dict(self.idem_settings or {})
        if "max_tries" not in settings and idem.settings.max_tries is None and self.max_retries is not None:
            settings["max_tries"] = self.max_retries + 1
        return settings

    def _key(self, args: tuple, kwargs: dict) -> Any:
        fn = _static(self, "idem_key")
        if fn is None:
            return default_key(self, args, kwargs)
        return key_of(fn, {"task": self.name, "args": args, "kwargs": kwargs}, *args, **kwargs)

    def _payload(self, args: tuple, kwargs: dict) -> Any:
        fn = _static(self, "idem_payload")
        return None if fn is None else fn(*args, **kwargs)


__all__ = ["IdempotentTask", "default_key", "idem_for", "stats_for"]
