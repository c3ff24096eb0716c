"""The Functions edition (functions/idem.lua) against an earlier version of
itself: server time per message and bytes per record (issue 37, item 4).

Each side is loaded in turn into one redis-server without the module
(FUNCTION LOAD REPLACE), rounds alternating, so both sides share the
server and the moment. Per round and side:

- claim + done: N new keys claimed in pipelines of 16, then completed;
  server time from INFO commandstats (`cmdstat_fcall` usec, reset before
  each phase), and server CPU from /proc for the whole run;
- memory: MEMORY USAGE of one record of each kind, and the growth of
  used_memory over RECORDS keys of 36 characters.

With --instructions, each side instead runs alone in a redis-server under
callgrind (as bench/instructions.py runs the module's commands): exact
instructions per idem_claim and per idem_done, and the functions they
went to, for what is left.

Usage: python functions.py [--baseline REV] [--server redis-server]
[--rounds 5] [--messages 50000] [--records 100000] [--instructions]
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from harness import CLOCK_TICKS, ROOT, free_port

BATCH = 16
# The hash-record library, as main held it before the packed record.
BASELINE_REV = "0caf7dd"


class Server:
    """A redis-server without the module."""

    def __init__(self, binary):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="idem-fbench-")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        self.version = self.client.info("server").get("redis_version")

    def cpu_seconds(self):
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def fcall_usec(self):
        stats = self.client.info("commandstats").get("cmdstat_fcall", {})
        return stats.get("usec", 0), stats.get("calls", 0)

    def used_memory(self):
        self.client.connection_pool.disconnect()
        time.sleep(0.1)
        return redis.Redis(port=self.port).info("memory")["used_memory"]

    def close(self):
        self.process.terminate()
        self.process.wait()


def key36(prefix, n):
    return f"{prefix}:{n:0{35 - len(prefix)}d}"


def pipelined(client, commands):
    replies = []
    for start in range(0, len(commands), BATCH):
        pipe = client.pipeline(transaction=False)
        for command in commands[start:start + BATCH]:
            pipe.execute_command(*command)
        replies += pipe.execute()
    return replies


def claim_done(server, messages, claim_opts=(), done_opts=()):
    """(claim us, done us) of server time per message, and CPU us per message."""
    client = server.client
    client.flushall()
    keys = [key36("m", n) for n in range(messages)]
    cpu = server.cpu_seconds()
    client.config_resetstat()
    replies = pipelined(client, [("FCALL", "idem_claim", 1, k, 60, *claim_opts) for k in keys])
    claim_usec, calls = server.fcall_usec()
    assert calls == messages and all(r[0] == b"NEW" for r in replies), replies[:3]
    client.config_resetstat()
    replies = pipelined(client, [("FCALL", "idem_done", 1, k, r[1], *done_opts) for k, r in zip(keys, replies)])
    done_usec, calls = server.fcall_usec()
    assert calls == messages and all(r == 1 for r in replies), replies[:3]
    cpu = server.cpu_seconds() - cpu
    return claim_usec / messages, done_usec / messages, cpu / (2 * messages) * 1e6


def memory_usage(server):
    """MEMORY USAGE of one record of each kind (keys of 36 characters)."""
    c = server.client
    c.flushall()
    rows = {}
    token = c.execute_command("FCALL", "idem_claim", 1, key36("d", 0), 60)[1]
    c.execute_command("FCALL", "idem_done", 1, key36("d", 0), token)
    rows["done (claim + done)"] = c.memory_usage(key36("d", 0))
    token = c.execute_command("FCALL", "idem_claim", 1, key36("r", 0), 60)[1]
    c.execute_command("FCALL", "idem_done", 1, key36("r", 0), token, "RESULT", "ok")
    rows["done, RESULT ok"] = c.memory_usage(key36("r", 0))
    token = c.execute_command("FCALL", "idem_claim", 1, key36("q", 0), 60, "PAYLOAD", "x" * 100)[1]
    c.execute_command("FCALL", "idem_done", 1, key36("q", 0), token)
    rows["done, PAYLOAD"] = c.memory_usage(key36("q", 0))
    c.execute_command("FCALL", "idem_once", 1, key36("o", 0), 86400)
    rows["done (once)"] = c.memory_usage(key36("o", 0))
    c.execute_command("FCALL", "idem_claim", 1, key36("p", 0), 60)
    rows["processing"] = c.memory_usage(key36("p", 0))
    c.execute_command("FCALL", "idem_claim", 1, key36("f", 0), 60, "PAYLOAD", "x" * 100)
    rows["processing, PAYLOAD"] = c.memory_usage(key36("f", 0))
    return rows


def memory_growth(server, records):
    """used_memory growth per key: done records (claim + done), processing ones."""
    c = server.client
    rows = {}
    for name, done in (("done (claim + done), used_memory", True), ("processing, used_memory", False)):
        c.flushall()
        time.sleep(0.2)
        before = server.used_memory()
        keys = [key36("g", n) for n in range(records)]
        replies = pipelined(c, [("FCALL", "idem_claim", 1, k, 60) for k in keys])
        if done:
            pipelined(c, [("FCALL", "idem_done", 1, k, r[1]) for k, r in zip(keys, replies)])
        rows[name] = (server.used_memory() - before) / records
    c.flushall()
    return rows


# What a profile's rows are grouped by: the Lua interpreter, the commands a
# function runs (each as redis.call reaches it), and the server around it.
PROFILE_ROWS = [
    ("FCALL, whole", "fcallCommand"),
    ("redis.call, whole (commands and their conversions)", "luaRedisGenericCommand"),
    ("  TIME", "timeCommand"),
    ("  SET", "setCommand"),
    ("  GET", "getCommand"),
    ("  Lua reply -> RESP", "luaReplyToRedisReply"),
    ("redis.sha1hex", "luaRedisSha1hexCommand"),
    ("struct.pack / unpack", ("b_pack", "b_unpack")),
    ("string.find / gsub", ("str_find", "str_gsub")),
    ("Lua garbage collector", "luaC_step"),
]


def callgrind_profile(source, messages, binary):
    """Instructions per idem_claim and per idem_done (new keys, pipelines
    of 16), and each phase's inclusive costs per call."""
    from instructions import fixed_seed, inclusive_costs

    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="idem-fcallgrind-"))
    out = workdir / "callgrind.out"
    process = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", binary, "--port", str(port),
         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        env={**os.environ, "LD_PRELOAD": str(fixed_seed())}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(300):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.2)
    control = lambda flag: subprocess.run(["callgrind_control", flag, str(process.pid)], check=True,
                                          capture_output=True)
    try:
        client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
        phases = {}
        for counted in (False, True):
            client.flushall()
            keys = [key36("m", n) for n in range(messages)]
            claims = [("FCALL", "idem_claim", 1, k, 60) for k in keys]
            if counted:
                control("-z")
            replies = pipelined(client, claims)
            if counted:
                control("-d")
                phases["idem_claim"] = out
            dones = [("FCALL", "idem_done", 1, k, r[1]) for k, r in zip(keys, replies)]
            if counted:
                control("-z")
            pipelined(client, dones)
            if counted:
                control("-d")
        dumps = sorted(workdir.glob(f"callgrind.out.{process.pid}.*"), key=lambda p: int(p.suffix[1:]))
        result = {}
        for name, dump in zip(("idem_claim", "idem_done"), dumps[-2:]):
            total, costs = inclusive_costs(dump)
            total -= costs.get("serverCron", 0)
            rows = {label: sum(costs.get(f, 0) for f in ((fn,) if isinstance(fn, str) else fn)) / messages
                    for label, fn in PROFILE_ROWS}
            result[name] = (total / messages, rows)
        return result
    finally:
        client.connection_pool.disconnect()
        subprocess.run(["redis-cli", "-p", str(port), "SHUTDOWN", "NOSAVE"], capture_output=True)
        process.wait()


