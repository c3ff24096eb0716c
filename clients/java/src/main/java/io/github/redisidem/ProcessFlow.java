package io.github.redisidem;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/**
 * One {@code process} call's decisions (docs/clients.md, "What process
 * does"), free of I/O: each reply in, the next step out. The sync and the
 * async drivers only send, sleep and run the work, so they cannot drift.
 */
final class ProcessFlow {
    private enum Phase { CLAIM, RELEASE, DONE, CONFIRM }

    private final Core core;
    private final byte[] payload;
    private final String key;
    private final String recordKey;
    private final long deadline;
    private Phase phase = Phase.CLAIM;
    private boolean waited;
    private Duration nextPause = Duration.ofMillis(10);
    private Job job;
    private Throwable failure;
    private Object value;
    private RedisCommand done;
    private String dropped;
    private Throwable dropCause;
    private int doneTries;
    private boolean resent;

    ProcessFlow(Core core, String key, byte[] payload) {
        this.core = core;
        this.payload = payload;
        this.key = key;
        this.recordKey = core.options.prefix() + key;
        this.deadline = System.nanoTime() + core.options.waitFor().toNanos();
    }

    private Duration remaining() {
        return Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
    }

    private Step claim() {
        Duration wait = waited && core.wire.edition == Edition.MODULE ? remaining() : null;
        return new Step.Send(core.wire.claim(recordKey, core.options.lease(), payload, core.options.maxTries(), core.options.bloom(), wait));
    }

    Step start() {
        return claim();
    }

    Step afterSleep() {
        return phase == Phase.CLAIM ? claim() : new Step.Send(done);
    }

    Step onReply(Object reply, Throwable error) {
        return switch (phase) {
            case CLAIM -> onClaim(reply, error);
            case RELEASE -> onRelease(reply, error);
            case DONE -> onDone(reply, error);
            case CONFIRM -> onConfirm(reply, error);
        };
    }

    private static Step fail(Throwable e) {
        return new Step.Finish(null, e);
    }

    private Step onClaim(Object reply, Throwable error) {
        if (error != null) {
            // A waiter unblocked (failover, resharding, CLIENT UNBLOCK) or a
            // record gone from its node wrote nothing: claim again.
            String m = error.getMessage() == null ? "" : error.getMessage();
            if (error instanceof ServerException && (m.startsWith("TRYAGAIN") || m.startsWith("UNBLOCKED"))
                    && !remaining().isZero()) {
                return new Step.Sleep(Duration.ofMillis(10));
            }
            return fail(error);
        }
        Claim claim;
        try {
            claim = Replies.claim(reply);
        } catch (IdemException e) {
            return fail(e);
        }
        switch (claim.status()) {
            case NEW, SEEN, RETRY -> {
                (claim.status() == ClaimStatus.NEW ? core.counters.firstRuns : core.counters.retries).incrementAndGet();
                job = new Job(key, recordKey, claim.status(), claim.token(), claim.attempt());
                try {
                    core.options.hooks().onRun(job);
                } catch (RuntimeException e) {
                    return release(new HookException(e, null));
                }
                return new Step.RunWork(job);
            }
            case DONE -> {
                core.counters.replays.incrementAndGet();
                core.quietly(() -> core.options.hooks().onReplay(key, claim.attempt()));
                try {
                    Object decoded = claim.result() == null ? null : core.options.codec().decode(claim.result());
                    return new Step.Finish(new Outcome<>(decoded, true, null, claim.attempt(), claim.result() != null), null);
                } catch (Exception e) {
                    return fail(new IdemException("the stored result could not be decoded", e));
                }
            }
            case BUSY -> {
                if (remaining().isZero()) {
                    core.counters.busy.incrementAndGet();
                    return fail(new BusyException(key, claim.leaseLeft()));
                }
                if (!waited) {
                    waited = true;
                    core.counters.waits.incrementAndGet();
                    core.quietly(() -> core.options.hooks().onBusy(key, claim.leaseLeft()));
                }
                if (core.wire.edition == Edition.MODULE) return claim();
                return new Step.Sleep(pause(claim.leaseLeft()));
            }
            case MISMATCH -> {
                core.counters.mismatches.incrementAndGet();
                return fail(new MismatchException("mismatch: " + key + " was claimed with another payload"));
            }
            default -> {
                core.counters.exhausted.incrementAndGet();
                return fail(new ExhaustedException("exhausted: " + key + " used its tries (attempt " + claim.attempt() + ")"));
            }
        }
    }

