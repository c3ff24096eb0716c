"""Redis Streams consumers on the loop: `StreamConsumer` (an Idem) and
`AsyncStreamConsumer` (an AsyncIdem) read a consumer group and run each
entry's work once per key (docs/clients.md, "Consumers of brokers").

    import redis, redis_idem
    from redis_idem.streams import StreamConsumer

    idem = redis_idem.Idem(redis.Redis(), lease=30, max_tries=5)
    consumer = StreamConsumer(idem, "orders", "billing")
    consumer.run(lambda entry, job: charge(entry.fields, fence=job.attempt))

- New entries come with XREADGROUP; entries a consumer left pending (it
  died, stalled, or gave them back) come again with XAUTOCLAIM once idle
  past `claim_idle` (the Idem's lease by default).
- The key is a field of the entry (`idem-key` by default), never its id.
- DONE and XACK go in one round trip, pipelined on one connection (XACK
  behind DONE, before a durable WAIT). When DONE did not complete the
  record (the lease was lost, the reply never came), the entry is put
  back in the group's pending list (XCLAIM ... FORCE): never acknowledged
  unless done.
- Busy and failures stay pending, their idle time set (XCLAIM ... IDLE) so
  that XAUTOCLAIM hands them out again after the holder's lease left, or
  after the retry delay: never acknowledged, never spun on.
- Exhausted (max_tries), Mismatch and MissingKey: XADD to the dead-letter
  stream (`<stream>:dlq`, the entry's fields plus `original-stream`,
  `original-id`, `error`) and XACK, in one MULTI.
- Nothing here trims the stream (XTRIM ... MINID what every group has
  acknowledged, as for any consumer group).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import redis
from redis.crc import key_slot

from ._adapters import ACK, DEAD, HOLD, AdapterStats, Policy, Verdict, error_text, settle, settle_async
from ._async import _drive as _drive_async
from ._errors import KeyT
from ._job import AfterDone, Flow, Job, Sleep
from ._settings import DEFAULT_OWNER
from ._sync import _drive

KEY_FIELD = "idem-key"
#: After a lost connection (Redis restarting, a failover), wait this long before reading again.
RECONNECT_PAUSE = 0.2


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class StreamEntry:
    """One stream entry given to the handler: `stream`, `id` (str),
    `fields` (as redis-py gives them: bytes, or str with decode_responses),
    `field(name)` (a field by its str name, whichever the client gives)."""

    __slots__ = ("stream", "id", "fields")

    def __init__(self, stream: str, id: str, fields: Dict[Any, Any]):
        self.stream = stream
        self.id = id
        self.fields = fields

    def field(self, name: str) -> Any:
        if name in self.fields:
            return self.fields[name]
        return self.fields.get(name.encode())

    def __repr__(self) -> str:
        return f"StreamEntry(stream={self.stream!r}, id={self.id!r}, fields={self.fields!r})"


def default_key(field: str) -> Callable[[StreamEntry], Any]:
    return lambda entry: entry.field(field)


# What the core asks its driver to do.


class Call(NamedTuple):
    """A redis-py client method: its reply."""

    name: str
    args: tuple
    kwargs: dict


class Multi(NamedTuple):
    """Raw commands in one MULTI / EXEC (or, with `transaction` False, one after the other): their replies."""

    commands: List[List[Any]]
    transaction: bool


class Settle(NamedTuple):
    """One entry through the Idem's loop: its Verdict."""

    entry: StreamEntry
    after: Callable[[KeyT], Optional[AfterDone]]


