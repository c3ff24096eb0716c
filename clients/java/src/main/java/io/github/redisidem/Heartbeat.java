package io.github.redisidem;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * EXTENDs every interval while work runs, on the instance's scheduled
 * executor. {@link #stop} returns only after a beat in flight has ended, so
 * no EXTEND follows the DONE (it would answer STALE and look like a lost lease).
 */
final class Heartbeat implements AutoCloseable {
    private final Core core;
    private final List<Job> jobs;
    private final ScheduledFuture<?> future;
    private boolean stopped;

    private Heartbeat(Core core, List<Job> jobs, Duration interval) {
        this.core = core;
        this.jobs = jobs;
        long ms = Math.max(1, interval.toMillis());
        this.future = interval.isZero() || jobs.isEmpty() ? null
                : core.scheduler.scheduleWithFixedDelay(this::beat, ms, ms, TimeUnit.MILLISECONDS);
    }

    static Heartbeat start(Core core, List<Job> jobs) {
        return new Heartbeat(core, jobs, core.options.heartbeatInterval());
    }

    private synchronized void beat() {
        for (Job job : jobs) {
            if (stopped) return;
            if (job.lost()) continue;
            Throwable error = null;
            try {
                // Bounded, so that a reply that never comes cannot hold up stop() (and the DONE after it).
                core.transport.send(core.wire.extend(job.recordKey, job.token, core.options.lease()))
                        .get(core.options.lease().toMillis(), TimeUnit.MILLISECONDS);
            } catch (ExecutionException e) {
                Throwable cause = Core.unwrap(e);
                error = cause instanceof ServerException ? ServerException.of(cause.getMessage()) : cause;
            } catch (TimeoutException | RuntimeException e) {
                // Never thrown on: an exception would end the periodic beat for good.
                error = e;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
            core.onExtend(job, error);
        }
    }

    @Override
    public void close() {
        if (future != null) future.cancel(false);
        synchronized (this) {
            stopped = true;
        }
    }
}
