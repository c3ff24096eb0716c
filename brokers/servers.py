"""The Redis servers of a scenario run: the records' store (the module, or
the Functions edition without it) and the side store the test owns."""

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "target" / "release" / "libredis_idem.so"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, dir, edition=None, binary="redis-server"):
        self.dir = Path(dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.edition = edition
        for _ in range(5):  # a port taken between free_port() and the bind: another
            if self._start(binary, edition):
                break
        else:
            raise SystemExit(f"redis-server did not start: {(self.dir / 'redis.log').read_text()}")
        if edition == "functions":
            self.client.function_load((ROOT / "functions" / "idem.lua").read_text(), replace=True)

    def _start(self, binary, edition):
        self.port = free_port()
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--logfile", str(self.dir / "redis.log")]
        if edition == "module":
            args += ["--loadmodule", str(MODULE)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}"
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                # Our pid, not a PING: another suite's server can take the
                # port first, and ours exits while theirs answers.
                if self.client.info("server")["process_id"] == self.process.pid:
                    return True
            except redis.ConnectionError:
                if self.process.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
            self.process.kill()
            self.process.wait()
            return False

    def flushall(self):
        """FLUSHALL that keeps the Functions edition's library."""
        self.client.flushall()

    def get(self, key):
        """The record as a dict of text fields, or None."""
        if self.edition == "module":
            reply = self.client.execute_command("IDEM.GET", key)
        else:
            reply = self.client.fcall_ro("idem_get", 1, key)
        if reply is None:
            return None
        if isinstance(reply, dict):
            items = reply.items()
        else:
            items = zip(reply[::2], reply[1::2])
        text = lambda v: v.decode() if isinstance(v, bytes) else v
        return {text(k): text(v) for k, v in items}

    def close(self):
        self.process.terminate()
        self.process.wait()
