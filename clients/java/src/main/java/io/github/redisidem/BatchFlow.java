package io.github.redisidem;

import java.util.ArrayList;
import java.util.List;

/** One {@code processMany} call's decisions, free of I/O, as {@link ProcessFlow} is for one key. */
final class BatchFlow<T> {
    private final Core core;
    private final List<String> keys;
    private final List<BatchItem<T>> items = new ArrayList<>();
    private final List<Integer> jobIndex = new ArrayList<>();
    private final List<Job> jobs = new ArrayList<>();
    private final List<Object> values = new ArrayList<>();
    private final List<String> dropped = new ArrayList<>();
    private final List<Throwable> dropCause = new ArrayList<>();
    private final List<Integer> doneJobs = new ArrayList<>();
    private final List<Integer> againJobs = new ArrayList<>();
    private final List<Integer> releaseJobs = new ArrayList<>();
    private final List<Throwable> releaseWhy = new ArrayList<>();

    BatchFlow(Core core, List<String> keys) {
        this.core = core;
        this.keys = keys;
    }

    private void set(int i, BatchStatus status, Object value, Throwable error, long attempt, boolean stored) {
        @SuppressWarnings("unchecked")
        T v = (T) value;
        items.set(i, new BatchItem<>(keys.get(i), status, v, error, attempt, stored));
    }

    /** The claims' answers: the jobs to run (onRun already called), the other keys settled. */
    List<Job> onClaims(List<Reply<Claim>> claims) {
        List<Job> run = new ArrayList<>();
        for (int i = 0; i < keys.size(); i++) {
            items.add(null);
            Reply<Claim> reply = claims.get(i);
            String key = keys.get(i);
            if (!reply.ok()) {
                set(i, BatchStatus.ERROR, null, reply.error(), 0, false);
                continue;
            }
            Claim c = reply.value();
            switch (c.status()) {
                case NEW, SEEN, RETRY -> {
                    (c.status() == ClaimStatus.NEW ? core.counters.firstRuns : core.counters.retries).incrementAndGet();
                    Job job = new Job(key, core.options.prefix() + key, c.status(), c.token(), c.attempt());
                    jobIndex.add(i);
                    jobs.add(job);
                    try {
                        core.options.hooks().onRun(job);
                        run.add(job);
                    } catch (RuntimeException e) {
                        releaseJobs.add(jobs.size() - 1);
                        releaseWhy.add(new HookException(e, null));
                        set(i, BatchStatus.FAILED, null, releaseWhy.get(releaseWhy.size() - 1), c.attempt(), false);
                    }
                }
                case DONE -> {
                    core.counters.replays.incrementAndGet();
                    core.quietly(() -> core.options.hooks().onReplay(key, c.attempt()));
                    try {
                        Object v = c.result() == null ? null : core.options.codec().decode(c.result());
                        set(i, BatchStatus.REPLAYED, v, null, c.attempt(), c.result() != null);
                    } catch (Exception e) {
                        set(i, BatchStatus.ERROR, null, new IdemException("the stored result could not be decoded", e), c.attempt(), true);
                    }
                }
                case BUSY -> {
                    core.counters.busy.incrementAndGet();
                    set(i, BatchStatus.BUSY, null, new BusyException(key, c.leaseLeft()), c.attempt(), false);
                }
                case MISMATCH -> {
                    core.counters.mismatches.incrementAndGet();
                    set(i, BatchStatus.MISMATCH, null, new MismatchException("mismatch: " + key), c.attempt(), false);
                }
                default -> {
                    core.counters.exhausted.incrementAndGet();
                    set(i, BatchStatus.EXHAUSTED, null, new ExhaustedException("exhausted: " + key), c.attempt(), false);
                }
            }
        }
        return run;
    }

    /** The works' outcomes (one per job run, in order): the DONE items of the successes. */
    List<DoneItem> onWorks(List<Object> results, List<Throwable> failures) {
        List<DoneItem> done = new ArrayList<>();
        int r = 0;
        for (int j = 0; j < jobs.size(); j++) {
            values.add(null);
            dropped.add(null);
            dropCause.add(null);
            if (releaseJobs.contains(j)) continue;
            Object value = results.get(r);
            Throwable failure = failures.get(r++);
            Job job = jobs.get(j);
            if (failure != null) {
                releaseJobs.add(j);
                releaseWhy.add(failure);
                set(jobIndex.get(j), BatchStatus.FAILED, null, failure, job.attempt(), false);
                continue;
            }
            values.set(j, value);
            byte[] bytes = null;
            try {
                bytes = core.options.codec().encode(value);
            } catch (Exception e) {
                dropped.set(j, "unserializable");
                dropCause.set(j, e);
            }
            doneJobs.add(j);
            done.add(new DoneItem(job.key(), job.token, bytes));
        }
        return done;
    }

    void onDones(List<Reply<Done>> replies) {
        for (int d = 0; d < doneJobs.size(); d++) {
            int j = doneJobs.get(d);
            Reply<Done> reply = replies.get(d);
            if (reply.error() instanceof ResultTooLargeException e) {
                dropped.set(j, "oversize");
                dropCause.set(j, e);
                againJobs.add(j);
                continue;
            }
            settle(j, reply);
        }
    }

    List<DoneItem> withoutResults() {
        return againJobs.stream().map(j -> new DoneItem(jobs.get(j).key(), jobs.get(j).token, null)).toList();
    }

    void onDonesAgain(List<Reply<Done>> replies) {
        for (int d = 0; d < againJobs.size(); d++) settle(againJobs.get(d), replies.get(d));
    }

    private void settle(int j, Reply<Done> reply) {
        Job job = jobs.get(j);
        int i = jobIndex.get(j);
        Object value = values.get(j);
        if (reply.error() instanceof StaleException || (reply.ok() && !reply.value().completed())) {
            core.lost(job);
            set(i, BatchStatus.LOST, value, new LeaseLostException("lease lost: " + job.key()), job.attempt(), false);
            return;
        }
        if (!reply.ok()) {
            set(i, BatchStatus.ERROR, value, reply.error(), job.attempt(), false);
            return;
        }
        core.counters.completed.incrementAndGet();
        if (dropped.get(j) == null && !reply.value().resultStored()) dropped.set(j, "memory");
        String reason = dropped.get(j);
        boolean stored = reason == null;
        if (!stored) {
            core.counters.resultsDropped.incrementAndGet();
            core.quietly(() -> core.options.hooks().onResultDropped(job, reason));
        }
        Throwable error = null;
        try {
            core.options.hooks().onDone(job, stored);
        } catch (RuntimeException e) {
            error = new HookException(e, value);
        }
        if (error == null && ("unserializable".equals(reason) || ("oversize".equals(reason) && core.options.oversize() == Oversize.ERROR))) {
            error = new ResultNotStoredException(value, dropCause.get(j));
        }
        set(i, BatchStatus.PROCESSED, value, error, job.attempt(), stored);
    }

    List<ReleaseItem> releases() {
        return releaseJobs.stream().map(j -> new ReleaseItem(jobs.get(j).key(), jobs.get(j).token)).toList();
    }

    void onReleases(List<Reply<Boolean>> replies) {
        for (int r = 0; r < releaseJobs.size(); r++) {
            if (replies.get(r).ok() && Boolean.TRUE.equals(replies.get(r).value())) {
                Job job = jobs.get(releaseJobs.get(r));
                Throwable why = releaseWhy.get(r);
                core.counters.released.incrementAndGet();
                core.quietly(() -> core.options.hooks().onRelease(job, why));
            }
        }
    }

    List<BatchItem<T>> items() {
        return items;
    }
}
