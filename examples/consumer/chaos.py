#!/usr/bin/env python3
"""Fault-injection run for the example consumer (consumer.py).

Starts its own redis-server with the module loaded (AOF on, fsync always), a
producer and several workers as subprocesses, breaks things on purpose, and
then checks that every payment took effect exactly once:

  faults injected (the plan is drawn from --seed)
    kill_before      a worker SIGKILLs itself after claiming, before the effect
    kill_after       ... after the DB commit, before IDEM.DONE
    kill_after_done  ... right after IDEM.DONE, which carried its XACK in
                     the same round trip: nothing comes back
    kill_mid_work    ... in the middle of long work, after its message was
                     redelivered to another worker and answered BUSY there
                     (that delivery must stay pending, not be acked)
    slow_unique      a worker stalls past its lease (no renewal); another
                     worker takes over (RETRY) and commits; the slow one then
                     hits the UNIQUE key, and its IDEM.DONE answers STALE
    slow_fenced      the same, but the slow one wakes before the newer
                     attempt commits: the attempt fence refuses its commit
    fail_once        the work raises once: IDEM.RELEASE, then a RETRY succeeds
    poison           the work always raises: MAXTRIES attempts, then
                     EXHAUSTED and a dead letter
    mismatch         a business id published again with other content:
                     MISMATCH, dead letter
    duplicates       the producer publishes some payments twice (new stream
                     id, same business id), at once and again much later
                     (after the record's retention: the Bloom filter says SEEN)
    long work        some payments take two leases; IDEM.EXTEND keeps the claim
    Redis            kill -9 mid-run, restarted on the same port and directory
                     (AOF); producer and workers reconnect and carry on

  checked at the end
    - every payment's effect is in the database exactly once (amount and
      account balances add up), none is lost; poison and mismatch are
      dead-lettered; the queue is drained (nothing pending, all delivered);
    - every record is done (or expired and remembered by the Bloom filter);
    - work started twice on a payment only where a fault on that payment
      explains it (a kill, a stall, a failure, or Redis killed while that
      attempt was unfinished), never because of a duplicate publish or a
      redelivery of a finished or in-flight message;
    - every planned fault was actually injected, with the outcome expected.

Exits 1 on any violation, listing them. `make demo` runs it.

    python3 chaos.py [--seed N] [--workers N] [--messages N] [--progress live|lines|none]
"""

import argparse
import glob
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import redis  # noqa: E402

import consumer  # noqa: E402
from consumer import DEAD, GROUP, STREAM, Payment, Settings, Store, TransientError, idem_keys  # noqa: E402
from producer import publish  # noqa: E402

# Timings of the run: short, so the whole run takes ~20 s.
SETTINGS = Settings(
    lease=3,  # s
    heartbeat=0.5,  # s: 2.5 s of slack before a busy machine loses a lease
    min_idle_ms=3500,  # XAUTOCLAIM after this: a dead worker's lease has lapsed by then
    maxtries=3,
    retain=5,  # s: short, so late duplicates meet an expired record (SEEN)
    block_ms=200,
)
PUBLISH_INTERVAL = 0.04  # s between payments
LATE_DUPLICATES_AT = 12.0  # s after the start: well after their retention
REDIS_KILL_AT = 0.4  # kill Redis once this share of the payments is published
REDIS_KILL_LATEST = 8.0  # s after the start, whatever was published
REDIS_DOWN_FOR = 0.5  # s between the kill and the restart

FAULT_KINDS = {  # kind: how many payments get it
    "kill_before": 3,
    "kill_after": 3,
    "kill_after_done": 1,
    "kill_mid_work": 1,
    "slow_unique": 1,
    "slow_fenced": 1,
    "fail_once": 2,
    "poison": 1,
}


# ---------------------------------------------------------------------------
# The journal: every process appends what it did, one JSON object a line
# ---------------------------------------------------------------------------


