"""Real servers for the tests, on free 127.0.0.1 ports: standalone (with
the module, or with functions/idem.lua loaded instead, or bare) and a
3-primary cluster (replicas too, for a failover). REDIS_SERVER picks the server binary (default
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
    """Three primaries, slots split evenly, each with `replicas` replicas;
    the module loaded on every node (or functions/idem.lua on every primary:
    functions do not travel)."""

    def __init__(self, edition: str = "module", replicas: int = 0):
        self.nodes = [Server(None if edition == "functions" else edition,
                             ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                              "--cluster-node-timeout", "5000"]) for _ in range(3 * (1 + replicas))]
        try:
            self._form(edition, replicas)
        except BaseException:
            self.stop()
            raise

    def _form(self, edition: str, replicas: int) -> None:
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        primaries, others = self.nodes[:3], self.nodes[3:]
        for node, (lo, hi) in zip(primaries, ranges):
            c = node.client()
            c.execute_command("CLUSTER", "ADDSLOTS", *range(lo, hi + 1))
        first = self.nodes[0].client()
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        self._wait_until(lambda t: "cluster_known_nodes:%d" % len(self.nodes) in t, "the nodes did not meet")
        for i, node in enumerate(others):
            primary_id = primaries[i % 3].client().execute_command("CLUSTER", "MYID")
            node.client().execute_command("CLUSTER", "REPLICATE", primary_id)
        self._wait_until(lambda t: "cluster_state:ok" in t, "the cluster did not form")
        for node in others:
            wait_for(lambda: replica_in_sync(node), f"replica {node.port} did not sync")
        if edition == "functions":
            for node in primaries:
                node.client().execute_command("FUNCTION", "LOAD", "REPLACE", FUNCTIONS.read_text())

    def _wait_until(self, ok, what: str) -> None:  # type: ignore[no-untyped-def]
        def every_node() -> bool:
            states = [n.client().execute_command("CLUSTER", "INFO") for n in self.nodes]
            return all(ok(s.decode() if isinstance(s, bytes) else str(s)) for s in states)
        wait_for(every_node, what)

    def failover(self, replica: Server) -> None:
        """A planned failover (`CLUSTER FAILOVER` on `replica`), waited for:
        the replica is the primary, its old primary replicates it in sync,
        and every node sees the cluster ok."""
        old_primary = replica.client().info("replication")["master_port"]
        replica.client().execute_command("CLUSTER", "FAILOVER")
        wait_for(lambda: replica.client().info("replication")["role"] == "master", "the failover did not happen")
        old = next(n for n in self.nodes if n.port == old_primary)
        wait_for(lambda: replica_in_sync(old), "the old primary did not become a replica in sync")
        self._wait_until(lambda t: "cluster_state:ok" in t, "the cluster is not ok after the failover")

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def replica_in_sync(node: Server) -> bool:
    info = node.client().info("replication")
    return info["role"] == "slave" and info.get("master_link_status") == "up" \
        and not info.get("master_sync_in_progress")


def wait_for(ok, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(what)
        time.sleep(0.05)
