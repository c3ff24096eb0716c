"""The runner of clients/conformance/cases.json: maps each step of a case
to this library's API (docs in clients/conformance/README.md), against the
real servers of the session. A TCP proxy cuts a connection for `cut_reply`;
an HTTP server (uvicorn) runs the ASGI middleware for the `http` steps."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import redis

import redis_idem as ri
from servers import free_port

CASES = Path(__file__).resolve().parents[2] / "conformance" / "cases.json"


def load_cases() -> List[dict]:
    return json.loads(CASES.read_text())["cases"]


class WorkFailed(Exception):
    """The `raise` of a case's work: the error named `Work`."""


def error_name(error: BaseException) -> str:
    if isinstance(error, WorkFailed):
        return "Work"
    name = type(error).__name__
    return name[: -len("Error")] if name.endswith("Error") else name


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


#: The proxy's command names (clients/conformance/README.md): the bulk
#: string it finds in what the library sends, module / Functions edition.
MARKERS = {
    "claim": (b"IDEM.CLAIM", b"idem_claim"),
    "done": (b"IDEM.DONE", b"idem_done"),
    "release": (b"IDEM.RELEASE", b"idem_release"),
    "mdone": (b"IDEM.MDONE", b"idem_done"),
    "mrelease": (b"IDEM.MRELEASE", b"idem_release"),
}


def marker(command: str, module: bool) -> bytes:
    name = MARKERS[command][0 if module else 1]
    return b"$%d\r\n%s\r\n" % (len(name), name)


