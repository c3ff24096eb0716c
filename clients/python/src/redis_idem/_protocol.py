"""The commands of both editions as (arguments, reply parser), and the
batch helpers' plans (which calls answer which keys): built without I/O,
in one place, for the sync and the asyncio command groups to send."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from redis.crc import key_slot

import redis

from ._errors import ModuleRequiredError, translate
from ._replies import ClaimReply, DoneReply, Edition, FilterInfo, Record

KeyT = Union[str, bytes]
Call = Tuple[List[Any], Callable[[Any], Any]]

#: The most keys one IDEM.MCLAIM / MDONE / MRELEASE takes.
MAX_BATCH = 10000


def _identity(reply: Any) -> Any:
    return reply


def _bool(reply: Any) -> bool:
    return bool(int(reply))


def _each(parse: Callable[[Any], Any]) -> Callable[[Any], List[Any]]:
    """A batch reply's parser: `parse` for each element, the typed error for an error element."""
    return lambda reply: [translate(r) if isinstance(r, redis.ResponseError) else parse(r) for r in reply]


def _done_reply(reply: Any) -> DoneReply:
    return DoneReply(int(reply))


_claims = _each(ClaimReply.parse)
_dones = _each(_done_reply)
_releases = _each(_bool)


def needs_module(what: str, why: str) -> ModuleRequiredError:
    return ModuleRequiredError(
        f"{what} needs the redis-idem module: the server runs the Functions edition (functions/idem.lua), {why}"
    )


