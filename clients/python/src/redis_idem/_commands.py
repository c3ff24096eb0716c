"""The command groups, the redis-py way (as `r.bf()` is): `IdemCommands(r)`
for redis.Redis and redis.RedisCluster, `AsyncIdemCommands(r)` for their
asyncio twins. Each method sends one command of the server's edition and
returns its typed reply; errors are the typed exceptions of `_errors`."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import redis
from redis.crc import key_slot

from ._errors import NotInstalledError, translate
from ._protocol import MAX_BATCH, Call, KeyT, Protocol, edition_from_command_info
from ._replies import ClaimReply, DoneReply, Edition, FilterInfo, Record

T = TypeVar("T")

_NOT_INSTALLED = (
    "the server has neither the redis-idem module (COMMAND INFO IDEM.CLAIM) nor its Functions library "
    "(FCALL_RO idem_edition 0): load the module, or `redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua`"
)


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


def _encoded(key: KeyT) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


def group_by_slot(keys: Sequence[KeyT], cluster: bool) -> List[List[int]]:
    """Indexes of `keys` grouped so that each group shares a slot (in a
    cluster) and holds at most MAX_BATCH keys, in the keys' order."""
    if cluster:
        by_slot: Dict[int, List[int]] = defaultdict(list)
        for i, key in enumerate(keys):
            by_slot[key_slot(_encoded(key))].append(i)
        groups = list(by_slot.values())
    else:
        groups = [list(range(len(keys)))] if keys else []
    return [g[i : i + MAX_BATCH] for g in groups for i in range(0, len(g), MAX_BATCH)]


def _module_from_command_info(client_call: Any) -> bool:
    try:
        return edition_from_command_info(client_call())
    except TypeError:
        # redis-py's COMMAND INFO parser fails on the [nil] of an unknown command.
        return False
    except redis.ResponseError:
        return False


class _Base:
    def __init__(self, client: Any, prefix: str = "", edition: Optional[Union[Edition, str]] = None):
        self.client = client
        self.prefix = prefix
        self.cluster = _is_cluster(client)
        if self.cluster:
            _tolerate_dotted_names(client)
        self._edition = Edition(edition) if edition is not None else None

    def _protocol(self) -> Protocol:
        assert self._edition is not None
        return Protocol(self._edition, self.prefix)


