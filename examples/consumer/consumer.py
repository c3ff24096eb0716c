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
import os
import signal
import sqlite3
import sys
import time
import zlib
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

try:
    import redis_idem
except ImportError:  # run from a checkout whose venv predates the library: use its source
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "src"))
    import redis_idem
from redis_idem import Status

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


class TransientError(Exception):
    """The work failed in a way a later attempt may not (timeout, 503...)."""


class Failed(Exception):
    """The work raised: reported, and the claim released on the way out."""


# ---------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------


class Worker:
    def __init__(self, redis_url, db_path, name, settings=None):
        self.r = connect(redis_url)
        self.store = Store(db_path)
        self.name = name  # consumer name in the group: unique per process
        self.settings = s = settings or Settings()
        # The claim, the lease kept alive while the work runs (EXTEND every
        # `heartbeat` s from a thread), DONE with the result, RELEASE when
        # the work raises: the redis-idem library. wait=0: a BUSY claim is
        # left pending at once (the holder may die; XAUTOCLAIM brings it
        # back), not waited for. DONE is sent again after a lost reply (the
        # same token is safe): the effect is committed, Redis must hear of it.
        self.idem = redis_idem.Idem(self.r, lease=s.lease, heartbeat=s.heartbeat, max_tries=s.maxtries,
                                    retain=s.retain, wait=0, done_retries=30)
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
        bid = payment.business_id
        def work(job):
            # NEW, SEEN or RETRY: we hold the claim.
            self.event("claim", id=bid, entry=entry_id, status=job.status.value, attempt=job.attempt)
            if job.status is not Status.NEW and self.store.applied(bid) is not None:
                # An earlier attempt applied the effect, then died before
                # IDEM.DONE (RETRY), or the record is gone and the Bloom
                # filter remembered (SEEN). Nothing to do but say so.
                self.event("found_in_db", id=bid, attempt=job.attempt, status=job.status.value)
                return "applied earlier"
            return self.process(entry_id, payment, job)

        try:
            # IDEM.CLAIM key lease PAYLOAD <content> MAXTRIES n BLOOM filter;
            # then the work, and IDEM.DONE with its result (database first,
            # then Redis), or IDEM.RELEASE if it raised.
            outcome = self.idem.process_outcome(key, work, payload=payment.fingerprint(), bloom=bloom)
            if outcome.replayed:
                # Completed before (this is a duplicate, or our XACK got
                # lost): outcome.value is the result stored by DONE.
                self.event("claim", id=bid, entry=entry_id, status="DONE", attempt=outcome.attempt)
                return self.ack(entry_id, payment, "done")
            self.event("done", id=bid, attempt=outcome.attempt, result_stored=outcome.result_stored)
            self.ack(entry_id, payment, "processed")
        except redis_idem.BusyError as e:
            # Someone holds a live lease. Do NOT ack: if that worker dies,
            # this pending message is how the payment gets redelivered
            # (XAUTOCLAIM, after min_idle_ms).
            self.event("claim", id=bid, entry=entry_id, status="BUSY", attempt=e.attempt)
        except redis_idem.ExhaustedError as e:
            self.event("claim", id=bid, entry=entry_id, status="EXHAUSTED", attempt=e.attempt)
            self.dead_letter(entry_id, fields, f"EXHAUSTED after {e.attempt} attempts")
        except redis_idem.MismatchError as e:
            self.event("claim", id=bid, entry=entry_id, status="MISMATCH", attempt=e.attempt)
            self.dead_letter(entry_id, fields, "MISMATCH business id reused for other content")
        except redis_idem.LeaseLostError as e:
            # IDEM.DONE answered STALE: another worker claimed the key since
            # (our lease lapsed). It finds the effect in the database and
            # settles the message; leave the XACK to it. (Lost during the
            # work, or fenced in the database: reported where it happened.)
            if not getattr(e, "reported", False):
                self.event("stale", id=bid, attempt=e.attempt)
        except Failed:
            pass  # the library released the claim: the message stays pending and comes back
        except LOST + (redis_idem.DoneUnconfirmedError,):
            # A reply is lost: the CLAIM's (we may or may not hold the claim:
            # the message is redelivered, and answers BUSY until the lease
            # lapses, then RETRY), or DONE's after all its tries.
            self.event("redis_error", id=bid, step="claim or done")

    def process(self, entry_id, payment, job):
        bid = payment.business_id
        # Tell the database which attempt is working now: from here on, a
        # write by an older attempt (a worker paused past its lease) fails.
        if not self.store.fence(bid, job.attempt):
            self.event("superseded", id=bid, attempt=job.attempt)
            raise self.reported(redis_idem.LeaseLostError(job.key, "superseded", job.attempt))
        self.event("start", id=bid, attempt=job.attempt, status=job.status.value, entry=entry_id)
        try:
            result = self.do_work(payment, job)
        except redis_idem.LeaseLostError as e:
            # Another worker took over; it will finish. Nothing to undo.
            self.event("lease_lost", id=bid, attempt=job.attempt)
            raise self.reported(e)
        except Exception as e:
            # Give the claim back at once (the library sends IDEM.RELEASE on
            # the way out), so the next delivery retries now rather than when
            # the lease would lapse. No XACK: the message stays pending and
            # comes back through XAUTOCLAIM; after MAXTRIES attempts
            # IDEM.CLAIM answers EXHAUSTED.
            self.event("failed", id=bid, attempt=job.attempt, error=repr(e))
            raise Failed() from e

        # Database first ...
        outcome = self.store.apply(payment, job.attempt, self.name)
        self.event(outcome, id=bid, attempt=job.attempt)
        if outcome == FENCED:
            # A newer attempt owns the payment; it will settle it.
            raise self.reported(redis_idem.LeaseLostError(job.key, "fenced", job.attempt))
        # ... then Redis (APPLIED, or ALREADY: an older attempt committed it).
        return result

    @staticmethod
    def reported(error):
        error.reported = True  # its event is in the journal already
        return error

    def do_work(self, payment, job):
        """The work before the effect: here a call to a payment provider,
        simulated by sleeping work_ms. The library renews the lease
        meanwhile; job.check() raises LeaseLostError if it was taken over."""
        deadline = time.monotonic() + payment.work_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
            job.check()
        return f"charged {payment.amount_cents} cents to {payment.account} (attempt {job.attempt})"

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