class Protocol:
    """Builds each command for one edition, with the key prefix applied."""

    def __init__(self, edition: Edition, prefix: str = ""):
        self.edition = edition
        self.prefix = prefix

    def key(self, key: KeyT) -> KeyT:
        if not self.prefix:
            return key
        if isinstance(key, bytes):
            return self.prefix.encode() + key
        return self.prefix + key

    @property
    def module(self) -> bool:
        return self.edition is Edition.MODULE

    def _fcall(self, name: str, key: KeyT, *args: Any, ro: bool = False) -> List[Any]:
        return ["FCALL_RO" if ro else "FCALL", name, 1, self.key(key), *args]

    def claim(
        self,
        key: KeyT,
        lease: int,
        payload: Optional[Any] = None,
        max_tries: Optional[int] = None,
        bloom: Optional[KeyT] = None,
        wait: Optional[float] = None,
        owner: Optional[str] = None,
    ) -> Call:
        whole_seconds("lease", lease)
        opts: List[Any] = []
        if payload is not None:
            opts += ["PAYLOAD", payload]
        if max_tries is not None:
            opts += ["MAXTRIES", max_tries]
        if owner is not None:
            opts += ["OWNER", owner]
        if bloom is not None:
            if not self.module:
                raise needs_module("BLOOM", "which keeps no Bloom filters")
            opts += ["BLOOM", self.key(bloom)]
        wait_ms = int(wait * 1000) if wait else 0
        if wait_ms > 0:
            if not self.module:
                raise needs_module("WAIT", "where a function cannot block: retry a BUSY claim after a backoff")
            opts += ["WAIT", wait_ms]
        if self.module:
            return ["IDEM.CLAIM", self.key(key), lease, *opts], ClaimReply.parse
        return self._fcall("idem_claim", key, lease, *opts), ClaimReply.parse

    def done(
        self,
        key: KeyT,
        token: Any,
        result: Optional[Any] = None,
        retain: Optional[int] = None,
        bloom: Optional[KeyT] = None,
    ) -> Call:
        opts: List[Any] = []
        if result is not None:
            opts += ["RESULT", result]
        if retain is not None:
            whole_seconds("retain", retain)
            opts += ["RETAIN", retain]
        if bloom is not None:
            if not self.module:
                raise needs_module("BLOOM", "which keeps no Bloom filters")
            opts += ["BLOOM", self.key(bloom)]
        if self.module:
            return ["IDEM.DONE", self.key(key), token, *opts], _done_reply
        return self._fcall("idem_done", key, token, *opts), _done_reply

    def release(self, key: KeyT, token: Any) -> Call:
        if self.module:
            return ["IDEM.RELEASE", self.key(key), token], _bool
        return self._fcall("idem_release", key, token), _bool

    def extend(self, key: KeyT, token: Any, lease: int) -> Call:
        whole_seconds("lease", lease)
        if self.module:
            return ["IDEM.EXTEND", self.key(key), token, lease], _bool
        return self._fcall("idem_extend", key, token, lease), _bool

    def get(self, key: KeyT) -> Call:
        if self.module:
            return ["IDEM.GET", self.key(key)], Record.parse
        return self._fcall("idem_get", key, ro=True), Record.parse

    def once(self, key: KeyT, retain: int) -> Call:
        whole_seconds("retain", retain)
        if self.module:
            return ["IDEM.ONCE", self.key(key), retain], _bool
        return self._fcall("idem_once", key, retain), _bool

    # Batch commands (module only; the helpers fall back to single calls).

    def _batch_only(self, name: str) -> None:
        if not self.module:
            raise needs_module(name, "which has no batch commands: use claim_many / done_many, which fall back to single calls")

    def mclaim(
        self,
        keys: Sequence[KeyT],
        lease: int,
        payloads: Optional[Sequence[Any]] = None,
        max_tries: Optional[int] = None,
        bloom: Optional[KeyT] = None,
        owner: Optional[str] = None,
    ) -> Call:
        self._batch_only("IDEM.MCLAIM")
        whole_seconds("lease", lease)
        args: List[Any] = ["IDEM.MCLAIM", lease, len(keys), *(self.key(k) for k in keys)]
        if payloads is not None:
            if len(payloads) != len(keys):
                raise ValueError("payloads: one per key")
            args += ["PAYLOADS", *payloads]
        if max_tries is not None:
            args += ["MAXTRIES", max_tries]
        if owner is not None:
            args += ["OWNER", owner]
        if bloom is not None:
            args += ["BLOOM", self.key(bloom)]
        return args, _claims

    def mdone(
        self,
        items: Sequence[Sequence[Any]],
        retain: Optional[int] = None,
        bloom: Optional[KeyT] = None,
    ) -> Call:
        """items: (key, token) or (key, token, result); RESULTS gives every
        key one or none, so either all items carry a result or none does."""
        self._batch_only("IDEM.MDONE")
        results = [_result_of(item) for item in items]
        with_results = [r is not None for r in results]
        if any(with_results) and not all(with_results):
            raise ValueError("mdone: every item with a result or none (done_many takes a mix)")
        args: List[Any] = ["IDEM.MDONE", len(items)]
        for item in items:
            args += [self.key(item[0]), item[1]]
        if items and all(with_results):
            args += ["RESULTS", *results]
        if retain is not None:
            whole_seconds("retain", retain)
            args += ["RETAIN", retain]
        if bloom is not None:
            args += ["BLOOM", self.key(bloom)]
        return args, _dones

    def mrelease(self, items: Sequence[Tuple[KeyT, Any]]) -> Call:
        self._batch_only("IDEM.MRELEASE")
        args: List[Any] = ["IDEM.MRELEASE", len(items)]
        for key, token in items:
            args += [self.key(key), token]
        return args, _releases

    # The batch helpers' plans: any number of keys, on either edition.

    def claim_many(self, keys: Sequence[KeyT], lease: int, payloads: Optional[Sequence[Any]],
                   max_tries: Optional[int], bloom: Optional[KeyT], cluster: bool,
                   owner: Optional[str] = None) -> "Batch":
        if payloads is not None and len(payloads) != len(keys):
            raise ValueError("payloads: one per key")
        pick = (lambda group: None) if payloads is None else (lambda group: [payloads[i] for i in group])
        if not self.module:
            return Batch([self.claim(k, lease, None if payloads is None else payloads[i], max_tries, bloom,
                                     owner=owner) for i, k in enumerate(keys)],
                         [[i] for i in range(len(keys))], len(keys), False)
        groups = group_by_slot([self.key(k) for k in keys], cluster)
        return Batch([self.mclaim([keys[i] for i in g], lease, pick(g), max_tries, bloom, owner) for g in groups],
                     groups, len(keys), True)

    def done_many(self, items: Sequence[Sequence[Any]], retain: Optional[int], bloom: Optional[KeyT],
                  cluster: bool) -> "Batch":
        if not self.module:
            return Batch([self.done(it[0], it[1], _result_of(it), retain, bloom) for it in items],
                         [[i] for i in range(len(items))], len(items), False)
        # One MDONE per slot for the items with a result, one for those without.
        groups: List[List[int]] = []
        for stored in (True, False):
            part = [i for i, it in enumerate(items) if (_result_of(it) is not None) is stored]
            groups += [[part[j] for j in g] for g in group_by_slot([self.key(items[i][0]) for i in part], cluster)]
        return Batch([self.mdone([items[i] for i in g], retain, bloom) for g in groups], groups, len(items), True)

    def release_many(self, items: Sequence[Tuple[KeyT, Any]], cluster: bool) -> "Batch":
        if not self.module:
            return Batch([self.release(k, t) for k, t in items], [[i] for i in range(len(items))], len(items), False)
        groups = group_by_slot([self.key(k) for k, _ in items], cluster)
        return Batch([self.mrelease([items[i] for i in g]) for g in groups], groups, len(items), True)

    # Date-sharded Bloom filters (module only).

    def _filters_only(self) -> None:
        if not self.module:
            raise needs_module("IDEM.BF.*", "which keeps no Bloom filters")

    def bf_reserve(
        self,
        key: KeyT,
        error_rate: float,
        capacity: int,
        window: Optional[int] = None,
        shard: Optional[Union[str, int]] = None,
        expansion: Optional[int] = None,
    ) -> Call:
        self._filters_only()
        args: List[Any] = ["IDEM.BF.RESERVE", self.key(key), repr(float(error_rate)), capacity]
        if window is not None:
            args += ["WINDOW", window]
        if shard is not None:
            args += ["SHARD", shard]
        if expansion is not None:
            args += ["EXPANSION", expansion]
        return args, lambda r: r in (b"OK", "OK", True)

    def bf_add(self, key: KeyT, item: Any) -> Call:
        self._filters_only()
        return ["IDEM.BF.ADD", self.key(key), item], _bool

    def bf_madd(self, key: KeyT, items: Sequence[Any]) -> Call:
        self._filters_only()
        return ["IDEM.BF.MADD", self.key(key), *items], lambda r: [bool(int(x)) for x in r]

    def bf_exists(self, key: KeyT, item: Any) -> Call:
        self._filters_only()
        return ["IDEM.BF.EXISTS", self.key(key), item], _bool

    def bf_mexists(self, key: KeyT, items: Sequence[Any]) -> Call:
        self._filters_only()
        return ["IDEM.BF.MEXISTS", self.key(key), *items], lambda r: [bool(int(x)) for x in r]

    def bf_info(self, key: KeyT) -> Call:
        self._filters_only()
        return ["IDEM.BF.INFO", self.key(key)], FilterInfo.parse


