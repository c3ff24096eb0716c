"""Real servers for the tests, on free 127.0.0.1 ports: standalone (with
the module, or with functions/idem.lua loaded instead, or bare) and a
3-primary cluster (replicas too, for a failover). REDIS_SERVER picks the server binary (default
redis-server), REDIS_IDEM_MODULE the module (default
<repo>/target/release/libredis_idem.so)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import redis

REPO = Path(__file__).resolve().parents[3]
#: REDIS_IDEM_FUNCTIONS tests another build of the Functions edition.
FUNCTIONS = Path(os.environ.get("REDIS_IDEM_FUNCTIONS", str(REPO / "functions" / "idem.lua")))


def server_bin() -> str:
    return os.environ.get("REDIS_SERVER", "redis-server")


def module_path() -> str:
    return os.environ.get("REDIS_IDEM_MODULE", str(REPO / "target" / "release" / "libredis_idem.so"))


def free_port(cluster: bool = False) -> int:
    """A free port; for a cluster node, one whose bus port (+10000) is free
    too, both below the kernel's ephemeral range (32768 and up): Redis
    refuses a cluster port over 55535, and outgoing connections do not take
    ports below that range."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    for _ in range(10_000):
        port = random.randrange(12_000, 22_700)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError("no free port pair (p, p + 10000)")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def stop_process(proc: Optional[subprocess.Popen]) -> None:
    """SIGTERM, then SIGKILL after 5 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Server:
    """One redis-server process. edition: "module", "functions" or None (bare)."""

    def __init__(self, edition: Optional[str] = "module", extra: Optional[List[str]] = None):
        self.edition = edition
        self.dir = tempfile.mkdtemp(prefix="redis-idem-py-")
        self.extra = list(extra or [])
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        for _ in range(5):  # a port taken between free_port() and bind: try another
            self.port = free_port("--cluster-enabled" in self.extra)
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
                # Our pid, not a PING: another suite's server can take the
                # port first, and ours exits while theirs answers.
                if redis.Redis(port=self.port, socket_timeout=1).info("server")["process_id"] == self.proc.pid:
                    return True
                self.proc.kill()
                self.proc.wait()
                return False
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
        stop_process(self.proc)
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
    return info["role"] in ("slave", "replica") and info.get("master_link_status") == "up" \
        and not info.get("master_sync_in_progress")


def wait_for(ok, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(what)
        time.sleep(0.05)


def acknowledged(primary: Server) -> None:
    """Waits until the primary's replica acknowledges a write made on it
    now (a SET, then WAIT 1 on the same connection): only then has it
    loaded its full sync and received everything written before. Listed
    `online` at the primary's offset is not that: after a full sync both
    offsets are 0 until the first write, while the replica may still be
    loading the RDB (Valkey 9 reads it in a background thread and loads it
    up to a second later under load), and a replica promoted then comes up
    empty. A WAIT without a write of the connection's own answers at once."""
    client = primary.client(single_connection_client=True)
    try:
        def acks() -> bool:
            client.set("topology:acknowledged", str(time.time()))
            return client.execute_command("WAIT", 1, 1000) >= 1
        wait_for(acks, "the replica does not acknowledge a write")
    finally:
        client.close()


def _replica_online(primary: Server, replica: Server, caught_up: bool = True) -> bool:
    """The primary lists the replica online (and, `caught_up`, at its own offset: no traffic meanwhile)."""
    info = primary.client().info("replication")
    offset = info.get("master_repl_offset")
    for name, value in info.items():
        if name.startswith(("slave", "replica")) and isinstance(value, dict) and value.get("port") == replica.port:
            return value.get("state") == "online" and (not caught_up or value.get("offset") == offset)
    return False