class Journal:
    """Append-only, one write(2) per event: survives the writer's SIGKILL."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ev, **fields):
        fields.update(ev=ev, t=time.time(), pid=os.getpid())
        os.write(self.fd, (json.dumps(fields, default=str) + "\n").encode())


def read_journals(workdir):
    events = []
    for path in glob.glob(os.path.join(workdir, "journal", "*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.strip():
                    events.append(json.loads(line))
    events.sort(key=lambda e: e["t"])
    return events


# ---------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------


def make_plan(seed, n):
    rng = random.Random(seed)
    messages = [
        {"business_id": f"payment:{i}", "account": f"acct:{i % 7}",
         "amount_cents": rng.randint(100, 50_000), "work_ms": rng.randint(10, 60)}
        for i in range(1, n + 1)
    ]
    ids = [m["business_id"] for m in messages]
    # Faults go to payments published early enough for the retries (which
    # wait for XAUTOCLAIM's min idle time) to finish within the run.
    pool = ids[4:int(n * 0.6)]
    rng.shuffle(pool)
    faults = {}
    for kind, count in FAULT_KINDS.items():
        for _ in range(count):
            faults[pool.pop()] = kind
    long_work = [pool.pop()]
    for m in messages:
        if m["business_id"] in long_work or faults.get(m["business_id"]) == "kill_mid_work":
            m["work_ms"] = SETTINGS.lease * 2000  # two leases: IDEM.EXTEND keeps it

    # The reused business id: early, so its record is still there (MISMATCH).
    mismatch = next(i for i in ids[1:12] if i not in faults and i not in long_work)
    dup_now = rng.sample([i for i in ids if i != mismatch], 12)
    # Late duplicates of payments settled long before (DONE or SEEN).
    early_plain = [i for i in ids[:int(n * 0.4)] if i not in faults and i not in long_work and i != mismatch]
    dup_late = rng.sample(early_plain, 10)
    return {
        "seed": seed,
        "messages": messages,
        "faults": faults,
        "long_work": long_work,
        "mismatch": mismatch,
        "dup_now": dup_now,
        "dup_late": dup_late,
    }


# ---------------------------------------------------------------------------
# The worker, with faults
# ---------------------------------------------------------------------------


class ChaosWorker(consumer.Worker):
    """consumer.Worker plus a journal and the planned faults. Each fault is
    injected once per payment (a marker file decides which worker), except
    `poison`, which fails every time."""

    def __init__(self, workdir, plan, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.faults = plan["faults"]
        self.markers = os.path.join(workdir, "markers")
        self.journal = Journal(os.path.join(workdir, "journal", f"{self.name}.jsonl"))
        self.injected = {}  # (business id, attempt) -> fault kind injected by this process
        self.entry = None  # the stream entry of the work in progress

    def take(self, bid, what):
        """True for the first caller (of all processes) for this bid."""
        try:
            os.close(os.open(os.path.join(self.markers, f"{bid}.{what}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def wait_marker(self, bid, what, seconds, claim=None):
        deadline = time.monotonic() + seconds
        while not os.path.exists(os.path.join(self.markers, f"{bid}.{what}")) and time.monotonic() < deadline:
            if claim is not None:
                claim.check()  # the library renews the lease meanwhile; this stops us if it was lost
            time.sleep(0.02)

    def inject(self, kind, bid, attempt):
        self.injected[(bid, attempt)] = kind
        self.journal.write("fault", worker=self.name, kind=kind, id=bid, attempt=attempt)

    def die(self):
        os.kill(os.getpid(), signal.SIGKILL)

    def event(self, name, **info):
        self.journal.write(name, worker=self.name, **info)
        bid, attempt = info.get("id"), info.get("attempt")
        kind = self.faults.get(bid)
        if name == "start":
            self.entry = info["entry"]
        if kind is None:
            return
        if name == "start" and kind == "kill_before" and self.take(bid, "fault"):
            self.inject(kind, bid, attempt)
            self.die()
        if name == "applied" and kind == "kill_after" and self.take(bid, "fault"):
            self.inject(kind, bid, attempt)
            self.die()
        if name == "done" and kind == "kill_after_done" and self.take(bid, "fault"):
            self.inject(kind, bid, attempt)
            self.die()
        if name == "claim" and kind == "kill_mid_work" and info["status"] == "BUSY":
            self.take(bid, f"busy-{info['entry']}")
        if name == "applied" and kind == "slow_unique" and (bid, attempt) not in self.injected:
            # The attempt that took over from the stalled worker, committed:
            # hold its IDEM.DONE until the stalled one has tried its own, so
            # that one meets a live newer claim (STALE), as it would in real
            # life when it wakes up a moment earlier.
            self.wait_marker(bid, "slow-resolved", 5)
        if (bid, attempt) in self.injected and kind.startswith("slow") and name in (
            "fenced", "stale", "done", "lease_lost", "superseded",
        ):
            self.take(bid, "slow-resolved")

    def do_work(self, payment, claim):
        bid = payment.business_id
        kind = self.faults.get(bid)
        if kind == "poison":
            self.inject(kind, bid, claim.attempt)
            raise TransientError("payment provider: 503 (every time: a poison message)")
        if kind == "fail_once" and self.take(bid, "fault"):
            self.inject(kind, bid, claim.attempt)
            raise TransientError("payment provider: timeout")
        if kind == "kill_mid_work" and self.take(bid, "fault"):
            # Work (renewing the lease) until a redelivery of this very
            # stream entry (XAUTOCLAIM) has met our claim (BUSY), then die.
            self.wait_marker(bid, f"busy-{self.entry}", 20, claim)
            self.inject(kind, bid, claim.attempt)
            self.die()
        result = super().do_work(payment, claim)
        if kind in ("slow_unique", "slow_fenced"):
            if self.take(bid, "fault"):
                self.inject(kind, bid, claim.attempt)
                # A paused process renews nothing: the library's heartbeat
                # renews no job marked lost, so mark it, as the pause would
                # silence it.
                claim.lost = True
                self.stall(bid, kind, claim.attempt)
            elif kind == "slow_fenced":
                # The attempt that took over: let the stalled one wake up and
                # meet our fence before we commit.
                self.wait_marker(bid, "slow-resolved", 5, claim)
        return result

    def stall(self, bid, kind, attempt):
        """A pause longer than the lease (GC, swapped out, stopped VM), with
        no lease renewal, lasting until another worker has taken over: it
        has committed (slow_unique) or registered its attempt (slow_fenced)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if kind == "slow_unique" and self.store.applied(bid) is not None:
                break
            if kind == "slow_fenced" and self.store.fence_of(bid) > attempt:
                break
            time.sleep(0.05)
        self.journal.write("stall_end", worker=self.name, id=bid, attempt=attempt)