class _Core:
    """The consumer's steps without I/O, as flows both drivers run."""

    def __init__(self, idem: Any, stream: str, group: str, consumer: Optional[str], key: Any,
                 payload: Any, settings: Any, on_settled: Any, dead_letter: Optional[str],
                 claim_idle: Optional[float], block: float, create_group: bool, retry_delay: float,
                 max_retry_delay: float):
        self.idem = idem
        self.stream = stream
        self.group = group
        self.consumer = consumer or DEFAULT_OWNER.value()
        self.policy = Policy(default_key(key) if isinstance(key, str) else key, payload, retry_delay,
                             max_retry_delay, settings, on_settled)
        self.dead_letter = dead_letter or f"{stream}:dlq"
        self.claim_idle = float(claim_idle if claim_idle is not None else idem.settings.lease)
        if self.claim_idle < idem.settings.lease:
            raise ValueError("claim_idle: at least the Idem's lease (an entry is taken over only once "
                             "its holder's lease has lapsed)")
        if not 0 < block < 3600:
            raise ValueError("block: seconds, more than 0")
        self.block_ms = max(1, int(block * 1000))
        self.create_group = create_group
        self.stats = AdapterStats(idem.stats)
        self.stopping = False
        self.cluster = bool(idem.commands.cluster)
        self._cursor = "0-0"
        self._claim_at = 0.0  # when XAUTOCLAIM is next due

    # -- reading -------------------------------------------------------

    def ensure_group(self) -> Flow:
        """XGROUP CREATE stream group 0 MKSTREAM: a new group reads the
        stream from its start (nothing published before it is missed)."""
        if not self.create_group:
            return
        try:
            yield Call("xgroup_create", (self.stream, self.group), {"id": "0", "mkstream": True})
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def fetch(self, count: int) -> Flow:
        """Up to `count` entries: those idle past claim_idle first
        (XAUTOCLAIM, when due), else new ones (XREADGROUP, blocking up to
        `block`)."""
        now = time.monotonic()
        if now >= self._claim_at:
            reply = yield Call("xautoclaim", (self.stream, self.group, self.consumer,
                                              int(self.claim_idle * 1000), self._cursor), {"count": count})
            self._cursor = _text(reply[0])
            entries = self._entries(reply[1])
            if self._cursor == "0-0" and not entries:  # the pending list walked: again in a while
                self._claim_at = now + min(5.0, max(0.05, self.claim_idle / 2))
            if entries:
                return entries
        reply = yield Call("xreadgroup", (self.group, self.consumer, {self.stream: ">"}),
                           {"count": count, "block": self.block_ms})
        return self._read(reply)

    def _read(self, reply: Any) -> List[StreamEntry]:
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3: {stream: [entries]}
            return [e for entries in reply.values() for e in self._entries(entries[0] if entries and
                                                                              isinstance(entries[0], list)
                                                                              else entries)]
        return [e for _, entries in reply for e in self._entries(entries)]

    def _entries(self, raw: Any) -> List[StreamEntry]:
        return [StreamEntry(self.stream, _text(entry_id), fields if fields is not None else {})
                for entry_id, fields in raw or []]

    # -- one entry -------------------------------------------------------

    def _same_slot(self, key: KeyT) -> bool:
        if not self.cluster:
            return True
        return key_slot(_bytes(self.idem.commands.prefix) + _bytes(key)) == key_slot(_bytes(self.stream))

    def _xack(self, entry_id: str) -> List[Any]:
        return ["XACK", self.stream, self.group, entry_id]

    def _after(self, entry: StreamEntry, made: List[AfterDone]) -> Callable[[KeyT], Optional[AfterDone]]:
        """The XACK that rides with the entry's DONE (kept in `made`)."""
        def after(key: KeyT) -> Optional[AfterDone]:
            if not self._same_slot(key):
                return None  # another node: XACK once DONE is confirmed
            made.append(AfterDone([(self._xack(entry.id), lambda reply: reply)]))
            return made[0]
        return after

    def handle(self, entry: StreamEntry) -> Flow:
        """One entry, to its end: acknowledged, held back or dead-lettered.
        A lost connection leaves it pending (it comes again)."""
        if not entry.fields:  # deleted from the stream while pending (Redis 6.2 answers nil fields)
            yield from self._quietly(Call("xack", (self.stream, self.group, entry.id), {}))
            return Verdict(ACK)
        made: List[AfterDone] = []
        verdict: Verdict = yield Settle(entry, self._after(entry, made))
        riding = made[0] if made else None
        if verdict.action == ACK:
            if riding is None or not riding.sent or not _ok(riding.replies):
                ok = yield from self._quietly(Call("xack", (self.stream, self.group, entry.id), {}))
                if not ok:
                    return verdict
            self.stats.add("acknowledged")
        elif verdict.action == DEAD:
            if not (yield from self._dead_letter(entry, verdict)):
                return verdict
            self.stats.add("dead_lettered")
        else:
            # Pending still (or again: DONE's XACK may have run): to be
            # handed out once the delay has passed.
            idle = max(0, int((self.claim_idle - verdict.delay) * 1000))
            yield from self._quietly(Call("xclaim", (self.stream, self.group, self.consumer, 0, [entry.id]),
                                          {"idle": idle, "justid": True,
                                           "force": bool(riding is not None and riding.sent)}))
            self.stats.add("held_back")
        self.policy.settled(entry, verdict)
        return verdict

    def _dead_letter(self, entry: StreamEntry, verdict: Verdict) -> Flow:
        fields: List[Any] = []
        for name, value in entry.fields.items():
            fields += [name, value]
        fields += ["original-stream", self.stream, "original-id", entry.id, "error", error_text(verdict.error)]
        same = not self.cluster or key_slot(_bytes(self.dead_letter)) == key_slot(_bytes(self.stream))
        # One MULTI; across nodes XADD first (a crash between the two leaves
        # a second copy, never a lost message).
        commands = [["XADD", self.dead_letter, "*", *fields], self._xack(entry.id)]
        return (yield from self._quietly(Multi(commands, same)))

    def _quietly(self, effect: Any) -> Flow:
        """An acknowledgement's command: True when it ran, False when the
        connection failed (the entry stays pending and comes again)."""
        try:
            yield effect
        except (redis.ConnectionError, redis.TimeoutError):
            return False
        return True


