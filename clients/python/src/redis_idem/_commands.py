"""The typed commands, the redis-py way (as `r.bf()` is): `IdemCommands(r)`
for redis.Redis and redis.RedisCluster, `AsyncIdemCommands(r)` for their
asyncio twins. Every method is written once, in `_Commands`: it builds its
command (or a batch plan) with `_protocol` and hands it to the executor,
`_send` / `_send_batch`, which is all the two classes add: one sends and
returns, the other returns a coroutine."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

import redis

from ._errors import NotInstalledError, translate
from ._protocol import MAX_BATCH, Batch, Call, KeyT, Protocol, edition_from_command_info
from ._replies import ClaimReply, DoneReply, Edition, FilterInfo, Record

Build = Callable[[Protocol], Call]
BuildBatch = Callable[[Protocol], Batch]

_NOT_INSTALLED = (
    "the server has neither the redis-idem module (COMMAND INFO IDEM.CLAIM) nor its Functions library "
    "(FCALL_RO idem_edition 0): load the module, or `redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua`"
)

#: What the server is asked once, one call after the other: the module wins
#: where both editions are loaded.
_DETECT = Batch([(["COMMAND", "INFO", "IDEM.CLAIM"], edition_from_command_info),
                 (["FCALL_RO", "idem_edition", 0], lambda reply: True)], [[0], [1]], 2, False)


def _edition_of(answers: List[Any]) -> Edition:
    if answers[0] is True:
        return Edition.MODULE
    if answers[1] is True:
        return Edition.FUNCTIONS
    raise NotInstalledError(_NOT_INSTALLED)


def _is_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


class _DottedNames:
    """redis-py 7+'s cluster clients refuse a command name with two dots
    (`IDEM.BF.ADD`: "Wrong command or module name") before routing it. This
    resolver answers "no policy" for those, so the client routes them by
    their key as any keyed command; every other name goes to the client's
    own resolver."""

    def __init__(self, inner: Any, is_async: bool):
        self.inner = inner
        self.is_async = is_async

    def resolve(self, command_name: str) -> Any:
        if command_name.count(".") > 1:
            if self.is_async:
                async def none() -> None:
                    return None

                return none()
            return None
        return self.inner.resolve(command_name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _tolerate_dotted_names(client: Any) -> None:
    inner = getattr(client, "_policy_resolver", None)
    if inner is not None and not isinstance(inner, _DottedNames):
        import inspect

        client._policy_resolver = _DottedNames(inner, inspect.iscoroutinefunction(inner.resolve))


def _answer(call: Call, reply: Any) -> Any:
    """A pipelined reply: parsed, or the typed error."""
    return translate(reply) if isinstance(reply, redis.ResponseError) else call[1](reply)


def _pipelines(client: Any, batch: Batch) -> Iterator[Tuple[Any, List[Call]]]:
    """The batch's calls queued on pipelines of at most MAX_BATCH commands, for the caller to execute."""
    for start in range(0, len(batch.calls), MAX_BATCH):
        chunk = batch.calls[start : start + MAX_BATCH]
        pipe = client.pipeline(transaction=False)
        for args, _ in chunk:
            pipe.execute_command(*args)
        yield pipe, chunk


#: A one-by-one call of a batch whose failure is that item's answer: an
#: error reply, or (detecting the edition) redis-py failing to parse
#: COMMAND INFO's [nil] for an unknown command.
_ITEM_ERRORS = (redis.ResponseError, TypeError)


