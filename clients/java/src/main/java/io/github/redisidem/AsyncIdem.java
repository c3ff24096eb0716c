package io.github.redisidem;

import io.github.redisidem.transport.Transport;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Executor;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.TimeUnit;

/**
 * The consumer loop without blocking a thread, for Lettuce's async API (or
 * any {@link Transport}): the same decisions as {@link Idem} (one
 * {@code ProcessFlow} per key), driven by futures. Continuations run on the
 * common pool, never on the client's I/O threads.
 *
 * <pre>{@code
 * AsyncIdem idem = new AsyncIdem(LettuceTransport.of(RedisClient.create(), RedisURI.create("redis://127.0.0.1")));
 * idem.process("order:1001", Receipt.class, job -> chargeAsync(order, job.attempt())).thenAccept(out -> ack(message));
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

    /** @return the settings */
    public IdemOptions options() {
        return core.options;
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
     * @return the outcome, or the failure (the work's own, or one of the library's errors)
     */
    public CompletableFuture<Outcome<Object>> process(String key, AsyncWork<?> work) {
        return run(key, null, core.options.codec(), work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param work the work
     * @return the outcome
     */
    public CompletableFuture<Outcome<Object>> process(String key, byte[] payload, AsyncWork<?> work) {
        return run(key, payload, core.options.codec(), work);
    }

    /**
     * @param key the key
     * @param type the result's class (a replay decoded into it)
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, Class<T> type, AsyncWork<? extends T> work) {
        return run(key, null, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param type the result's class
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, byte[] payload, Class<T> type, AsyncWork<? extends T> work) {
        return run(key, payload, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param type the result's generic type
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, TypeRef<T> type, AsyncWork<? extends T> work) {
        return run(key, null, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param type the result's generic type
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, byte[] payload, TypeRef<T> type, AsyncWork<? extends T> work) {
        return run(key, payload, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param codec how this call's result is stored and replayed
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, Codec<T> codec, AsyncWork<? extends T> work) {
        return run(key, null, codec, work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param codec how this call's result is stored and replayed
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     */
    public <T> CompletableFuture<Outcome<T>> process(String key, byte[] payload, Codec<T> codec, AsyncWork<? extends T> work) {
        return run(key, payload, codec, work);
    }

    private <T> CompletableFuture<Outcome<T>> run(String key, byte[] payload, Codec<T> codec, AsyncWork<? extends T> work) {
        ProcessFlow<T> flow = new ProcessFlow<>(core, key, payload, codec, core.options.waitFor());
        return CompletableFuture.supplyAsync(flow::start, executor).thenCompose(step -> drive(flow, step, work));
    }

    private <T> CompletableFuture<Outcome<T>> drive(ProcessFlow<T> flow, Step step, AsyncWork<? extends T> work) {
        if (step instanceof Step.Finish finish) {
            Result result = finish.result();
            return result.error() == null ? CompletableFuture.completedFuture(result.outcome()) : CompletableFuture.failedFuture(result.error());
        }
        CompletableFuture<Step> next;
        if (step instanceof Step.Sleep sleep) {
            Executor later = CompletableFuture.delayedExecutor(sleep.pause().toMillis(), TimeUnit.MILLISECONDS, executor);
            next = CompletableFuture.supplyAsync(flow::afterSleep, later);
        } else if (step instanceof Step.Run run) {
            Job job = run.job();
            core.heartbeat.start(job);
            CompletableFuture<? extends T> result;
            try {
                CompletionStage<? extends T> stage = work.run(job);
                result = stage.toCompletableFuture();
            } catch (Throwable e) {
                result = CompletableFuture.failedFuture(e);
            }
            next = result.handleAsync((v, e) -> {
                core.heartbeat.stop(job);
                return e == null ? flow.onWorkReturned(v) : flow.onWorkFailed(Core.unwrap(e));
            }, executor);
        } else {
            next = core.answerAsync(step).thenApplyAsync(flow::onAnswer, executor);
        }
        return next.thenCompose(s -> drive(flow, s, work));
    }

    /**
     * As {@link Idem#processMany(List, Work)}: the works of the granted keys run side by side.
     *
     * @param keys the keys
     * @param work the work, called once per granted key
     * @return one item per key, in order
     */
    public CompletableFuture<List<BatchItem<Object>>> processMany(List<String> keys, AsyncWork<?> work) {
        return Many.async(core, keys, null, core.options.codec(), work, executor);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param work the work
     * @return one item per key, in order
     */
    public CompletableFuture<List<BatchItem<Object>>> processMany(List<String> keys, List<byte[]> payloads, AsyncWork<?> work) {
        return Many.async(core, keys, payloads, core.options.codec(), work, executor);
    }

    /**
     * @param keys the keys
     * @param type the results' class
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     */
    public <T> CompletableFuture<List<BatchItem<T>>> processMany(List<String> keys, Class<T> type, AsyncWork<? extends T> work) {
        return Many.async(core, keys, null, core.codec(type), work, executor);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param type the results' class
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     */
    public <T> CompletableFuture<List<BatchItem<T>>> processMany(List<String> keys, List<byte[]> payloads, Class<T> type,
                                                                  AsyncWork<? extends T> work) {
        return Many.async(core, keys, payloads, core.codec(type), work, executor);
    }

    /**
     * @param keys the keys
     * @param type the results' generic type
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     */
    public <T> CompletableFuture<List<BatchItem<T>>> processMany(List<String> keys, TypeRef<T> type, AsyncWork<? extends T> work) {
        return Many.async(core, keys, null, core.codec(type), work, executor);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param type the results' generic type
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     */
    public <T> CompletableFuture<List<BatchItem<T>>> processMany(List<String> keys, List<byte[]> payloads, TypeRef<T> type,
                                                                  AsyncWork<? extends T> work) {
        return Many.async(core, keys, payloads, core.codec(type), work, executor);
    }

    /**
     * @param keys the keys
     * @param codec how the results are stored and replayed
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     */
    public <T> CompletableFuture<List<BatchItem<T>>> processMany(List<String> keys, Codec<T> codec, AsyncWork<? extends T> work) {
        return Many.async(core, keys, null, codec, work, executor);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param codec how the results are stored and replayed
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     */
    public <T> CompletableFuture<List<BatchItem<T>>> processMany(List<String> keys, List<byte[]> payloads, Codec<T> codec,
                                                                  AsyncWork<? extends T> work) {
        return Many.async(core, keys, payloads, codec, work, executor);
    }

    /** Stops the heartbeat's timer; the transport is the caller's to close. */
    @Override
    public void close() {
        core.close();
    }
}
