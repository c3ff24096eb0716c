"""Claim + done per message: the two steps a consumer makes, where the
second carries the token the first returned, which redis-benchmark cannot
chain. A small generator in Python does it: two processes, each claiming 16
new keys in one pipeline and completing them in the next.

The generator, not the server, limits messages per second here; the
server's CPU per message is the figure to compare.
"""

import multiprocessing
import statistics
import time

import redis

from harness import Server

BATCH = 16
TOKEN32 = "0123456789abcdef" * 2
PROCESSES = 2


def run_idem(client, keys):
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("IDEM.CLAIM", key, 60)
    tokens = [reply[1] for reply in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    for key, token in zip(keys, tokens):
        pipe.execute_command("IDEM.DONE", key, token)
    assert all(reply == 1 for reply in pipe.execute())


def run_lua(client, keys):
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("FCALL", "bench_claim", 1, key, 60, TOKEN32)
    tokens = [reply[1] for reply in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    for key, token in zip(keys, tokens):
        pipe.execute_command("FCALL", "bench_done", 1, key, token)
    assert all(reply == 1 for reply in pipe.execute())


def run_edition(client, keys):
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("FCALL", "idem_claim", 1, key, 60)
    tokens = [reply[1] for reply in pipe.execute()]
    pipe = client.pipeline(transaction=False)
    for key, token in zip(keys, tokens):
        pipe.execute_command("FCALL", "idem_done", 1, key, token)
    assert all(reply == 1 for reply in pipe.execute())


def run_set(client, keys):
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("SET", key, TOKEN32[:16], "NX", "PX", 86_400_000)
    pipe.execute()
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("SET", key, "done", "XX", "PX", 86_400_000)
    pipe.execute()


SIDES = {"SET NX PX + SET XX": run_set, "IDEM.CLAIM + IDEM.DONE": run_idem, "Lua claim + done": run_lua,
         "Functions edition idem_claim + idem_done": run_edition}


def worker(port, side, prefix, count):
    client = redis.Redis(port=port)
    step = SIDES[side]
    for start in range(0, count, BATCH):
        step(client, [f"{prefix}:{n}" for n in range(start, start + BATCH)])


def measure(server, side, messages):
    server.client.flushall()
    per_process = messages // PROCESSES
    before_cpu, before = server.cpu_seconds(), time.monotonic()
    processes = [multiprocessing.Process(target=worker, args=(server.port, side, f"p{i}", per_process))
                 for i in range(PROCESSES)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
        assert process.exitcode == 0, f"{side}: a generator process failed"
    elapsed = time.monotonic() - before
    cpu = server.cpu_seconds() - before_cpu
    return PROCESSES * per_process / elapsed, cpu / (PROCESSES * per_process) * 1e6


def report(server, messages=100_000, rounds=3):
    runs = {side: [] for side in SIDES}
    for _ in range(rounds):
        for side in SIDES:
            runs[side].append(measure(server, side, messages))
    base = "SET NX PX + SET XX"
    lines = ["", f"### Claim + done per message, pipelines of {BATCH}, {PROCESSES} generator processes, "
             f"median of {rounds} rounds", "",
             "| steps | messages/s (generator-bound) | server CPU us/message | CPU vs SET NX PX + SET XX | CPU vs Lua |",
             "|---|---|---|---|---|"]
    medians = {side: (statistics.median(r for r, _ in runs[side]), statistics.median(c for _, c in runs[side]))
               for side in SIDES}
    for side in SIDES:
        rate, cpu = medians[side]
        lines.append(f"| {side} | {rate:,.0f} | {cpu:.2f} | {medians[base][1] / cpu:.2f} | "
                     f"{medians['Lua claim + done'][1] / cpu:.2f} |")
    return lines, medians


if __name__ == "__main__":
    from records import load_lua
    with Server(redisbloom=False) as server:
        load_lua(server)
        print("\n".join(report(server, messages=50_000, rounds=1)[0]))
