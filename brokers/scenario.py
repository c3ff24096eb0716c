#!/usr/bin/env python3
"""Runs clients/conformance/brokers.json against real brokers.

    brokers/scenario.py --broker kafka [--adapters id,id] [--editions module,functions]

For each adapter of that broker listed in brokers.json (or those named), on
each edition: a Redis for the records (the module, or functions/idem.lua),
a Redis the test owns for the effects (the side store), the broker
(brokers/launch.py, started once for the whole run), a producer that sends
every message once and a fifth of them twice (a producer's retry: same
business key, new offset or id), three consumer processes of the adapter's
own program; one member killed mid-work and another added, one stopped past
its lease and resumed; then every promise of docs/clients.md "Consumers of
brokers" checked. brokers/README.md says how a consumer program is written.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from brokers import BROKERS
from servers import RedisServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = json.loads((ROOT / "clients" / "conformance" / "brokers.json").read_text())

# The work's two steps in the side store (see brokers/README.md).
START = """
local tries = redis.call('HINCRBY', 'tries', KEYS[1], 1)
redis.call('HSET', 'working', ARGV[2], KEYS[1] .. '|' .. ARGV[1])
if ARGV[1] == 'poison' or (ARGV[1] == 'fail-once' and tries == 1) then return 'fail' end
return 'ok'
"""
EFFECT = """
redis.call('HDEL', 'working', ARGV[4])
local attempt = tonumber(ARGV[1])
local fence = tonumber(redis.call('HGET', 'fence', KEYS[1]) or '0')
if attempt < fence then
  redis.call('HINCRBY', 'stats', 'fenced', 1)
  return 'fenced'
end
redis.call('HSET', 'fence', KEYS[1], attempt)
if redis.call('HSETNX', 'applied', KEYS[1], attempt) == 0 then
  redis.call('RPUSH', 'duplicates', KEYS[1] .. '@' .. attempt)
  return 'duplicate'
