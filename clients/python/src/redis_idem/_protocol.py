"""The commands of both editions as (arguments, reply parser): what the sync
and asyncio command groups send, built in one place."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from ._errors import UnsupportedError
from ._replies import ClaimReply, DoneReply, Edition, FilterInfo, Record

KeyT = Union[str, bytes]
Call = Tuple[List[Any], Callable[[Any], Any]]

#: The most keys one IDEM.MCLAIM / MDONE / MRELEASE takes.
MAX_BATCH = 10000


def _identity(reply: Any) -> Any:
    return reply


def _bool(reply: Any) -> bool:
    return bool(int(reply))


def _claims(reply: Any) -> List[Any]:
    return [r if isinstance(r, Exception) else ClaimReply.parse(r) for r in reply]


def _dones(reply: Any) -> List[Any]:
    return [r if isinstance(r, Exception) else DoneReply(int(r)) for r in reply]


def _releases(reply: Any) -> List[Any]:
    return [r if isinstance(r, Exception) else bool(int(r)) for r in reply]


def needs_module(what: str, why: str) -> UnsupportedError:
    return UnsupportedError(
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
        maxtries: Optional[int] = None,
        bloom: Optional[KeyT] = None,
        wait_ms: Optional[int] = None,
    ) -> Call:
        opts: List[Any] = []
        if payload is not None:
            opts += ["PAYLOAD", payload]
        if maxtries is not None:
            opts += ["MAXTRIES", maxtries]
        if bloom is not None:
            if not self.module:
                raise needs_module("BLOOM", "which keeps no Bloom filters")
            opts += ["BLOOM", self.key(bloom)]
        if wait_ms:
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
            opts += ["RETAIN", retain]
        if bloom is not None:
            if not self.module:
                raise needs_module("BLOOM", "which keeps no Bloom filters")
            opts += ["BLOOM", self.key(bloom)]
        parse = lambda r: DoneReply(int(r))  # noqa: E731
        if self.module:
            return ["IDEM.DONE", self.key(key), token, *opts], parse
        return self._fcall("idem_done", key, token, *opts), parse

    def release(self, key: KeyT, token: Any) -> Call:
        if self.module:
            return ["IDEM.RELEASE", self.key(key), token], _bool
        return self._fcall("idem_release", key, token), _bool

    def extend(self, key: KeyT, token: Any, lease: int) -> Call:
        if self.module:
            return ["IDEM.EXTEND", self.key(key), token, lease], _bool
        return self._fcall("idem_extend", key, token, lease), _bool

    def get(self, key: KeyT) -> Call:
        if self.module:
            return ["IDEM.GET", self.key(key)], Record.parse
        return self._fcall("idem_get", key, ro=True), Record.parse

    def once(self, key: KeyT, retain: int) -> Call:
        if self.module:
            return ["IDEM.ONCE", self.key(key), retain], _bool
        return self._fcall("idem_once", key, retain), _bool

    # Batch commands (module only; the helpers fall back to single calls).

    def _batch_only(self, name: str) -> None:
        if not self.module:
            raise needs_module(name, "which has no batch commands: use claim_many / done_many, which fall back to single calls")

    def mclaim(
        self,
        lease: int,
        keys: Sequence[KeyT],
        payloads: Optional[Sequence[Any]] = None,
        maxtries: Optional[int] = None,
        bloom: Optional[KeyT] = None,
    ) -> Call:
        self._batch_only("IDEM.MCLAIM")
        args: List[Any] = ["IDEM.MCLAIM", lease, len(keys), *(self.key(k) for k in keys)]
        if payloads is not None:
            if len(payloads) != len(keys):
                raise ValueError("payloads: one per key")
            args += ["PAYLOADS", *payloads]
        if maxtries is not None:
            args += ["MAXTRIES", maxtries]
        if bloom is not None:
            args += ["BLOOM", self.key(bloom)]
        return args, _claims

    def mdone(
        self,
        pairs: Sequence[Tuple[KeyT, Any]],
        results: Optional[Sequence[Any]] = None,
        retain: Optional[int] = None,
        bloom: Optional[KeyT] = None,
    ) -> Call:
        self._batch_only("IDEM.MDONE")
        args: List[Any] = ["IDEM.MDONE", len(pairs)]
        for key, token in pairs:
            args += [self.key(key), token]
        if results is not None:
            if len(results) != len(pairs):
                raise ValueError("results: one per key")
            args += ["RESULTS", *results]
        if retain is not None:
            args += ["RETAIN", retain]
        if bloom is not None:
            args += ["BLOOM", self.key(bloom)]
        return args, _dones

    def mrelease(self, pairs: Sequence[Tuple[KeyT, Any]]) -> Call:
        self._batch_only("IDEM.MRELEASE")
        args: List[Any] = ["IDEM.MRELEASE", len(pairs)]
        for key, token in pairs:
            args += [self.key(key), token]
        return args, _releases

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


def edition_from_command_info(reply: Any) -> bool:
    """COMMAND INFO IDEM.CLAIM: True when the module is loaded."""
    if isinstance(reply, dict):  # redis-py parses COMMAND INFO into a dict by name
        return any(v for v in reply.values())
    if isinstance(reply, (list, tuple)):
        return any(x is not None for x in reply)
    return bool(reply)
