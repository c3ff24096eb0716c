#!/usr/bin/env python3
"""What Redis 7.0's wake-up hooks cost other clients' writes (issue 35).

On Redis 7.0 the server serves no waiter whose key is deleted or
overwritten by another type, so from the first IDEM.CLAIM ... WAIT on the
module hears every data type's writes (keyspace events), for good: 7.0
cannot unsubscribe. This measures what that costs a write of another
type: server time per call (INFO commandstats, usec_per_call) of SET,
LPUSH, HSET and INCR sent by redis-benchmark, on two servers side by side
with the module loaded, one armed from the load (wait-hooks-at-load yes,
as after a first WAIT) and one not; rounds alternate, medians and ratios
are printed.

    python3 bench/wait_hooks.py [--module target/release/libredis_idem.so]
        [--rounds 5] [--requests 200000]

Needs Debian's redis-server and redis-benchmark (7.0.15). About 2 minutes.
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

TESTS = ["set", "lpush", "hset", "incr"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True, text=True).stdout


def start(module: Path, armed: bool, directory: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--loadmodule", str(module)]
    if armed:
        args += ["wait-hooks-at-load", "yes"]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if cli(port, "PING").strip() == "PONG":
                return server, port
        except subprocess.CalledProcessError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"redis-server on {port} did not start")


def usec_per_call(port: int, requests: int) -> dict[str, float]:
    """One redis-benchmark run of every test; server microseconds per call."""
    cli(port, "FLUSHALL")
    cli(port, "CONFIG", "RESETSTAT")
    subprocess.run(["redis-benchmark", "-p", str(port), "-t", ",".join(TESTS), "-n", str(requests),
                    "-P", "16", "-c", "4", "-r", "100000", "-q"], check=True, capture_output=True)
    stats = {}
    for line in cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            values = dict(field.split("=") for field in fields.split(","))
            stats[name] = float(values["usec_per_call"])
    return {test: stats[test] for test in TESTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", type=Path, default=Path("target/release/libredis_idem.so"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200_000)
    options = parser.parse_args()
    module = options.module.resolve()
    directory = Path(tempfile.mkdtemp(prefix="wait-hooks-"))
    servers = {}
    for armed in (False, True):
        (directory / str(armed)).mkdir()
        servers[armed] = start(module, armed, directory / str(armed))
    runs = {False: [], True: []}
    try:
        for _ in range(options.rounds):
            for armed in (False, True):
                runs[armed].append(usec_per_call(servers[armed][1], options.requests))
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"Server time per call (INFO commandstats usec_per_call), medians of {options.rounds} rounds of "
          f"redis-benchmark -n {options.requests} -P 16 -c 4 -r 100000, {os.cpu_count()} cores:")
    print("| command | module loaded | armed (after a first WAIT) | ratio |")
    print("|---|---|---|---|")
    for test in TESTS:
        plain = statistics.median(run[test] for run in runs[False])
        armed = statistics.median(run[test] for run in runs[True])
        print(f"| {test.upper()} | {plain:.2f} us | {armed:.2f} us | {armed / plain:.2f}x |")


if __name__ == "__main__":
    main()