def _ok(replies: Optional[List[Any]]) -> bool:
    return bool(replies) and not any(isinstance(r, BaseException) for r in replies)


class _Member:
    """What StreamConsumer and AsyncStreamConsumer share around their core."""

    _core: _Core

    @property
    def stats(self) -> AdapterStats:
        """The adapter's counters and (`as_dict()`) the Idem's."""
        return self._core.stats

    @property
    def consumer(self) -> str:
        """This consumer's name in the group."""
        return self._core.consumer

    def stop(self) -> None:
        """Stop taking entries: run() returns once those in hand are settled
        (safe from a signal handler, or loop.add_signal_handler)."""
        self._core.stopping = True


class StreamConsumer(_Member):
    """A consumer of `group` on `stream` with an Idem (redis.Redis or
    RedisCluster: give the stream and the keys one hash tag for one round
    trip in a cluster).

    `handler(entry, job)` is the work (a StreamEntry and the Job: pass
    `job.attempt` to your writes); what it returns is the stored result.
    Options: `consumer` (this consumer's name in the group; default
    host:pid), `key` (a field name, or a function of the entry; default
    `idem-key`), `payload` (a function of the entry, for MISMATCH),
    `settings` (a function of the entry answering process()'s settings
    for it, as a dict: `{"bloom": ...}`), `on_settled(entry, verdict)`
    (called once the entry was acknowledged, held back or dead-lettered),
    `dead_letter` (default `<stream>:dlq`), `claim_idle` (seconds an entry
    stays pending before XAUTOCLAIM takes it over; default and least the
    Idem's lease), `block` (seconds XREADGROUP waits; 1), `create_group`
    (XGROUP CREATE ... 0 MKSTREAM when missing; True), `retry_delay` and
    `max_retry_delay` (a failed entry comes again after 0.1 s, doubling
    each attempt, up to 30 s)."""

    def __init__(self, idem: Any, stream: str, group: str, *, consumer: Optional[str] = None,
                 key: Any = KEY_FIELD, payload: Optional[Callable[[StreamEntry], Any]] = None,
                 settings: Optional[Callable[[StreamEntry], Dict[str, Any]]] = None,
                 on_settled: Optional[Callable[[StreamEntry, Verdict], None]] = None,
                 dead_letter: Optional[str] = None, claim_idle: Optional[float] = None, block: float = 1.0,
                 create_group: bool = True, retry_delay: float = 0.1, max_retry_delay: float = 30.0):
        self.idem = idem
        self._core = _Core(idem, stream, group, consumer, key, payload, settings, on_settled, dead_letter,
                           claim_idle, block, create_group, retry_delay, max_retry_delay)

    def run(self, handler: Callable[[StreamEntry, Job], Any]) -> None:
        """Read and settle entries, one at a time, until stop()."""
        core = self._core
        act = self._act(handler)
        # The group is made on the first NOGROUP: a Redis that is down or
        # loading when run() starts is waited for, as later on.
        while not core.stopping:
            try:
                entries = _drive(core.fetch(1), act)
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(RECONNECT_PAUSE)
                continue
            except redis.ResponseError as e:
                if not str(e).startswith("NOGROUP"):
                    raise
                try:
                    if core.create_group:
                        _drive(core.ensure_group(), act)
                        continue
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                time.sleep(RECONNECT_PAUSE)
                continue
            for entry in entries:
                _drive(core.handle(entry), act)

    def handle(self, entry: StreamEntry, handler: Callable[[StreamEntry, Job], Any]) -> Verdict:
        """One entry you read yourself (with XREADGROUP on this group, as
        this consumer): settled as run() would."""
        return _drive(self._core.handle(entry), self._act(handler))

    def _act(self, handler: Callable[[StreamEntry, Job], Any]) -> Callable[[Any], Any]:
        client, core = self.idem.client, self._core

        def act(effect: Any) -> Any:
            kind = type(effect)
            if kind is Call:
                return getattr(client, effect.name)(*effect.args, **effect.kwargs)
            if kind is Settle:
                return settle(self.idem, core.policy, effect.entry, handler, effect.after)
            if kind is Multi:
                with client.pipeline(transaction=effect.transaction) as pipe:
                    for command in effect.commands:
                        pipe.execute_command(*command)
                    return pipe.execute()
            if kind is Sleep:
                return time.sleep(effect.seconds)
            raise TypeError(effect)
        return act


