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

The queue and the dedup are wired by the library's Streams adapter
(redis_idem.streams.StreamConsumer): it reads the group, takes over what a
dead worker left pending, claims each entry's business key, runs the work
below, and sends IDEM.DONE and XACK together, in one round trip. This file
is the work and the settings.

The one rule that makes it work: DATABASE FIRST, THEN REDIS. Commit the
effect, then IDEM.DONE with its XACK. A crash between any two steps leaves
a state the next delivery recognises:

  crash before the commit    the lease lapses, the next CLAIM says RETRY,
                             the effect is not in the database: do it.
  crash after the commit,    the next CLAIM says RETRY, the database has the
  before IDEM.DONE           effect: just mark it done.
  crash after IDEM.DONE      its XACK went with it: nothing comes back (a
                             duplicate publish finds DONE: acknowledged).

What each IDEM.CLAIM status means here:

  NEW        first time: process it.
  SEEN       no record, but the Bloom filter says this key may have been
             completed (the record's retention ended): check the database
             before doing anything.
  RETRY      an earlier attempt was released or its lease lapsed; it may
             have partly run: check the database first, then process.
  DONE       completed already: the adapter acknowledges it, no work.
  BUSY       someone else is processing it right now: not acknowledged; the
             entry stays pending and XAUTOCLAIM hands it out again once the
             holder's lease has run out.
  EXHAUSTED  MAXTRIES attempts failed: dead-lettered.
  MISMATCH   the business id was claimed before with different content:
             dead-lettered (rejected).

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
from redis_idem import Hooks, Status
from redis_idem.streams import ACK as ACKNOWLEDGED, DEAD as DEAD_LETTERED, StreamConsumer

log = logging.getLogger("consumer")

# A command that raises one of these may or may not have been executed: the
# reply is lost. Each step below says what that means for it.
LOST = (redis.ConnectionError, redis.TimeoutError)

STREAM = "queue:{payments}"  # the queue
GROUP = "payments"  # the consumer group every worker joins
DEAD = "queue:{payments}:dead"  # dead letters (the stream's hash tag: XADD and XACK in one MULTI)


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
        self.payment = None  # the payment at work (for the hooks)
        # The claim, the lease kept alive while the work runs (EXTEND every
        # `heartbeat` s from a thread), DONE with the result, RELEASE when
        # the work raises: the redis-idem library. wait=0: a BUSY claim is
        # left pending at once (the holder may die; XAUTOCLAIM brings it
        # back), not waited for. DONE is sent again after a lost reply (the
        # same token is safe): the effect is committed, Redis must hear of it.
        self.idem = redis_idem.Idem(self.r, lease=s.lease, heartbeat=s.heartbeat, max_tries=s.maxtries,
                                    retain=s.retain, wait=0, done_retries=30, hooks=Hooks(on_done=self.on_done))
        # The queue: XREADGROUP, XAUTOCLAIM after min_idle_ms, XACK with
        # IDEM.DONE, dead letters (XADD + XACK in one MULTI): the adapter.
        # The record's key, its PAYLOAD (MISMATCH for a reused business id)
        # and its Bloom filter come from the entry's business content,
        # never from its stream id.
        self.consumer = StreamConsumer(
            self.idem, STREAM, GROUP, consumer=name,
            key=lambda entry: idem_keys(self.parse(entry).business_id)[0],
            payload=lambda entry: self.parse(entry).fingerprint(),
            settings=lambda entry: {"bloom": idem_keys(self.parse(entry).business_id)[1]},
            dead_letter=DEAD, claim_idle=s.min_idle_ms / 1000, block=s.block_ms / 1000,
            on_settled=self.settled)

    NOTABLE = {"dead_letter", "failed", "stale", "fenced", "superseded", "lease_lost",
               "already", "found_in_db", "redis_error"}

    def event(self, name, **info):
        """Every step reports here: log it, count it in your metrics. (The
        fault-injection run overrides this to keep a journal and crash.)"""
        level = logging.INFO if name in self.NOTABLE else logging.DEBUG
        log.log(level, "%s %s %s", self.name, name, info)

    # -- the loop --------------------------------------------------------

    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        # Until stop(): entries left pending past min_idle_ms first (a dead
        # worker's, a stuck one's, a BUSY or failed one given back), then
        # new ones; a Redis that is down or restarting is waited for.
        self.consumer.run(self.work)

    def stop(self):
        self.consumer.stop()  # finish the current message, then leave

    @staticmethod
    def parse(entry):
        """The payment in a stream entry. A malformed entry has no key: the
        adapter dead-letters it (no redelivery can fix it)."""
        return Payment.from_fields(entry.fields)

    # -- one delivery ----------------------------------------------------

    def work(self, entry, job):
        """NEW, SEEN or RETRY: we hold the claim. What this returns is
        stored by IDEM.DONE (sent with the entry's XACK); if it raises, the
        claim is released and the entry stays pending."""
        payment = self.payment = self.parse(entry)
        bid = payment.business_id
        self.event("claim", id=bid, entry=entry.id, status=job.status.value, attempt=job.attempt)
        if job.status is not Status.NEW and self.store.applied(bid) is not None:
            # An earlier attempt applied the effect, then died before
            # IDEM.DONE (RETRY), or the record is gone and the Bloom
            # filter remembered (SEEN). Nothing to do but say so.
            self.event("found_in_db", id=bid, attempt=job.attempt, status=job.status.value)
            return "applied earlier"
        return self.process(entry.id, payment, job)

    def on_done(self, job, result_stored):
        """IDEM.DONE (and the entry's XACK, in the same round trip) answered."""
        self.event("done", id=self.payment.business_id, attempt=job.attempt, result_stored=result_stored)

    def settled(self, entry, verdict):
        """The adapter acknowledged the entry, gave it back or dead-lettered it."""
        fields = {k.decode(): v.decode(errors="replace") for k, v in entry.fields.items()}
        bid, error = fields.get("id", "?"), verdict.error
        if verdict.action == ACKNOWLEDGED:
            replayed = verdict.outcome is not None and verdict.outcome.replayed
            if replayed:
                # Completed before (a duplicate, or a redelivery of ours):
                # outcome.value is the result stored by DONE.
                self.event("claim", id=bid, entry=entry.id, status="DONE", attempt=verdict.outcome.attempt)
            self.event("acked", id=bid, entry=entry.id, why="done" if replayed else "processed")
        elif verdict.action == DEAD_LETTERED:
            status = {"ExhaustedError": "EXHAUSTED", "MismatchError": "MISMATCH"}.get(type(error).__name__)
            if status:
                self.event("claim", id=bid, entry=entry.id, status=status, attempt=error.attempt)
            self.event("dead_letter", id=bid, entry=entry.id, reason=str(error))
        elif isinstance(error, redis_idem.BusyError):
            # Someone holds a live lease. Not acknowledged: if that worker
            # dies, this pending entry is how the payment gets redelivered.
            self.event("claim", id=bid, entry=entry.id, status="BUSY", attempt=error.attempt)
        elif isinstance(error, redis_idem.LeaseLostError):
            # IDEM.DONE answered STALE: another worker claimed the key since
            # (our lease lapsed). It finds the effect in the database and
            # settles the message. (Lost during the work, or fenced in the
            # database: reported where it happened.)
            if not getattr(error, "reported", False):
                self.event("stale", id=bid, attempt=error.attempt)
        elif isinstance(error, LOST + (redis_idem.DoneUnconfirmedError,)):
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
            # the way out), so the next delivery retries soon rather than
            # when the lease would lapse. No XACK: the entry stays pending
            # and comes back through XAUTOCLAIM; after MAXTRIES attempts
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


def settings_args(parser):
    d = Settings()
    parser.add_argument("--lease", type=int, default=d.lease, help="claim lease, s")
    parser.add_argument("--heartbeat", type=float, default=d.heartbeat, help="lease renewal period, s")
    parser.add_argument("--min-idle-ms", type=int, default=d.min_idle_ms, help="XAUTOCLAIM min idle time")
    parser.add_argument("--maxtries", type=int, default=d.maxtries)
    parser.add_argument("--retain", type=int, default=d.retain, help="keep done records, s")
    parser.add_argument("--block-ms", type=int, default=d.block_ms)


def settings_from(args):
    return Settings(args.lease, args.heartbeat, args.min_idle_ms, args.maxtries, args.retain, args.block_ms)


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
