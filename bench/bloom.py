"""Bloom filter figures: bits per item, measured false-positive rate, and
IDEM.BF.ADD / IDEM.BF.EXISTS throughput, each beside RedisBloom's in the
same run on the same server.

Bits per item are the server's used_memory growth per item added, so they
include every allocation either module makes, rounded by the allocator.
"""

import math
import struct
import sys
import time

from harness import Server, compare, pipelined, resp

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



# ---------------------------------------------------------------------------
# The volume sweep (issue 13): the filter's sizing judged at every volume.
#
# Every filter here is written through the AOF and measured on a server of
# its own making: the AOF holds the writes (IDEM.BF.APPLY at chosen primary
# times for the seven-day windows, which answer clients with an error), the
# server loads it at start, and each side's bits per item are the
# used_memory its DEL frees, divided by the items added. The AOF is written
# directly in RESP, a thousand items per command, from byte templates, so
# that 10M items a shard cost seconds to generate, not minutes.

SWEEP_VOLUMES = (10_000, 100_000, 1_000_000, 10_000_000)
SINGLE_VOLUMES = (1_000, 10_000, 100_000, 1_000_000, 10_000_000)
WINDOW = 7
# Per-shard volumes of the seven shards, for the sweep's volume v. The
# doubling and halving shapes put v in the middle shard (day 3), so that
# every shape of a volume passes through v and no shard exceeds 8v.
SHAPES = {
    "steady": lambda v: [v] * WINDOW,
    "doubling": lambda v: [round(v * 2.0 ** (day - 3)) for day in range(WINDOW)],
    "halving": lambda v: [round(v * 2.0 ** (3 - day)) for day in range(WINDOW)],
}
# Issue 13's targets: (most bits per item, least rate, most rate).
WINDOW_TARGETS = {"steady": (14.5, 0.005, 0.01), "doubling": (16.0, 0.0, 0.01), "halving": (16.0, 0.0, 0.01)}
SINGLE_TARGET = (10.5, 0.01)
GROWN_TARGET = 0.8  # at most this times RedisBloom's bits per item
MADD_ITEMS = 100
# Small filters are measured as many copies, so that what a DEL frees is
# well above the allocator's noise: at least this many items per side.
LEAST_ITEMS_MEASURED = 100_000
# Plain keys loaded beside the filters, so that deleting the filters never
# lets the cron shrink the keyspace's tables inside a measurement.
BALLAST_KEYS = 1000
# The largest filter the module allows: the halving shape at 10M starts
# with an 80M-item shard. No latency tracking: Redis allocates a command's
# latency histogram (24 KB) the first time the command runs, so the first
# DEL of a server would hide 24 KB of what it frees (2.8 bits per item in a
# window of 10k-item shards).
AOF_SERVER = ["--appendonly", "yes", "--appendfsync", "no", "--latency-tracking", "no",
              "--idem.bf-max-bytes", str(511 * 1024 * 1024)]

ITEM_DIGITS = 9
_TAILS = [b"%03d\r\n" % n for n in range(BATCH)]
CHUNK_COMMANDS = 64


def log(message):
    print(f"[sweep {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def bulk(value):
    return b"$%d\r\n%s\r\n" % (len(value), value)


def item_blocks(tag, count):
    """(n, RESP of n items) per thousand of `tag`:000000000, `tag`:000000001,
    ...: one template per thousand, so that making an item costs a copy."""
    tag = tag.encode()
    length = len(tag) + 1 + ITEM_DIGITS
    for block in range(math.ceil(count / BATCH)):
        n = min(BATCH, count - block * BATCH)
        head = b"$%d\r\n%s:%0*d" % (length, tag, ITEM_DIGITS - 3, block)
        yield n, head + head.join(_TAILS[:n])


def item_commands(prefix_args, tag, count):
    """RESP commands `prefix_args... item...`, a thousand items each."""
    prefix = b"".join(bulk(arg if isinstance(arg, bytes) else str(arg).encode()) for arg in prefix_args)
    for n, block in item_blocks(tag, count):
        yield b"*%d\r\n%s%s" % (len(prefix_args) + n, prefix, block)


def chunked(commands):
    """Joins RESP commands into chunks of a few MB for the AOF file."""
    chunk = []
    for command in commands:
        chunk.append(command)
        if len(chunk) == CHUNK_COMMANDS:
            yield b"".join(chunk)
            chunk = []
    if chunk:
        yield b"".join(chunk)


def ballast():
    yield b"".join(resp(("SET", f"ballast:{n}", "x")) for n in range(BALLAST_KEYS))


def loaded_server(commands, redisbloom=True):
    """A server whose AOF held `commands` (RESP bytes) at its start."""
    server = Server(extra=AOF_SERVER, redisbloom=redisbloom)
    started = time.monotonic()
    server.replay_aof_chunks(chunked(commands))
    log(f"  AOF written and loaded in {time.monotonic() - started:.1f} s")
    return server


def as_map(reply):
    """A map reply as a dict, whether it came as RESP3 or as RESP2's flat array."""
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2]))


