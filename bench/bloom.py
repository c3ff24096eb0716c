"""Bloom filter figures: bits per item, measured false-positive rate, and
IDEM.BF.ADD / IDEM.BF.EXISTS throughput, each beside RedisBloom's in the
same run on the same server.

Bits per item are the server's used_memory growth per item added, so they
include every allocation either module makes, rounded by the allocator.
"""

import struct
import time

from harness import Server, compare, pipelined

ERROR_RATE = 0.01
FRESH_QUERIES = 100_000
BATCH = 1000
DAY_MS = 86_400_000


def items(prefix, count):
    return [f"{prefix}:{n:012d}" for n in range(count)]


def add_all(client, command, key, values):
    pipelined(client, [(command, key, *values[i:i + BATCH]) for i in range(0, len(values), BATCH)], batch=10)


def false_positive_rate(client, query):
    """`query(batch)` answers 0/1 per item; fresh items were never added."""
    fresh = items("fresh", FRESH_QUERIES)
    hits = 0
    for start in range(0, len(fresh), BATCH):
        hits += sum(query(fresh[start:start + BATCH]))
    return hits / len(fresh)


def measure(server, setup, fill, query):
    client = server.client
    client.flushall()
    time.sleep(0.2)
    before = server.used_memory()
    setup(client)
    count = fill(client)
    bits = (server.used_memory() - before) * 8 / count
    return bits, false_positive_rate(client, lambda batch: query(client, batch))


def idem_query(key):
    return lambda client, batch: client.execute_command("IDEM.BF.MEXISTS", key, *batch)


def rb_query(key):
    return lambda client, batch: client.execute_command("BF.MEXISTS", key, *batch)


def memory_and_fpr(server, capacity):
    rows = []

    def reserved(window):
        return lambda c: c.execute_command("IDEM.BF.RESERVE", "f", ERROR_RATE, capacity, "WINDOW", window)

    def fill(command, key, count):
        def run(client):
            add_all(client, command, key, items("item", count))
            return count
        return run

    rows.append(("one shard reserved at capacity", "redis-idem", *measure(
        server, reserved(1), fill("IDEM.BF.MADD", "f", capacity), idem_query("f"))))
    rows.append(("one filter reserved at capacity", "RedisBloom", *measure(
        server, lambda c: c.execute_command("BF.RESERVE", "b", ERROR_RATE, capacity),
        fill("BF.MADD", "b", capacity), rb_query("b"))))

    small = capacity // 10
    rows.append(("one shard grown 10x in one burst", "redis-idem", *measure(
        server, lambda c: c.execute_command("IDEM.BF.RESERVE", "f", ERROR_RATE, small, "WINDOW", 1),
        fill("IDEM.BF.MADD", "f", capacity), idem_query("f"))))
    rows.append(("one filter grown 10x in one burst", "RedisBloom", *measure(
        server, lambda c: c.execute_command("BF.RESERVE", "b", ERROR_RATE, small, "EXPANSION", 2),
        fill("BF.MADD", "b", capacity), rb_query("b"))))

    # Seven daily shards, each holding `capacity` items: IDEM.BF.APPLY (the
    # command replicas and the AOF receive) adds at an explicit primary
    # time, days 0..6 from now, all inside the window when queried now. It
    # answers clients with an error, so it runs from the AOF, on a server
    # of its own; the filter's bits are the memory its DEL frees.
    with Server(extra=["--appendonly", "yes", "--appendfsync", "no"], redisbloom=False) as aof_server:
        client = aof_server.client
        client.execute_command("IDEM.BF.RESERVE", "f", ERROR_RATE, capacity, "WINDOW", 7)
        now = int(client.execute_command("TIME")[0]) * 1000
        commands = []
        for day in range(7):
            values = items(f"day{day}", capacity)
            header = struct.pack("<q", now + day * DAY_MS)  # the primary's time, ms
            commands += [("IDEM.BF.APPLY", "f", header, *values[i:i + BATCH]) for i in range(0, len(values), BATCH)]
        aof_server.replay_from_aof(commands)
        with_filter = aof_server.used_memory()
        rate = false_positive_rate(aof_server.client, lambda batch: idem_query("f")(aof_server.client, batch))
        aof_server.client.delete("f")
        bits = (with_filter - aof_server.used_memory()) * 8 / (7 * capacity)
    rows.append(("seven daily shards, 0.01 for the window", "redis-idem", bits, rate))

    def seven_keys(rate):
        def setup(client):
            for day in range(7):
                client.execute_command("BF.RESERVE", f"b{day}", rate, capacity)

        def fill_keys(client):
            for day in range(7):
                add_all(client, "BF.MADD", f"b{day}", items(f"day{day}", capacity))
            return 7 * capacity

        def query(client, batch):
            answers = [client.execute_command("BF.MEXISTS", f"b{day}", *batch) for day in range(7)]
            return [int(any(column)) for column in zip(*answers)]
        return setup, fill_keys, query

    setup, fill_keys, query = seven_keys(ERROR_RATE / 7)
    rows.append(("seven daily keys at 0.01/7 each", "RedisBloom", *measure(server, setup, fill_keys, query)))
    setup, fill_keys, query = seven_keys(ERROR_RATE)
    rows.append(("seven daily keys at 0.01 each", "RedisBloom", *measure(server, setup, fill_keys, query)))
    server.client.flushall()
    return rows


