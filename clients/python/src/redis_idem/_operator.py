"""Operator actions on either edition, standalone or cluster: find stuck and
dead-lettered records (`IDEM.SCAN`, `FCALL_RO idem_scan`), give them back
(`IDEM.REQUEUE`, `FCALL idem_requeue`), read a record and the counters.

    op = redis_idem.Operator(redis.Redis())
    for key in op.scan(state="released", min_tries=3):   # the dead letters of MAXTRIES 3
        op.requeue(key)

In a cluster, `scan` walks every primary in turn (a scan sees one node's
keys); every other call goes to the key's node. `AsyncOperator` is the same
for redis.asyncio clients."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Union

import redis

from ._commands import AsyncIdemCommands, IdemCommands, _is_cluster
from ._errors import translate
from ._replies import Edition, RecordState

KeyT = Union[str, bytes]

#: `progress(node, nodes, calls, found)` after each scan call.
Progress = Callable[[int, int, int, int], None]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _scan_options(state: Optional[Union[RecordState, str]], min_tries: Optional[int], idle: Optional[int],
                  match: Optional[KeyT], count: Optional[int]) -> List[Any]:
    options: List[Any] = []
    for name, value in (("MATCH", match), ("COUNT", count), ("MINTRIES", min_tries), ("IDLE", idle)):
        if value is not None:
            options += [name, value]
    if state is not None:
        options += ["STATE", RecordState(state).value]
    return options


def _scan_call(module: bool, cursor: Any, options: List[Any]) -> List[Any]:
    if module:
        return ["IDEM.SCAN", cursor, *options]
    return ["FCALL_RO", "idem_scan", 0, cursor, *options]


def _requeue_call(module: bool, key: KeyT) -> List[Any]:
    return ["IDEM.REQUEUE", key] if module else ["FCALL", "idem_requeue", 1, key]


def _primaries(client: Any, cluster: bool) -> List[Any]:
    if not cluster:
        return [client]
    nodes = client.get_primaries()
    # The sync cluster client hands out a client per node; the asyncio
    # one's nodes run commands themselves.
    connection = getattr(client, "get_redis_connection", None)
    return [connection(node) for node in nodes] if connection else nodes


class Operator:
    """Operator actions on a redis.Redis or redis.RedisCluster client.
    `edition` skips asking the server which one it runs."""

    def __init__(self, client: Any, edition: Optional[Union[Edition, str]] = None):
        self.client = client
        self.cluster = _is_cluster(client)
        self._commands = IdemCommands(client, edition=edition)

    @property
    def edition(self) -> Edition:
        return self._commands.edition

    @property
    def module(self) -> bool:
        return self.edition is Edition.MODULE

    def primaries(self) -> List[Any]:
        """A client per primary: the client itself when not a cluster."""
        return _primaries(self.client, self.cluster)

    def scan(self, state: Optional[Union[RecordState, str]] = None, min_tries: Optional[int] = None,
             idle: Optional[int] = None, match: Optional[KeyT] = None, count: Optional[int] = None,
             progress: Optional[Progress] = None) -> Iterator[bytes]:
        """Every record whose fields match all the filters given, as key
        names, each primary in turn: `state` (processing, expired, released,
        done), `min_tries` (claims since the latest requeue), `idle`
        (seconds since its latest change), `match` (a SCAN glob), `count`
        (work per call). A record present for the whole scan is returned at
        least once (SCAN's guarantee: maybe more)."""
        options = _scan_options(state, min_tries, idle, match, count)
        nodes = self.primaries()
        for index, node in enumerate(nodes):
            cursor: Any = 0
            calls = found = 0
            while True:
                try:
                    cursor, keys = node.execute_command(*_scan_call(self.module, cursor, options))
                except redis.ResponseError as e:
                    raise translate(e) from None
                calls += 1
                found += len(keys)
                yield from keys
                if progress is not None:
                    progress(index, len(nodes), calls, found)
                if _text(cursor) == "0":
                    break

    def requeue(self, key: KeyT) -> bool:
        """Gives a record's work back: `True` when it is now released (its
        attempt kept, its tries restarted), `False` when there is no record.
        A record whose lease is live is refused with an error."""
        try:
            return bool(self.client.execute_command(*_requeue_call(self.module, key)))
        except redis.ResponseError as e:
            raise translate(e) from None

    def get(self, key: KeyT) -> Optional[Dict[str, Any]]:
        """The record's fields as IDEM.GET gives them (names as text), or
        None when there is no record."""
        if self.module:
            args: List[Any] = ["IDEM.GET", key]
        else:
            args = ["FCALL_RO", "idem_get", 1, key]
        try:
            reply = self.client.execute_command(*args)
        except redis.ResponseError as e:
            raise translate(e) from None
        if reply is None:
            return None
        if isinstance(reply, dict):
            pairs = list(reply.items())
        else:
            pairs = [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]
        fields = {_text(k): v for k, v in pairs}
        fields["state"] = _text(fields["state"])
        if fields.get("fingerprint") is not None:
            fields["fingerprint"] = _text(fields["fingerprint"])
        return fields

    def counters(self) -> Dict[str, int]:
        """`INFO idem`'s counters summed over the primaries (names without
        the `idem_` prefix). The Functions edition keeps none: empty."""
        total: Dict[str, int] = {}
        for node in self.primaries():
            for name, value in node.info("idem").items():
                if isinstance(value, int):
                    key = name[len("idem_"):] if name.startswith("idem_") else name
                    total[key] = total.get(key, 0) + value
        return total


class AsyncOperator:
    """Operator's `scan` and `requeue` for redis.asyncio.Redis and
    redis.asyncio.RedisCluster: `async for key in op.scan(...)`."""

    def __init__(self, client: Any, edition: Optional[Union[Edition, str]] = None):
        self.client = client
        self.cluster = _is_cluster(client)
        self._commands = AsyncIdemCommands(client, edition=edition)

    async def scan(self, state: Optional[Union[RecordState, str]] = None, min_tries: Optional[int] = None,
                   idle: Optional[int] = None, match: Optional[KeyT] = None,
                   count: Optional[int] = None) -> AsyncIterator[bytes]:
        """As `Operator.scan`."""
        module = await self._commands.get_edition() is Edition.MODULE
        options = _scan_options(state, min_tries, idle, match, count)
        for node in _primaries(self.client, self.cluster):
            cursor: Any = 0
            while True:
                try:
                    cursor, keys = await node.execute_command(*_scan_call(module, cursor, options))
                except redis.ResponseError as e:
                    raise translate(e) from None
                for key in keys:
                    yield key
                if _text(cursor) == "0":
                    break

    async def requeue(self, key: KeyT) -> bool:
        """As `Operator.requeue`."""
        module = await self._commands.get_edition() is Edition.MODULE
        try:
            return bool(await self.client.execute_command(*_requeue_call(module, key)))
        except redis.ResponseError as e:
            raise translate(e) from None
