"""What Idem and AsyncIdem share: their construction and settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Optional, Tuple

from ._loop import Hooks, Loop, Settings, Stats


def socket_timeout_of(client: Any) -> Optional[float]:
    for holder in (getattr(client, "connection_pool", None), getattr(client, "nodes_manager", None)):
        kwargs = getattr(holder, "connection_kwargs", None)
        if isinstance(kwargs, dict):
            return kwargs.get("socket_timeout")
    timeout = getattr(client, "socket_timeout", None)  # asyncio RedisCluster, ...
    return timeout if isinstance(timeout, (int, float)) else None


class IdemBase:
    """`prefix` goes before every key (one namespace per tenant or app);
    `hooks` a Hooks; the other keywords are Settings, which every call
    takes too."""

    commands: Any

    def __init__(self, client: Any, *, prefix: str = "", edition: Optional[str] = None,
                 hooks: Optional[Hooks] = None, **settings: Any):
        self.client = client
        self.commands = self._commands_class(client, prefix=prefix, edition=edition)
        self.settings = Settings(**settings)
        self.stats = Stats()
        self._loop = Loop(self.stats, hooks or Hooks())
        self._loop.socket_timeout = socket_timeout_of(client)

    _commands_class: Any = None

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