def exit_with_parent():
    """Leave when the orchestrator is gone (killed, interrupted)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def worker_main(args):
    exit_with_parent()
    plan = load_plan(args.workdir)
    url = f"redis://127.0.0.1:{args.port}/0"
    db = os.path.join(args.workdir, "payments.sqlite")
    ChaosWorker(args.workdir, plan, url, db, args.name, SETTINGS).run()


# ---------------------------------------------------------------------------
# The producer, with duplicates
# ---------------------------------------------------------------------------


def producer_main(args):
    exit_with_parent()
    plan = load_plan(args.workdir)
    r = consumer.connect(f"redis://127.0.0.1:{args.port}/0")
    j = Journal(os.path.join(args.workdir, "journal", "producer.jsonl"))
    t0 = args.t0

    def on_retry(payment, tries):
        j.write("publish_retry", id=payment.business_id, tries=tries)

    def pub(payment, kind):
        entry = publish(r, payment, on_retry)
        j.write("published", id=payment.business_id, entry=entry, kind=kind, amount=payment.amount_cents)

    dup_now, dup_late = set(plan["dup_now"]), plan["dup_late"]
    by_id = {m["business_id"]: Payment(**m) for m in plan["messages"]}
    for m in plan["messages"]:
        p = by_id[m["business_id"]]
        pub(p, "first")
        if p.business_id in dup_now:
            pub(p, "dup_now")  # a producer retry: same payment, new entry
        if p.business_id == plan["mismatch"]:
            pub(Payment(p.business_id, p.account, p.amount_cents + 1, p.work_ms), "mismatch")
        time.sleep(PUBLISH_INTERVAL)
    time.sleep(max(0.0, t0 + LATE_DUPLICATES_AT - time.time()))
    for bid in dup_late:
        pub(by_id[bid], "dup_late")
    j.write("producer_done")


# ---------------------------------------------------------------------------
# The orchestrator
# ---------------------------------------------------------------------------


def load_plan(workdir):
    with open(os.path.join(workdir, "plan.json")) as f:
        return json.load(f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisProcess:
    def __init__(self, server_bin, module, workdir):
        self.server_bin, self.module, self.dir = server_bin, module, os.path.join(workdir, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port, self.proc = None, None

    def args(self):
        return [
            self.server_bin, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", self.dir, "--logfile", "redis.log", "--daemonize", "no",
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--loadmodule", self.module,
        ]

    def start(self, same_port=False):
        for _ in range(50):
            if not same_port:
                self.port = free_port()
            self.proc = subprocess.Popen(self.args(), cwd=self.dir, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self.wait_ready():
                return
            if "Address already in use" not in self.log_tail():
                raise RuntimeError(f"redis-server did not start; its log:\n{self.log_tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"redis-server: no port; its log:\n{self.log_tail()}")

    def wait_ready(self, seconds=15):
        r = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1, protocol=2)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    r.ping()
                    if r.info("server")["process_id"] == self.proc.pid:
                        return True
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                time.sleep(0.02)
        finally:
            r.close()
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError(f"redis-server did not answer in {seconds} s; its log:\n{self.log_tail()}")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, n=30):
        try:
            with open(os.path.join(self.dir, "redis.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError as e:
            return f"<no log: {e}>"


class Progress:
    """A live status line on a terminal, a status line every few seconds
    otherwise; notes (kills, restarts) on lines of their own."""

    def __init__(self, mode):
        self.mode, self.last, self.text = mode, 0.0, ""

    def status(self, text):
        self.text = text
        if self.mode == "live":
            sys.stdout.write("\r\x1b[K" + text)
            sys.stdout.flush()
        elif self.mode == "lines" and time.monotonic() - self.last >= 3:
            self.last = time.monotonic()
            print(text, flush=True)

    def note(self, text):
        if self.mode == "live":
            sys.stdout.write("\r\x1b[K" + text + "\n" + self.text)
            sys.stdout.flush()
        elif self.mode == "lines":
            print(text, flush=True)

    def end(self):
        if self.mode == "live":
            sys.stdout.write("\r\x1b[K" + self.text + "\n")
            sys.stdout.flush()


class Run:
    def __init__(self, args):
        self.args = args
        self.workdir = os.path.abspath(args.workdir)
        self.violations = []
        self.workers = {}  # name -> Popen
        self.worker_gen = Counter()
        self.producer = None
        self.crashes = []  # (kill time, up time)
        self.worker_kills = 0
        self.unexpected_exits = []

    def violation(self, text):
        self.violations.append(text)

    # -- processes -------------------------------------------------------

    def spawn_worker(self, slot):
        self.worker_gen[slot] += 1
        name = f"w{slot}" if self.worker_gen[slot] == 1 else f"w{slot}.{self.worker_gen[slot]}"
        log = open(os.path.join(self.workdir, "logs", f"{name}.log"), "wb")
        self.workers[name] = (slot, subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_worker", "--workdir", self.workdir,
             "--port", str(self.redis.port), "--name", name],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        ))
        log.close()

    def reap_workers(self, progress):
        for name, (slot, proc) in list(self.workers.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del self.workers[name]
            if rc == -signal.SIGKILL:
                self.worker_kills += 1
                fault = self.last_fault(name)
                progress.note(f"  worker {name} killed ({fault}); starting a replacement")
            else:
                self.unexpected_exits.append(name)
                self.violation(f"worker {name} exited unexpectedly (status {rc}); its log:\n{self.log_tail(name)}")
            self.spawn_worker(slot)

    def last_fault(self, name):
        path = os.path.join(self.workdir, "journal", f"{name}.jsonl")
        fault = "?"
        try:
            with open(path) as f:
                for line in f:
                    e = json.loads(line)
                    if e["ev"] == "fault":
                        fault = f"{e['kind']} {e['id']} attempt {e['attempt']}"
        except OSError:
            pass
        return fault

    def log_tail(self, name, n=25):
        try:
            with open(os.path.join(self.workdir, "logs", f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError as e:
            return f"<no log: {e}>"

    def stop_all(self):
        procs = [p for _, p in self.workers.values()]
        if self.producer:
            procs.append(self.producer)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 8
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.violation(f"process {p.args[2:]} did not stop on SIGTERM within 8 s")
                p.kill()
                p.wait()

    # -- the run ---------------------------------------------------------

    def main(self):
        a = self.args
        if os.path.exists(self.workdir):
            subprocess.run(["rm", "-rf", self.workdir], check=True)
        for d in ("journal", "markers", "logs"):
            os.makedirs(os.path.join(self.workdir, d))
        plan = make_plan(a.seed, a.messages)
        with open(os.path.join(self.workdir, "plan.json"), "w") as f:
            json.dump(plan, f, indent=1)
        self.plan = plan
        progress = Progress(a.progress)
        print(f"chaos run: seed {a.seed}, {a.messages} payments, {a.workers} workers, "
              f"lease {SETTINGS.lease} s, XAUTOCLAIM after {SETTINGS.min_idle_ms} ms; in {self.workdir}", flush=True)
        faults = ", ".join(f"{k} x{v}" for k, v in FAULT_KINDS.items())
        print(f"  faults: {faults}, mismatch x1, duplicates x{len(plan['dup_now']) + len(plan['dup_late'])}, "
              f"long work x{len(plan['long_work'])}, redis kill -9 once {REDIS_KILL_AT:.0%} are published", flush=True)

        self.redis = RedisProcess(a.redis_server, a.module, self.workdir)
        self.journal = Journal(os.path.join(self.workdir, "journal", "orchestrator.jsonl"))
        try:
            self.redis.start()
            r = redis.Redis(port=self.redis.port, socket_timeout=5, protocol=2)
            r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
            Store(os.path.join(self.workdir, "payments.sqlite")).db.close()  # the schema, once
            t0 = time.time()
            self.t0 = t0
            for slot in range(1, a.workers + 1):
                self.spawn_worker(slot)
            self.producer = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "_producer", "--workdir", self.workdir,
                 "--port", str(self.redis.port), "--t0", repr(t0)],
                stdin=subprocess.DEVNULL, stdout=open(os.path.join(self.workdir, "logs", "producer.log"), "wb"),
                stderr=subprocess.STDOUT,
            )
            self.loop(r, progress)
            self.stop_all()
            progress.end()
            self.runtime = time.time() - t0
            self.check(r)
        finally:
            for _, p in self.workers.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if self.producer and self.producer.poll() is None:
                self.producer.kill()
                self.producer.wait()
            self.redis.stop()
        return self.report()

    def loop(self, r, progress):
        killed = False
        xlen = 0
        drained_since = None
        db = sqlite3.connect(os.path.join(self.workdir, "payments.sqlite"), timeout=30)
        next_status = 0.0
        while True:
            now = time.time() - self.t0
            self.reap_workers(progress)
            if not killed and (xlen >= REDIS_KILL_AT * len(self.plan["messages"]) or now >= REDIS_KILL_LATEST):
                killed = True
                progress.note(f"  {now:5.1f} s  kill -9 redis-server (pid {self.redis.proc.pid})")
                kill_t = time.time()
                self.redis.kill9()
                self.journal.write("redis_killed")
                time.sleep(REDIS_DOWN_FOR)
                self.redis.start(same_port=True)
                up_t = time.time()
                self.crashes.append((kill_t, up_t))
                self.journal.write("redis_up", down_s=up_t - kill_t)
                progress.note(f"  {time.time() - self.t0:5.1f} s  redis-server restarted from its AOF "
                              f"after {up_t - kill_t:.1f} s")
            producer_rc = self.producer.poll()
            if producer_rc not in (None, 0):
                self.violation(f"producer exited with status {producer_rc}:\n{self.log_tail('producer')}")
                return
            try:
                xlen = r.xlen(STREAM)
                group = r.xinfo_groups(STREAM)[0]
                last = r.xrevrange(STREAM, count=1)
                dead = r.xlen(DEAD)
                up = True
            except (redis.ConnectionError, redis.TimeoutError):
                up = False
            if up and producer_rc == 0 and group["pending"] == 0 and last and group["last-delivered-id"] == last[0][0]:
                drained_since = drained_since or time.monotonic()
                if time.monotonic() - drained_since > 0.5:
                    return
            else:
                drained_since = None
            if now >= next_status:
                next_status = now + 0.25
                effects = db.execute("SELECT count(*) FROM payments").fetchone()[0]
                if up:
                    text = (f"  {now:5.1f} s  published {xlen:4d}  effects {effects:4d}  pending {group['pending']:3d}  "
                            f"dead letters {dead}  workers killed {self.worker_kills}  redis restarts {len(self.crashes)}")
                else:
                    text = f"  {now:5.1f} s  effects {effects:4d}  redis DOWN"
                progress.status(text)
            if now > self.args.timeout:
                self.violation(f"the queue did not drain within {self.args.timeout} s")
                return
            time.sleep(0.05)

    # -- the checks ------------------------------------------------------

    def check(self, r):
        plan = self.plan
        v = self.violation
        events = read_journals(self.workdir)
        self.events = events
        msgs = {m["business_id"]: m for m in plan["messages"]}
        faults = plan["faults"]
        poison = {b for b, k in faults.items() if k == "poison"}
        mismatch = plan["mismatch"]

        # 1. The effects: each payment exactly once, none lost.
        db = sqlite3.connect(os.path.join(self.workdir, "payments.sqlite"))
        rows = {b: (acct, amount, attempt, worker) for b, acct, amount, attempt, worker in
                db.execute("SELECT business_id, account, amount_cents, attempt, worker FROM payments")}
        self.rows = rows
        for bid, m in msgs.items():
            row = rows.get(bid)
            if bid in poison:
                if row:
                    v(f"{bid}: poison message has an effect {row}")
            elif row is None:
                v(f"{bid}: LOST, no effect in the database")
            elif row[0] != m["account"] or (row[1] != m["amount_cents"] and not (bid == mismatch and row[1] == m["amount_cents"] + 1)):
                v(f"{bid}: effect {row} does not match the message {m}")
            elif row[2] < 1:
                v(f"{bid}: effect stored without a fencing number: {row}")
        for bid in rows:
            if bid not in msgs:
                v(f"{bid}: effect for an unknown payment")
        for bid, n in db.execute("SELECT business_id, count(*) FROM payments GROUP BY 1 HAVING count(*) > 1"):
            v(f"{bid}: applied {n} times")
        expected = Counter()  # what the balances must be: each payment once
        for bid, m in msgs.items():
            if bid not in poison:
                expected[m["account"]] += rows[bid][1] if bid == mismatch and bid in rows else m["amount_cents"]
        balances = dict(db.execute("SELECT account, balance_cents FROM accounts"))
        for acct in set(expected) | set(balances):
            if balances.get(acct, 0) != expected[acct]:
                v(f"{acct}: balance {balances.get(acct, 0)}, expected {expected[acct]} (each payment once)")
        applied = defaultdict(list)
        for e in events:
            if e["ev"] == "applied":
                applied[e["id"]].append(e)
        for bid, row in rows.items():
            if [e["attempt"] for e in applied[bid]] != [row[2]]:
                v(f"{bid}: stored attempt {row[2]}, journal shows applies {[(e['worker'], e['attempt']) for e in applied[bid]]}")

        # 2. The queue: drained, everything acknowledged.
        group = r.xinfo_groups(STREAM)[0]
        last = r.xrevrange(STREAM, count=1)[0][0]
        pending = r.xpending(STREAM, GROUP)["pending"]
        if pending or group["last-delivered-id"] != last:
            v(f"queue not drained: {pending} pending, last delivered {group['last-delivered-id']} of {last}")
        self.xlen = r.xlen(STREAM)
        # The adapter's dead letters: the entry's fields, where it came
        # from, and the error ("ExhaustedError: ...", "MismatchError: ...").
        self.dead = [(f[b"id"].decode(), f[b"error"].decode()) for _, f in r.xrange(DEAD)]
        dead_ids = {b for b, _ in self.dead}
        for bid in poison:
            if not any(b == bid and reason.startswith("ExhaustedError") for b, reason in self.dead):
                v(f"{bid}: poison message not dead-lettered as EXHAUSTED ({self.dead})")
        if not any(b == mismatch and reason.startswith("MismatchError") for b, reason in self.dead):
            v(f"{mismatch}: reused business id not dead-lettered as MISMATCH ({self.dead})")
        for bid in dead_ids - poison - {mismatch}:
            v(f"{bid}: dead-lettered, unexpectedly: {[d for d in self.dead if d[0] == bid]}")
        published = Counter(e["kind"] for e in events if e["ev"] == "published")
        self.published = published

        # 3. The records. A poison message uses its max_tries attempts; a
        # claim granted whose reply the Redis kill lost (redis_error) used
        # one no worker ran, and its record lapses (expired) rather than
        # being released.
        granted = Counter(e["id"] for e in events if e["ev"] == "claim" and e["status"] in ("NEW", "RETRY"))
        lost = Counter(e["id"] for e in events if e["ev"] == "redis_error")
        for bid in msgs:
            key, bloom = idem_keys(bid)
            rec = r.execute_command("IDEM.GET", key)
            rec = dict(zip(rec[::2], rec[1::2])) if rec else None
            if bid in poison:
                if (not rec or rec[b"attempt"] != SETTINGS.maxtries or granted[bid] + lost[bid] < SETTINGS.maxtries
                        or rec[b"state"] not in ((b"released", b"expired") if lost[bid] else (b"released",))):
                    v(f"{bid}: poison record should be released at attempt {SETTINGS.maxtries} "
                      f"({granted[bid]} claims granted, {lost[bid]} replies lost): {rec}")
            elif rec is None:
                if r.execute_command("IDEM.BF.EXISTS", bloom, key) != 1:
                    v(f"{bid}: record gone and not in the Bloom filter {bloom}")
            elif rec[b"state"] != b"done":
                v(f"{bid}: record not done: {rec}")

        # 4. Every second start of the work is explained by a fault.
        self.check_starts(events)

        # 5. Every planned fault happened, with the expected outcome.
        injected = defaultdict(list)
        for e in events:
            if e["ev"] == "fault":
                injected[e["id"]].append(e)
        for bid, kind in faults.items():
            got = [e["kind"] for e in injected[bid]]
            want = [kind] * (granted[bid] if kind == "poison" else 1)
            if got != want:
                v(f"{bid}: planned fault {kind}, injected {got}")
        for bid, kind in faults.items():
            if not kind.startswith("slow") or not injected[bid]:
                continue
            f = injected[bid][0]
            mine = [e["ev"] for e in events if e.get("id") == bid and e.get("worker") == f["worker"]
                    and e.get("attempt") == f["attempt"]]
            want = ["fenced"] if kind == "slow_fenced" else ["already", "stale"]
            if [x for x in mine if x in ("fenced", "already", "stale", "done", "applied")] != want:
                v(f"{bid}: the stalled worker should end with {want}, its events: {mine}")
        for bid, kind in faults.items():
            if kind == "kill_mid_work" and injected[bid]:
                f = injected[bid][0]
                entry = next(e["entry"] for e in events if e["ev"] == "start" and e["worker"] == f["worker"]
                             and e["id"] == bid and e["attempt"] == f["attempt"])
                if not any(e["ev"] == "claim" and e["entry"] == entry and e["status"] == "BUSY" and e["t"] < f["t"]
                           for e in events):
                    v(f"{bid}: no redelivery of {entry} answered BUSY while the worker that was killed held it")
        for bid, kind in faults.items():
            if kind == "kill_after_done" and injected[bid]:
                # XACK went with IDEM.DONE, in one round trip: the entry is
                # settled, and no redelivery of it ever reaches a worker.
                f = injected[bid][0]
                entry = next(e["entry"] for e in events if e["ev"] == "start" and e["worker"] == f["worker"]
                             and e["id"] == bid and e["attempt"] == f["attempt"])
                again = [(e["worker"], e["status"]) for e in events
                         if e["ev"] == "claim" and e.get("entry") == entry and e["t"] > f["t"]]
                if again:
                    v(f"{bid}: entry {entry} delivered again after its IDEM.DONE and XACK: {again}")
        for bid in plan["long_work"]:
            if not any(e["ev"] == "start" and e["id"] == bid for e in events):
                v(f"{bid}: long work never started")
        if len(self.crashes) != 1:
            v(f"redis was restarted {len(self.crashes)} times, expected 1")

    def check_starts(self, events):
        starts = defaultdict(list)
        ends = {}
        fault_at = {}
        for e in events:
            k = (e.get("worker"), e.get("id"), e.get("attempt"))
            if e["ev"] == "start":
                starts[e["id"]].append(e)
            elif e["ev"] in ("done", "stale", "fenced", "failed", "lease_lost"):
                ends[k] = e["t"]
            elif e["ev"] == "fault":
                fault_at[k] = e["kind"]
        self.starts = starts
        self.restart_reasons = Counter()
        for bid, ss in starts.items():
            attempts = [s["attempt"] for s in ss]
            if len(set(attempts)) != len(attempts):
                self.violation(f"{bid}: work started twice with the same attempt: {attempts}")
            for s in ss:
                if s["status"] not in ("NEW", "RETRY", "SEEN"):
                    self.violation(f"{bid}: work started on a {s['status']} claim")
            for prev, cur in zip(ss, ss[1:]):
                k = (prev["worker"], bid, prev["attempt"])
                why = []
                if k in fault_at:
                    why.append(fault_at[k])
                end = ends.get(k, float("inf"))
                if any(kill <= end and up >= prev["t"] for kill, up in self.crashes):
                    why.append("redis_killed")
                if not why:
                    self.violation(
                        f"{bid}: work started again (attempt {cur['attempt']}, {cur['status']}, by {cur['worker']}) "
                        f"though the previous attempt {prev['attempt']} by {prev['worker']} met no fault")
                else:
                    self.restart_reasons[why[0]] += 1  # the injected fault, if any, comes first

    # -- the report ------------------------------------------------------

    def report(self):
        ev = [e for e in getattr(self, "events", [])]
        claims = Counter(e["status"] for e in ev if e["ev"] == "claim")
        n_claims = sum(claims.values())
        claimed_ids = {e["id"] for e in ev if e["ev"] == "claim"}
        kinds = Counter(e["ev"] for e in ev)
        faults = Counter(e["kind"] for e in ev if e["ev"] == "fault")
        starts = getattr(self, "starts", {})
        n_starts = sum(len(s) for s in starts.values())
        found_in_db = kinds["found_in_db"]
        dead = Counter(reason.split(":")[0] for _, reason in getattr(self, "dead", []))
        published = getattr(self, "published", Counter())
        rows = [
            ("messages", len(self.plan["messages"]), "distinct payments (business ids) published"),
            ("stream_entries", getattr(self, "xlen", 0), "entries in the stream"),
            ("duplicate_publishes", published["dup_now"] + published["dup_late"],
             f"same payment published again: {published['dup_now']} at once, {published['dup_late']} late"),
            ("publish_retries", kinds["publish_retry"], "XADD retried by the producer while Redis was down"),
            ("mismatch_publishes", published["mismatch"], "a business id reused for other content"),
            ("effects", len(getattr(self, "rows", {})), "payments applied in the database"),
            ("deliveries", n_claims, "deliveries that reached IDEM.CLAIM"),
            ("duplicates_delivered", n_claims - len(claimed_ids), "deliveries of an id claimed before"),
            ("duplicates_suppressed", claims["DONE"] + claims["BUSY"] + found_in_db,
             f"no work: DONE {claims['DONE']}, BUSY {claims['BUSY']}, "
             f"RETRY/SEEN found in the database {found_in_db}"),
            ("claims_new", claims["NEW"], ""),
            ("claims_retry", claims["RETRY"], ""),
            ("claims_seen", claims["SEEN"], "record expired, Bloom filter remembered"),
            ("starts", n_starts, "times a worker started the work"),
            ("retries_after_faults", n_starts - len(starts),
             "starts beyond the first: " + ", ".join(f"{k} {v}" for k, v in sorted(self.restart_reasons.items()))
             if hasattr(self, "restart_reasons") else ""),
            ("kills_before_effect", faults["kill_before"], "SIGKILL after the claim, before the effect"),
            ("kills_after_effect", faults["kill_after"], "SIGKILL after the DB commit, before IDEM.DONE"),
            ("kills_after_done", faults["kill_after_done"], "SIGKILL right after IDEM.DONE and its XACK"),
            ("kills_mid_work", faults["kill_mid_work"], "SIGKILL during long work, after a redelivery got BUSY"),
            ("slow_superseded", faults["slow_unique"] + faults["slow_fenced"],
             f"stalled past the lease: UNIQUE + STALE {faults['slow_unique']}, fenced {faults['slow_fenced']}"),
            ("stale_done", kinds["stale"], "IDEM.DONE answered STALE"),
            ("fenced_commits", kinds["fenced"], "DB transactions refused by the attempt fence"),
            ("failures_released", kinds["failed"], "work failed: IDEM.RELEASE"),
            ("lease_extends_lost", kinds["lease_lost"], "IDEM.EXTEND answered STALE"),
            ("redis_restarts", len(self.crashes), "kill -9, restarted from the AOF"),
            ("worker_kills", self.worker_kills, "workers replaced"),
            ("dead_letters", sum(dead.values()),
             ", ".join(f"{k} {v}" for k, v in sorted(dead.items())) or ""),
            ("violations", len(self.violations), ""),
            ("runtime_s", round(getattr(self, "runtime", 0.0), 1), "seconds"),
        ]
        print("counts:")
        for name, value, note in rows:
            print(f"  {name:<24}{value:>7}   {note}".rstrip())
        self.print_timeline()
        if self.violations:
            print(f"\nVIOLATIONS ({len(self.violations)}):")
            for text in self.violations[:50]:
                print("  - " + text.replace("\n", "\n    "))
            print(f"\nFAIL (journals, logs and the database are in {self.workdir})")
            return 1
        print("\nPASS: every payment took effect exactly once; work was repeated only after a fault")
        return 0

    def print_timeline(self):
        """What happened to each faulted payment, attempt by attempt."""
        ev = getattr(self, "events", [])
        if not ev:
            return
        print("faulted payments (per attempt: worker, claim status, outcome):")
        watched = dict(self.plan["faults"])
        watched[self.plan["mismatch"]] = "mismatch"
        for bid, kind in sorted(watched.items(), key=lambda x: (x[1], int(x[0].split(":")[1]))):
            steps = []
            for e in ev:
                if e.get("id") != bid:
                    continue
                if e["ev"] == "claim" and (e["status"] != "BUSY" or kind == "kill_mid_work"):
                    steps.append(f"{e['worker']} {e['status']}#{e['attempt']}")
                elif e["ev"] == "fault":
                    steps.append(f"<{e['kind']}>")
                elif e["ev"] in ("applied", "already", "fenced", "stale", "found_in_db", "failed", "dead_letter"):
                    steps.append(e["ev"])
            print(f"  {kind:<15} {bid:<12} " + " -> ".join(steps))


def main():
    p = argparse.ArgumentParser(description="fault-injection run of the example consumer")
    sub = p.add_subparsers(dest="role")
    w = sub.add_parser("_worker")
    w.add_argument("--workdir", required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--name", required=True)
    pr = sub.add_parser("_producer")
    pr.add_argument("--workdir", required=True)
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--t0", type=float, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--messages", type=int, default=120)
    p.add_argument("--timeout", type=float, default=50, help="s for the queue to drain")
    p.add_argument("--module", default=os.environ.get(
        "REDIS_IDEM_MODULE", os.path.join(REPO, "target", "release", "libredis_idem.so")))
    p.add_argument("--redis-server", default=os.environ.get("REDIS_SERVER", "redis-server"))
    p.add_argument("--workdir", default=os.path.join(REPO, "target", "chaos"))
    p.add_argument("--progress", choices=["auto", "live", "lines", "none"], default="auto")
    args = p.parse_args()
    if args.role == "_worker":
        return worker_main(args)
    if args.role == "_producer":
        return producer_main(args)
    if args.progress == "auto":
        args.progress = "live" if sys.stdout.isatty() else "lines"
    args.module = os.path.abspath(args.module)
    if not os.path.isfile(args.module):
        sys.exit(f"module not found at {args.module}: run `cargo build --release` (or `make build`) first")
    sys.exit(Run(args).main())


if __name__ == "__main__":
    main()