def instructions_report(sides, messages, binary):
    profiles = {name: callgrind_profile(source, messages, binary) for name, source in sides.items()}
    names = list(sides)
    print(f"Instructions per call under callgrind ({messages:,} new keys, pipelines of 16, {binary})\n")
    for function in ("idem_claim", "idem_done"):
        print(f"| {function}: instructions per call | " + " | ".join(names) + " | after / before |")
        print("|---|" + "---|" * (len(names) + 1))
        before, after = (profiles[n][function] for n in names)
        print(f"| all (serverCron left out) | {before[0]:,.0f} | {after[0]:,.0f} | {after[0] / before[0]:.2f} |")
        for label, _ in PROFILE_ROWS:
            b, a = before[1][label], after[1][label]
            print(f"| {label} | {b:,.0f} | {a:,.0f} | {a / b if b else 0:.2f} |")
        print()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision of the earlier functions/idem.lua")
    parser.add_argument("--server", default="redis-server")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead")
    args = parser.parse_args()
    sides = {
        f"before ({args.baseline})": subprocess.run(["git", "show", f"{args.baseline}:functions/idem.lua"], cwd=ROOT,
                                                     check=True, capture_output=True, text=True).stdout,
        "after": (ROOT / "functions" / "idem.lua").read_text(),
    }
    if args.instructions:
        instructions_report(sides, min(args.messages, 5000), args.server)
        return
    server = Server(args.server)
    runs = {name: [] for name in sides}
    heavy = {name: [] for name in sides}
    try:
        for _ in range(args.rounds):
            for name, source in sides.items():
                server.client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
                runs[name].append(claim_done(server, args.messages))
                heavy[name].append(claim_done(server, args.messages // 2, ("PAYLOAD", "p" * 64),
                                              ("RESULT", "r" * 100)))
        memory = {}
        for name, source in sides.items():
            server.client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
            memory[name] = {**memory_usage(server), **memory_growth(server, args.records)}
    finally:
        server.close()
    names = list(sides)
    print(f"Functions edition, {server.version}, median of {args.rounds} alternating rounds, "
          f"{args.messages:,} messages a round, pipelines of {BATCH}\n")
    print("| per message (us) | " + " | ".join(names) + " | after / before |")
    print("|---|" + "---|" * (len(names) + 1))
    for label, table in (("", runs), (", PAYLOAD 64 B + RESULT 100 B", heavy)):
        for what, pick in (("idem_claim server time", lambda r: r[0]), ("idem_done server time", lambda r: r[1]),
                           ("claim + done server time", lambda r: r[0] + r[1]),
                           ("server CPU, claim or done", lambda r: r[2])):
            values = {n: [pick(r) for r in table[n]] for n in names}
            ratio = statistics.median(a / b for a, b in zip(values[names[1]], values[names[0]]))
            print(f"| {what}{label} | " + " | ".join(f"{statistics.median(values[n]):.2f}" for n in names)
                  + f" | {ratio:.2f} |")
    print(f"\n| bytes per record (keys of 36 characters; used_memory over {args.records:,} keys) | "
          + " | ".join(names) + " | after / before |")
    print("|---|" + "---|" * (len(names) + 1))
    for what in memory[names[0]]:
        before, after = memory[names[0]][what], memory[names[1]][what]
        print(f"| {what} | {before:.1f} | {after:.1f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
