package io.github.redisidem;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;

/** What an {@link Idem} and an {@link AsyncIdem} share: the transport, the edition's wire, the options, the counters. */
final class Core {
    final Transport transport;
    final IdemOptions options;
    final Wire wire;
    final Counters counters = new Counters();
    final ScheduledExecutorService scheduler;

    Core(Transport transport, IdemOptions options) {
        this.transport = transport;
        this.options = options;
        this.wire = new Wire(options.edition() != null ? options.edition() : detect(transport));
        ScheduledThreadPoolExecutor pool = new ScheduledThreadPoolExecutor(2, r -> {
            Thread t = new Thread(r, "redis-idem-heartbeat");
            t.setDaemon(true);
            return t;
        });
        pool.setRemoveOnCancelPolicy(true);
        this.scheduler = pool;
    }

    /** COMMAND INFO IDEM.CLAIM, then FCALL_RO idem_edition 0 (docs/functions.md). */
    static Edition detect(Transport transport) {
        Object info = join(transport.send(new RedisCommand("COMMAND", null, List.of(Wire.bytes("INFO"), Wire.bytes("IDEM.CLAIM")), null)));
        if (info instanceof List<?> l && !l.isEmpty() && l.get(0) != null) return Edition.MODULE;
        try {
            join(transport.send(new RedisCommand("FCALL_RO", null, List.of(Wire.bytes("idem_edition"), Wire.bytes(0)), null)));
            return Edition.FUNCTIONS;
        } catch (ServerException e) {
            throw new NotInstalledException("neither the redis-idem module nor its Functions edition is on the server: " + e.getMessage());
        }
    }

    /** A reply, or the transport's failure as it is (not wrapped). */
    static <T> T join(CompletableFuture<T> future) {
        try {
            return future.get();
        } catch (ExecutionException e) {
            throw rethrow(e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IdemException("interrupted", e);
        }
    }

    static RuntimeException rethrow(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) t = t.getCause();
        if (t instanceof RuntimeException r) return r;
        if (t instanceof Error e) throw e;
        return new IdemException(t.toString(), t);
    }

    static Throwable unwrap(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) t = t.getCause();
        return t;
    }

    /** A lease found lost: counted and told once per job. */
    void lost(Job job) {
        if (job.markLost()) {
            counters.leasesLost.incrementAndGet();
            quietly(() -> options.hooks().onLeaseLost(job));
        }
    }

    /** A hook called after the outcome is settled: what it raises is ignored. */
    void quietly(Runnable hook) {
        try {
            hook.run();
        } catch (RuntimeException ignored) {
            // docs/clients.md: only onRun and onDone raising changes the outcome.
        }
    }

    /** The heartbeat's EXTEND answer: STALE is a lost lease; a connection error waits for the next beat. */
    void onExtend(Job job, Throwable error) {
        if (error == null) counters.extendsOk.incrementAndGet();
        else if (error instanceof StaleException) lost(job);
    }
}
