package io.github.redisidem;

import io.github.redisidem.exceptions.IdemException;
import io.github.redisidem.exceptions.NotInstalledException;
import io.github.redisidem.exceptions.ServerException;
import io.github.redisidem.exceptions.StaleException;
import io.github.redisidem.transport.RedisCommand;
import io.github.redisidem.transport.Transport;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;

/**
 * What a front end ({@link Idem}, {@link AsyncIdem}) holds, resolved once
 * when it is made: the transport, the edition's wire, the settings, the
 * counters, the heartbeat, the batches and the lanes concurrent calls share.
 */
final class Core implements AutoCloseable {
    final Transport transport;
    final IdemOptions options;
    final Wire wire;
    final Counters counters = new Counters();
    final Heartbeat heartbeat;
    final Batches batches;
    private final Lane<Step.Claim> claims;
    private final Lane<Step.Done> dones;
    private final ConcurrentHashMap<Object, Codec<?>> typed = new ConcurrentHashMap<>();

    Core(Transport transport, IdemOptions options) {
        this.transport = transport;
        this.options = options;
        this.wire = new Wire(options.edition() != null ? options.edition() : detect(transport));
        this.heartbeat = new Heartbeat(this);
        this.batches = new Batches(this);
        this.claims = options.batch() ? new Lane<>(ops -> batches.claims(ops, true)) : null;
        this.dones = options.batch() ? new Lane<>(ops -> batches.dones(ops, true)) : null;
    }

    /** COMMAND INFO IDEM.CLAIM, then FCALL_RO idem_edition 0 (docs/functions.md). */
    static Edition detect(Transport transport) {
        Object info = join(transport.send(new RedisCommand("COMMAND", null, List.of(Wire.bytes("INFO"), Wire.bytes("IDEM.CLAIM")))));
        if (info instanceof List<?> l && !l.isEmpty() && l.get(0) != null) return Edition.MODULE;
        try {
            join(transport.send(new RedisCommand("FCALL_RO", null, List.of(Wire.bytes("idem_edition"), Wire.bytes(0)))));
            return Edition.FUNCTIONS;
        } catch (ServerException e) {
            throw new NotInstalledException("neither the redis-idem module nor its Functions edition is on the server: " + e.getMessage());
        }
    }

    /** The instance's codec for results of this class, made once. */
    @SuppressWarnings("unchecked")
    <T> Codec<T> codec(Class<T> type) {
        return (Codec<T>) typed.computeIfAbsent(type, t -> options.codec().as(type));
    }

    /** The instance's codec for results of this generic type, made once. */
    @SuppressWarnings("unchecked")
    <T> Codec<T> codec(TypeRef<T> type) {
        return (Codec<T>) typed.computeIfAbsent(type, t -> options.codec().as(type));
    }

    /** A step's command, answered; concurrent claims and DONEs share a batch per tick (blocking until the answer). */
    Answer answer(Step op) {
        if (claims != null && op instanceof Step.Claim c && c.waitFor() == null) return claims.blocking(c);
        if (dones != null && op instanceof Step.Done d) return dones.blocking(d);
        return batches.one(op).join();
    }

    /** As {@link #answer}, without blocking a thread. */
    CompletableFuture<Answer> answerAsync(Step op) {
        if (claims != null && op instanceof Step.Claim c && c.waitFor() == null) return claims.async(c);
        if (dones != null && op instanceof Step.Done d) return dones.async(d);
        return batches.one(op);
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
        t = unwrap(t);
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
            counters.leasesLost.increment();
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
        if (error == null) counters.extensions.increment();
        else if (error instanceof StaleException) lost(job);
    }

    /** Stops the heartbeat's timer. */
    @Override
    public void close() {
        heartbeat.close();
    }
}