class IdemCommands(_Base):
    """redis-idem's commands on a redis.Redis or redis.RedisCluster client.

    `prefix` is put before every key (records and filters): one namespace
    per instance, e.g. per tenant. `edition` skips asking the server.
    """

    @property
    def edition(self) -> Edition:
        """The server's edition: the module when loaded (also beside the
        library), else the Functions library; asked once."""
        if self._edition is None:
            self._edition = self._detect()
        return self._edition

    def _detect(self) -> Edition:
        if _module_from_command_info(lambda: self.client.execute_command("COMMAND", "INFO", "IDEM.CLAIM")):
            return Edition.MODULE
        try:
            self.client.execute_command("FCALL_RO", "idem_edition", 0)
            return Edition.FUNCTIONS
        except redis.ResponseError:
            raise NotInstalledError(_NOT_INSTALLED) from None

    @property
    def protocol(self) -> Protocol:
        if self._edition is None:
            self._edition = self._detect()
        return self._protocol()

    def _run(self, call: Call) -> Any:
        args, parse = call
        try:
            reply = self.client.execute_command(*args)
        except redis.ResponseError as e:
            raise translate(e) from None
        return parse(reply)

    # Records

    def claim(self, key: KeyT, lease: int, *, payload: Any = None, maxtries: Optional[int] = None,
              bloom: Optional[KeyT] = None, wait_ms: Optional[int] = None) -> ClaimReply:
        """IDEM.CLAIM key lease [PAYLOAD p] [MAXTRIES n] [BLOOM f] [WAIT ms]."""
        return self._run(self.protocol.claim(key, lease, payload, maxtries, bloom, wait_ms))

    def done(self, key: KeyT, token: Any, *, result: Any = None, retain: Optional[int] = None,
             bloom: Optional[KeyT] = None) -> DoneReply:
        """IDEM.DONE key token [RESULT r] [RETAIN s] [BLOOM f]. Raises StaleError."""
        return self._run(self.protocol.done(key, token, result, retain, bloom))

    def release(self, key: KeyT, token: Any) -> bool:
        """IDEM.RELEASE key token: True when the live claim was given up."""
        return self._run(self.protocol.release(key, token))

    def extend(self, key: KeyT, token: Any, lease: int) -> bool:
        """IDEM.EXTEND key token lease: True, or raises StaleError."""
        return self._run(self.protocol.extend(key, token, lease))

    def get(self, key: KeyT) -> Optional[Record]:
        """IDEM.GET key: the record, or None."""
        return self._run(self.protocol.get(key))

    def once(self, key: KeyT, retain: int) -> bool:
        """IDEM.ONCE key retain: True when the key was absent and is now done."""
        return self._run(self.protocol.once(key, retain))

    # Batch commands, as sent (module only; one slot, at most 10000 keys)

    def mclaim(self, lease: int, keys: Sequence[KeyT], *, payloads: Optional[Sequence[Any]] = None,
               maxtries: Optional[int] = None, bloom: Optional[KeyT] = None) -> List[Any]:
        """IDEM.MCLAIM: a ClaimReply or an exception per key."""
        return [_typed(r) for r in self._run(self.protocol.mclaim(lease, keys, payloads, maxtries, bloom))]

    def mdone(self, pairs: Sequence[Tuple[KeyT, Any]], *, results: Optional[Sequence[Any]] = None,
              retain: Optional[int] = None, bloom: Optional[KeyT] = None) -> List[Any]:
        """IDEM.MDONE: a DoneReply or an exception (StaleError, ...) per key."""
        return [_typed(r) for r in self._run(self.protocol.mdone(pairs, results, retain, bloom))]

    def mrelease(self, pairs: Sequence[Tuple[KeyT, Any]]) -> List[Any]:
        """IDEM.MRELEASE: a bool or an exception per key."""
        return [_typed(r) for r in self._run(self.protocol.mrelease(pairs))]

    # Batch helpers: any number of keys, split by slot and into chunks of
    # 10000; single calls (pipelined where possible) on the Functions edition.

    def claim_many(self, keys: Sequence[KeyT], lease: int, *, payloads: Optional[Sequence[Any]] = None,
                   maxtries: Optional[int] = None, bloom: Optional[KeyT] = None) -> List[Any]:
        """CLAIM each key: a ClaimReply or an exception per key, in order."""
        if payloads is not None and len(payloads) != len(keys):
            raise ValueError("payloads: one per key")
        out: List[Any] = [None] * len(keys)
        if self.edition is Edition.MODULE:
            for group in group_by_slot([self.protocol.key(k) for k in keys], self.cluster):
                part = self.mclaim(lease, [keys[i] for i in group],
                                   payloads=None if payloads is None else [payloads[i] for i in group],
                                   maxtries=maxtries, bloom=bloom)
                for i, reply in zip(group, part):
                    out[i] = _typed(reply)
            return out
        calls = [self.protocol.claim(k, lease, None if payloads is None else payloads[i], maxtries, bloom)
                 for i, k in enumerate(keys)]
        return self._singles(calls)

    def done_many(self, items: Sequence[Tuple[KeyT, Any, Any]], *, retain: Optional[int] = None,
                  bloom: Optional[KeyT] = None) -> List[Any]:
        """DONE each (key, token, result) (result None: none stored): a
        DoneReply or an exception per item, in order."""
        out: List[Any] = [None] * len(items)
        if self.edition is Edition.MODULE:
            keys = [self.protocol.key(k) for k, _, _ in items]
            for group in group_by_slot(keys, self.cluster):
                results = [items[i][2] for i in group]
                with_results = any(r is not None for r in results)
                if with_results and any(r is None for r in results):
                    # RESULTS gives every key one: split the ones without.
                    for i in group:
                        out[i] = self._one_done(items[i], retain, bloom)
                    continue
                part = self.mdone([(items[i][0], items[i][1]) for i in group],
                                  results=results if with_results else None, retain=retain, bloom=bloom)
                for i, reply in zip(group, part):
                    out[i] = reply
            return out
        return self._singles([self.protocol.done(k, t, r, retain, bloom) for k, t, r in items])

    def release_many(self, pairs: Sequence[Tuple[KeyT, Any]]) -> List[Any]:
        out: List[Any] = [None] * len(pairs)
        if self.edition is Edition.MODULE:
            for group in group_by_slot([self.protocol.key(k) for k, _ in pairs], self.cluster):
                for i, reply in zip(group, self.mrelease([pairs[i] for i in group])):
                    out[i] = reply
            return out
        return self._singles([self.protocol.release(k, t) for k, t in pairs])

    def _one_done(self, item: Tuple[KeyT, Any, Any], retain: Optional[int], bloom: Optional[KeyT]) -> Any:
        try:
            return self.done(item[0], item[1], result=item[2], retain=retain, bloom=bloom)
        except redis.ResponseError as e:
            return e

    def _singles(self, calls: List[Call]) -> List[Any]:
        """One call per key, pipelined (standalone) or one by one (cluster:
        each FCALL goes to its own key's node)."""
        if self.cluster:
            out = []
            for call in calls:
                try:
                    out.append(self._run(call))
                except redis.ResponseError as e:
                    out.append(e)
            return out
        out = []
        for start in range(0, len(calls), MAX_BATCH):
            chunk = calls[start : start + MAX_BATCH]
            pipe = self.client.pipeline(transaction=False)
            for args, _ in chunk:
                pipe.execute_command(*args)
            for (_, parse), reply in zip(chunk, pipe.execute(raise_on_error=False)):
                out.append(translate(reply) if isinstance(reply, redis.ResponseError) else parse(reply))
        return out

    # Date-sharded Bloom filters (module only)

    def bf_reserve(self, key: KeyT, error_rate: float, capacity: int, *, window: Optional[int] = None,
                   shard: Optional[Union[str, int]] = None, expansion: Optional[int] = None) -> bool:
        return self._run(self.protocol.bf_reserve(key, error_rate, capacity, window, shard, expansion))

    def bf_add(self, key: KeyT, item: Any) -> bool:
        """True: not seen in the window (now added)."""
        return self._run(self.protocol.bf_add(key, item))

    def bf_madd(self, key: KeyT, *items: Any) -> List[bool]:
        return self._run(self.protocol.bf_madd(key, items))

    def bf_exists(self, key: KeyT, item: Any) -> bool:
        return self._run(self.protocol.bf_exists(key, item))

    def bf_mexists(self, key: KeyT, *items: Any) -> List[bool]:
        return self._run(self.protocol.bf_mexists(key, items))

    def bf_info(self, key: KeyT) -> Optional[FilterInfo]:
        return self._run(self.protocol.bf_info(key))


