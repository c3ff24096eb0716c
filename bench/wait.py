"""make bench-wait: duplicates that arrive while the first copy is in flight
(issue 12), answered by `IDEM.CLAIM ... WAIT ms` against clients polling
with IDEM.CLAIM every 10 ms and every 100 ms. Results in
bench/results/wait.md.

Each round: a holder claims a fresh key, works WORK_MS, then sends
IDEM.DONE. CLIENTS duplicate clients arrive at random moments during the
first 80% of the work and send IDEM.CLAIM on the key: with WAIT, once, and
block until the DONE; polling, again every interval until the answer is not
BUSY. Measured:

- latency: from the moment the holder's DONE is written to the socket to the
  moment each duplicate's final reply (DONE) is readable, p50 and p99;
- server CPU per message: INFO's used_cpu_sys + used_cpu_user over the run,
  over the messages completed (the holder's copy and each duplicate's).

All clients run in one thread on bare sockets under epoll, and each reply
is timed by the kernel's receive timestamp (SO_TIMESTAMPNS), taken when
the segment reaches the client's socket: the latency is the server's
wake-up and writes plus the loopback, not Python's scheduling nor how fast
one thread reads fifty sockets.
Each run measures the three modes in turn (the order rotates run by run);
the report gives the median over runs of each figure.
"""

import argparse
import datetime
import heapq
import os
import random
import selectors
import statistics
import subprocess
import time
from pathlib import Path

import harness

RESULTS = Path(__file__).resolve().parent / "results"
CLIENTS = 50
WORK_MS = 50
LEASE_S = 30
WAIT_MS = 5000
# (name, how): "wait", a polling interval in ms, or "blpop": Redis's own
# blocking for scale, CLIENTS BLPOPs on one list woken by one RPUSH of
# CLIENTS elements (no record, no claim: the floor of waking that many
# blocked clients at once on this machine).
MODES = (("IDEM.CLAIM ... WAIT", "wait"), ("poll every 10 ms", 10), ("poll every 100 ms", 100),
         ("BLPOP woken by one RPUSH (Redis's own blocking, for scale)", "blpop"))


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def cpu(client):
    info = client.info("cpu")
    return info["used_cpu_sys"] + info["used_cpu_user"]


def run_mode(server, how, rounds, seed):
    """One run of one mode: (latencies in seconds, the first duplicate's of
    each key, the holder's own DONE
    round trips in seconds, CPU seconds, elapsed seconds, messages,
    commands sent by the duplicates)."""
    rng = random.Random(seed)
    selector = selectors.DefaultSelector()
    holder = harness.RawConnection(server.port)
    holder_redis = server.client
    dups = [harness.RawConnection(server.port) for _ in range(CLIENTS)]
    for conn in [holder, *dups]:
        selector.register(conn, selectors.EVENT_READ)
    latencies = []
    firsts = []
    done_trips = []
    claims = 0
    cpu_before = cpu(holder_redis)
    began = time.perf_counter()
    for number in range(rounds):
        key = f"wb:{seed}:{how}:{number}"
        arrivals = [rng.uniform(0, 0.8 * WORK_MS / 1000) for _ in range(CLIENTS)]
        if how != "blpop":
            status, token, _ = holder_redis.execute_command("IDEM.CLAIM", key, LEASE_S)
            assert status == b"NEW", status
        start = time.perf_counter()
        # (when, tie-breaker, what, connection)
        timers = [(start + offset, i, "claim", dups[i]) for i, offset in enumerate(arrivals)]
        timers.append((start + WORK_MS / 1000, -1, "done", holder))
        heapq.heapify(timers)
        done_at = None
        holder_answered = False
        pending = set(dups)
        answered_before = len(latencies)
        while pending or not holder_answered:
            now = time.perf_counter()
            while timers and timers[0][0] <= now:
                _, _, what, conn = heapq.heappop(timers)
                if what == "done":
                    done_at = time.time_ns()  # the clock of the kernel's receive timestamps
                    if how == "blpop":
                        conn.send("RPUSH", key, *range(CLIENTS))
                    else:
                        conn.send("IDEM.DONE", key, token, "RESULT", "ok")
                    continue
                claims += 1
                if how == "blpop":
                    conn.send("BLPOP", key, WAIT_MS / 1000)
                elif how == "wait":
                    conn.send("IDEM.CLAIM", key, LEASE_S, "WAIT", WAIT_MS)
                else:
                    conn.send("IDEM.CLAIM", key, LEASE_S)
            timeout = max(0.0, timers[0][0] - time.perf_counter()) if timers else None
            ready = selector.select(timeout)
            now = time.perf_counter()
            for event, _ in ready:
                conn = event.fileobj
                replies, received = conn.feed()
                assert received is not None, "no kernel receive timestamp (SO_TIMESTAMPNS)"
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
                    if conn is holder:
                        expected = CLIENTS if how == "blpop" else 1
                        assert reply == expected, f"the holder's write answered {reply}"
                        done_trips.append((received - done_at) / 1e9)
                        holder_answered = True
                        continue
                    status = reply[0]
                    if status == b"BUSY":
                        assert isinstance(how, int), f"{how} answered BUSY: {reply}"
                        heapq.heappush(timers, (now + how / 1000, dups.index(conn), "claim", conn))
                    elif how == "blpop":
                        assert done_at is not None and status == key.encode(), reply
                        latencies.append((received - done_at) / 1e9)
                        pending.discard(conn)
                    elif status == b"DONE":
                        assert done_at is not None and reply[1] == b"ok", reply
                        latencies.append((received - done_at) / 1e9)
                        pending.discard(conn)
                    else:
                        raise AssertionError(f"unexpected reply {reply}")
        firsts.append(min(latencies[answered_before:]))
    cpu_used = cpu(holder_redis) - cpu_before
    elapsed = time.perf_counter() - began
    for conn in [holder, *dups]:
        selector.unregister(conn)
        conn.close()
    selector.close()
    return latencies, firsts, done_trips, cpu_used, elapsed, rounds * (CLIENTS + 1), claims


