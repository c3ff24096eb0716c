package io.github.redisidem;

import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.HookException;
import io.github.redisidem.exceptions.IdemException;
import io.github.redisidem.exceptions.LeaseLostException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import io.github.redisidem.exceptions.ResultTooLargeException;
import io.github.redisidem.exceptions.ServerException;
import io.github.redisidem.exceptions.StaleException;
import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/**
 * One key's decisions (docs/clients.md, "What process does"), free of I/O:
 * each answer in, the next step out. The single call, the batch
 * ({@code processMany}: one flow per key, their commands batched) and the
 * sync and async drivers all drive this one class, so they cannot drift.
 *
 * @param <T> the work's result
 */
final class ProcessFlow<T> {
    private enum Phase { CLAIM, OWNER, RELEASE, DONE, CONFIRM }

    private final Core core;
    private final Codec<T> codec;
    private final String key;
    private final String recordKey;
    private final byte[] payload;
    private final long deadline;
    private Phase phase = Phase.CLAIM;
    private boolean waited;
    private long nextPauseMs = 10;
    private Job job;
    private Duration busyLeft;
    private Throwable failure;
    private NotDurableException claimNotDurable;
    private T value;
    private byte[] result;
    private String dropped;
    private Throwable dropCause;
    private int doneResends;
    private boolean maybeRan;
    private Answer lastDone;

    /**
     * @param wait how long a busy key is waited for (zero: not at all)
     */
    ProcessFlow(Core core, String key, byte[] payload, Codec<T> codec, Duration wait) {
        this.core = core;
        this.codec = codec;
        this.key = key;
        this.recordKey = core.options.prefix() + key;
        this.payload = payload;
        this.deadline = System.nanoTime() + wait.toNanos();
    }

    String key() {
        return key;
    }

    private long nanosLeft() {
        return deadline - System.nanoTime();
    }

    private Step claim() {
        Duration wait = null;
        if (waited && core.wire.module() && nanosLeft() >= 1_000_000) wait = Duration.ofNanos(nanosLeft());
        return new Step.Claim(recordKey, payload, wait, core.options.lease());
    }

    private Step done() {
        return new Step.Done(recordKey, job.token, result, core.options.retain());
    }

    Step start() {
        return claim();
    }

    Step afterSleep() {
        return phase == Phase.CLAIM ? claim() : done();
    }

    Step onAnswer(Answer a) {
        try {
            return switch (phase) {
                case CLAIM -> onClaim(a);
                case OWNER -> onOwner(a);
                case RELEASE -> onRelease(a);
                case DONE -> onDone(a);
                case CONFIRM -> onConfirm(a);
            };
        } catch (RuntimeException e) {
            // An answer of a shape no server sends: the call fails with it, never with a half-made decision.
            return finish(BatchStatus.ERROR, value, e, job == null ? 0 : job.attempt(), false);
        }
    }

    /** A connection failure: the command may or may not have run. */
    static boolean connectionError(Throwable e) {
        return !(e instanceof IdemException) && !(e instanceof IllegalArgumentException) && !(e instanceof Error);
    }

    /** An error reply that says the command ran nowhere (a failover, a resharding, an unblocked waiter). */
    static boolean wroteNothing(Throwable e) {
        if (!(e instanceof ServerException)) return false;
        String m = e.getMessage() == null ? "" : e.getMessage();
        return m.startsWith("TRYAGAIN") || m.startsWith("UNBLOCKED") || m.startsWith("READONLY") || m.startsWith("MASTERDOWN")
                || m.startsWith("LOADING") || m.startsWith("NOREPLICAS") || m.startsWith("MOVED") || m.startsWith("ASK") || m.startsWith("CLUSTERDOWN");
    }

    private Step finish(BatchStatus status, Object v, Throwable error, long attempt, boolean stored) {
        return new Step.Finish(new Result(status, v, error, attempt, stored, job == null ? null : job.status()));
    }