def idem_items(client, keys):
    """Items the filters at `keys` hold in their live shards."""
    total = 0
    for key in keys:
        total += int(as_map(client.execute_command("IDEM.BF.INFO", key))[b"items"])
    return total


def rb_items(client, keys):
    total = 0
    for key in keys:
        total += int(as_map(client.execute_command("BF.INFO", key))[b"Number of items inserted"])
    return total


def check_loaded(client, name, counted, added):
    """A command that failed in the AOF fails silently: every filter must
    hold what was added (less the few items that collided as they went in)."""
    if not 0.95 * added <= counted <= added:
        raise SystemExit(f"{name}: holds {counted} items of the {added} written; did a command in the AOF fail?")


def freed_bits(server, keys, added):
    """Bits per item that deleting `keys` frees."""
    before = server.used_memory()
    server.client.delete(*keys)
    return (before - server.used_memory()) * 8 / added


def union_query(keys, command):
    """A query across keys (one a day, by hand): positive if any is."""
    def query(client, batch):
        answers = [client.execute_command(command, key, *batch) for key in keys]
        return [int(any(column)) for column in zip(*answers)]
    return query


def window_row(shape, volume):
    """redis-idem's seven shards, and seven RedisBloom keys at 0.01/7 and
    at 0.01 (each reserved at its day's exact volume: by hand, at best), for
    one shape and volume. Returns {side: (bits, rate)}."""
    volumes = SHAPES[shape](volume)
    total = sum(volumes)
    now = int(time.time() * 1000)

    def commands():
        yield from ballast()
        # redis-idem: reserved at the first day's volume, as a user who
        # knows today's traffic would; each later shard sized by the filter.
        yield resp(("IDEM.BF.RESERVE", "f", ERROR_RATE, volumes[0], "WINDOW", WINDOW))
        for day, count in enumerate(volumes):
            header = struct.pack("<q", now + day * DAY_MS)  # the primary's time, ms
            yield from item_commands((b"IDEM.BF.APPLY", b"f", header), f"d{day}", count)
        for prefix, rate in (("b", ERROR_RATE / WINDOW), ("c", ERROR_RATE)):
            for day, count in enumerate(volumes):
                yield resp(("BF.RESERVE", f"{prefix}{day}", rate, count))
                yield from item_commands(("BF.MADD", f"{prefix}{day}"), f"d{day}", count)

    log(f"{shape} around {volume:,}: shards of {volumes[0]:,} .. {volumes[-1]:,}, {total:,} items a side")
    with loaded_server(commands()) as server:
        client = server.client
        rb_keys = {prefix: [f"{prefix}{day}" for day in range(WINDOW)] for prefix in "bc"}
        # A write the filter refuses (one that would take it past the
        # largest filter, 511 MB of bits) fails silently in the AOF: the
        # row says how much it held instead of failing the sweep.
        held = idem_items(client, ["f"])
        if held < 0.95 * total:
            log(f"  redis-idem holds {held:,} of {total:,} items: its writes were refused")
        else:
            check_loaded(client, "redis-idem", held, total)
        # Each day in a shard of its own (the AOF's RESERVE ran at load
        # time: a run across midnight would put day 0 in tomorrow's shard).
        shards = as_map(client.execute_command("IDEM.BF.INFO", "f"))[b"shards"]
        if len(shards) != WINDOW and held >= 0.95 * total:
            raise SystemExit(f"redis-idem: {len(shards)} shards where {WINDOW} days were written")
        for keys in rb_keys.values():
            check_loaded(client, "RedisBloom", rb_items(client, keys), total)
        sides = {"held": held}
        for side, keys, query in (
                ("redis-idem", ["f"], idem_query("f")),
                ("RedisBloom 0.01/7", rb_keys["b"], union_query(rb_keys["b"], "BF.MEXISTS")),
                ("RedisBloom 0.01", rb_keys["c"], union_query(rb_keys["c"], "BF.MEXISTS"))):
            rate = false_positive_rate(client, lambda batch: query(client, batch))
            refused = side == "redis-idem" and held < 0.95 * total
            sides[side] = (freed_bits(server, keys, max(held, 1) if refused else total), rate)
        return sides