def idle_cpu_rate(server, seconds=3.0):
    """Server CPU seconds per second with CLIENTS + 1 idle connections: its
    background (serverCron, clientsCron), which every mode pays for as long
    as it runs."""
    conns = [harness.RawConnection(server.port) for _ in range(CLIENTS + 1)]
    before = cpu(server.client)
    time.sleep(seconds)
    used = cpu(server.client) - before
    for conn in conns:
        conn.close()
    return used / seconds


def measure(runs, rounds, binary):
    """Per mode, per run: p50 and p99 (ms), CPU per message (us), CLAIMs
    per duplicate; and the medians over runs."""
    per_mode = {name: [] for name, _ in MODES}
    with harness.Server(redisbloom=False, binary=binary) as server:
        # One untimed round of each mode: connections, first blocking,
        # the command's latency histograms.
        for _, how in MODES:
            run_mode(server, how, 2, seed=10_000)
        server.client.flushall()
        idle = idle_cpu_rate(server)
        for run in range(runs):
            order = MODES[run % len(MODES):] + MODES[:run % len(MODES)]
            for name, how in order:
                latencies, firsts, done_trips, cpu_used, elapsed, messages, claims = run_mode(
                    server, how, rounds, seed=run)
                per_mode[name].append({
                    "p50": percentile(latencies, 0.50) * 1e3,
                    "p99": percentile(latencies, 0.99) * 1e3,
                    "max": max(latencies) * 1e3,
                    "first50": percentile(firsts, 0.50) * 1e3,
                    "first99": percentile(firsts, 0.99) * 1e3,
                    "trip50": percentile(done_trips, 0.50) * 1e3,
                    "trip99": percentile(done_trips, 0.99) * 1e3,
                    "cpu_us": cpu_used / messages * 1e6,
                    "net_us": (cpu_used - idle * elapsed) / messages * 1e6,
                    "round_ms": elapsed / rounds * 1e3,
                    "claims": claims / (rounds * CLIENTS),
                })
                server.client.flushall()
    return per_mode, idle


def report(per_mode, idle, runs, rounds):
    lines = [
        "## Duplicates in flight: IDEM.CLAIM ... WAIT against polling (issue 12)",
        "",
        f"{CLIENTS} duplicate clients per key, arriving during the first 80% of the holder's "
        f"{WORK_MS} ms of work; {rounds} keys one after another per run, {runs} runs, each mode once "
        "per run (order rotating). Latency: from the holder's IDEM.DONE written to the socket to "
        "each duplicate's DONE reply received (the kernel's receive timestamp, SO_TIMESTAMPNS). "
        "CPU: the server's used_cpu_sys + used_cpu_user over the run, per message (the holder's "
        f"copy and the {CLIENTS} duplicates'); net of idle takes off the server's idle background "
        f"({idle * 1e3:.2f} ms of CPU per second with {CLIENTS + 1} idle connections, measured before "
        "the runs) for the run's duration. The holder's own round trip (its DONE, or RPUSH) is "
        "given for scale, and so is the latency of the first duplicate answered for each key. "
        "Medians over runs; the range over runs in brackets.",
        "",
        "| mode | latency p50 (ms) | latency p99 (ms) | latency max (ms) | first answered p50 / p99 (ms) "
        "| holder's round trip p50 / p99 (ms) | server CPU per message (us) | net of idle (us) "
        "| commands per duplicate | ms per key |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _ in MODES:
        results = per_mode[name]

        def cell(field, digits):
            values = [r[field] for r in results]
            return (f"{statistics.median(values):.{digits}f} "
                    f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")

        def pair(low, high):
            return (f"{statistics.median(r[low] for r in results):.3f} / "
                    f"{statistics.median(r[high] for r in results):.3f}")

        lines.append(f"| {name} | {cell('p50', 3)} | {cell('p99', 3)} | {cell('max', 3)} | "
                     f"{pair('first50', 'first99')} | {pair('trip50', 'trip99')} | "
                     f"{cell('cpu_us', 1)} | {cell('net_us', 1)} | {cell('claims', 2)} | {cell('round_ms', 0)} |")
    return "\n".join(lines)


def header(binary):
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()
    return "\n".join([
        "# redis-idem: IDEM.CLAIM WAIT benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: {os.cpu_count()} cores; load average at start {load[0]:.2f}",
        f"- server: {version}",
        "",
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs of each mode (default 7)")
    parser.add_argument("--rounds", type=int, default=60, help="keys per run (default 60)")
    parser.add_argument("--server", default="redis-server", help="the server binary (default redis-server)")
    parser.add_argument("--out", default="wait.md", help="the file under bench/results/ (default wait.md)")
    args = parser.parse_args()
    head = header(args.server)
    text = head + "\n" + report(*measure(args.runs, args.rounds, args.server), args.runs, args.rounds) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