def _result_of(item: Sequence[Any]) -> Any:
    return item[2] if len(item) > 2 else None


def whole_seconds(name: str, value: Any) -> None:
    """The server takes lease and retain in whole seconds: refuse anything
    else before sending (30.5 would be refused by the server, 0.5 too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: whole seconds, at least 1 (got {value!r})")


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


@dataclass
class Batch:
    """A batch helper's calls, and for each the indexes of the items it
    answers: a batch command (`multi`) answers a list, one per index; a
    single command one reply. `finish` puts the answers back in item order,
    a call's error standing for each of its items."""

    calls: List[Call]
    answers: List[List[int]]
    size: int
    multi: bool

    def finish(self, replies: Sequence[Any]) -> List[Any]:
        out: List[Any] = [None] * self.size
        for indexes, reply in zip(self.answers, replies):
            if isinstance(reply, Exception) or not self.multi:
                for i in indexes:
                    out[i] = reply
            else:
                for i, one in zip(indexes, reply):
                    out[i] = one
        return out


def edition_from_command_info(reply: Any) -> bool:
    """COMMAND INFO IDEM.CLAIM: True when the module is loaded."""
    if isinstance(reply, dict):  # redis-py parses COMMAND INFO into a dict by name
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(x is not None for x in reply)
    return bool(reply)
