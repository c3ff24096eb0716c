"""Record figures: IDEM.CLAIM and IDEM.ONCE beside what users run today
(SET NX PX, the same CLAIM written as a Lua function, PING as the ceiling)
and beside the Functions edition (functions/idem.lua, FCALL idem_claim),
with and without a replica, memory per record, and unpipelined latency.

Every write run starts from an empty keyspace (FLUSHALL before each run),
so every side pays the same dictionary growth.
"""

import time
from pathlib import Path

import pairs
from harness import Server, compare, latency_percentiles, pipelined

TOKEN16 = "0123456789abcdef"
TOKEN32 = TOKEN16 * 2
LUA = (Path(__file__).resolve().parent / "claim.lua").read_text()
# The Functions edition, loaded beside the module (its functions have other
# names than the module's commands, so both run on one server).
EDITION = (Path(__file__).resolve().parent.parent / "functions" / "idem.lua").read_text()
RECORDS = 200_000


def load_lua(server):
    server.client.execute_command("FUNCTION", "LOAD", "REPLACE", LUA)
    server.client.execute_command("FUNCTION", "LOAD", "REPLACE", EDITION)


CLAIM_SIDES = [
    ("SET NX PX", ["SET", "s:__rand_int__", TOKEN16, "NX", "PX", "86400000"]),
    ("IDEM.CLAIM", ["IDEM.CLAIM", "c:__rand_int__", "60"]),
    ("Lua claim", ["FCALL", "bench_claim", "1", "l:__rand_int__", "60", TOKEN32]),
    ("FCALL idem_claim (Functions edition)", ["FCALL", "idem_claim", "1", "f:__rand_int__", "60"]),
    ("PING", ["PING"]),
]

ONCE_SIDES = [
    ("SET 1 NX EX", ["SET", "o:__rand_int__", "1", "NX", "EX", "86400"]),
    ("IDEM.ONCE", ["IDEM.ONCE", "i:__rand_int__", "86400"]),
    ("FCALL idem_once (Functions edition)", ["FCALL", "idem_once", "1", "j:__rand_int__", "86400"]),
]


def key36(n):
    return f"order:{n:030d}"


def memory_per_key(server, command):
    client = server.client
    client.flushall()
    time.sleep(0.2)
    before = server.used_memory()
    pipelined(server.client, [command(n) for n in range(RECORDS)], batch=1000)
    return (server.used_memory() - before) / RECORDS


def memory(server):
    now_ms = int(time.time() * 1000)
    rows = [
        ("IDEM.ONCE (a done record)", memory_per_key(server, lambda n: ("IDEM.ONCE", key36(n), 86400))),
        ("IDEM.CLAIM (a processing record)", memory_per_key(server, lambda n: ("IDEM.CLAIM", key36(n), 60))),
        ("FCALL idem_once (Functions edition, a done record)", memory_per_key(
            server, lambda n: ("FCALL", "idem_once", 1, key36(n), 86400))),
        ("FCALL idem_claim (Functions edition, a processing record)", memory_per_key(
            server, lambda n: ("FCALL", "idem_claim", 1, key36(n), 60))),
        ("SET key <16-byte token> NX PX", memory_per_key(
            server, lambda n: ("SET", key36(n), f"{n:016x}", "NX", "PX", 86400000))),
    ]

    def hash_record(n):
        return ("HSET", key36(n), "state", "done", "attempt", 1, "done_at", now_ms)

    def hash_expiry(server):
        pipelined(server.client, [("PEXPIRE", key36(n), 86400000) for n in range(RECORDS)], batch=1000)

    client = server.client
    client.flushall()
    time.sleep(0.2)
    before = server.used_memory()
    pipelined(client, [hash_record(n) for n in range(RECORDS)], batch=1000)
    hash_expiry(server)
    rows.append(("HSET record + PEXPIRE", (server.used_memory() - before) / RECORDS))
    client.flushall()
    return rows


def table(title, result, names, base):
    lines = ["", title, "", f"| command | req/s | server CPU us/op | req/s vs {base} | CPU vs {base} |",
             "|---|---|---|---|---|"]
    for name in names:
        r = result[name]
        lines.append(f"| {name} | {r['rps']:,.0f} | {r['cpu_us']:.2f} | {r['rps_ratio']:.2f} | {r['cpu_ratio']:.2f} |")
    return lines


def report(requests=500_000, rounds=5):
    lines = []
    with Server(redisbloom=False) as server:
        load_lua(server)
        flush = server.client.flushall
        for pipeline in (16, 1):
            n = requests if pipeline > 1 else requests // 5
            claims = compare(server, CLAIM_SIDES, n, rounds, pipeline, between=flush)
            lines += table(f"### Claims on new keys, 50 clients, -P {pipeline}, median of {rounds} alternating rounds",
                           claims, [name for name, _ in CLAIM_SIDES], "SET NX PX")
            once = compare(server, ONCE_SIDES, n, rounds, pipeline, between=flush)
            lines += table(f"### Mark-if-absent, 50 clients, -P {pipeline}", once, [name for name, _ in ONCE_SIDES], "SET NX EX")

        pair_lines, _ = pairs.report(server)
        lines += pair_lines

        lines += ["", "### Latency, unpipelined, 50 clients (ms)", "", "| command | p50 | p99 |", "|---|---|---|"]
        for name, command in CLAIM_SIDES[:2]:
            flush()
            p50, p99 = latency_percentiles(server, command, requests // 5)
            lines.append(f"| {name} | {p50:.3f} | {p99:.3f} |")

        lines += ["", f"### Memory per record ({RECORDS:,} keys of 36 characters, used_memory growth)", "",
                  "| record | bytes per key |", "|---|---|"]
        for name, per_key in memory(server):
            lines.append(f"| {name} | {per_key:.1f} |")

        replica_of = ["--replicaof", "127.0.0.1", str(server.port)]
        with Server(redisbloom=False, warm=False, extra=replica_of) as replica:
            for _ in range(100):
                if replica.client.info("replication").get("master_link_status") == "up":
                    break
                time.sleep(0.1)
            claims = compare(server, CLAIM_SIDES[:2], requests, rounds, 16, between=flush)
            lines += table(f"### Claims with a replica attached, -P 16, median of {rounds} rounds",
                           claims, ["SET NX PX", "IDEM.CLAIM"], "SET NX PX")
    lines += ["", "Ratios are each command over the baseline named in the column (CPU: the baseline's CPU per op "
              "over the command's; above 1 is cheaper)."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(requests=200_000, rounds=3))
