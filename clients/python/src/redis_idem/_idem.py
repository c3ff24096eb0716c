"""What Idem and AsyncIdem share: their construction and settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Optional, Tuple

from ._job import Command
from ._loop import Loop
from ._protocol import Protocol
from ._replies import Edition
from ._settings import Hooks, Settings, Stats

#: `batch`'s default: on. Measured (bench/clients/python): at 64 calls in
#: flight it cut the time per message to 0.2x (asyncio) and 0.66x (threads)
#: of the hand-made pair's, and the server's CPU to 0.2-0.5x; a call alone
#: sends its own command at once, for about 6 µs of client CPU.
DEFAULT_BATCH = True


def socket_timeout_of(client: Any) -> Optional[float]:
    for holder in (getattr(client, "connection_pool", None), getattr(client, "nodes_manager", None)):
        kwargs = getattr(holder, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            return kwargs.get("socket_timeout")
    timeout = getattr(client, "socket_timeout", None)  # asyncio RedisCluster, ...
    return timeout if isinstance(timeout, (int, float)) else None


class IdemBase:
    """`prefix` goes before every key (one namespace per tenant or app);
    `edition` skips asking the server; `hooks` a Hooks; `batch` lets
    concurrent calls share one batch command per tick; the other keywords
    are Settings, which every call takes too."""

    commands: Any

    def __init__(self, client: Any, *, prefix: str = "", edition: Optional[str] = None,
                 hooks: Optional[Hooks] = None, batch: bool = DEFAULT_BATCH, **settings: Any):
        self.client = client
        self.commands = self._commands_class(client, prefix=prefix, edition=edition)
        self.settings = Settings(**settings)
        self.stats = Stats()
        self.batch = bool(batch)
        self._loop = Loop(self.stats, hooks or Hooks())
        self._loop.socket_timeout = socket_timeout_of(client)
        self._loop.cluster = self.commands.cluster
        self._ready = False
        if edition is not None:
            self._resolved(Edition(edition))

    _commands_class: Any = None

    def _resolved(self, edition: Edition) -> None:
        """The edition, known once: the loop's commands are built for it from now on."""
        self._loop.protocol = Protocol(edition, self.commands.prefix)
        self._ready = True

    @property
    def hooks(self) -> Hooks:
        return self._loop.hooks

    @hooks.setter
    def hooks(self, hooks: Hooks) -> None:
        self._loop.hooks = hooks

    def _settings(self, overrides: Mapping[str, Any]) -> Settings:
        return replace(self.settings, **overrides) if overrides else self.settings

    def _call_key(self, key: Callable[..., Any], payload: Optional[Callable[..., Any]],
                  settings: Mapping[str, Any]) -> Callable[..., Tuple[Any, Any]]:
        """For `idempotent`: checks its options when the decorator is made,
        and answers the function that makes a call's key and payload from
        its arguments."""
        if not callable(key) or (payload is not None and not callable(payload)):
            raise TypeError("idempotent(key=..., payload=...) take functions of the call's arguments")
        self._settings(settings)  # an unknown setting fails here, not at the first call
        return lambda *args, **kwargs: (key(*args, **kwargs), None if payload is None else payload(*args, **kwargs))

    # Coalescing: what a lane's batch sends.

    @staticmethod
    def _claim_lane(effect: Command) -> Any:
        """The lane of a claim that can share an IDEM.MCLAIM (no WAIT), else None."""
        kw = effect.kwargs
        if kw.get("wait"):
            return None
        return ("claim", effect.args[1], kw.get("max_tries"), kw.get("bloom"), kw.get("owner"),
                kw.get("payload") is None)

    def _one_claim(self, lane: Any, entry: Any) -> Any:
        """A lane's call alone: the single IDEM.CLAIM it would have sent."""
        _, lease, max_tries, bloom, owner, _ = lane
        return self._loop.protocol.claim(entry[0], lease, entry[1], max_tries, bloom, None, owner)

    def _claims_plan(self, lane: Any, entries: list) -> Any:
        _, lease, max_tries, bloom, owner, _ = lane
        keys = [key for key, _ in entries]
        payloads = None if entries[0][1] is None else [payload for _, payload in entries]
        return self._loop.protocol.claim_many(keys, lease, payloads, max_tries, bloom, self.commands.cluster, owner)

    def _dones_plan(self, items: list, retain: Any, bloom: Any) -> Tuple[Any, list]:
        batch = self._loop.protocol.done_many(items, retain, bloom, self.commands.cluster)
        return batch, self._loop.groups(batch, [key for key, _, _ in items], None)