class AsyncStreamConsumer(_Member):
    """StreamConsumer on an AsyncIdem: `await consumer.run(handler)` with
    `handler` async (a plain function will do), `concurrency` entries at
    work at once (1), each read only when a worker is free to start it."""

    def __init__(self, idem: Any, stream: str, group: str, *, consumer: Optional[str] = None,
                 key: Any = KEY_FIELD, payload: Optional[Callable[[StreamEntry], Any]] = None,
                 settings: Optional[Callable[[StreamEntry], Dict[str, Any]]] = None,
                 on_settled: Optional[Callable[[StreamEntry, Verdict], None]] = None,
                 dead_letter: Optional[str] = None, claim_idle: Optional[float] = None, block: float = 1.0,
                 create_group: bool = True, retry_delay: float = 0.1, max_retry_delay: float = 30.0,
                 concurrency: int = 1):
        if concurrency < 1:
            raise ValueError("concurrency: 1 or more")
        self.idem = idem
        self.concurrency = concurrency
        self._core = _Core(idem, stream, group, consumer, key, payload, settings, on_settled, dead_letter,
                           claim_idle, block, create_group, retry_delay, max_retry_delay)

    async def run(self, handler: Callable[[StreamEntry, Job], Any]) -> None:
        from ._pump import pump

        core = self._core
        act = self._act(handler)

        async def fetch(count: int) -> List[StreamEntry]:
            # As StreamConsumer.run: the group made on the first NOGROUP.
            try:
                return await _drive_async(core.fetch(count), act)
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            except redis.ResponseError as e:
                if not str(e).startswith("NOGROUP"):
                    raise
                try:
                    if core.create_group:
                        await _drive_async(core.ensure_group(), act)
                        return []
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
            await asyncio.sleep(RECONNECT_PAUSE)
            return []

        async def handle(entry: StreamEntry) -> None:
            await _drive_async(core.handle(entry), act)

        await pump(fetch, handle, self.concurrency, lambda: core.stopping)

    async def handle(self, entry: StreamEntry, handler: Callable[[StreamEntry, Job], Any]) -> Verdict:
        return await _drive_async(self._core.handle(entry), self._act(handler))

    def _act(self, handler: Callable[[StreamEntry, Job], Any]) -> Callable[[Any], Any]:
        client, core = self.idem.client, self._core

        async def act(effect: Any) -> Any:
            kind = type(effect)
            if kind is Call:
                return await getattr(client, effect.name)(*effect.args, **effect.kwargs)
            if kind is Settle:
                return await settle_async(self.idem, core.policy, effect.entry, handler, effect.after)
            if kind is Multi:
                async with client.pipeline(transaction=effect.transaction) as pipe:
                    for command in effect.commands:
                        pipe.execute_command(*command)
                    return await pipe.execute()
            if kind is Sleep:
                return await asyncio.sleep(effect.seconds)
            raise TypeError(effect)
        return act


__all__ = ["ACK", "AsyncStreamConsumer", "DEAD", "HOLD", "StreamConsumer", "StreamEntry", "Verdict"]
