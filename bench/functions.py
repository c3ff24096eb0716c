"""The Functions edition (functions/idem.lua) against an earlier version of
itself: server time per message and bytes per record (issue 37, item 4).

Both sides are loaded at once into one redis-server without the module,
each under its own names (before_claim, after_claim, ...). Per round:

- claim + done: the sides take turns every 512 messages (new keys claimed
  in pipelines of 16, then completed), so that both meet the same load on
  a shared machine; server time from INFO commandstats (`cmdstat_fcall`
  usec) and server CPU from INFO cpu (used_cpu_user + used_cpu_sys), read
  before and after each turn. Each ratio is the median of the rounds'.
- memory (once, one side after the other): MEMORY USAGE of one record of
  each kind, and the growth of used_memory over RECORDS keys of 36
  characters.

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

import harness
from harness import ROOT, free_port

BATCH = 16
# The hash-record library, as main held it before the packed record.
BASELINE_REV = "0caf7dd"


class Server(harness.Server):
    """A redis-server without the module (`wrapper`: a command to run it
    under, as valgrind)."""

    def __init__(self, binary, wrapper=(), env=None, wait=10, workdir=None):
        self.port = free_port()
        self.dir = workdir or tempfile.mkdtemp(prefix="idem-fbench-")
        self.process = subprocess.Popen(
            [*wrapper, binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             "--appendonly", "no"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)
        started = time.monotonic()
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() - started > wait:
                    raise SystemExit(f"{binary} did not start")
                time.sleep(0.05)
        info = self.client.info("server")
        self.version = f"Valkey {info['valkey_version']}" if "valkey_version" in info else f"Redis {info['redis_version']}"

    def usage(self):
        """(FCALL's server time in us, the server's CPU in us) so far."""
        info = self.client.execute_command("INFO", "commandstats", "cpu")
        return (info.get("cmdstat_fcall", {}).get("usec", 0),
                (info["used_cpu_user"] + info["used_cpu_sys"]) * 1e6)


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


CHUNK = 512


def renamed(source, name):
    """A library source under another name, its functions name_claim, ..."""
    return source.replace("#!lua name=idem", f"#!lua name={name}", 1).replace("'idem_", f"'{name}_")


def claim_done(server, names, messages, claim_opts=(), done_opts=()):
    """Per side: (claim us, done us) of server time, and server CPU us, per
    message, the sides taking turns every CHUNK messages."""
    client = server.client
    client.flushall()
    totals = {name: [0.0, 0.0, 0.0] for name in names}
    for turn, start in enumerate(range(0, messages, CHUNK)):
        for name in names if turn % 2 == 0 else names[::-1]:
            keys = [key36(name[0], n) for n in range(start, min(start + CHUNK, messages))]
            time0, cpu0 = server.usage()
            replies = pipelined(client, [("FCALL", f"{name}_claim", 1, k, 60, *claim_opts) for k in keys])
            time1, _ = server.usage()
            done = pipelined(client, [("FCALL", f"{name}_done", 1, k, r[1], *done_opts) for k, r in zip(keys, replies)])
            time2, cpu2 = server.usage()
            assert all(r[0] == b"NEW" for r in replies) and all(r == 1 for r in done), (replies[:2], done[:2])
            for i, value in enumerate((time1 - time0, time2 - time1, cpu2 - cpu0)):
                totals[name][i] += value
    return {name: (claim / messages, done / messages, cpu / messages) for name, (claim, done, cpu) in totals.items()}


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


# Probes: functions that each do one piece of what idem_claim and idem_done
# do, so that a callgrind count splits a call into the server's fixed
# costs and the library's own Lua (Debian's redis-server is stripped: its
# Lua and scripting code have no function names to attribute by).
PROBES = """#!lua name=idem_probe
local far = 9000000000000
redis.register_function('probe_empty', function() return 1 end)
redis.register_function('probe_time', function() redis.call('TIME') return 1 end)
local claimed = '%s'
local done = '%s'
local token = '%s'
redis.register_function('probe_set_nx_get', function(keys)
  redis.pcall('SET', keys[1], claimed, 'NX', 'GET', 'PXAT', far) return 1 end)