    private Step onClaim(Answer a) {
        if (a.error() != null) {
            // Nothing written, or the connection closed (a failover: the client reconnects): claim again while time is left.
            if ((wroteNothing(a.error()) || connectionError(a.error())) && nanosLeft() > 0) return new Step.Sleep(pause(null));
            return finish(BatchStatus.ERROR, null, a.error(), 0, false);
        }
        Claim c = Replies.claim(a.reply());
        NotDurableException.Stage notDurable = notDurableStage(core, c, a);
        switch (c.status()) {
            case NEW, SEEN, RETRY -> {
                job = new Job(key, recordKey, c.status(), c.token(), c.attempt());
                if (notDurable != null) {
                    claimNotDurable = new NotDurableException(NotDurableException.Stage.CLAIM, Math.max(0, a.acknowledged()), null);
                    phase = Phase.RELEASE;
                    return new Step.Release(recordKey, job.token);
                }
                (c.status() == ClaimStatus.NEW ? core.counters.firstRuns : core.counters.retries).increment();
                try {
                    core.options.hooks().onRun(job);
                } catch (RuntimeException e) {
                    return release(new HookException(e, null));
                }
                return new Step.Run(job);
            }
            case DONE -> {
                if (notDurable != null) return replayNotDurable(c, a);
                core.counters.replays.increment();
                core.quietly(() -> core.options.hooks().onReplay(key, c.attempt()));
                T decoded;
                try {
                    decoded = c.result() == null ? null : codec.decode(c.result());
                } catch (Exception e) {
                    return finish(BatchStatus.ERROR, null, new IdemException("the stored result of " + key + " could not be decoded: " + e.getMessage(), e),
                            c.attempt(), true);
                }
                return finish(BatchStatus.REPLAYED, decoded, null, c.attempt(), c.result() != null);
            }
            case BUSY -> {
                if (nanosLeft() > 0) {
                    if (!waited) {
                        waited = true;
                        core.counters.waits.increment();
                        core.quietly(() -> core.options.hooks().onBusy(key, c.leaseLeft()));
                    }
                    return core.wire.module() ? claim() : new Step.Sleep(pause(c.leaseLeft()));
                }
                core.counters.busy.increment();
                busyLeft = c.leaseLeft();
                phase = Phase.OWNER;
                return new Step.Get(recordKey);
            }
            case MISMATCH -> {
                core.counters.mismatches.increment();
                return finish(BatchStatus.MISMATCH, null, new MismatchException("mismatch: " + key + " was claimed with another payload"), c.attempt(), false);
            }
            default -> {
                core.counters.exhausted.increment();
                return finish(BatchStatus.EXHAUSTED, null, new ExhaustedException("exhausted: " + key + " used its tries (attempt " + c.attempt() + ")"),
                        c.attempt(), false);
            }
        }
    }

    /**
     * With {@code durable}, the stage at which a claim's answer is NotDurable (counted), or null: the rule of
     * {@code process}, {@code processMany} and {@code claimMany} alike. A granted claim whose WAIT fell short is
     * NotDurable at {@link NotDurableException.Stage#CLAIM} (the caller gives it back); a replay's at
     * {@link NotDurableException.Stage#DONE} (see {@link #replayNotDurable}; nothing to give back). Busy and
     * refused claims wrote and read nothing to keep.
     */
    static NotDurableException.Stage notDurableStage(Core core, Claim c, Answer a) {
        NotDurableException.Stage stage = switch (c.status()) {
            case NEW, SEEN, RETRY -> NotDurableException.Stage.CLAIM;
            case DONE -> NotDurableException.Stage.DONE;
            default -> null;
        };
        if (stage == null || a.durableOk()) return null;
        core.counters.notDurable.increment();
        return stage;
    }

    /**
     * A completion replayed by a primary fewer replicas acknowledge (one deposed by a failover keeps answering
     * for a while) may be gone from the next one: NotDurable at the done stage with the stored result, not a
     * replay to acknowledge the message on. A replay holds no claim: nothing to release. A result that does not
     * decode is carried as null (the answer is NotDurable either way).
     */
    private Step replayNotDurable(Claim c, Answer a) {
        T decoded = null;
        boolean stored = false;
        if (c.result() != null) {
            try {
                decoded = codec.decode(c.result());
                stored = true;
            } catch (Exception ignored) {
                // the result is a courtesy here: the redelivery reads the record again from whoever is primary
            }
        }
        return finish(BatchStatus.NOT_DURABLE, decoded, new NotDurableException(NotDurableException.Stage.DONE, Math.max(0, a.acknowledged()), decoded),
                c.attempt(), stored);
    }

    /** Busy at the end: who holds the key, read once on this path only (null when the read fails). */
    private Step onOwner(Answer a) {
        String owner = null;
        if (a.error() == null) {
            try {
                Record r = Replies.record(a.reply());
                owner = r == null ? null : r.owner();
            } catch (RuntimeException ignored) {
                // the owner is a courtesy: Busy is the answer either way
            }
        }
        return finish(BatchStatus.BUSY, null, new BusyException(key, busyLeft, owner), 0, false);
    }

    /** The polling pause (Functions edition, or a claim to send again): 10 ms doubling to 1 s, jittered, within the lease left and the deadline. */
    private Duration pause(Duration leaseLeft) {
        long ms = nextPauseMs / 2 + ThreadLocalRandom.current().nextLong(nextPauseMs / 2 + 1);
        if (leaseLeft != null) ms = Math.min(ms, Math.max(1, leaseLeft.toMillis()));
        ms = Math.max(1, Math.min(ms, Math.max(1, nanosLeft() / 1_000_000)));
        nextPauseMs = Math.min(1000, nextPauseMs * 2);
        return Duration.ofMillis(ms);
    }

