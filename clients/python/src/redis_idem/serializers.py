"""How results are stored: JSON by default; any object with `dumps(value)
-> bytes` and `loads(data) -> value` will do."""

from __future__ import annotations

import json
from typing import Any, Protocol, Union


class Serializer(Protocol):
    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: Union[bytes, str]) -> Any: ...


class JsonSerializer:
    """JSON (UTF-8), compact. `default` and `object_hook` go to json."""

    def __init__(self, default: Any = None, object_hook: Any = None):
        self.default = default
        self.object_hook = object_hook

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), default=self.default).encode()

    def loads(self, data: Union[bytes, str]) -> Any:
        return json.loads(data, object_hook=self.object_hook)


class BytesSerializer:
    """The result as it is: bytes (str is UTF-8 encoded); replayed as bytes
    (as str with a decode_responses client)."""

    def dumps(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode()
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"BytesSerializer stores bytes or str, not {type(value).__name__}")
        return bytes(value)

    def loads(self, data: Union[bytes, str]) -> Any:
        return data