class Proxy:
    """Forwards bytes both ways between the library and the server. Armed
    with a marker (a command's name as RESP sends it), it cuts the next
    `times` connections whose client chunk holds it (-1: every one until
    disarmed): `forward` sends the chunk on and drops the server's reply
    (cut_reply), else the server never sees it (cut_request). It keeps
    listening, so the library reconnects."""

    def __init__(self, port: int):
        self.upstream = port
        self.armed: Optional[bytes] = None
        self.times = 0
        self.forward = True
        self.lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes, times: int = 1, forward: bool = True) -> None:
        """Cut the next `times` connections that send `marker` (-1: all)."""
        with self.lock:
            self.armed, self.times, self.forward = marker, times, forward

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            pair = {"cut": False}
            threading.Thread(target=self._pump, args=(client, server, pair, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair: dict, from_client: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                cut = forward = False
                if from_client:
                    with self.lock:
                        if self.armed is not None and self.armed.lower() in data.lower():
                            self.times -= 1
                            pair["cut"] = cut = True
                            forward = self.forward
                            if self.times == 0:
                                self.armed = None
                elif pair["cut"]:
                    break  # the reply of the cut command never reaches the client
                if cut and not forward:
                    break
                dst.sendall(data)
                if cut:
                    time.sleep(0.2)  # the server has run it; its reply is dropped above
                    break
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


class Http:
    """uvicorn on a free port with the middleware around a test app whose
    answer each request names (the `x-handler` header: status, body,
    gate, sleep_ms); `x-options` picks the middleware's settings."""

    def __init__(self, runner: "Runner"):
        import uvicorn

        self.runner = runner
        self.runs = 0
        self.finished = 0
        self.lock = threading.Lock()
        self.middlewares: Dict[str, Any] = {}
        self.client: Any = None
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    interface="asgi3", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    async def handler(self, scope: dict, receive: Any, send: Any) -> None:
        import asyncio

        spec = json.loads(dict(scope["headers"])[b"x-handler"])
        with self.lock:
            self.runs += 1
        if spec.get("gate"):
            gate = self.runner.gate(spec["gate"])
            while not gate.is_set():
                await asyncio.sleep(0.01)
        if spec.get("sleep_ms"):
            await asyncio.sleep(spec["sleep_ms"] / 1000)
        body = spec["body"].encode()
        await send({"type": "http.response.start", "status": spec["status"],
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        with self.lock:
            self.finished += 1

    async def app(self, scope: dict, receive: Any, send: Any) -> None:
        from redis_idem.asgi import IdempotencyMiddleware

        if self.client is None:
            self.client = redis.asyncio.Redis(host="127.0.0.1", port=self.runner.port)
        options = dict(scope["headers"]).get(b"x-options", b"{}").decode()
        if options not in self.middlewares:
            opts = json.loads(options)
            kwargs = {"wait": opts["wait_ms"] / 1000} if "wait_ms" in opts else {}
            self.middlewares[options] = IdempotencyMiddleware(self.handler, self.client, prefix=self.runner.ns, **kwargs)
        await self.middlewares[options](scope, receive, send)

    def request(self, step: dict) -> dict:
        """Over http.client, which sends a header's value as given (httpx
        refuses one with surrounding whitespace, which a case sends)."""
        import http.client

        headers = dict(step.get("headers", {}))
        headers["x-handler"] = json.dumps(step["handler"])
        headers["x-options"] = json.dumps(step.get("options", {}))
        timeout = step.get("client_timeout_ms", 30000) / 1000
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(step["method"], step["target"], body=step["body"].encode(), headers=headers)
            answer = conn.getresponse()
            body = answer.read().decode()
        except (socket.timeout, TimeoutError):
            return {"client_timeout": True}
        finally:
            conn.close()
        return {"status": answer.status, "replayed": answer.getheader("idempotent-replayed") == "true",
                "body": body, "retry_after": answer.getheader("retry-after") is not None, "client_timeout": False}

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Call:
    """One process() call of a case, in this thread or another."""

    def __init__(self, runner: "Runner", step: dict):
        self.runner, self.step = runner, step
        self.ran = False
        self.started = threading.Event()
        self.job: Optional[ri.Job] = None
        self.lost_seen: Optional[bool] = None
        self.outcome: Optional[ri.Outcome] = None
        self.error: Optional[BaseException] = None
        self.thread: Optional[threading.Thread] = None

    def _value(self, spec: dict) -> Any:
        if "raise" in spec:
            raise WorkFailed(spec["raise"])
        if spec.get("return_unserializable"):
            return object()
        if "return_bytes" in spec:
            return "x" * spec["return_bytes"]
        return spec.get("return")

    def _began(self, job: ri.Job) -> None:
        self.ran, self.job = True, job
        self.runner.job_keys.append(job.key)
        self.started.set()

    def work(self, spec: dict) -> Any:
        """The case's work: a function, or a coroutine function for AsyncIdem."""
        if self.runner.asynchronous:
            async def run_async(job: ri.Job) -> Any:
                import asyncio

                self._began(job)
                if "gate" in spec:
                    gate = self.runner.gate(spec["gate"])
                    while not gate.is_set():
                        await asyncio.sleep(0.01)
                    self.lost_seen = job.lost
                if "sleep_ms" in spec:
                    await asyncio.sleep(spec["sleep_ms"] / 1000)
                return self._value(spec)

            return run_async

        def run(job: ri.Job) -> Any:
            self._began(job)
            if "gate" in spec:
                self.runner.gate(spec["gate"]).wait(30)
                self.lost_seen = job.lost
            if "sleep_ms" in spec:
                time.sleep(spec["sleep_ms"] / 1000)
            return self._value(spec)

        return run

    def __call__(self) -> None:
        s = self.step
        try:
            self.outcome = self.runner.call("process_outcome", s["key"], self.work(s["work"]),
                                            payload=s.get("payload"), **self.runner.settings(s.get("options", {})))
        except Exception as e:
            self.error = e

    def start(self) -> None:
        self.thread = threading.Thread(target=self, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join(60)
            assert not self.thread.is_alive(), "the call did not finish"

    def check(self, expect: dict) -> None:
        o, e = self.outcome, self.error
        got: Dict[str, Any] = {"ran": self.ran}
        if o is not None:
            got.update(value=o.value, replayed=o.replayed, result_stored=o.result_stored, attempt=o.attempt,
                       status=o.status.value if o.status else None)
        elif self.job is not None:
            got.update(attempt=self.job.attempt, status=self.job.status.value)
        if self.job is not None:
            got["job_key"] = self.job.key
        if e is not None:
            got.update(error=error_name(e), message=str(e))
            if hasattr(e, "result"):
                got["error_result"] = e.result
            if isinstance(e, ri.BusyError):
                got["lease_left_ms"] = e.lease_left * 1000
                got["owner"] = e.owner
            if isinstance(e, ri.NotDurableError):
                got["stage"] = e.stage
        got["lost_seen"] = self.lost_seen
        for field, want in expect.items():
            if field == "lease_left_ms_min":
                assert got["lease_left_ms"] >= want, (field, got)
            elif field == "message":
                assert want in got["message"], (field, got)
            else:
                assert field in got, (field, got, e)
                assert got[field] == want, (field, got, e)
        if "error" not in expect:
            assert e is None, f"unexpected {e!r}"


class Runner:
    """One case: a fresh key prefix, the instance under test, the steps."""

    def __init__(self, case: dict, client_factory: Any, raw: Any, primaries: List[Any], port: int, module: bool,
                 asynchronous: bool = False, topology: Any = None):
        self.case, self.raw, self.primaries, self.port, self.module = case, raw, primaries, port, module
        self.asynchronous = asynchronous
        self.topology = topology  #: servers.Replicated or servers.Sentineled for those topologies
        self.job_keys: List[Any] = []
        self.hook_calls: Dict[str, int] = {}
        self.ns = f"c:{uuid.uuid4().hex[:8]}:"
        self.proxy = Proxy(port) if "proxy" in case["needs"] else None
        kind = ri.AsyncIdem if asynchronous else ri.Idem
        self.loop: Any = None
        if asynchronous:  # AsyncIdem runs on an event loop of its own thread; the steps submit to it
            import asyncio

            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()
            self.client = self.submit(self._async_client(client_factory, self.proxy.port if self.proxy else port))
        else:
            self.client = client_factory(self.proxy.port if self.proxy else port)
        # Every case runs with batch on (one batch per tick).
        self.idem = kind(self.client, prefix=self.ns, hooks=self.hooks(case["options"].get("hooks", {})),
                         batch=True, **self.settings(case["options"]))
        self.cmds = ri.IdemCommands(raw, prefix=self.ns)
        self.gates: Dict[str, threading.Event] = {}
        self.calls: Dict[str, Call] = {}
        self.waitings = 0  # the waiting steps so far
        self.tokens: Dict[str, str] = {}
        self.http: Optional[Http] = None
        self.http_calls: Dict[str, Any] = {}
        self.calls_before = self.command_calls()

    @staticmethod
    async def _cancel_tasks() -> None:
        """The instance's heartbeat task (asleep) goes with the case's event loop."""
        import asyncio

        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    @staticmethod
    async def _async_client(factory: Any, port: int) -> Any:
        return factory(port)

    def submit(self, coroutine: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A method of the instance under test, awaited on its loop for AsyncIdem."""
        answer = getattr(self.idem, method)(*args, **kwargs)
        return self.submit(answer) if self.asynchronous else answer

    @staticmethod
    def settings(options: dict) -> dict:
        out: Dict[str, Any] = {}
        if "lease_ms" in options:
            out["lease"] = options["lease_ms"] // 1000
        if "wait_ms" in options:
            out["wait"] = options["wait_ms"] / 1000
        if "heartbeat_ms" in options:
            out["heartbeat"] = options["heartbeat_ms"] / 1000
        for name in ("max_tries", "oversize", "owner"):
            if name in options:
                out[name] = options[name]
        if "durable" in options:
            d = options["durable"]
            out["durable"] = ri.Durable(replicas=d["replicas"], timeout=d.get("timeout_ms", 1000) / 1000,
                                        fsync=d.get("fsync", False))
        return out

    def hooks(self, spec: dict) -> ri.Hooks:
        """Every hook counts its calls; those the case names raise."""
        lock = threading.Lock()

        def hook(name: str) -> Any:
            def call(*args: Any) -> None:
                with lock:
                    self.hook_calls[name] = self.hook_calls.get(name, 0) + 1
                if spec.get(name) == "raise":
                    raise RuntimeError("hook failed")
            return call

        names = ("on_run", "on_replay", "on_busy", "on_done", "on_release", "on_lease_lost", "on_result_dropped")
        return ri.Hooks(**{name: hook(name) for name in names})

    def gate(self, name: str) -> threading.Event:
        return self.gates.setdefault(name, threading.Event())

    def command_calls(self) -> Dict[tuple, int]:
        """INFO commandstats' calls per primary and command (the name's case varies by server)."""
        out: Dict[tuple, int] = {}
        for n, node in enumerate(self.nodes()):
            for name, stats in node.info("commandstats").items():
                out[(n, name[len("cmdstat_"):].lower())] = stats.get("calls", 0)
        return out

    def nodes(self) -> List[Any]:
        """A client per primary (behind Sentinel: the current one)."""
        return self.topology.primaries() if self.topology is not None else self.primaries

    def blocked(self) -> List[dict]:
        out = []
        for node in self.nodes():
            for c in node.client_list():
                if "b" in c.get("flags", "") and c.get("cmd", "").lower() == "idem.claim":
                    out.append((node, c))
        return out

    def run(self) -> None:
        try:
            for step in self.case["steps"]:
                getattr(self, "op_" + step["op"])(step)
            for call in self.calls.values():
                call.finish()
            self.check_stats(self.case["stats"])
            for name, count in self.case.get("hooks_called", {}).items():
                assert self.hook_calls.get(name, 0) == count, (name, self.hook_calls)
        finally:
            if self.topology is not None:
                self.topology.restore()
            for gate in self.gates.values():
                gate.set()
            if self.http is not None:
                self.http.stop()
            if self.proxy is not None:
                self.proxy.close()
            if self.asynchronous:
                self.submit(self.client.aclose())
                self.submit(self._cancel_tasks())
                self.loop.call_soon_threadsafe(self.loop.stop)
            else:
                self.client.close()

    def check_stats(self, want: dict) -> None:
        got = self.idem.stats.as_dict()
        for name, value in got.items():
            if name == "extends":
                assert value >= want.get("extends_min", 0), (name, got)
            else:
                assert value == want.get(name, 0), (name, got, want)

    # -- the steps -------------------------------------------------------

    def op_process(self, step: dict) -> None:
        call = Call(self, step)
        call()
        call.check(step.get("expect", {}))

    def op_start(self, step: dict) -> None:
        self.calls[step["id"]] = call = Call(self, step)
        call.start()

    def op_running(self, step: dict) -> None:
        assert self.calls[step["id"]].started.wait(10), "the work did not start"

    def op_waiting(self, step: dict) -> None:
        deadline = time.monotonic() + 10
        if not self.module:
            # No blocked client to see: a call counts its wait at its first BUSY answer.
            self.waitings += 1
            while self.idem.stats.waits < self.waitings:
                assert time.monotonic() < deadline, "no call counted a wait"
                time.sleep(0.01)
            return
        while not self.blocked():
            assert time.monotonic() < deadline, "no client blocked in idem.claim"
            time.sleep(0.01)

    def op_finish(self, step: dict) -> None:
        call = self.calls.pop(step["id"])
        call.finish()
        call.check(step.get("expect", {}))

    def op_open(self, step: dict) -> None:
        self.gate(step["gate"]).set()

    def op_process_many(self, step: dict) -> None:
        calls = {key: Call(self, {"key": key}) for key in step["keys"]}
        works = {key: calls[key].work(spec) for key, spec in step["work"].items()}
        items = self.call("process_many", step["keys"], lambda job: works[job.key](job), payloads=step.get("payloads"))
        assert [i.key for i in items] == step["keys"]
        for item, want in zip(items, step["expect"]):
            got = {"key": item.key, "status": item.status, "value": item.value, "attempt": item.attempt,
                   "result_stored": item.result_stored, "error": None if item.error is None else error_name(item.error),
                   "message": str(item.error)}
            for field, value in want.items():
                if field == "message":
                    assert value in got["message"], (field, got)
                else:
                    assert got[field] == value, (field, got, item.error)
            if "error" not in want and item.status != "busy":  # a busy item carries its BusyError (lease_left)
                assert item.error is None, item

    def _claim_expect(self, reply: Any, want: dict) -> None:
        if isinstance(reply, Exception):
            assert want.get("error") == error_name(reply), (want, reply)
            return
        assert "error" not in want, (want, reply)
        if "status" in want:
            assert reply.status.value == want["status"], (want, reply)
        if "attempt" in want:
            assert reply.attempt == want["attempt"], (want, reply)

    def op_claim(self, step: dict) -> None:
        try:
            reply: Any = self.cmds.claim(step["key"], step["lease_ms"] // 1000, owner=step.get("owner"))
        except redis.ResponseError as e:
            reply = e
        if step.get("as") and not isinstance(reply, Exception):
            self.tokens[step["as"]] = reply.token
        self._claim_expect(reply, step.get("expect", {}))

    def op_claim_many(self, step: dict) -> None:
        replies = self.cmds.claim_many(step["keys"], step["lease_ms"] // 1000)
        for i, reply in enumerate(replies):
            name = (step.get("as") or [None] * len(replies))[i]
            if name and not isinstance(reply, Exception):
                self.tokens[name] = reply.token
            if "expect" in step:
                self._claim_expect(reply, step["expect"][i])

    def _done_expect(self, reply: Any, want: dict) -> None:
        if isinstance(reply, Exception):
            assert want.get("error") == error_name(reply), (want, reply)
        elif "completed" in want:
            assert reply.completed == want["completed"], (want, reply)

    def op_done(self, step: dict) -> None:
        result = step.get("result")
        try:
            reply: Any = self.cmds.done(step["key"], self.tokens[step["token"]],
                                        result=None if result is None else result.encode())
        except redis.ResponseError as e:
            reply = e
        self._done_expect(reply, step.get("expect", {}))

    def _items(self, step: dict) -> list:
        return [(it[0], self.tokens[it[1]], *([it[2].encode()] if len(it) > 2 else [])) for it in step["items"]]

    def op_done_many(self, step: dict) -> None:
        replies = self.cmds.done_many(self._items(step))
        for reply, want in zip(replies, step.get("expect", [{}] * len(replies))):
            self._done_expect(reply, want)

    def op_release(self, step: dict) -> None:
        released = self.cmds.release(step["key"], self.tokens[step["token"]])
        if "released" in step.get("expect", {}):
            assert released == step["expect"]["released"]

    def op_release_many(self, step: dict) -> None:
        replies = self.cmds.release_many([(k, t) for k, t, *_ in self._items(step)])
        for reply, want in zip(replies, step.get("expect", [{}] * len(replies))):
            assert reply == want.get("released", reply)

    def op_get(self, step: dict) -> None:
        cmds = self.cmds
        if step.get("on") == "replica":
            cmds = ri.IdemCommands(self.topology.replica_client(), prefix=self.ns)
        record = cmds.get(step["key"])
        want = step["expect"]
        if want is None:
            assert record is None, record
            return
        assert record is not None
        got = {"state": record.state.value, "attempt": record.attempt, "result": text(record.result),
               "owner": record.owner}
        for field, value in want.items():
            if field == "owner" and value == "$default":
                value = ri.DEFAULT_OWNER.value()
            assert got[field] == value, (field, got)

    def op_set(self, step: dict) -> None:
        self.raw.set(self.ns + step["key"], step["value"])

    def op_del(self, step: dict) -> None:
        self.raw.delete(self.ns + step["key"])

    def op_sleep(self, step: dict) -> None:
        time.sleep(step["ms"] / 1000)

    def op_unblock(self, step: dict) -> None:
        blocked = self.blocked()
        assert blocked, "nobody to unblock"
        for node, c in blocked:
            node.execute_command("CLIENT", "UNBLOCK", c["id"], "ERROR")

    def _cut(self, step: dict, forward: bool) -> None:
        assert self.proxy is not None
        times = step.get("times", 1)
        self.proxy.arm(marker(step["command"], self.module), -1 if times == "all" else times, forward)

    def op_cut_reply(self, step: dict) -> None:
        self._cut(step, forward=True)

    def op_cut_request(self, step: dict) -> None:
        self._cut(step, forward=False)

    def op_command_calls(self, step: dict) -> None:
        now = self.command_calls()
        total = sum(v - self.calls_before.get(k, 0) for k, v in now.items() if k[1] == step["command"])
        if "expect" in step:
            assert total == step["expect"], (step, total)
        if "expect_max" in step:
            assert total <= step["expect_max"], (step, total)

    def op_replica(self, step: dict) -> None:
        getattr(self.topology, step["action"])()

    def op_failover(self, step: dict) -> None:
        self.topology.failover()

    # -- HTTP ------------------------------------------------------------

    def _http(self) -> Http:
        if self.http is None:
            self.http = Http(self)
        return self.http

    def _http_expect(self, got: dict, want: dict) -> None:
        got = dict(got, handler_runs=self._http().runs)
        for field, value in want.items():
            assert got.get(field) == value, (field, got)

    def op_http(self, step: dict) -> None:
        self._http_expect(self._http().request(step), step.get("expect", {}))

    def op_http_start(self, step: dict) -> None:
        http, box = self._http(), {}
        thread = threading.Thread(target=lambda: box.update(http.request(step)), daemon=True)
        thread.start()
        self.http_calls[step["id"]] = (thread, box)

    def op_http_finish(self, step: dict) -> None:
        thread, box = self.http_calls.pop(step["id"])
        thread.join(30)
        self._http_expect(box, step.get("expect", {}))

    def op_handler_finished(self, step: dict) -> None:
        deadline = time.monotonic() + 10
        while self._http().finished < step["count"]:
            assert time.monotonic() < deadline, "the handler did not finish"
            time.sleep(0.01)

    def op_fingerprint(self, step: dict) -> None:
        from redis_idem.asgi import fingerprint

        assert fingerprint(step["method"], step["target"], step["body"].encode()) == step["expect"]
