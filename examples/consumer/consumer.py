#!/usr/bin/env python3
"""Exactly-once effects on an at-least-once queue: a worker.

Three parts, each doing what it is good at:

  the queue   a Redis Stream read through a consumer group. XREADGROUP
              delivers, XACK settles, XAUTOCLAIM takes over messages left
              pending by a dead or stuck worker. Delivery is at least once:
              a message can arrive twice, or be published twice.

  the dedup   redis-idem. One record per BUSINESS operation (payment:42),
              never per stream message id: a producer that publishes the
              same payment twice makes two stream entries with two ids, but
              one record. IDEM.CLAIM tells the worker what to do with a
              delivery; IDEM.DONE / RELEASE / EXTEND settle, give back and
              renew the claim.

  the effect  a database (SQLite here). The effect is committed in one
              transaction together with the claim's `attempt` (the fencing
              number), under a UNIQUE key on the business id: the last line
              of defence if everything else went wrong.

The one rule that makes it work: DATABASE FIRST, THEN REDIS. Commit the
effect, then IDEM.DONE, then XACK. A crash between any two steps leaves a
state the next delivery recognises:

  crash before the commit    the lease lapses, the next CLAIM says RETRY,
                             the effect is not in the database: do it.
  crash after the commit,    the next CLAIM says RETRY, the database has the
  before IDEM.DONE           effect: just mark it done.
  crash after IDEM.DONE,     the next CLAIM says DONE: acknowledge, no work.
  before XACK

What each IDEM.CLAIM status means here:

  NEW        first time: process it.
  SEEN       no record, but the Bloom filter says this key may have been
             completed (the record's retention ended): check the database
             before doing anything.
  RETRY      an earlier attempt was released or its lease lapsed; it may
             have partly run: check the database first, then process.
  DONE       completed already: XACK, do nothing.
  BUSY       someone else is processing it right now: do NOT ack; the
             message stays pending and is redelivered by XAUTOCLAIM later.
  EXHAUSTED  MAXTRIES attempts failed: dead-letter it.
  MISMATCH   the business id was claimed before with different content:
             dead-letter (reject) it.

Run it (`make run` starts Redis with the module on port 6379):

    python3 consumer.py --name worker-1 --db payments.sqlite
    python3 producer.py --count 100

The fault-injection run in chaos.py (`make demo`) runs several of these
against a Redis that it kills with SIGKILL mid-way, and checks the result.
"""

import argparse
import json
import logging
import signal
import sqlite3
import time
import zlib
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("consumer")

# A command that raises one of these may or may not have been executed: the
# reply is lost. Each step below says what that means for it.
LOST = (redis.ConnectionError, redis.TimeoutError)

STREAM = "queue:{payments}"  # the queue
GROUP = "payments"  # the consumer group every worker joins
DEAD = "queue:{payments}:dead"  # dead letters (same hash tag: see dead_letter)


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


@dataclass
class Settings:
    lease: int = 30  # s: how long a claim is held without renewal
    heartbeat: float = 10.0  # s: renew the lease this often during long work
    min_idle_ms: int = 60_000  # XAUTOCLAIM messages pending this long elsewhere
    maxtries: int = 5  # attempts before IDEM.CLAIM answers EXHAUSTED
    retain: int = 86_400  # s: keep done records this long (IDEM.DONE RETAIN)
    batch: int = 1  # messages per XREADGROUP (more: the rest of a batch waits
    #                 behind a slow message, until XAUTOCLAIM hands it to another worker)
    block_ms: int = 1000  # XREADGROUP BLOCK


def connect(url):
    """A Redis client for a worker.

    redis-py retries a command on a connection error by default. Do not let
    it retry IDEM.CLAIM: when Redis executed the first CLAIM but the reply was
    lost, the silent retry answers BUSY against our own claim, whose token we
    never saw. We turn client retries off and decide per step what a lost
    reply means (see `handle`).
    """
    return redis.Redis.from_url(
        url,
        protocol=2,  # the reply shapes this file expects, whatever redis-py's default
        socket_timeout=5,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )


# ---------------------------------------------------------------------------
# The message
# ---------------------------------------------------------------------------


@dataclass
class Payment:
    business_id: str  # "payment:42": the key of everything below
    account: str
    amount_cents: int
    work_ms: int = 0  # demo only: how long the "payment provider" takes

    @classmethod
    def from_fields(cls, fields):
        f = {k.decode(): v.decode() for k, v in fields.items()}
        return cls(f["id"], f["account"], int(f["amount_cents"]), int(f.get("work_ms", 0)))

    def fields(self):
        return {
            "id": self.business_id,
            "account": self.account,
            "amount_cents": self.amount_cents,
            "work_ms": self.work_ms,
        }

    def fingerprint(self):
        """What IDEM.CLAIM PAYLOAD hashes: the business content only, so the
        same payment published twice matches, and a business id reused for a
        different payment answers MISMATCH."""
        return json.dumps(
            {"id": self.business_id, "account": self.account, "amount_cents": self.amount_cents},
            sort_keys=True,
        )


BLOOM_BUCKETS = 16


def idem_keys(business_id):
    """The record's key and the Bloom filter its completions go to.

    `IDEM.CLAIM ... BLOOM f` needs f in the record's hash slot (Redis
    Cluster), so both carry the same {hash tag}. Bucketing the tag by a hash
    of the business id spreads the records over 16 slots instead of one.
    """
    bucket = zlib.crc32(business_id.encode()) % BLOOM_BUCKETS
    tag = "{payments:%02d}" % bucket
    return f"idem:{tag}:{business_id}", f"idem:{tag}:done"


# ---------------------------------------------------------------------------
# The database: the system of record
# ---------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    business_id  TEXT PRIMARY KEY,   -- UNIQUE: the last line of defence
    account      TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,   -- the fencing number of the claim that applied it
    worker       TEXT NOT NULL,
    applied_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS accounts (
    account       TEXT PRIMARY KEY,
    balance_cents INTEGER NOT NULL   -- the effect: not idempotent by itself
);
CREATE TABLE IF NOT EXISTS fences (
    business_id TEXT PRIMARY KEY,
    attempt     INTEGER NOT NULL     -- the highest attempt that started work
);
"""

APPLIED, ALREADY, FENCED = "applied", "already", "fenced"


class Store:
    def __init__(self, path):
        # isolation_level=None: we write BEGIN/COMMIT ourselves.
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")  # readers never block writers
        self.db.execute("PRAGMA synchronous=FULL")  # COMMIT returns once durable
        self.db.executescript(SCHEMA)

    def applied(self, business_id):
        """The attempt that applied this payment, or None."""
        row = self.db.execute(
            "SELECT attempt FROM payments WHERE business_id = ?", (business_id,)
        ).fetchone()
        return row[0] if row else None

    def fence(self, business_id, attempt):
        """Registers `attempt` as working on this payment. False when a newer
        attempt has already registered: this one is superseded."""
        self.db.execute(
            "INSERT INTO fences VALUES (?, ?) ON CONFLICT (business_id) "
            "DO UPDATE SET attempt = excluded.attempt WHERE excluded.attempt > fences.attempt",
            (business_id, attempt),
        )
        return self.fence_of(business_id) == attempt

    def fence_of(self, business_id):
        row = self.db.execute(
            "SELECT attempt FROM fences WHERE business_id = ?", (business_id,)
        ).fetchone()
        return row[0] if row else 0

    def apply(self, payment, attempt, worker):
        """The effect, in one transaction. APPLIED: done now. ALREADY: the
        UNIQUE key says an earlier attempt applied it. FENCED: a newer
        attempt has started since ours: we lost the claim, write nothing."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")  # take the write lock now
        try:
            try:
                db.execute(
                    "INSERT INTO payments VALUES (?, ?, ?, ?, ?, ?)",
                    (payment.business_id, payment.account, payment.amount_cents,
                     attempt, worker, time.time()),
                )
            except sqlite3.IntegrityError:  # UNIQUE (business_id)
                db.execute("ROLLBACK")
                return ALREADY
            if self.fence_of(payment.business_id) > attempt:
                db.execute("ROLLBACK")
                return FENCED
            db.execute(
                "INSERT INTO accounts VALUES (?, ?) ON CONFLICT (account) "
                "DO UPDATE SET balance_cents = balance_cents + excluded.balance_cents",
                (payment.account, payment.amount_cents),
            )
            db.execute("COMMIT")
            return APPLIED
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


