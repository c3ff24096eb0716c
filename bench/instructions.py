"""make bench-instructions: instructions per command, counted by callgrind.

Server CPU per operation moves by a few percent between runs on a shared
machine; an instruction count does not move at all, and callgrind says
which function spent it. Each side runs alone in a redis-server under
callgrind: a warm-up run grows the keyspace's tables, then the counters are
zeroed and N commands from redis-benchmark (50 clients, -P 16, random keys)
are counted, event loop and networking code included.
"""

import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import MODULE, free_port, redisbloom_path

REQUESTS = 20_000
TOKEN16 = "0123456789abcdef"

# What each side spends on propagating its write: SET rewrites its own
# arguments (PX to PXAT), has call() copy them for propagation and frees
# the original vector afterwards; a module builds a new vector with
# RM_Replicate, or has its arguments copied as they are with
# RM_ReplicateVerbatim (both copy through alsoPropagate, counted inside
# them). Both then pay propagatePendingCommands.
MODULE_REPLICATION = ("RM_Replicate", "RM_ReplicateVerbatim")
NATIVE_REPLICATION = ("rewriteClientCommandVector", "freeClientOriginalArgv", "alsoPropagate")


def replication_cost(costs):
    own = sum(costs.get(name, 0) for name in MODULE_REPLICATION) or sum(
        costs.get(name, 0) for name in NATIVE_REPLICATION)
    return own + costs.get("propagatePendingCommands", 0)


def reply_cost(costs):
    """A module replies through RM_ReplyWith* (which call addReply*
    themselves); SET calls addReply directly."""
    module = sum(v for name, v in costs.items() if name.startswith("RM_ReplyWith"))
    return module or costs.get("addReply", 0)


# (label, setup commands, command for redis-benchmark, flush before the
# counted run)
SIDES = [
    ("SET NX PX", [], ["SET", "k:__rand_int__", TOKEN16, "NX", "PX", "86400000"], True),
    ("IDEM.CLAIM", [], ["IDEM.CLAIM", "k:__rand_int__", "60"], True),
    ("SET 1 NX EX", [], ["SET", "k:__rand_int__", "1", "NX", "EX", "86400"], True),
    ("IDEM.ONCE", [], ["IDEM.ONCE", "k:__rand_int__", "86400"], True),
    ("BF.ADD (RedisBloom)", [["BF.RESERVE", "b", "0.01", "20000000"]], ["BF.ADD", "b", "__rand_int__"], False),
    ("IDEM.BF.ADD", [["IDEM.BF.RESERVE", "f", "0.01", "20000000", "WINDOW", "1"]],
     ["IDEM.BF.ADD", "f", "__rand_int__"], False),
]


def cli(port, *args):
    subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True)


def bench(port, command):
    subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(REQUESTS), "-c", "50", "-P", "16",
                    "-r", "100000000", "-q", *command], check=True, capture_output=True)


def inclusive_costs(profile):
    """Instructions per function, callees included, from a callgrind dump."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(profile)],
                         capture_output=True, text=True, check=True).stdout
    costs, total = {}, 0
    for line in out.splitlines():
        match = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(\S+)", line)
        if not match:
            continue
        value = int(match.group(1).replace(",", ""))
        name = match.group(2)
        if name == "PROGRAM":
            total = value
            continue
        name = name.split(":", 1)[-1]
        costs[name] = max(costs.get(name, 0), value)
    return total, costs


def measure(setup, command, flush):
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="idem-callgrind-"))
    out = workdir / "callgrind.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--loadmodule", str(MODULE), "--loadmodule", str(redisbloom_path())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        for args in setup:
            cli(port, *args)
        bench(port, command)
        if flush:
            cli(port, "FLUSHALL")
        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
        bench(port, command)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
        total, costs = inclusive_costs(Path(f"{out}.{server.pid}.1"))
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "SHUTDOWN", "NOSAVE"], capture_output=True)
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    per_op = lambda value: value / REQUESTS
    replication = per_op(replication_cost(costs))
    reply = per_op(reply_cost(costs))
    details = {name: per_op(costs.get(name, 0)) for name in
               ("lookupCommandByCString", "moduleCreateArgvFromUserFormat", "RM_ModuleTypeSetValue", "setKey")}
    return per_op(total), replication, reply, details


def report():
    rows = {label: measure(setup, command, flush) for label, setup, command, flush in SIDES}
    lines = [
        f"### Instructions per command (callgrind, {REQUESTS:,} commands, 50 clients, -P 16)",
        "",
        "| command | instructions | vs baseline | propagating the write | replying |",
        "|---|---|---|---|---|",
    ]
    pairs = [("SET NX PX", "IDEM.CLAIM"), ("SET 1 NX EX", "IDEM.ONCE"), ("BF.ADD (RedisBloom)", "IDEM.BF.ADD")]
    for base, ours in pairs:
        for label in (base, ours):
            total, replication, reply, _ = rows[label]
            ratio = rows[base][0] / total
            lines.append(f"| {label} | {total:,.0f} | {ratio:.2f} | {replication:,.0f} | {reply:,.0f} |")
    claim = rows["IDEM.CLAIM"][3]
    lines += [
        "",
        "Ratios are the baseline's instructions over the command's (above 1 is cheaper). "
        "Inside one IDEM.CLAIM's RM_Replicate: command lookup "
        f"{claim['lookupCommandByCString']:,.0f}, argument vector {claim['moduleCreateArgvFromUserFormat']:,.0f}. "
        "Storing the value: RM_ModuleTypeSetValue "
        f"{claim['RM_ModuleTypeSetValue']:,.0f} (SET's setKey {rows['SET NX PX'][3]['setKey']:,.0f}).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    text = report()
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")
    print(text)