class _Commands:
    """redis-idem's commands. `prefix` goes before every key (records and
    filters): one namespace per instance, e.g. per tenant. `edition` skips
    asking the server."""

    def __init__(self, client: Any, prefix: str = "", edition: Optional[Union[Edition, str]] = None):
        self.client = client
        self.prefix = prefix
        self.cluster = _is_cluster(client)
        if self.cluster:
            _tolerate_dotted_names(client)
        self._edition = Edition(edition) if edition is not None else None

    def _send(self, build: Build) -> Any:
        raise NotImplementedError

    def _send_batch(self, build: BuildBatch) -> Any:
        raise NotImplementedError

    # Records

    def claim(self, key: KeyT, lease: int, *, payload: Any = None, max_tries: Optional[int] = None,
              bloom: Optional[KeyT] = None, wait: Optional[float] = None, owner: Optional[str] = None) -> ClaimReply:
        """IDEM.CLAIM key lease [PAYLOAD p] [MAXTRIES n] [OWNER o] [BLOOM f] [WAIT ms]; `wait` in seconds."""
        return self._send(lambda p: p.claim(key, lease, payload, max_tries, bloom, wait, owner))

    def done(self, key: KeyT, token: Any, *, result: Any = None, retain: Optional[int] = None,
             bloom: Optional[KeyT] = None) -> DoneReply:
        """IDEM.DONE key token [RESULT r] [RETAIN s] [BLOOM f]. Raises StaleError."""
        return self._send(lambda p: p.done(key, token, result, retain, bloom))

    def release(self, key: KeyT, token: Any) -> bool:
        """IDEM.RELEASE key token: True when the live claim was given up."""
        return self._send(lambda p: p.release(key, token))

    def extend(self, key: KeyT, token: Any, lease: int) -> bool:
        """IDEM.EXTEND key token lease: True, or raises StaleError."""
        return self._send(lambda p: p.extend(key, token, lease))

    def get(self, key: KeyT) -> Optional[Record]:
        """IDEM.GET key: the record, or None."""
        return self._send(lambda p: p.get(key))

    def once(self, key: KeyT, retain: int) -> bool:
        """IDEM.ONCE key retain: True when the key was absent and is now done."""
        return self._send(lambda p: p.once(key, retain))

    # The batch commands as the module takes them (one slot, at most 10000
    # keys; ModuleRequiredError on the Functions edition).

    def mclaim(self, keys: Sequence[KeyT], lease: int, *, payloads: Optional[Sequence[Any]] = None,
               max_tries: Optional[int] = None, bloom: Optional[KeyT] = None,
               owner: Optional[str] = None) -> List[Any]:
        """IDEM.MCLAIM: a ClaimReply or a typed error per key."""
        return self._send(lambda p: p.mclaim(keys, lease, payloads, max_tries, bloom, owner))

    def mdone(self, items: Sequence[Sequence[Any]], *, retain: Optional[int] = None,
              bloom: Optional[KeyT] = None) -> List[Any]:
        """IDEM.MDONE of (key, token) items, or (key, token, result) items:
        a DoneReply or a typed error (StaleError, ...) per item."""
        return self._send(lambda p: p.mdone(items, retain, bloom))

    def mrelease(self, items: Sequence[Tuple[KeyT, Any]]) -> List[Any]:
        """IDEM.MRELEASE of (key, token) items: a bool or a typed error per item."""
        return self._send(lambda p: p.mrelease(items))

    # The batch helpers: any number of keys, on both editions, one answer
    # per item in order (a key's error is its element). On the module one
    # batch command per slot and per 10000 keys; on the Functions edition
    # one single command per key, pipelined.

    def claim_many(self, keys: Sequence[KeyT], lease: int, *, payloads: Optional[Sequence[Any]] = None,
                   max_tries: Optional[int] = None, bloom: Optional[KeyT] = None,
                   owner: Optional[str] = None) -> List[Any]:
        """CLAIM each key: a ClaimReply or a typed error per key."""
        return self._send_batch(lambda p: p.claim_many(keys, lease, payloads, max_tries, bloom, self.cluster, owner))

    def done_many(self, items: Sequence[Sequence[Any]], *, retain: Optional[int] = None,
                  bloom: Optional[KeyT] = None) -> List[Any]:
        """DONE each (key, token) or (key, token, result): a DoneReply or a typed error per item."""
        return self._send_batch(lambda p: p.done_many(items, retain, bloom, self.cluster))

    def release_many(self, items: Sequence[Tuple[KeyT, Any]]) -> List[Any]:
        """RELEASE each (key, token): a bool or a typed error per item."""
        return self._send_batch(lambda p: p.release_many(items, self.cluster))

    # Date-sharded Bloom filters (module only)

    def bf_reserve(self, key: KeyT, error_rate: float, capacity: int, *, window: Optional[int] = None,
                   shard: Optional[Union[str, int]] = None, expansion: Optional[int] = None) -> bool:
        return self._send(lambda p: p.bf_reserve(key, error_rate, capacity, window, shard, expansion))

    def bf_add(self, key: KeyT, item: Any) -> bool:
        """True: not seen in the window (now added)."""
        return self._send(lambda p: p.bf_add(key, item))

    def bf_madd(self, key: KeyT, *items: Any) -> List[bool]:
        return self._send(lambda p: p.bf_madd(key, items))

    def bf_exists(self, key: KeyT, item: Any) -> bool:
        return self._send(lambda p: p.bf_exists(key, item))

    def bf_mexists(self, key: KeyT, *items: Any) -> List[bool]:
        return self._send(lambda p: p.bf_mexists(key, items))

    def bf_info(self, key: KeyT) -> Optional[FilterInfo]:
        return self._send(lambda p: p.bf_info(key))