# ---------------------------------------------------------------------------
# The claim a worker holds
# ---------------------------------------------------------------------------


class LeaseLost(Exception):
    """IDEM.EXTEND answered STALE: another worker has claimed the key since."""


class Claim:
    """A claim this worker holds: key, token, attempt (the fencing number).

    Long work calls keep_alive() often; it renews the lease with IDEM.EXTEND
    once per heartbeat. (A background thread would do as well.)
    """

    def __init__(self, r, key, token, attempt, status, settings):
        self.r, self.key, self.token = r, key, token
        self.attempt, self.status = attempt, status
        self.settings = settings
        self.renewed = time.monotonic()

    def keep_alive(self):
        if time.monotonic() - self.renewed < self.settings.heartbeat:
            return
        try:
            self.r.execute_command("IDEM.EXTEND", self.key, self.token, self.settings.lease)
            self.renewed = time.monotonic()
        except redis.ResponseError as e:
            if str(e).startswith("STALE"):
                raise LeaseLost(str(e)) from None
            raise
        except LOST:
            # Redis unreachable: keep working and try again next time. If the
            # outage outlasts the lease another worker may take over; the
            # fence in the database keeps the two apart.
            pass


class TransientError(Exception):
    """The work failed in a way a later attempt may not (timeout, 503...)."""


# ---------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------