def throughput(server, requests, rounds, pipeline):
    client = server.client
    client.flushall()
    # Both reserved large enough that the run never grows them.
    client.execute_command("IDEM.BF.RESERVE", "f", ERROR_RATE, 20_000_000, "WINDOW", 1)
    client.execute_command("BF.RESERVE", "b", ERROR_RATE, 20_000_000)
    adds = compare(server, [("BF.ADD", ["BF.ADD", "b", "__rand_int__"]),
                            ("IDEM.BF.ADD", ["IDEM.BF.ADD", "f", "__rand_int__"])],
                   requests, rounds, pipeline)
    exists = compare(server, [("BF.EXISTS", ["BF.EXISTS", "b", "__rand_int__"]),
                              ("IDEM.BF.EXISTS", ["IDEM.BF.EXISTS", "f", "__rand_int__"])],
                     requests, rounds, pipeline)
    client.flushall()
    return {**adds, **exists}


def report(capacity=1_000_000, requests=500_000, rounds=5):
    lines = [f"### Bloom filters: memory and false positives ({capacity:,} items per shard or key, error rate {ERROR_RATE})", "",
             "| layout | module | bits per item | measured false-positive rate |", "|---|---|---|---|"]
    with Server() as server:
        for layout, module, bits, rate in memory_and_fpr(server, capacity):
            lines.append(f"| {layout} | {module} | {bits:.2f} | {rate:.4f} |")
        for pipeline in (16, 1):
            result = throughput(server, requests, rounds, pipeline)
            lines += ["", f"### Bloom filters: throughput, 50 clients, -P {pipeline}, median of {rounds} alternating rounds", "",
                      "| command | req/s | server CPU us/op | req/s ratio | CPU ratio |", "|---|---|---|---|---|"]
            for name in ("BF.ADD", "IDEM.BF.ADD"):
                r = result[name]
                lines.append(f"| {name} | {r['rps']:,.0f} | {r['cpu_us']:.2f} | {r['rps_ratio']:.2f} | {r['cpu_ratio']:.2f} |")
            for name in ("BF.EXISTS", "IDEM.BF.EXISTS"):
                r = result[name]
                lines.append(f"| {name} | {r['rps']:,.0f} | {r['cpu_us']:.2f} | {r['rps_ratio']:.2f} | {r['cpu_ratio']:.2f} |")
    lines += ["", "Ratios are redis-idem over RedisBloom (CPU ratio: RedisBloom's CPU per op over ours; above 1 is faster)."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