def single_row(volume):
    """One shard reserved at `volume`, and one reserved at a tenth of it
    and grown to `volume` in one burst, beside RedisBloom's, as many copies
    as make LEAST_ITEMS_MEASURED. Returns {side: (bits, rate)}."""
    copies = max(1, LEAST_ITEMS_MEASURED // volume)
    small = max(1, volume // 10)
    layouts = (
        # (side, key prefix, reserve command, add command)
        ("redis-idem at capacity", "f", ("IDEM.BF.RESERVE", ERROR_RATE, volume, "WINDOW", 1), "IDEM.BF.MADD"),
        ("RedisBloom at capacity", "b", ("BF.RESERVE", ERROR_RATE, volume), "BF.MADD"),
        ("redis-idem grown 10x", "g", ("IDEM.BF.RESERVE", ERROR_RATE, small, "WINDOW", 1), "IDEM.BF.MADD"),
        ("RedisBloom grown 10x", "c", ("BF.RESERVE", ERROR_RATE, small, "EXPANSION", 2), "BF.MADD"),
    )

    def commands():
        yield from ballast()
        for _, prefix, reserve, add in layouts:
            for copy in range(copies):
                key = f"{prefix}:{copy}"
                yield resp((reserve[0], key, *reserve[1:]))
                # Every copy its own items: the same items would give every
                # copy the same false positives.
                yield from item_commands((add, key), f"{prefix}{copy}", volume)

    log(f"one shard of {volume:,} (x{copies}), reserved at capacity and at {small:,}")
    with loaded_server(commands()) as server:
        client = server.client
        sides = {}
        for side, prefix, reserve, _ in layouts:
            keys = [f"{prefix}:{copy}" for copy in range(copies)]
            counter = idem_items if prefix in "fg" else rb_items
            check_loaded(client, side, counter(client, keys), copies * volume)
            command = "IDEM.BF.MEXISTS" if prefix in "fg" else "BF.MEXISTS"
            # The rate of one filter (the first copy): copies are alike.
            rate = false_positive_rate(client, lambda batch: client.execute_command(command, keys[0], *batch))
            sides[side] = (freed_bits(server, keys, copies * volume), rate)
        return sides


def madd_throughput(server, requests, rounds, pipeline):
    """IDEM.BF.MADD and BF.MADD of MADD_ITEMS random items per call."""
    client = server.client
    client.flushall()
    # Both reserved large enough that the runs never grow them.
    capacity = int(requests * MADD_ITEMS * rounds * 1.1)
    client.execute_command("IDEM.BF.RESERVE", "f", ERROR_RATE, capacity, "WINDOW", 1)
    client.execute_command("BF.RESERVE", "b", ERROR_RATE, capacity)
    items = ["__rand_int__"] * MADD_ITEMS
    result = compare(server, [("BF.MADD", ["BF.MADD", "b", *items]), ("IDEM.BF.MADD", ["IDEM.BF.MADD", "f", *items])],
                     requests, rounds, pipeline)
    client.flushall()
    return result


def short(n):
    """1250 -> 1.25k, 8000000 -> 8M."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return str(n)


def verdict(misses):
    return "met" if not misses else "missed: " + "; ".join(misses)


def window_verdict(shape, bits, rate):
    most_bits, least_rate, most_rate = WINDOW_TARGETS[shape]
    misses = []
    if bits > most_bits:
        misses.append(f"{bits - most_bits:.2f} bits over")
    if rate > most_rate:
        misses.append(f"rate {(rate - most_rate) * 100:.2f} points over 1%")
    if rate < least_rate:
        misses.append(f"rate {(least_rate - rate) * 100:.2f} points under 0.5%")
    return verdict(misses)


def sweep_report(volumes=SWEEP_VOLUMES, single_volumes=SINGLE_VOLUMES, shapes=tuple(SHAPES),
                 big_shapes=tuple(SHAPES), big=10_000_000, madd_requests=50_000, rounds=5):
    """The volume sweep as Markdown. Volumes of `big` items or more run
    only for `big_shapes` (the 10M rows of a shape take minutes each)."""
    started = time.monotonic()
    lines = [f"### Filters at every volume: seven-shard windows (error rate {ERROR_RATE} for the window)", "",
             "Daily shards, a week's window, each shard written at its own day's time through the AOF. "
             "Doubling and halving put the named volume in the middle shard (day 3 of 0..6): shards of v/8 .. 8v "
             "or 8v .. v/8. redis-idem is reserved at the first shard's volume; each RedisBloom key at its own "
             "day's exact volume (by hand, at best). Bits per item: the used_memory that deleting the filter frees, "
             f"over every item added. Rates: {FRESH_QUERIES:,} items never added, queried against the whole window.", "",
             "| shape | per-shard volume | shards | redis-idem bits | redis-idem rate | RedisBloom 0.01/7 bits | rate "
             "| RedisBloom 0.01 bits | rate | target | redis-idem against it |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for volume in volumes:
            if volume >= big and shape not in big_shapes:
                continue
            row_started = time.monotonic()
            sides = window_row(shape, volume)
            log(f"  {shape} {short(volume)} done in {time.monotonic() - row_started:.0f} s: {sides}")
            volumes_of = SHAPES[shape](volume)
            bits, rate = sides["redis-idem"]
            held = sides["held"]
            most_bits, least_rate, most_rate = WINDOW_TARGETS[shape]
            target = f"<= {most_bits:g} bits, rate " + (f"{least_rate:.1%}-{most_rate:.0%}" if least_rate else f"<= {most_rate:.0%}")
            cells = [shape, short(volume), f"{short(volumes_of[0])} .. {short(volumes_of[-1])}"]
            for side in ("redis-idem", "RedisBloom 0.01/7", "RedisBloom 0.01"):
                cells += [f"{sides[side][0]:.2f}", f"{sides[side][1]:.2%}"]
            if held < 0.95 * sum(volumes_of):
                # Bits per item it held; the refused items are in no shard.
                cells[3] = f"{bits:.2f} (of {short(held)} items held)"
                cells += [target, f"missed: writes refused after {short(held)} of {short(sum(volumes_of))} items "
                                  "(the largest filter is 511 MB of bits)"]
            else:
                cells += [target, window_verdict(shape, bits, rate)]
            lines.append("| " + " | ".join(cells) + " |")

    single = {volume: single_row(volume) for volume in single_volumes}
    lines += ["", f"### Filters at every volume: one shard (error rate {ERROR_RATE})", "",
              "Reserved at capacity (WINDOW 1), then filled to it; and reserved at a tenth, then grown 10x in one burst "
              f"(MADD of {BATCH:,} items a call; RedisBloom with EXPANSION 2). Filters under "
              f"{LEAST_ITEMS_MEASURED:,} items are measured as that many items' worth of copies.", "",
              "| items | redis-idem at capacity: bits | rate | RedisBloom: bits | rate | target <= 10.5 bits, rate <= 1% "
              "| grown 10x: redis-idem bits | rate | RedisBloom bits | rate | ratio | target <= 0.8x RedisBloom |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for volume, sides in single.items():
        bits, rate = sides["redis-idem at capacity"]
        misses = []
        if bits > SINGLE_TARGET[0]:
            misses.append(f"{bits - SINGLE_TARGET[0]:.2f} bits over")
        if rate > SINGLE_TARGET[1]:
            misses.append(f"rate {(rate - SINGLE_TARGET[1]) * 100:.2f} points over")
        grown_bits, grown_rate = sides["redis-idem grown 10x"]
        rb_grown_bits, rb_grown_rate = sides["RedisBloom grown 10x"]
        ratio = grown_bits / rb_grown_bits
        grown_verdict = verdict([] if ratio <= GROWN_TARGET else [f"{ratio - GROWN_TARGET:.2f} over"])
        lines.append("| " + " | ".join([
            short(volume), f"{bits:.2f}", f"{rate:.2%}", f"{sides['RedisBloom at capacity'][0]:.2f}",
            f"{sides['RedisBloom at capacity'][1]:.2%}", verdict(misses),
            f"{grown_bits:.2f}", f"{grown_rate:.2%}", f"{rb_grown_bits:.2f}", f"{rb_grown_rate:.2%}",
            f"{ratio:.2f}", grown_verdict]) + " |")

    lines += ["", f"### Filters at every volume: IDEM.BF.MADD of {MADD_ITEMS} items per call, 50 clients, "
              f"median of {rounds} alternating rounds", "",
              "| command | calls/s | server CPU us/call | items per second of server CPU | CPU ratio | target >= 1.0 |",
              "|---|---|---|---|---|---|"]
    log(f"MADD of {MADD_ITEMS} items, {madd_requests:,} calls a run")
    with Server() as server:
        for pipeline in (16, 1):
            result = madd_throughput(server, madd_requests, rounds, pipeline)
            for name in ("BF.MADD", "IDEM.BF.MADD"):
                r = result[name]
                target = "" if name == "BF.MADD" else verdict(
                    [] if r["cpu_ratio"] >= 1.0 else [f"{1.0 - r['cpu_ratio']:.2f} short"])
                lines.append(f"| {name}, -P {pipeline} | {r['rps']:,.0f} | {r['cpu_us']:.2f} | "
                             f"{MADD_ITEMS / r['cpu_us'] * 1e6:,.0f} | {r['cpu_ratio']:.2f} | {target} |")
    lines += ["", "CPU ratio: RedisBloom's server CPU per item over ours (above 1: we spend less).",
              "", f"The sweep took {(time.monotonic() - started) / 60:.0f} minutes."]
    log(f"sweep done in {time.monotonic() - started:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
