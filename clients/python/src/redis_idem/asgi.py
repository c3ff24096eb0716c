"""ASGI middleware (Starlette, FastAPI, any ASGI app) honouring the
`Idempotency-Key` request header (draft-ietf-httpapi-idempotency-key-header),
as docs/clients.md defines it for every library:

- the key is `http:<scope>:<Idempotency-Key>` (`http:<Idempotency-Key>`
  without `scope_key`) under the prefix, the header's value taken without
  leading and trailing spaces and tabs;
- the fingerprint, sent as PAYLOAD, is the hex SHA-256 of
  `METHOD SP target LF body` (the target as received: the path, then `?`
  and the raw query when there is one; the raw body bytes), so the same
  JSON with other whitespace is another request: `422`;
- the first request runs the app; its response is stored when the app
  finishes, whether or not the client is still connected, as
  `{"v":1,"status":201,"headers":[[name, value], ...],"body":"<base64>"}`;
- a repeat gets that response, with `Idempotent-Replayed: true`; a repeat
  while the first is at work waits (`wait`, 10 s), then `409` with
  `Retry-After`;
- the app raising or answering 5xx: nothing stored, the claim released;
  after `max_tries` (3) failed runs, `500`.

    idem = AsyncIdem(redis.asyncio.Redis(), prefix="shop:", lease=30)
    app.add_middleware(IdempotencyMiddleware, idem=idem)       # its settings; or client=..., prefix=...
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from typing import Any, Awaitable, Callable, Iterable, List, Optional, Tuple

from ._async import AsyncIdem
from ._errors import BusyError, DoneUnconfirmedError, ExhaustedError, LeaseLostError, MismatchError, NotDurableError

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
Response = Tuple[int, List[Tuple[bytes, bytes]], bytes]

#: Not stored: they belong to one connection, or are set again when sent.
_UNSTORED = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"content-length"}


def fingerprint(method: str, target: str, body: bytes) -> str:
    """The request's fingerprint: hex SHA-256 of `METHOD SP target LF body`."""
    return hashlib.sha256(f"{method.upper()} {target}\n".encode("latin-1") + body).hexdigest()


def _target(scope: Scope) -> str:
    path = scope.get("raw_path")
    text = path.decode("latin-1") if isinstance(path, (bytes, bytearray)) and path else scope.get("path", "")
    query = scope.get("query_string", b"")
    return f"{text}?{query.decode('latin-1')}" if query else text


class ResponseCodec:
    """A response as stored: the JSON every library's middleware reads."""

    def encode(self, response: Response) -> bytes:
        status, headers, body = response
        kept = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers if k.lower() not in _UNSTORED]
        doc = {"v": 1, "status": status, "headers": kept, "body": base64.b64encode(body).decode()}
        return json.dumps(doc, separators=(",", ":")).encode()

    def decode(self, data: Any) -> Response:
        doc = json.loads(data)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in doc["headers"]]
        return int(doc["status"]), headers, base64.b64decode(doc["body"])


class _ServerError(Exception):
    """The app answered 5xx: release the claim rather than store it."""


async def _plain(send: Send, status: int, text: str, extra: Iterable[Tuple[bytes, bytes]] = ()) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_UNSET: Any = object()