    private Step release(Throwable why) {
        failure = why;
        phase = Phase.RELEASE;
        return new Step.Release(recordKey, job.token);
    }

    /** The work (or a hook before it) failed in any way: its claim is given back. */
    Step onWorkFailed(Throwable error) {
        return release(error);
    }

    private Step onRelease(Answer a) {
        if (claimNotDurable != null) return finish(BatchStatus.NOT_DURABLE, null, claimNotDurable, job.attempt(), false);
        // Sent once: a RELEASE that fails (or answers 0) lets the claim lapse with its lease; only a 1 is counted.
        if (a.error() == null && a.reply() instanceof Long n && n == 1) core.counters.released.increment();
        core.quietly(() -> core.options.hooks().onRelease(job, failure));
        return finish(BatchStatus.FAILED, null, failure, job.attempt(), false);
    }

    Step onWorkReturned(T v) {
        value = v;
        try {
            result = codec.encode(v);
        } catch (Exception e) {
            dropped = "unserializable";
            dropCause = e;
            result = null;
        }
        phase = Phase.DONE;
        return done();
    }

    private Step onDone(Answer a) {
        Throwable e = a.error();
        if (e instanceof ResultTooLargeException && result != null) {
            // Refused, nothing written: completed without the result.
            dropped = "oversize";
            dropCause = e;
            result = null;
            return done();
        }
        if (e instanceof StaleException) return leaseLost();
        if (e != null && (connectionError(e) || wroteNothing(e))) {
            // The same token is safe to send again; a 0 to it is then confirmed.
            if (connectionError(e)) maybeRan = true;
            if (doneResends >= core.options.doneRetries()) {
                return finish(BatchStatus.ERROR, value, new DoneUnconfirmedException(value, e), job.attempt(), false);
            }
            return new Step.Sleep(Duration.ofMillis(50L << Math.min(20, doneResends++)));
        }
        // Any other error (WRONGTYPE: the key was overwritten): the record was not completed.
        if (e != null) return finish(BatchStatus.ERROR, value, e, job.attempt(), false);
        Done d = Replies.done(a.reply());
        if (!d.completed()) {
            if (!maybeRan) return leaseLost();
            phase = Phase.CONFIRM;
            lastDone = a;
            return new Step.Get(recordKey);
        }
        return completed(d.resultStored(), a);
    }

    /** 0 to a resent DONE: this worker's own completion when the record is done with this job's attempt. */
    private Step onConfirm(Answer a) {
        if (a.error() != null && connectionError(a.error())) {
            phase = Phase.DONE;
            return onDone(a);
        }
        if (a.error() != null) return finish(BatchStatus.ERROR, value, a.error(), job.attempt(), false);
        Record r = Replies.record(a.reply());
        if (r != null && r.state() == RecordState.DONE && r.attempt() == job.attempt()) return completed(r.result() != null || dropped != null, lastDone);
        return leaseLost();
    }

    private Step leaseLost() {
        core.lost(job);
        return finish(BatchStatus.LOST, value, new LeaseLostException("lease lost: " + key + " was claimed by another worker after attempt " + job.attempt()),
                job.attempt(), false);
    }

    /** The record is completed by this worker: counted once, whatever comes after. */
    private Step completed(boolean serverStored, Answer done) {
        core.counters.completed.increment();
        if (dropped == null && !serverStored) dropped = "memory";
        boolean stored = dropped == null;
        if (!stored) {
            core.counters.resultsDropped.increment();
            String reason = dropped;
            core.quietly(() -> core.options.hooks().onResultDropped(job, reason));
        }
        if (!done.durableOk()) {
            core.counters.notDurable.increment();
            core.quietly(() -> core.options.hooks().onDone(job, stored));
            return finish(BatchStatus.NOT_DURABLE, value, new NotDurableException(NotDurableException.Stage.DONE, Math.max(0, done.acknowledged()), value),
                    job.attempt(), stored);
        }
        try {
            core.options.hooks().onDone(job, stored);
        } catch (RuntimeException e) {
            return finish(BatchStatus.PROCESSED, value, new HookException(e, value), job.attempt(), stored);
        }
        if ("unserializable".equals(dropped) || ("oversize".equals(dropped) && core.options.oversize() == Oversize.ERROR)) {
            return finish(BatchStatus.PROCESSED, value, new ResultNotStoredException(value, dropCause), job.attempt(), false);
        }
        return finish(BatchStatus.PROCESSED, value, null, job.attempt(), stored);
    }
}
