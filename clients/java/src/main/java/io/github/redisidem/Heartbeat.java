package io.github.redisidem;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The instance's one heartbeat: a timer that does nothing until a job has
 * run for {@code heartbeat}, then EXTENDs each job that old, every
 * {@code heartbeat}. A job costs an entry in a set while it runs, no timer
 * of its own. {@link #stop} returns only after a beat in flight for that
 * job has ended, so no EXTEND follows the DONE (it would answer STALE and
 * look like a lost lease).
 */
final class Heartbeat implements AutoCloseable {
    private final Core core;
    private final long interval;
    private final Set<Job> running = ConcurrentHashMap.newKeySet();
    private final AtomicBoolean scheduled = new AtomicBoolean();
    private final ScheduledThreadPoolExecutor timer;

    Heartbeat(Core core) {
        this.core = core;
        this.interval = core.options.heartbeat().toNanos();
        this.timer = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "redis-idem-heartbeat");
            t.setDaemon(true);
            return t;
        });
        timer.setRemoveOnCancelPolicy(true);
    }

    void start(Job job) {
        if (interval == 0) return;
        synchronized (job) {
            job.beating = true;
        }
        job.beatDue = System.nanoTime() + interval;
        running.add(job);
        if (scheduled.compareAndSet(false, true)) schedule(interval);
    }

    void stop(Job job) {
        if (interval == 0) return;
        synchronized (job) {
            job.beating = false;
        }
        running.remove(job);
    }

    private void schedule(long nanos) {
        try {
            timer.schedule(this::tick, Math.max(1_000_000, nanos), TimeUnit.NANOSECONDS);
        } catch (RuntimeException e) {
            scheduled.set(false); // closed
        }
    }

    private void tick() {
        long next = interval;
        try {
            long now = System.nanoTime();
            next = Long.MAX_VALUE;
            for (Job job : running) {
                if (job.beatDue - now <= 0) {
                    beat(job);
                    job.beatDue = System.nanoTime() + interval;
                }
                next = Math.min(next, job.beatDue - System.nanoTime());
            }
        } finally {
            scheduled.set(false);
            if (!running.isEmpty() && scheduled.compareAndSet(false, true)) schedule(next == Long.MAX_VALUE ? interval : next);
        }
    }

    private void beat(Job job) {
        synchronized (job) {
            if (!job.beating || job.lost()) return;
            Throwable error = null;
            try {
                // Bounded, so that a reply that never comes cannot hold up stop() (and the DONE after it).
                core.transport.send(core.wire.extend(job.recordKey, job.token, core.options.lease()))
                        .get(core.options.lease().toMillis(), TimeUnit.MILLISECONDS);
            } catch (ExecutionException e) {
                error = Core.unwrap(e);
            } catch (TimeoutException | RuntimeException e) {
                error = e;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
            core.onExtend(job, error);
        }
    }

    /** @return the timer's threads (0 or 1) */
    int threads() {
        return timer.getPoolSize();
    }

    /** @return how many times the timer was set since the instance was made */
    long timersScheduled() {
        return timer.getTaskCount();
    }

    @Override
    public void close() {
        timer.shutdownNow();
    }
}
