"""ASGI middleware (Starlette, FastAPI, any ASGI app) honouring the
`Idempotency-Key` request header as the IETF draft
(draft-ietf-httpapi-idempotency-key-header) describes:

- the first request with a key runs the app; its response (status, headers,
  body) is stored with the record when it completes;
- a repeat gets that response again, with `Idempotent-Replayed: true`;
- a repeat while the first is still running waits for it (`wait` seconds:
  WAIT on the module, polling on the Functions edition), then gets its
  response; still running after the wait: `409` with `Retry-After`;
- the key reused with another request (method, path, query or body):
  `422`;
- the app raising, or answering 5xx: the claim is released, so the
  client's retry runs the request again; after `maxtries` failed runs,
  `500` until the record is forgotten (idem.history).

    app.add_middleware(IdempotencyMiddleware, client=redis.asyncio.Redis(), prefix="shop:")
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Iterable, List, Optional, Tuple

from ._aconsumer import AsyncIdem
from ._errors import BusyError, ExhaustedError, LeaseLostError, MismatchError

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
Response = Tuple[int, List[Tuple[bytes, bytes]], bytes]


class ResponseSerializer:
    """A response as stored: `[status, headers]` as JSON, a newline, the body."""

    def dumps(self, response: Response) -> bytes:
        status, headers, body = response
        head = [status, [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers]]
        return json.dumps(head, separators=(",", ":")).encode() + b"\n" + body

    def loads(self, data: Any) -> Response:
        if isinstance(data, str):
            data = data.encode("latin-1")
        head, _, body = data.partition(b"\n")
        status, headers = json.loads(head)
        return status, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers], body


class _ServerError(Exception):
    """The app answered 5xx: release the claim rather than store it."""


async def _plain(send: Send, status: int, text: str, extra: Iterable[Tuple[bytes, bytes]] = ()) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class IdempotencyMiddleware:
    """See the module's doc. `client` is a redis.asyncio.Redis or
    RedisCluster with the module or the Functions edition; `prefix` scopes
    the records (and `scope_key(scope)`, if given, per client or account:
    keys from two accounts never meet); `methods` are the requests it
    applies to; `required` answers 400 to those without the header."""

    def __init__(
        self,
        app: Any,
        client: Any,
        *,
        prefix: str = "idempotency:",
        header: str = "idempotency-key",
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool = False,
        scope_key: Optional[Callable[[Scope], str]] = None,
        lease: int = 30,
        wait: float = 5.0,
        maxtries: int = 3,
        retain: Optional[int] = None,
        retry_after: int = 1,
        max_key_length: int = 255,
        edition: Optional[str] = None,
    ):
        self.app = app
        self.header = header.lower().encode("latin-1")
        self.methods = {m.upper() for m in methods}
        self.required = required
        self.scope_key = scope_key
        self.retry_after = retry_after
        self.max_key_length = max_key_length
        self.idem = AsyncIdem(client, prefix=prefix, edition=edition, lease=lease, wait=wait, maxtries=maxtries,
                              retain=retain, serializer=ResponseSerializer())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            return await self.app(scope, receive, send)
        values = [v for k, v in scope.get("headers", []) if k.lower() == self.header]
        if not values:
            if self.required:
                return await _plain(send, 400, "this request needs an Idempotency-Key header")
            return await self.app(scope, receive, send)
        key = values[0].decode("latin-1").strip()
        if len(values) > 1 or not key or len(key) > self.max_key_length:
            return await _plain(send, 400, "Idempotency-Key: one value, of 1 to %d characters" % self.max_key_length)
        body = await _read_body(receive)
        if self.scope_key is not None:
            key = f"{self.scope_key(scope)}:{key}"
        query = scope.get("query_string", b"")
        fingerprint = f"{scope['method'].upper()} {scope.get('path', '')}?".encode() + query + b"\n" + body

        try:
            async with self.idem.job(key, payload=fingerprint) as job:
                if job.replayed:
                    return await self._replay(send, job.result)
                job.result = await self._run(scope, body, send)
        except MismatchError:
            return await _plain(send, 422, "Idempotency-Key reused with another request")
        except BusyError:
            return await _plain(send, 409, "a request with this Idempotency-Key is in progress",
                                [(b"retry-after", str(self.retry_after).encode())])
        except ExhaustedError:
            return await _plain(send, 500, "this request failed too often: send it again with a new Idempotency-Key")
        except (_ServerError, LeaseLostError):
            return  # already answered: the app's 5xx (released), or ours ran over a lease another run took

    async def _replay(self, send: Send, response: Optional[Response]) -> None:
        if response is None:  # completed, but the response was not kept (too large, or maxmemory)
            return await _plain(send, 500, "this request was completed, but its response was not kept")
        status, headers, body = response
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"idempotent-replayed", b"true")]})
        await send({"type": "http.response.body", "body": body})

    async def _run(self, scope: Scope, body: bytes, send: Send) -> Response:
        """Run the app, forwarding its response as it comes and keeping a copy."""
        sent = False

        async def replay_receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        status, headers, chunks = 500, [], []

        async def capture(message: dict) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = message["status"], list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        await self.app(scope, replay_receive, capture)
        if status >= 500:
            raise _ServerError(status)
        return status, [(bytes(k), bytes(v)) for k, v in headers], b"".join(chunks)


async def _read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)
