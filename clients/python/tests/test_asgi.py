"""The Idempotency-Key middleware through a real HTTP server (uvicorn, in a
thread) and a real client (httpx)."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import redis_idem
from redis_idem.asgi import IdempotencyMiddleware


def make_app(port: int, prefix: str, runs: list) -> Starlette:  # type: ignore[type-arg]
    async def charge(request: Request):  # type: ignore[no-untyped-def]
        body = await request.json()
        runs.append(body)
        if body.get("sleep"):
            import asyncio

            await asyncio.sleep(body["sleep"])
        if body.get("fail") == "raise":
            raise RuntimeError("provider down")
        if body.get("fail") == "503":
            return PlainTextResponse("try later", status_code=503)
        return JSONResponse({"charged": body["amount"], "run": len(runs)}, status_code=201,
                            headers={"x-charge-id": f"ch_{len(runs)}"})

    app = Starlette(routes=[Route("/charge", charge, methods=["POST"]),
                            Route("/strict", charge, methods=["POST"])])
    client = aioredis.Redis(host="127.0.0.1", port=port)
    app.add_middleware(IdempotencyMiddleware, client=client, prefix=prefix, wait=0.8, lease=5)
    return app


@pytest.fixture
def http(server, ns):  # type: ignore[no-untyped-def]
    runs: list = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(make_app(server.port, ns, runs), host="127.0.0.1", port=port, log_level="critical")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started and time.monotonic() < deadline:
        time.sleep(0.01)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield client, runs
    web.should_exit = True
    thread.join(10)


def _until(condition):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the first request never reached the app"
        time.sleep(0.005)


def post(client, key, body):  # type: ignore[no-untyped-def]
    # A connection per request: uvicorn closes one after an app that raised,
    # and a request sent on it meanwhile would be reset.
    headers = {"Connection": "close", **({"Idempotency-Key": key} if key else {})}
    return client.post("/charge", json=body, headers=headers)


def test_first_request_runs_repeat_replays_status_headers_body(http):  # type: ignore[no-untyped-def]
    client, runs = http
    first = post(client, "k1", {"amount": 1250})
    assert first.status_code == 201 and first.json() == {"charged": 1250, "run": 1}
    assert first.headers["x-charge-id"] == "ch_1" and "idempotent-replayed" not in first.headers
    again = post(client, "k1", {"amount": 1250})
    assert again.status_code == 201 and again.content == first.content
    assert again.headers["x-charge-id"] == "ch_1" and again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-length"] == str(len(first.content)) and "transfer-encoding" not in again.headers
    assert len(runs) == 1


def test_without_the_header_the_request_just_runs(http):  # type: ignore[no-untyped-def]
    client, runs = http
    assert post(client, None, {"amount": 1}).json()["run"] == 1
    assert post(client, None, {"amount": 1}).json()["run"] == 2


def test_in_flight_duplicate_waits_for_the_result(http):  # type: ignore[no-untyped-def]
    client, runs = http
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, client, "k3", {"amount": 5, "sleep": 0.3})
        _until(lambda: runs)
        waited = post(client, "k3", {"amount": 5, "sleep": 0.3})  # within the 0.8 s wait
        assert first.result().status_code == 201
    assert waited.status_code == 201 and waited.content == first.result().content and len(runs) == 1
    assert waited.headers["idempotent-replayed"] == "true"


def test_the_stored_response_is_the_shared_json_format(http, server, ns):  # type: ignore[no-untyped-def]
    client, runs = http
    first = post(client, "fmt", {"amount": 3})
    record = redis_idem.IdemCommands(server.client(), prefix=ns).get("http:fmt")  # http:<Idempotency-Key>
    stored = json.loads(record.result)
    assert stored["v"] == 1 and stored["status"] == 201
    assert base64.b64decode(stored["body"]) == first.content
    names = [name for name, _ in stored["headers"]]
    assert "x-charge-id" in names and not {"content-length", "date", "connection"} & set(names)


def test_a_failed_run_is_released_and_runs_again(http):  # type: ignore[no-untyped-def]
    client, runs = http
    assert post(client, "k5", {"amount": 1, "fail": "503"}).status_code == 503
    assert post(client, "k5", {"amount": 1, "fail": "503"}).status_code == 503
    assert len(runs) == 2  # not stored: the retry ran again
    assert post(client, "k6", {"amount": 1, "fail": "raise"}).status_code == 500
    assert post(client, "k6", {"amount": 1}).status_code == 422  # another body than the failed run's
    assert post(client, "k7", {"amount": 1, "fail": "raise"}).status_code == 500
    assert post(client, "k7", {"amount": 1, "fail": "raise"}).status_code == 500
    assert post(client, "k7", {"amount": 1, "fail": "raise"}).status_code == 500
    exhausted = post(client, "k7", {"amount": 1, "fail": "raise"})  # max_tries 3 used
    assert exhausted.status_code == 500 and "new Idempotency-Key" in exhausted.text


def test_durable_repeat_not_acknowledged_replays_with_the_header(server, ns):  # type: ignore[no-untyped-def]
    # The same records behind two middlewares: the plain one stores the
    # response, the durable one (1 replica asked, none here) reads it back:
    # the stored response with Idempotent-Replayed, the app not run again,
    # as the Go and Java middlewares answer.
    runs: list = []
    plain, durable = make_app(server.port, ns, runs), make_app(server.port, ns, runs)
    durable.user_middleware.clear()
    durable.add_middleware(IdempotencyMiddleware, client=aioredis.Redis(host="127.0.0.1", port=server.port),
                           prefix=ns, wait=0.8, lease=5,
                           durable=redis_idem.Durable(replicas=1, timeout=0.05))
    with serve(plain) as first_client, serve(durable) as durable_client:
        first = post(first_client, "dk1", {"amount": 7})
        assert first.status_code == 201
        again = post(durable_client, "dk1", {"amount": 7})
        assert again.status_code == 201 and again.content == first.content, again.text
        assert again.headers["x-charge-id"] == "ch_1" and again.headers["idempotent-replayed"] == "true"
        assert len(runs) == 1


def test_durable_claim_not_acknowledged_is_503_with_retry_after(server, ns):  # type: ignore[no-untyped-def]
    # A first request whose claim the replicas did not acknowledge (1 asked,
    # none here): released, the app not run, 503 and Retry-After, as the Go
    # and Java middlewares answer (it escaped as a 500).
    runs: list = []
    app = make_app(server.port, ns, runs)
    app.user_middleware.clear()
    app.add_middleware(IdempotencyMiddleware, client=aioredis.Redis(host="127.0.0.1", port=server.port),
                       prefix=ns, wait=0.8, lease=5, durable=redis_idem.Durable(replicas=1, timeout=0.05))
    with serve(app) as client:
        refused = post(client, "nd1", {"amount": 7})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        assert runs == []
        assert redis_idem.IdemCommands(server.client(), prefix=ns).get("http:nd1").state \
            is redis_idem.RecordState.RELEASED


@contextlib.contextmanager
def serve(app):  # type: ignore[no-untyped-def]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        web.should_exit = True
        thread.join(10)