class Replicated:
    """A primary and one replica of it (the `replicated` topology of the
    conformance cases): `detach` makes the replica stop acknowledging,
    `attach` makes it a replica again, in sync; `restore` re-attaches
    after a case."""

    def __init__(self, edition: str):
        self.primary = Server(edition)
        # Functions travel by replication: the replica of the Functions edition runs no module.
        self.replica = Server("module" if edition == "module" else None)
        self.attached = False
        try:
            self.attach()
        except BaseException:
            self.stop()
            raise

    @property
    def port(self) -> int:
        return self.primary.port

    def primaries(self) -> List[redis.Redis]:
        return [self.primary.client()]

    def replica_client(self) -> redis.Redis:
        return self.replica.client()

    def detach(self) -> None:
        self.replica.client().execute_command("REPLICAOF", "NO", "ONE")
        wait_for(lambda: not any(k.startswith(("slave", "replica")) and isinstance(v, dict)
                                 for k, v in self.primary.client().info("replication").items()),
                 "the primary still lists its replica")
        self.attached = False

    def attach(self) -> None:
        self.replica.client().execute_command("REPLICAOF", "127.0.0.1", self.primary.port)
        wait_for(lambda: replica_in_sync(self.replica) and _replica_online(self.primary, self.replica),
                 "the replica did not come in sync")
        acknowledged(self.primary)
        self.attached = True

    def restore(self) -> None:
        if not self.attached:
            self.attach()

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()


class Sentineled:
    """A primary, one replica and one Sentinel monitoring them as
    `mymaster` with quorum 1 (the `sentinel` topology): `failover` is
    SENTINEL FAILOVER once the replica acknowledged a write, waited for
    until the roles have swapped and the old primary acknowledges too."""

    NAME = "mymaster"

    def __init__(self, edition: str):
        self.servers = [Server(edition)]
        self.servers.append(Server("module" if edition == "module" else None))
        self.sentinel_port = 0
        self.proc: Optional[subprocess.Popen] = None
        self.dir = tempfile.mkdtemp(prefix="redis-idem-py-sentinel-")
        try:
            self.servers[1].client().execute_command("REPLICAOF", "127.0.0.1", self.servers[0].port)
            wait_for(lambda: _replica_online(self.servers[0], self.servers[1]), "the replica did not sync")
            acknowledged(self.servers[0])
            self._start_sentinel()
        except BaseException:
            self.stop()
            raise

    def _start_sentinel(self) -> None:
        self.sentinel_port = free_port()
        conf = Path(self.dir, "sentinel.conf")
        conf.write_text("\n".join([
            f"port {self.sentinel_port}", "bind 127.0.0.1", f"dir {self.dir}", "logfile sentinel.log",
            f"sentinel monitor {self.NAME} 127.0.0.1 {self.servers[0].port} 1",
            f"sentinel down-after-milliseconds {self.NAME} 2000",
            f"sentinel failover-timeout {self.NAME} 10000", ""]))
        self.proc = subprocess.Popen([server_bin(), str(conf), "--sentinel"], cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self._knows_replica(), "the Sentinel did not find the replica")

    def _sentinel(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.sentinel_port, socket_timeout=2, decode_responses=True)

    def _knows_replica(self) -> bool:
        try:
            replicas = self._sentinel().execute_command("SENTINEL", "REPLICAS", self.NAME)
        except redis.RedisError:
            return False
        return any("s_down" not in str(r) and "disconnected" not in str(r) for r in replicas)

    @property
    def sentinels(self) -> list:
        return [("127.0.0.1", self.sentinel_port)]

    def primary(self) -> Server:
        _, port = self._sentinel().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.NAME)
        return next(s for s in self.servers if s.port == int(port))

    def primaries(self) -> List[redis.Redis]:
        return [self.primary().client()]

    def failover(self) -> None:
        old = self.primary()
        new = next(s for s in self.servers if s is not old)
        # The replica has everything the case wrote: a Sentinel failover
        # promotes the replica as it is (asynchronous replication, not what
        # the case is about), and writes it never acknowledged are lost.
        acknowledged(old)
        self._sentinel().execute_command("SENTINEL", "FAILOVER", self.NAME)
        wait_for(lambda: self.primary() is new, "the Sentinel did not name the replica primary")
        wait_for(lambda: new.client().execute_command("ROLE")[0] in (b"master", "master"), "no new primary")
        wait_for(lambda: replica_in_sync(old) and _replica_online(new, old, caught_up=False),
                 "the old primary is not the new one's replica with the link up")
        acknowledged(new)

    def restore(self) -> None:
        pass

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
        for s in self.servers:
            s.stop()