redis.register_function('probe_reply', function() return { { ok = 'NEW' }, token, 1 } end)
redis.register_function('probe_get', function(keys) redis.pcall('GET', keys[1]) return 1 end)
redis.register_function('probe_set', function(keys) redis.call('SET', keys[1], done, 'PXAT', far) return 1 end)
""" % ("c" * 56, "d" * 24, "t" * 32)
# Each call's pieces: (row, the probe that does it alone); a piece costs
# what its probe counts beyond an empty function.
CLAIM_PIECES = [("TIME", "probe_time"), ("SET ... NX GET PXAT (a new key, 56 bytes)", "probe_set_nx_get"),
                ("the reply [NEW, token, 1]", "probe_reply")]
DONE_PIECES = [("TIME", "probe_time"), ("GET", "probe_get"), ("SET ... PXAT (over the record, 24 bytes)", "probe_set")]
OWN_LUA = {"idem_claim": "the library's own Lua (arguments, token, the record's encoding)",
           "idem_done": "the library's own Lua (arguments, the record's checks and decoding, encoding)"}


class Callgrind(Server):
    """A redis-server under callgrind, counting what runs between count() calls."""

    def __init__(self, binary):
        from instructions import fixed_seed, inclusive_costs

        self.inclusive_costs = inclusive_costs
        self.dumps = 0
        workdir = tempfile.mkdtemp(prefix="idem-fcallgrind-")
        self.out = Path(workdir) / "callgrind.out"
        super().__init__(binary, wrapper=("valgrind", "--tool=callgrind", f"--callgrind-out-file={self.out}.%p"),
                         env={**os.environ, "LD_PRELOAD": str(fixed_seed())}, wait=60, workdir=workdir)

    def count(self, commands):
        """Runs `commands` in pipelines of 16; (instructions per command
        with serverCron left out, the replies)."""
        control = lambda flag: subprocess.run(["callgrind_control", flag, str(self.process.pid)], check=True,
                                              capture_output=True)
        control("-z")
        replies = pipelined(self.client, commands)
        control("-d")
        self.dumps += 1
        total, costs = self.inclusive_costs(Path(f"{self.out}.{self.process.pid}.{self.dumps}"))
        return (total - costs.get("serverCron", 0)) / len(commands), replies


def callgrind_profile(sides, messages, binary):
    """Per side, instructions per idem_claim and idem_done on new keys;
    and the probes' counts."""
    server = Callgrind(binary)
    keys = [key36("m", n) for n in range(messages)]
    c = server.client
    try:
        counts = {}
        for name, source in sides.items():
            c.execute_command("FUNCTION", "LOAD", "REPLACE", source)
            for counted in (False, True):
                c.flushall()
                claim, replies = server.count([("FCALL", "idem_claim", 1, k, 60) for k in keys])
                done, _ = server.count([("FCALL", "idem_done", 1, k, r[1]) for k, r in zip(keys, replies)])
            counts[name] = {"idem_claim": claim, "idem_done": done}
        c.execute_command("FUNCTION", "LOAD", "REPLACE", PROBES)
        probes = {}
        for probe in ["probe_empty"] + [p for _, p in CLAIM_PIECES + DONE_PIECES]:
            for counted in (False, True):
                c.flushall()
                if probe in ("probe_get", "probe_set"):
                    pipelined(c, [("SET", k, "x" * 56, "PXAT", 9000000000000) for k in keys])
                probes[probe], _ = server.count([("FCALL", probe, 1, k) for k in keys])
        return counts, probes
    finally:
        server.close()


def instructions_report(sides, messages, binary):
    counts, probes = callgrind_profile(sides, messages, binary)
    names = list(sides)
    print(f"Instructions per call under callgrind ({messages:,} new keys, pipelines of 16, {binary})\n")
    print("| instructions per call | " + " | ".join(names) + " | after / before |")
    print("|---|" + "---|" * (len(names) + 1))
    rows = [("idem_claim", lambda f: counts[f]["idem_claim"]), ("idem_done", lambda f: counts[f]["idem_done"]),
            ("claim + done", lambda f: counts[f]["idem_claim"] + counts[f]["idem_done"])]
    for label, value in rows:
        before, after = (value(n) for n in names)
        print(f"| {label} | {before:,.0f} | {after:,.0f} | {after / before:.2f} |")
    empty = probes["probe_empty"]
    for function, pieces in (("idem_claim", CLAIM_PIECES), ("idem_done", DONE_PIECES)):
        print(f"\n| where an {function} of `after` goes | instructions | share |")
        print("|---|---|---|")
        total = counts[names[-1]][function]
        parts = [("FCALL of an empty function (dispatch, KEYS/ARGV, the Lua call)", empty)]
        parts += [(label, probes[probe] - empty) for label, probe in pieces]
        parts.append((OWN_LUA[function], total - sum(v for _, v in parts)))
        for label, value in parts:
            print(f"| {label} | {value:,.0f} | {value / total:.0%} |")


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
    names = ["before", "after"]
    titles = [f"before ({args.baseline})", "after"]
    runs, heavy = [], []
    try:
        for name, source in zip(names, sides.values()):
            server.client.execute_command("FUNCTION", "LOAD", "REPLACE", renamed(source, name))
        for _ in range(args.rounds):
            runs.append(claim_done(server, names, args.messages))
            heavy.append(claim_done(server, names, args.messages // 2, ("PAYLOAD", "p" * 64), ("RESULT", "r" * 100)))
        memory = {}
        server.client.execute_command("FUNCTION", "FLUSH")
        for name, source in sides.items():
            server.client.execute_command("FUNCTION", "LOAD", "REPLACE", source)
            memory[name] = {**memory_usage(server), **memory_growth(server, args.records)}
    finally:
        server.close()
    print(f"Functions edition, {server.version}, {args.rounds} rounds of {args.messages:,} messages, the sides "
          f"taking turns every {CHUNK}, pipelines of {BATCH}; medians\n")
    print("| per message (us) | " + " | ".join(titles) + " | after / before |")
    print("|---|" + "---|" * (len(names) + 1))
    for label, table in (("", runs), (", PAYLOAD 64 B + RESULT 100 B", heavy)):
        for what, pick in (("idem_claim server time", lambda r: r[0]), ("idem_done server time", lambda r: r[1]),
                           ("claim + done server time", lambda r: r[0] + r[1]),
                           ("claim + done server CPU", lambda r: r[2])):
            values = {n: [pick(r[n]) for r in table] for n in names}
            ratio = statistics.median(a / b for a, b in zip(values["after"], values["before"]))
            print(f"| {what}{label} | " + " | ".join(f"{statistics.median(values[n]):.2f}" for n in names)
                  + f" | {ratio:.2f} |")
    names = list(sides)
    print(f"\n| bytes per record, keys of 36 characters: MEMORY USAGE, or used_memory growth over {args.records:,} keys | "
          + " | ".join(names) + " | after / before |")
    print("|---|" + "---|" * (len(names) + 1))
    for what in memory[names[0]]:
        before, after = memory[names[0]][what], memory[names[1]][what]
        print(f"| {what} | {before:.1f} | {after:.1f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
