"""Real servers for the tests, on free 127.0.0.1 ports: standalone (with
the module, or with functions/idem.lua loaded instead, or bare) and a
3-node cluster. REDIS_SERVER picks the server binary (default
redis-server), REDIS_IDEM_MODULE the module (default
<repo>/target/release/libredis_idem.so)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import redis

REPO = Path(__file__).resolve().parents[3]
FUNCTIONS = REPO / "functions" / "idem.lua"


def server_bin() -> str:
    return os.environ.get("REDIS_SERVER", "redis-server")


def module_path() -> str:
    return os.environ.get("REDIS_IDEM_MODULE", str(REPO / "target" / "release" / "libredis_idem.so"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One redis-server process. edition: "module", "functions" or None (bare)."""

    def __init__(self, edition: Optional[str] = "module", extra: Optional[List[str]] = None):
        self.edition = edition
        self.dir = tempfile.mkdtemp(prefix="redis-idem-py-")
        self.extra = list(extra or [])
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        for _ in range(5):  # a port taken between free_port() and bind: try another
            self.port = free_port()
            if self._start():
                break
        else:
            raise RuntimeError(f"{server_bin()} did not start; log:\n{self.log()}")
        if edition == "functions":
            self.client().execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS.read_text())

    def _start(self) -> bool:
        args = [server_bin(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--logfile", "server.log", "--save", "", "--appendonly", "no", "--daemonize", "no"]
        if self.edition == "module":
            path = module_path()
            if not os.path.exists(path):
                raise RuntimeError(f"no module at {path}: build it (make build) or set REDIS_IDEM_MODULE")
            args += ["--loadmodule", path]
        args += self.extra
        self.proc = subprocess.Popen(args, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return True
            except redis.RedisError:
                time.sleep(0.02)
        self.proc.kill()
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> redis.Redis:  # type: ignore[no-untyped-def]
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text()[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """Three primaries, no replicas, slots split evenly; the module loaded
    (or functions/idem.lua on every primary: functions do not travel)."""

    def __init__(self, edition: str = "module"):
        self.nodes = [Server(None if edition == "functions" else edition,
                             ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                              "--cluster-node-timeout", "5000"]) for _ in range(3)]
        try:
            self._form(edition)
        except BaseException:
            self.stop()
            raise

    def _form(self, edition: str) -> None:
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        for node, (lo, hi) in zip(self.nodes, ranges):
            c = node.client()
            c.execute_command("CLUSTER", "ADDSLOTS", *range(lo, hi + 1))
        first = self.nodes[0].client()
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            states = [n.client().execute_command("CLUSTER", "INFO") for n in self.nodes]
            texts = [s.decode() if isinstance(s, bytes) else str(s) for s in states]
            if all("cluster_state:ok" in t and "cluster_known_nodes:3" in t for t in texts):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the cluster did not form")
        if edition == "functions":
            for node in self.nodes:
                node.client().execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS.read_text())

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
