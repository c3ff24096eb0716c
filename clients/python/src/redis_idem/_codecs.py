"""How results are stored (`codec=`): JSON by default; any object with
`encode(value) -> bytes` and `decode(data) -> value` will do. A first run
returns the work's own object; a replay returns `decode(encode(object))`
(JSON: a tuple or a set comes back as a list, a date is refused)."""

from __future__ import annotations

import json
from typing import Any, Protocol, Union


class Codec(Protocol):
    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: Union[bytes, str]) -> Any: ...


class JsonCodec:
    """JSON (UTF-8), compact, strict: what json cannot encode (bytes, a
    datetime, NaN) raises, so the record is completed without the result
    and the caller gets ResultNotStoredError. `default` and `object_hook`
    go to json."""

    def __init__(self, default: Any = None, object_hook: Any = None):
        self.default = default
        self.object_hook = object_hook

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), default=self.default, allow_nan=False).encode()

    def decode(self, data: Union[bytes, str]) -> Any:
        return json.loads(data, object_hook=self.object_hook)


class BytesCodec:
    """The result as it is: bytes (str is UTF-8 encoded); replayed as bytes
    (as str with a decode_responses client)."""

    def encode(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode()
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"BytesCodec stores bytes or str, not {type(value).__name__}")
        return bytes(value)

    def decode(self, data: Union[bytes, str]) -> Any:
        return data