    /** Functions-edition polling: 10 ms doubling to 1 s, jittered, never past the holder's lease end nor the deadline. */
    private Duration pause(Duration leaseLeft) {
        long ms = nextPause.toMillis();
        ms = ms / 2 + ThreadLocalRandom.current().nextLong(ms / 2 + 1);
        ms = Math.min(ms, Math.max(1, leaseLeft.toMillis()));
        ms = Math.min(ms, Math.max(1, remaining().toMillis()));
        nextPause = nextPause.multipliedBy(2).compareTo(Duration.ofSeconds(1)) > 0 ? Duration.ofSeconds(1) : nextPause.multipliedBy(2);
        return Duration.ofMillis(ms);
    }

    private Step release(Throwable why) {
        failure = why;
        phase = Phase.RELEASE;
        return new Step.Send(core.wire.release(recordKey, job.token));
    }

    Step onWorkFailed(Throwable error) {
        return release(error);
    }

    private Step onRelease(Object reply, Throwable error) {
        if (error == null && reply instanceof Long n && n == 1) {
            core.counters.released.incrementAndGet();
            core.quietly(() -> core.options.hooks().onRelease(job, failure));
        }
        return fail(failure);
    }

    Step onWorkReturned(Object result) {
        value = result;
        phase = Phase.DONE;
        byte[] bytes = null;
        try {
            bytes = core.options.codec().encode(result);
        } catch (Exception e) {
            dropped = "unserializable";
            dropCause = e;
        }
        done = core.wire.done(recordKey, job.token, bytes, core.options.retain(), core.options.bloom());
        return new Step.Send(done);
    }

    private Step onDone(Object reply, Throwable error) {
        if (error instanceof ResultTooLargeException e && dropped == null) {
            dropped = "oversize";
            dropCause = e;
            done = core.wire.done(recordKey, job.token, null, core.options.retain(), core.options.bloom());
            return new Step.Send(done);
        }
        if (error instanceof StaleException) return leaseLost();
        if (error != null && !(error instanceof ServerException)) {
            // The connection dropped before DONE's reply: the same token is safe to send again.
            if (doneTries >= core.options.doneRetries()) return fail(new DoneUnconfirmedException(value, error));
            resent = true;
            return new Step.Sleep(Duration.ofMillis(50L << doneTries++));
        }
        if (error != null) return fail(error);
        Done answer = Replies.done(reply);
        if (!answer.completed()) {
            if (!resent) return leaseLost();
            // 0 to a resent DONE: this worker's own completion if the record is done with this job's attempt.
            phase = Phase.CONFIRM;
            return new Step.Send(core.wire.get(recordKey));
        }
        return completed(answer.resultStored());
    }

    private Step onConfirm(Object reply, Throwable error) {
        if (error != null && !(error instanceof ServerException)) {
            phase = Phase.DONE;
            return onDone(null, error);
        }
        if (error != null) return fail(error);
        Record record = Replies.record(reply);
        if (record != null && record.state() == RecordState.DONE && record.attempt() == job.attempt()) {
            return completed(record.result() != null || dropped != null);
        }
        return leaseLost();
    }

    private Step leaseLost() {
        core.lost(job);
        return fail(new LeaseLostException("lease lost: " + key + " was claimed by another worker after attempt " + job.attempt()));
    }

    private Step completed(boolean serverStored) {
        core.counters.completed.incrementAndGet();
        if (dropped == null && !serverStored) dropped = "memory";
        boolean stored = dropped == null;
        if (!stored) {
            core.counters.resultsDropped.incrementAndGet();
            String reason = dropped;
            core.quietly(() -> core.options.hooks().onResultDropped(job, reason));
        }
        try {
            core.options.hooks().onDone(job, stored);
        } catch (RuntimeException e) {
            return fail(new HookException(e, value));
        }
        if ("unserializable".equals(dropped) || ("oversize".equals(dropped) && core.options.oversize() == Oversize.ERROR)) {
            return fail(new ResultNotStoredException(value, dropCause));
        }
        return new Step.Finish(new Outcome<>(value, false, job.status(), job.attempt(), stored), null);
    }
}