class Worker:
    def __init__(self, redis_url, db_path, name, settings=None):
        self.r = connect(redis_url)
        self.store = Store(db_path)
        self.name = name  # consumer name in the group: unique per process
        self.settings = settings or Settings()
        self.stopping = False

    NOTABLE = {"dead_letter", "failed", "stale", "fenced", "superseded", "lease_lost",
               "already", "found_in_db", "redis_down", "redis_error"}

    def event(self, name, **info):
        """Every step reports here: log it, count it in your metrics. (The
        fault-injection run overrides this to keep a journal and crash.)"""
        level = logging.INFO if name in self.NOTABLE else logging.DEBUG
        log.log(level, "%s %s %s", self.name, name, info)

    # -- the loop --------------------------------------------------------

    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        cursor = "0-0"
        group_ready = False
        while not self.stopping:
            try:
                if not group_ready:
                    self.ensure_group()
                    group_ready = True
                # 1. Messages pending for min_idle_ms with any consumer (a
                #    dead worker, a stuck one, or a BUSY we left earlier):
                #    take them over. They come back with their delivery count
                #    increased.
                cursor, entries, _deleted = self.r.xautoclaim(
                    STREAM, GROUP, self.name, self.settings.min_idle_ms, cursor, count=self.settings.batch
                )
                for entry_id, fields in entries:
                    self.handle(entry_id.decode(), fields)
                # 2. New messages.
                reply = self.r.xreadgroup(
                    GROUP, self.name, {STREAM: ">"}, count=self.settings.batch, block=self.settings.block_ms
                )
                for _stream, entries in reply or []:
                    for entry_id, fields in entries:
                        self.handle(entry_id.decode(), fields)
            except LOST as e:
                # Redis is down, restarting (LOADING is a ConnectionError
                # too) or too slow to answer. Whatever we were doing is still pending in the group:
                # wait and carry on.
                self.event("redis_down", error=str(e))
                time.sleep(0.2)

    def stop(self):
        self.stopping = True  # finish the current message, then leave

    def ensure_group(self):
        try:
            self.r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    # -- one delivery ----------------------------------------------------

    def handle(self, entry_id, fields):
        try:
            payment = Payment.from_fields(fields)
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            return self.dead_letter(entry_id, fields, f"MALFORMED {e}")

        key, bloom = idem_keys(payment.business_id)
        s = self.settings
        try:
            status, value, attempt = self.r.execute_command(
                "IDEM.CLAIM", key, s.lease,
                "PAYLOAD", payment.fingerprint(),
                "MAXTRIES", s.maxtries,
                "BLOOM", bloom,
            )
        except LOST:
            # The reply is lost: we may or may not hold the claim now. Leave
            # the message pending. It is redelivered; if our claim did happen
            # it answers BUSY until the lease lapses, then RETRY.
            self.event("redis_error", id=payment.business_id, step="claim")
            return
        status = status.decode()
        self.event("claim", id=payment.business_id, entry=entry_id, status=status, attempt=attempt)

        if status == "DONE":
            # Completed before (this is a duplicate, or our XACK got lost).
            # `value` is the RESULT stored by IDEM.DONE.
            return self.ack(entry_id, payment, "done")
        if status == "BUSY":
            # Someone holds a live lease (`value` ms left). Do NOT ack: if
            # that worker dies, this pending message is how the payment gets
            # redelivered (XAUTOCLAIM, after min_idle_ms).
            return
        if status == "EXHAUSTED":
            return self.dead_letter(entry_id, fields, f"EXHAUSTED after {attempt} attempts")
        if status == "MISMATCH":
            return self.dead_letter(entry_id, fields, "MISMATCH business id reused for other content")

        # NEW, SEEN or RETRY: we hold the claim.
        claim = Claim(self.r, key, value, attempt, status, s)
        if status in ("SEEN", "RETRY") and self.store.applied(payment.business_id) is not None:
            # An earlier attempt applied the effect, then died before
            # IDEM.DONE (RETRY), or the record is gone and the Bloom filter
            # remembered (SEEN). Nothing to do but say so.
            self.event("found_in_db", id=payment.business_id, attempt=attempt, status=status)
            return self.complete(entry_id, payment, claim, bloom)
        self.process(entry_id, payment, claim, bloom)

    def process(self, entry_id, payment, claim, bloom):
        bid = payment.business_id
        # Tell the database which attempt is working now: from here on, a
        # write by an older attempt (a worker paused past its lease) fails.
        if not self.store.fence(bid, claim.attempt):
            self.event("superseded", id=bid, attempt=claim.attempt)
            return
        self.event("start", id=bid, attempt=claim.attempt, status=claim.status, entry=entry_id)
        try:
            result = self.do_work(payment, claim)
        except LeaseLost:
            # Another worker took over; it will finish. Nothing to undo.
            self.event("lease_lost", id=bid, attempt=claim.attempt)
            return
        except Exception as e:
            # Give the claim back at once, so the next delivery retries now
            # rather than when the lease would lapse. No XACK: the message
            # stays pending and comes back through XAUTOCLAIM; after
            # MAXTRIES attempts IDEM.CLAIM answers EXHAUSTED.
            self.event("failed", id=bid, attempt=claim.attempt, error=repr(e))
            try:
                self.r.execute_command("IDEM.RELEASE", claim.key, claim.token)
            except LOST:
                pass  # the lease lapses on its own
            return

        # Database first ...
        outcome = self.store.apply(payment, claim.attempt, self.name)
        self.event(outcome, id=bid, attempt=claim.attempt)
        if outcome == FENCED:
            return  # a newer attempt owns the payment; it will settle it
        # ... then Redis (APPLIED, or ALREADY: an older attempt committed it).
        self.complete(entry_id, payment, claim, bloom, result)

    def do_work(self, payment, claim):
        """The work before the effect: here a call to a payment provider,
        simulated by sleeping work_ms. Long work calls claim.keep_alive()
        regularly; it raises LeaseLost if the claim was taken over."""
        deadline = time.monotonic() + payment.work_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
            claim.keep_alive()
        return f"charged {payment.amount_cents} cents to {payment.account} (attempt {claim.attempt})"

    def complete(self, entry_id, payment, claim, bloom, result="applied earlier"):
        """IDEM.DONE, then XACK. The effect is committed: Redis must hear of
        it, so a lost connection is retried rather than given up."""
        for tries in range(100):
            try:
                reply = self.r.execute_command(
                    "IDEM.DONE", claim.key, claim.token,
                    "RESULT", result, "RETAIN", self.settings.retain, "BLOOM", bloom,
                )
                break
            except redis.ResponseError as e:
                if not str(e).startswith("STALE"):
                    raise
                # Another worker claimed the key since (our lease lapsed). It
                # will find the effect in the database and settle the
                # message; leave the XACK to it.
                self.event("stale", id=payment.business_id, attempt=claim.attempt)
                return
            except LOST:
                # Unknown whether it went through: DONE again with the same
                # token is safe (odd = completed now, 0 = already done).
                time.sleep(min(0.1 * (tries + 1), 1.0))
        else:
            raise RuntimeError(f"IDEM.DONE {claim.key}: Redis unreachable")
        self.event("done", id=payment.business_id, attempt=claim.attempt, reply=reply)
        self.ack(entry_id, payment, "processed")

    def ack(self, entry_id, payment, why):
        try:
            self.r.xack(STREAM, GROUP, entry_id)
            self.event("acked", id=payment.business_id, entry=entry_id, why=why)
        except LOST:
            # Lost: the message is redelivered, and CLAIM answers DONE.
            self.event("redis_error", id=payment.business_id, step="ack")

    def dead_letter(self, entry_id, fields, reason):
        """Park the message on the dead-letter stream and ack it, in one
        MULTI/EXEC: both or neither. (In Redis Cluster, both stream keys need
        the same hash tag, as {payments} here.)"""
        bid = fields.get(b"id", b"?").decode(errors="replace")
        try:
            with self.r.pipeline(transaction=True) as p:
                p.xadd(DEAD, {**fields, "reason": reason, "entry": entry_id, "worker": self.name})
                p.xack(STREAM, GROUP, entry_id)
                p.execute()
            self.event("dead_letter", id=bid, entry=entry_id, reason=reason)
        except LOST:
            self.event("redis_error", id=bid, step="dead_letter")


def settings_args(parser):
    d = Settings()
    parser.add_argument("--lease", type=int, default=d.lease, help="claim lease, s")
    parser.add_argument("--heartbeat", type=float, default=d.heartbeat, help="lease renewal period, s")
    parser.add_argument("--min-idle-ms", type=int, default=d.min_idle_ms, help="XAUTOCLAIM min idle time")
    parser.add_argument("--maxtries", type=int, default=d.maxtries)
    parser.add_argument("--retain", type=int, default=d.retain, help="keep done records, s")
    parser.add_argument("--batch", type=int, default=d.batch)
    parser.add_argument("--block-ms", type=int, default=d.block_ms)


def settings_from(args):
    return Settings(args.lease, args.heartbeat, args.min_idle_ms, args.maxtries, args.retain, args.batch, args.block_ms)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    p.add_argument("--db", default="payments.sqlite")
    p.add_argument("--name", required=True, help="consumer name, unique per worker")
    p.add_argument("-v", "--verbose", action="store_true")
    settings_args(p)
    args = p.parse_args()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    Worker(args.redis, args.db, args.name, settings_from(args)).run()


if __name__ == "__main__":
    main()
