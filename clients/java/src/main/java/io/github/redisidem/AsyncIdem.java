package io.github.redisidem;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.TimeUnit;

/**
 * The consumer loop without blocking a thread, for Lettuce's async API (or
 * any {@link Transport}): the same decisions as {@link Idem} (one
 * {@code ProcessFlow}), driven by futures. Continuations run on the common
 * pool, never on the client's I/O threads.
 *
 * <pre>{@code
 * AsyncIdem idem = new AsyncIdem(LettuceTransport.of(RedisClient.create(), RedisURI.create("redis://127.0.0.1")));
 * idem.process("order:1001", job -> chargeAsync(order, job.attempt())).thenAccept(out -> ack(message));
 * }</pre>
 */
public final class AsyncIdem implements AutoCloseable {
    private final Core core;
    private final Executor executor = ForkJoinPool.commonPool();

    /**
     * With the defaults; asks the server which edition it has (blocking, once).
     *
     * @param transport the client
     */
    public AsyncIdem(Transport transport) {
        this(transport, IdemOptions.defaults());
    }

    /**
     * @param transport the client
     * @param options the settings
     */
    public AsyncIdem(Transport transport, IdemOptions options) {
        this.core = new Core(transport, options);
    }

    /** @return the edition in use */
    public Edition edition() {
        return core.wire.edition;
    }

    /** @return the counters so far */
    public Stats stats() {
        return core.counters.snapshot();
    }

    /**
     * As {@link Idem#process(String, Work)}.
     *
     * @param key the key
     * @param work the work
     * @param <T> its result
     * @return the outcome, or the failure (the work's own, or one of the library's errors)
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, AsyncWork<T> work) {
        return process(key, null, work);
    }

    /**
     * As {@link Idem#process(String, byte[], Work)}.
     *
     * @param key the key
     * @param payload PAYLOAD, or null
     * @param work the work
     * @param <T> its result
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, byte[] payload, AsyncWork<T> work) {
        ProcessFlow flow = new ProcessFlow(core, key, payload);
        return CompletableFuture.supplyAsync(flow::start, executor).thenCompose(step -> drive(flow, step, work));
    }

    @SuppressWarnings("unchecked")
    private <T> CompletableFuture<Outcome<T>> drive(ProcessFlow flow, Step step, AsyncWork<T> work) {
        if (step instanceof Step.Send send) {
            CompletableFuture<Object> reply;
            try {
                reply = core.transport.send(send.command());
            } catch (RuntimeException e) {
                reply = CompletableFuture.failedFuture(e);
            }
            return reply.handleAsync((r, e) -> flow.onReply(r, e == null ? null : typed(Core.unwrap(e))), executor)
                    .thenCompose(next -> drive(flow, next, work));
        }
        if (step instanceof Step.Sleep sleep) {
            Executor later = CompletableFuture.delayedExecutor(sleep.pause().toMillis(), TimeUnit.MILLISECONDS, executor);
            return CompletableFuture.supplyAsync(flow::afterSleep, later).thenCompose(next -> drive(flow, next, work));
        }
        if (step instanceof Step.RunWork run) {
            Heartbeat beat = Heartbeat.start(core, java.util.List.of(run.job()));
            CompletableFuture<T> result;
            try {
                result = work.run(run.job()).toCompletableFuture();
            } catch (Exception e) {
                result = CompletableFuture.failedFuture(e);
            }
            return result.handleAsync((v, e) -> {
                beat.close();
                return e == null ? flow.onWorkReturned(v) : flow.onWorkFailed(Core.unwrap(e));
            }, executor).thenCompose(next -> drive(flow, next, work));
        }
        Step.Finish finish = (Step.Finish) step;
        return finish.error() == null ? CompletableFuture.completedFuture((Outcome<T>) finish.outcome())
                : CompletableFuture.failedFuture(finish.error());
    }

    private static Throwable typed(Throwable e) {
        return e instanceof ServerException ? ServerException.of(e.getMessage()) : e;
    }

    /** Stops the heartbeat executor; the transport is the caller's to close. */
    @Override
    public void close() {
        core.scheduler.shutdownNow();
    }
}