class IdemCommands(_Commands):
    """The commands on a redis.Redis or redis.RedisCluster client."""

    @property
    def edition(self) -> Edition:
        """The server's edition, asked once."""
        if self._edition is None:
            self._edition = _edition_of(self._run_batch(_DETECT, pipelined=False))
        return self._edition

    def _execute(self, call: Call) -> Any:
        try:
            reply = self.client.execute_command(*call[0])
        except redis.ResponseError as e:
            raise translate(e) from None
        return call[1](reply)

    def _run_batch(self, batch: Batch, pipelined: bool) -> List[Any]:
        replies: List[Any] = []
        if pipelined:
            for pipe, chunk in _pipelines(self.client, batch):
                replies += [_answer(c, r) for c, r in zip(chunk, pipe.execute(raise_on_error=False))]
        else:
            for call in batch.calls:
                try:
                    replies.append(self._execute(call))
                except _ITEM_ERRORS as e:
                    replies.append(e)
        return batch.finish(replies)

    def _send(self, build: Build) -> Any:
        return self._execute(build(Protocol(self.edition, self.prefix)))

    def _send_batch(self, build: BuildBatch) -> Any:
        batch = build(Protocol(self.edition, self.prefix))
        # Single commands are pipelined, but not in a cluster: each goes to its key's node.
        return self._run_batch(batch, pipelined=not batch.multi and not self.cluster)


class AsyncIdemCommands(_Commands):
    """The commands on a redis.asyncio.Redis or RedisCluster client: the same methods, as coroutines."""

    async def get_edition(self) -> Edition:
        """The server's edition, asked once."""
        if self._edition is None:
            self._edition = _edition_of(await self._run_batch(_DETECT, pipelined=False))
        return self._edition

    async def _execute(self, call: Call) -> Any:
        try:
            reply = await self.client.execute_command(*call[0])
        except redis.ResponseError as e:
            raise translate(e) from None
        return call[1](reply)

    async def _run_batch(self, batch: Batch, pipelined: bool) -> List[Any]:
        replies: List[Any] = []
        if pipelined:
            for pipe, chunk in _pipelines(self.client, batch):
                replies += [_answer(c, r) for c, r in zip(chunk, await pipe.execute(raise_on_error=False))]
        else:
            for call in batch.calls:
                try:
                    replies.append(await self._execute(call))
                except _ITEM_ERRORS as e:
                    replies.append(e)
        return batch.finish(replies)

    async def _send(self, build: Build) -> Any:  # type: ignore[override]
        return await self._execute(build(Protocol(await self.get_edition(), self.prefix)))

    async def _send_batch(self, build: BuildBatch) -> Any:  # type: ignore[override]
        batch = build(Protocol(await self.get_edition(), self.prefix))
        return await self._run_batch(batch, pipelined=not batch.multi and not self.cluster)