class IdempotencyMiddleware:
    """See the module's doc. Give it `idem=` (an AsyncIdem: its client,
    prefix, edition, hooks and settings: `lease`, `wait`, `max_tries`,
    `retain`, `durable`, `owner`), or `client=` (a redis.asyncio.Redis,
    RedisCluster or Sentinel `master_for` client with the module or the
    Functions edition) with `prefix`. Its own options set what they name,
    over the Idem's: `lease` (s, 30), `wait` (s, 10), `max_tries` (3),
    `retain`, `durable`, `owner`. `scope_key(scope)`, if given, keys the
    records per client or account (keys from two accounts never meet);
    `methods` are the requests it applies to; `required` answers 400 to
    those without the header."""

    def __init__(
        self,
        app: Any,
        client: Any = None,
        *,
        idem: Optional[AsyncIdem] = None,
        prefix: Optional[str] = None,
        header: str = "idempotency-key",
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool = False,
        scope_key: Optional[Callable[[Scope], str]] = None,
        lease: Optional[int] = None,
        wait: Optional[float] = None,
        max_tries: Optional[int] = None,
        retain: Optional[int] = None,
        durable: Any = _UNSET,
        owner: Any = _UNSET,
        retry_after: int = 1,
        max_key_length: int = 255,
        edition: Optional[str] = None,
    ):
        if (idem is None) == (client is None):
            raise TypeError("IdempotencyMiddleware: give idem= (an AsyncIdem) or client= (a redis.asyncio client)")
        self.app = app
        self.header = header.lower().encode("latin-1")
        self.methods = {m.upper() for m in methods}
        self.required = required
        self.scope_key = scope_key
        self.retry_after = retry_after
        self.max_key_length = max_key_length
        mine = {"lease": lease, "wait": wait, "max_tries": max_tries, "retain": retain}
        settings = {name: value for name, value in mine.items() if value is not None}
        settings.update({name: value for name, value in (("durable", durable), ("owner", owner)) if value is not _UNSET})
        if idem is not None:
            base = idem.settings
            settings = {"lease": base.lease, "wait": base.wait, "max_tries": base.max_tries or 3, "retain": base.retain,
                        "durable": base.durable, "owner": base.owner, "done_retries": base.done_retries,
                        "done_timeout": base.done_timeout, **settings}
            self.idem = AsyncIdem(idem.client, prefix=idem.commands.prefix if prefix is None else prefix,
                                  edition=edition or idem.commands._edition, hooks=idem.hooks,
                                  codec=ResponseCodec(), **settings)
        else:
            settings.setdefault("max_tries", 3)
            self.idem = AsyncIdem(client, prefix="idempotency:" if prefix is None else prefix, edition=edition,
                                  codec=ResponseCodec(), **settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            return await self.app(scope, receive, send)
        values = [v for k, v in scope.get("headers", []) if k.lower() == self.header]
        if not values:
            if self.required:
                return await _plain(send, 400, "this request needs an Idempotency-Key header")
            return await self.app(scope, receive, send)
        key = values[0].decode("latin-1").strip(" \t")  # RFC 9110's optional whitespace, nothing else
        if len(values) > 1 or not key or len(key) > self.max_key_length:
            return await _plain(send, 400, "Idempotency-Key: one value, of 1 to %d characters" % self.max_key_length)
        body = await _read_body(receive)
        key = f"http:{self.scope_key(scope)}:{key}" if self.scope_key is not None else f"http:{key}"
        payload = fingerprint(scope["method"], _target(scope), body)
        # Shielded: a server that cancels the request when the client goes
        # away must not stop the app before its response is stored.
        await asyncio.shield(asyncio.ensure_future(self._handle(scope, body, send, key, payload)))

    async def _handle(self, scope: Scope, body: bytes, send: Send, key: str, payload: str) -> None:
        client = _Client(send)
        ran = False  # whether this request's app ran: a NotDurable DONE without it is a replay

        def run(job: Any) -> Any:
            nonlocal ran
            ran = True
            return self._run(scope, body, client)

        try:
            outcome = await self.idem.process_outcome(key, run, payload=payload)
        except MismatchError:
            return await client.plain(422, "Idempotency-Key reused with another request")
        except BusyError:
            return await client.plain(409, "a request with this Idempotency-Key is in progress",
                                      [(b"retry-after", str(self.retry_after).encode())])
        except ExhaustedError:
            return await client.plain(500, "this request failed too often: send it again with a new Idempotency-Key")
        except (_ServerError, LeaseLostError, DoneUnconfirmedError):
            return  # answered already: the app's 5xx (released), or its response, whose record another run owns
        except NotDurableError as e:
            if e.stage == "done" and not ran:
                # A repeat whose read the replicas did not acknowledge: the stored
                # response, as any replay (none kept: 503, send again), as Go and Java.
                if e.result is None:
                    return await client.plain(503, "idempotency store unavailable")
                return await self._replay(client, e.result)
            if e.stage == "done":
                return  # answered already: the app's response, its completion not acknowledged
            # The claim not acknowledged (released, the app not run): send it again, as Go and Java answer.
            return await client.plain(503, "this request could not be claimed durably: send it again",
                                      [(b"retry-after", str(self.retry_after).encode())])
        if outcome.replayed:
            await self._replay(client, outcome.value)

    async def _replay(self, client: "_Client", response: Optional[Response]) -> None:
        if response is None:  # completed, but the response was not kept (too large, or maxmemory)
            return await client.plain(500, "this request was completed, but its response was not kept")
        status, headers, body = response
        # The whole body is known: say its length, as the first response
        # did, rather than have the server send it chunked.
        length = [] if status < 200 or status in (204, 304) else [(b"content-length", str(len(body)).encode())]
        await client.send({"type": "http.response.start", "status": status,
                           "headers": [*headers, *length, (b"idempotent-replayed", b"true")]})
        await client.send({"type": "http.response.body", "body": body})

    async def _run(self, scope: Scope, body: bytes, client: "_Client") -> Response:
        """Run the app, forwarding its response as it comes and keeping a copy."""
        given = False
        never = asyncio.Event()

        async def receive() -> dict:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()  # the app is not told the client left: it finishes, and its response is stored
            return {"type": "http.disconnect"}

        status, headers, chunks = 500, [], []

        async def capture(message: dict) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = message["status"], list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            await client.send(message)

        await self.app(scope, receive, capture)
        if status >= 500:
            raise _ServerError(status)
        return status, [(bytes(k), bytes(v)) for k, v in headers], b"".join(chunks)


class _Client:
    """The connection's `send`, which stops forwarding once the client has
    gone (the server raises, or drops what is sent) instead of failing the app."""

    def __init__(self, send: Send):
        self._send = send
        self.gone = False

    async def send(self, message: dict) -> None:
        if self.gone:
            return
        try:
            await self._send(message)
        except Exception:  # OSError, or the server's own ClientDisconnected
            self.gone = True

    async def plain(self, status: int, text: str, extra: Iterable[Tuple[bytes, bytes]] = ()) -> None:
        await _plain(self.send, status, text, extra)


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
