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
                self.client.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start: {(self.dir / 'redis.log').read_text()}")
                time.sleep(0.05)
        if edition == "functions":
            self.client.function_load((ROOT / "functions" / "idem.lua").read_text(), replace=True)

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