end
redis.call('RPUSH', 'order:' .. ARGV[2], ARGV[3])
return 'applied'
"""


def plan(spec, n, run, rng):
    """The messages in publish order: dicts with key, account, seq, kind,
    and `copy` (true for a producer's retry of an earlier message)."""
    keys = [f"{run}:{i}" for i in range(n)]
    spread = lambda count, lo, hi: {int(n * (lo + (hi - lo) * (j + 0.5) / count)) for j in range(count)}
    poison = spread(spec["poison"], 0.05, 0.95)
    slow = spread(spec["slow"], 0.1, 0.9) - poison
    plain = [i for i in range(n) if i not in poison and i not in slow]
    fail_once = set(rng.sample(plain, int(n * spec["fail_once_share"])))
    copies = set(rng.sample([i for i in range(n) if i not in poison], int(n * spec["duplicate_share"])))
    seqs = {}
    messages = []
    for i, key in enumerate(keys):
        account = i % spec["accounts"]
        seqs[account] = seqs.get(account, 0) + 1
        kind = "poison" if i in poison else "slow" if i in slow else "fail-once" if i in fail_once else "ok"
        messages.append({"key": key, "account": account, "seq": seqs[account], "kind": kind})
    out = list(messages)
    for i in sorted(copies, reverse=True):
        at = min(len(out), out.index(messages[i]) + 1 + rng.randrange(spec["duplicate_within"]))
        out.insert(at, dict(messages[i], copy=True))
    return out


class Member:
    """One consumer process of the adapter's program."""

    def __init__(self, adapter, env, member, logdir):
        self.id = member
        self.log = logdir / f"{adapter['id']}-{env['IDEM_EDITION']}-member{member}.log"
        self.process = subprocess.Popen(adapter["command"], cwd=ROOT, env=dict(env, IDEM_MEMBER=str(member)),
                                        stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)

    def signal(self, sig):
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout):
        """SIGTERM (the program finishes what it holds and acknowledges what
        is done), then SIGKILL after `timeout`. Answers whether it ended by
        itself."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait()
            return False


def wait_for(what, check, timeout, members=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        for m in members:
            if m.process.poll() not in (None, -signal.SIGKILL):
                raise AssertionError(f"member {m.id} exited with {m.process.returncode} (log: {m.log})")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def member_in_slow_work(side, members):
    working = {k.decode(): v.decode() for k, v in side.hgetall("working").items()}
    for m in members:
        if m.process.poll() is None and working.get(str(m.id), "").endswith("|slow"):
            return m
    return None


def stop_in_slow_work(side, members, timeout):
    """SIGSTOPs a member in the middle of a slow work and answers it. The
    `working` entry is read again once the stop has landed: a member whose
    effect was already on its way (its entry gone) stopped after the effect
    and before DONE, where a redelivery's effect is rightly a second one
    that no fence can refuse; it is resumed at once, well within its lease,
    and another moment is picked."""
    deadline = time.monotonic() + timeout
    while True:
        sleeper = wait_for("a member in slow work to stop", lambda: member_in_slow_work(side, members),
                           max(1, deadline - time.monotonic()), members)
        entry = side.hget("working", str(sleeper.id))
        sleeper.signal(signal.SIGSTOP)
        time.sleep(0.3)  # a command sent before the stop has run by now
        if entry is not None and side.hget("working", str(sleeper.id)) == entry:
            return sleeper
        sleeper.signal(signal.SIGCONT)


def taken_over(side, members, sleeper, key):
    """Whether another live member is at work on the stopped member's key
    (it claimed the next attempt and started, its effect not yet written).
    The stopped member is resumed only once it is not: a late effect that
    lands while the next holder is mid-work comes before that holder's, and
    no fence can refuse it, since the side store has not yet seen the newer
    attempt (docs/clients.md: downstream stores reject numbers lower than
    they have seen). A RocketMQ orderly queue reached its next holder only
    8 s into a 10 s stop on a loaded machine, and the effect ran twice."""
    working = {k.decode(): v.decode() for k, v in side.hgetall("working").items()}
    return any(m is not sleeper and m.process.poll() is None and working.get(str(m.id), "").startswith(key + "|")
               for m in members)


def run_one(adapter, edition, broker, stores, spec, logdir, rng):
    """One adapter on one edition: a list of what failed (empty: passed)."""
    idem, side = stores[edition], stores["side"]
    idem.client.flushall()
    side.client.flushall()
    name = f"idem-{adapter['id']}-{edition}-{int(time.time() * 1000) % 10**9}"
    n = spec["messages"][edition]
    messages = plan(spec, n, name, rng)
    env = dict(os.environ, IDEM_ADAPTER=adapter["id"], IDEM_REDIS_URL=idem.url, IDEM_EDITION=edition,
               SIDE_REDIS_URL=side.url, BROKER=json.dumps(broker.info), IDEM_SOURCE=name,
               IDEM_GROUP=f"{name}-group", IDEM_LEASE_S=str(spec["lease_s"]),
               IDEM_MAX_TRIES=str(spec["max_tries"]), IDEM_WORK_MS=str(spec["work_ms"]),
               IDEM_SLOW_WORK_MS=str(spec["slow_work_ms"]),
               SIDE_START_SHA=side.client.script_load(START), SIDE_EFFECT_SHA=side.client.script_load(EFFECT))
    broker.setup(adapter, env, idem)
    broker.produce(adapter, env, messages, idem)
    poison = {m["key"] for m in messages if m["kind"] == "poison"}
    wanted = {m["key"] for m in messages} - poison
    members = [Member(adapter, env, i, logdir) for i in range(1, spec["members"] + 1)]
    applied = lambda: side.client.hlen("applied")
    started = time.monotonic()
    stuck = None
    try:
        wait_for("20% of the effects", lambda: applied() >= spec["kill_at_effects"] * len(wanted),
                 spec["settle_s"], members)
        victim = wait_for("a member in slow work to kill", lambda: member_in_slow_work(side.client, members),
                          spec["settle_s"], members)
        victim.signal(signal.SIGKILL)
        members.append(Member(adapter, env, len(members) + 1, logdir))
        wait_for("half the effects", lambda: applied() >= spec["stop_at_effects"] * len(wanted),
                 spec["settle_s"], members)
        sleeper = stop_in_slow_work(side.client, members, spec["settle_s"])
        stopped_key = side.client.hget("working", str(sleeper.id)).decode().rsplit("|", 1)[0]
        time.sleep(spec["stop_for_s"] - 0.3)
        wait_for("the member that took over the stopped member's key to finish its work",
                 lambda: not taken_over(side.client, members, sleeper, stopped_key), spec["settle_s"], members)
        sleeper.signal(signal.SIGCONT)
        resumed = time.monotonic()
        poison_done = lambda: all(int(side.client.hget("tries", k) or 0) >= spec["max_tries"] for k in poison)
        wait_for("every effect and every poison message's tries",
                 lambda: applied() >= len(wanted) and poison_done(), spec["settle_s"], members)
        wait_for("the dead letters", lambda: len(broker.dead_letters(adapter, env, idem)) >= len(poison),
                 spec["settle_s"], members)
        wait_for("everything acknowledged", lambda: not broker.unacked(adapter, env, idem),
                 spec["settle_s"], members)
        # The resumed member ends its slow work within slow_work_ms of its
        # SIGCONT; its fenced DONE may then give its message back (Streams:
        # pending again, FORCE) after the others acknowledged everything, and
        # that message must come round again before the members stop.
        time.sleep(max(0.0, resumed + spec["slow_work_ms"] / 1000 + 2 - time.monotonic()))
        wait_for("everything acknowledged once the resumed member's work has ended",
                 lambda: not broker.unacked(adapter, env, idem), spec["settle_s"], members)
    except AssertionError as e:
        stuck = str(e)
    finally:
        for m in members:
            if m.process.poll() is None:
                m.stop(30)
    took = time.monotonic() - started
    failures = ([stuck] if stuck else []) + check(adapter, edition, messages, wanted, poison, idem, side, broker,
                                                  env, spec)
    fenced = int(side.client.hget("stats", "fenced") or 0)
    print(f"{adapter['id']} on {edition}: {len(messages)} messages ({n} keys) in {took:.1f} s, "
          f"{fenced} late writes fenced: {'ok' if not failures else 'FAILED'}", flush=True)
    return failures


def check(adapter, edition, messages, wanted, poison, idem, side, broker, env, spec):
    failures = []
    s = side.client
    applied = {k.decode() for k in s.hkeys("applied")}
    if applied != wanted:
        failures.append(f"effects missing for {len(wanted - applied)} keys (e.g. {sorted(wanted - applied)[:3]}), "
                        f"applied for {len(applied - wanted)} that should not be (e.g. {sorted(applied - wanted)[:3]})")
    dups = [d.decode() for d in s.lrange("duplicates", 0, 20)]
    if dups:
        failures.append(f"{s.llen('duplicates')} effects applied twice: {dups}")
    if adapter.get("ordered"):
        for account in range(spec["accounts"]):
            seqs = [int(x) for x in s.lrange(f"order:{account}", 0, -1)]
            if seqs != sorted(seqs):
                failures.append(f"account {account}'s effects out of order: {seqs[:40]}")
    for key in sorted(wanted | poison):
        record = idem.get(key)
        if key in poison:
            if record is None or int(record.get("tries") or record.get("attempt")) < spec["max_tries"]:
                failures.append(f"poison key {key}: record {record}")
        elif record is None or record.get("state") != "done":
            failures.append(f"key {key} not done: {record}")
        if len(failures) > 30:
            break
    unacked = broker.unacked(adapter, env, idem)
    if unacked:
        failures.append(f"left unacknowledged: {unacked}")
    letters = broker.dead_letters(adapter, env, idem)
    keys = sorted(letter["key"] for letter in letters)
    if keys != sorted(poison):
        failures.append(f"dead letters {keys}, expected {sorted(poison)}")
    for letter in letters:
        if not letter.get("origin"):
            failures.append(f"dead letter {letter['key']} does not say where it came from: {letter}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", required=True, choices=sorted(BROKERS))
    parser.add_argument("--adapters", help="adapter ids (default: every adapter of the broker)")
    parser.add_argument("--editions", default="module,functions")
    parser.add_argument("--messages", type=int, help="messages per run (default: brokers.json's)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--workdir", type=Path, default=ROOT / "target" / "brokers" / "runs")
    args = parser.parse_args()
    spec = dict(DATA["scenario"])
    if args.messages:
        spec["messages"] = {"module": args.messages, "functions": args.messages}
    adapters = [a for a in DATA["adapters"] if a["broker"] == args.broker]
    if args.adapters:
        names = args.adapters.split(",")
        unknown = set(names) - {a["id"] for a in adapters}
        if unknown:
            parser.error(f"no {args.broker} adapter named {', '.join(sorted(unknown))} in brokers.json")
        adapters = [a for a in adapters if a["id"] in names]
    if not adapters:
        print(f"no {args.broker} adapter in clients/conformance/brokers.json", file=sys.stderr)
        return 0
    print(f"seed {args.seed}", flush=True)
    rng = random.Random(args.seed)
    workdir = args.workdir / f"{args.broker}-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    editions = args.editions.split(",")
    stores = {"side": RedisServer(workdir / "side")}
    broker = BROKERS[args.broker](workdir / "broker")
    failed = {}
    try:
        for edition in editions:
            stores[edition] = RedisServer(workdir / edition, edition=edition)
        for adapter in adapters:
            for edition in editions:
                failures = run_one(adapter, edition, broker, stores, spec, workdir, rng)
                if failures:
                    failed[f"{adapter['id']} on {edition}"] = failures
    finally:
        broker.close()
        for s in stores.values():
            s.close()
    for run, failures in failed.items():
        print(f"\n{run} (seed {args.seed}, logs in {workdir}):", file=sys.stderr)
        for f in failures[:30]:
            print(f"  - {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