def _typed(reply: Any) -> Any:
    return translate(reply) if isinstance(reply, redis.ResponseError) else reply


class AsyncIdemCommands(_Base):
    """IdemCommands for redis.asyncio.Redis and redis.asyncio.RedisCluster:
    the same methods, as coroutines."""

    async def get_edition(self) -> Edition:
        if self._edition is None:
            self._edition = await self._detect()
        return self._edition

    async def _detect(self) -> Edition:
        try:
            info = await self.client.execute_command("COMMAND", "INFO", "IDEM.CLAIM")
            if edition_from_command_info(info):
                return Edition.MODULE
        except (TypeError, redis.ResponseError):
            pass
        try:
            await self.client.execute_command("FCALL_RO", "idem_edition", 0)
            return Edition.FUNCTIONS
        except redis.ResponseError:
            raise NotInstalledError(_NOT_INSTALLED) from None

    async def get_protocol(self) -> Protocol:
        await self.get_edition()
        return self._protocol()

    async def _run(self, call: Call) -> Any:
        args, parse = call
        try:
            reply = await self.client.execute_command(*args)
        except redis.ResponseError as e:
            raise translate(e) from None
        return parse(reply)

    async def claim(self, key: KeyT, lease: int, *, payload: Any = None, maxtries: Optional[int] = None,
                    bloom: Optional[KeyT] = None, wait_ms: Optional[int] = None) -> ClaimReply:
        return await self._run((await self.get_protocol()).claim(key, lease, payload, maxtries, bloom, wait_ms))

    async def done(self, key: KeyT, token: Any, *, result: Any = None, retain: Optional[int] = None,
                   bloom: Optional[KeyT] = None) -> DoneReply:
        return await self._run((await self.get_protocol()).done(key, token, result, retain, bloom))

    async def release(self, key: KeyT, token: Any) -> bool:
        return await self._run((await self.get_protocol()).release(key, token))

    async def extend(self, key: KeyT, token: Any, lease: int) -> bool:
        return await self._run((await self.get_protocol()).extend(key, token, lease))

    async def get(self, key: KeyT) -> Optional[Record]:
        return await self._run((await self.get_protocol()).get(key))

    async def once(self, key: KeyT, retain: int) -> bool:
        return await self._run((await self.get_protocol()).once(key, retain))

    async def mclaim(self, lease: int, keys: Sequence[KeyT], *, payloads: Optional[Sequence[Any]] = None,
                     maxtries: Optional[int] = None, bloom: Optional[KeyT] = None) -> List[Any]:
        p = await self.get_protocol()
        return [_typed(r) for r in await self._run(p.mclaim(lease, keys, payloads, maxtries, bloom))]

    async def mdone(self, pairs: Sequence[Tuple[KeyT, Any]], *, results: Optional[Sequence[Any]] = None,
                    retain: Optional[int] = None, bloom: Optional[KeyT] = None) -> List[Any]:
        p = await self.get_protocol()
        return [_typed(r) for r in await self._run(p.mdone(pairs, results, retain, bloom))]

    async def mrelease(self, pairs: Sequence[Tuple[KeyT, Any]]) -> List[Any]:
        p = await self.get_protocol()
        return [_typed(r) for r in await self._run(p.mrelease(pairs))]

    async def claim_many(self, keys: Sequence[KeyT], lease: int, *, payloads: Optional[Sequence[Any]] = None,
                         maxtries: Optional[int] = None, bloom: Optional[KeyT] = None) -> List[Any]:
        if payloads is not None and len(payloads) != len(keys):
            raise ValueError("payloads: one per key")
        p = await self.get_protocol()
        out: List[Any] = [None] * len(keys)
        if p.module:
            for group in group_by_slot([p.key(k) for k in keys], self.cluster):
                part = await self.mclaim(lease, [keys[i] for i in group],
                                         payloads=None if payloads is None else [payloads[i] for i in group],
                                         maxtries=maxtries, bloom=bloom)
                for i, reply in zip(group, part):
                    out[i] = reply
            return out
        return await self._singles([p.claim(k, lease, None if payloads is None else payloads[i], maxtries, bloom)
                                    for i, k in enumerate(keys)])

    async def done_many(self, items: Sequence[Tuple[KeyT, Any, Any]], *, retain: Optional[int] = None,
                        bloom: Optional[KeyT] = None) -> List[Any]:
        p = await self.get_protocol()
        out: List[Any] = [None] * len(items)
        if p.module:
            for group in group_by_slot([p.key(k) for k, _, _ in items], self.cluster):
                results = [items[i][2] for i in group]
                with_results = any(r is not None for r in results)
                if with_results and any(r is None for r in results):
                    for i in group:
                        try:
                            out[i] = await self.done(items[i][0], items[i][1], result=items[i][2],
                                                     retain=retain, bloom=bloom)
                        except redis.ResponseError as e:
                            out[i] = e
                    continue
                part = await self.mdone([(items[i][0], items[i][1]) for i in group],
                                        results=results if with_results else None, retain=retain, bloom=bloom)
                for i, reply in zip(group, part):
                    out[i] = reply
            return out
        return await self._singles([p.done(k, t, r, retain, bloom) for k, t, r in items])

    async def release_many(self, pairs: Sequence[Tuple[KeyT, Any]]) -> List[Any]:
        p = await self.get_protocol()
        out: List[Any] = [None] * len(pairs)
        if p.module:
            for group in group_by_slot([p.key(k) for k, _ in pairs], self.cluster):
                for i, reply in zip(group, await self.mrelease([pairs[i] for i in group])):
                    out[i] = reply
            return out
        return await self._singles([p.release(k, t) for k, t in pairs])

    async def _singles(self, calls: List[Call]) -> List[Any]:
        if self.cluster:
            out = []
            for call in calls:
                try:
                    out.append(await self._run(call))
                except redis.ResponseError as e:
                    out.append(e)
            return out
        out = []
        for start in range(0, len(calls), MAX_BATCH):
            chunk = calls[start : start + MAX_BATCH]
            pipe = self.client.pipeline(transaction=False)
            for args, _ in chunk:
                pipe.execute_command(*args)
            for (_, parse), reply in zip(chunk, await pipe.execute(raise_on_error=False)):
                out.append(translate(reply) if isinstance(reply, redis.ResponseError) else parse(reply))
        return out

    async def bf_reserve(self, key: KeyT, error_rate: float, capacity: int, *, window: Optional[int] = None,
                         shard: Optional[Union[str, int]] = None, expansion: Optional[int] = None) -> bool:
        p = await self.get_protocol()
        return await self._run(p.bf_reserve(key, error_rate, capacity, window, shard, expansion))

    async def bf_add(self, key: KeyT, item: Any) -> bool:
        return await self._run((await self.get_protocol()).bf_add(key, item))

    async def bf_madd(self, key: KeyT, *items: Any) -> List[bool]:
        return await self._run((await self.get_protocol()).bf_madd(key, items))

    async def bf_exists(self, key: KeyT, item: Any) -> bool:
        return await self._run((await self.get_protocol()).bf_exists(key, item))

    async def bf_mexists(self, key: KeyT, *items: Any) -> List[bool]:
        return await self._run((await self.get_protocol()).bf_mexists(key, items))

    async def bf_info(self, key: KeyT) -> Optional[FilterInfo]:
        return await self._run((await self.get_protocol()).bf_info(key))


