package io.github.redisidem;

import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.transport.Transport;
import java.time.Duration;
import java.util.List;
import java.util.function.UnaryOperator;

/**
 * The consumer loop over a {@link Transport} (Jedis or Lettuce, a server, a
 * Sentinel-watched primary or a cluster), for any number of threads.
 *
 * <pre>{@code
 * Idem idem = new Idem(JedisTransport.of(RedisClient.create("127.0.0.1", 6379)),
 *         IdemOptions.builder().prefix("shop:").build());
 * Outcome<Receipt> out = idem.process("order:1001", Receipt.class, job -> charge(order, job.attempt()));
 * }</pre>
 *
 * <p>{@code process} runs the work at most once per key while its record
 * lives (docs/clients.md, "What process does"). Given a {@code Class<T>},
 * a {@link TypeRef} or a {@link Codec}, a replay decodes the stored result
 * into that type, as a first run returns it; without one, a replay is the
 * codec's plain decoding (JSON: a {@code Map}, a {@code List}, ...). The
 * work's own checked exceptions reach the caller unwrapped (the claim was
 * released); the library's errors are in {@code io.github.redisidem.exceptions}.
 */
public final class Idem implements AutoCloseable {
    final Core core;
    private final IdemCommands commands;

    /**
     * With the defaults; asks the server which edition it has.
     *
     * @param transport the client
     */
    public Idem(Transport transport) {
        this(transport, IdemOptions.defaults());
    }

    /**
     * @param transport the client
     * @param options the settings
     */
    public Idem(Transport transport, IdemOptions options) {
        this(new Core(transport, options));
    }

    private Idem(Core core) {
        this.core = core;
        this.commands = new IdemCommands(core);
    }

    /**
     * Another instance on the same client and edition with some settings
     * changed (its own counters and heartbeat; close it too):
     * {@code idem.with(o -> o.waitFor(Duration.ZERO))}.
     *
     * @param change the settings to change, on a builder holding this instance's
     * @return the instance
     */
    public Idem with(UnaryOperator<IdemOptions.Builder> change) {
        return new Idem(new Core(core.transport, change.apply(core.options.toBuilder()).edition(core.wire.edition).build()));
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

    /** @return the typed commands (the server's commands as they are) */
    public IdemCommands commands() {
        return commands;
    }

    /**
     * Runs {@code work} at most once for {@code key}; a replay is the codec's plain decoding of the stored result.
     *
     * @param key the business key (the prefix goes before it)
     * @param work the work
     * @return the work's value, or the stored one on a replay
     * @throws Exception the work's own failure (the claim was released), or one of the library's errors
     */
    public Outcome<Object> process(String key, Work<?> work) throws Exception {
        return run(key, null, core.options.codec(), work);
    }

    /**
     * As {@link #process(String, Work)}, with a payload: the same key with another payload is {@link MismatchException}.
     *
     * @param key the key
     * @param payload PAYLOAD (its fingerprint is stored)
     * @param work the work
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public Outcome<Object> process(String key, byte[] payload, Work<?> work) throws Exception {
        return run(key, payload, core.options.codec(), work);
    }

    /**
     * Runs {@code work} at most once for {@code key}; a replay decodes the stored result into {@code type}.
     *
     * @param key the key
     * @param type the result's class ({@code long.class}: a {@code Long} both times)
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public <T> Outcome<T> process(String key, Class<T> type, Work<? extends T> work) throws Exception {
        return run(key, null, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param type the result's class
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public <T> Outcome<T> process(String key, byte[] payload, Class<T> type, Work<? extends T> work) throws Exception {
        return run(key, payload, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param type the result's generic type ({@code new TypeRef<List<Receipt>>() {}})
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public <T> Outcome<T> process(String key, TypeRef<T> type, Work<? extends T> work) throws Exception {
        return run(key, null, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param type the result's generic type
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public <T> Outcome<T> process(String key, byte[] payload, TypeRef<T> type, Work<? extends T> work) throws Exception {
        return run(key, payload, core.codec(type), work);
    }

    /**
     * @param key the key
     * @param codec how this call's result is stored and replayed
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public <T> Outcome<T> process(String key, Codec<T> codec, Work<? extends T> work) throws Exception {
        return run(key, null, codec, work);
    }

    /**
     * @param key the key
     * @param payload PAYLOAD
     * @param codec how this call's result is stored and replayed
     * @param work the work
     * @param <T> the result's type
     * @return the outcome
     * @throws Exception as {@link #process(String, Work)}
     */
    public <T> Outcome<T> process(String key, byte[] payload, Codec<T> codec, Work<? extends T> work) throws Exception {
        return run(key, payload, codec, work);
    }

    private <T> Outcome<T> run(String key, byte[] payload, Codec<T> codec, Work<? extends T> work) throws Exception {
        ProcessFlow<T> flow = new ProcessFlow<>(core, key, payload, codec, core.options.waitFor());
        Step step = flow.start();
        while (true) {
            if (step instanceof Step.Run run) {
                Job job = run.job();
                T value;
                core.heartbeat.start(job);
                try {
                    value = work.run(job);
                } catch (Throwable e) {
                    core.heartbeat.stop(job);
                    step = flow.onWorkFailed(e);
                    continue;
                }
                core.heartbeat.stop(job);
                step = flow.onWorkReturned(value);
            } else if (step instanceof Step.Sleep sleep) {
                Thread.sleep(sleep.pause().toMillis());
                step = flow.afterSleep();
            } else if (step instanceof Step.Finish finish) {
                Result result = finish.result();
                if (result.error() != null) throw Idem.<RuntimeException>sneaky(result.error());
                return result.outcome();
            } else {
                step = flow.onAnswer(core.answer(step));
            }
        }
    }

    /** The work's own failure, checked or not, as it is. */
    @SuppressWarnings("unchecked")
    static <E extends Throwable> E sneaky(Throwable e) throws E {
        throw (E) e;
    }

    /**
     * Claims every key in one batch, runs the work for each granted key (one
     * heartbeat for the batch), completes the successes in one DONE batch and
     * releases the failures in one RELEASE batch; a busy key is not waited
     * for. Every promise of {@code process} holds per key (a lost DONE reply
     * resent and confirmed, {@code DoneUnconfirmedException} in its item).
     *
     * @param keys the keys
     * @param work the work, called once per granted key
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public List<BatchItem<Object>> processMany(List<String> keys, Work<?> work) throws InterruptedException {
        return Many.blocking(core, keys, null, core.options.codec(), work);
    }

    /**
     * @param keys the keys
     * @param payloads one per key
     * @param work the work
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public List<BatchItem<Object>> processMany(List<String> keys, List<byte[]> payloads, Work<?> work) throws InterruptedException {
        return Many.blocking(core, keys, payloads, core.options.codec(), work);
    }

    /**
     * @param keys the keys
     * @param type the results' class (replays decoded into it)
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, Class<T> type, Work<? extends T> work) throws InterruptedException {
        return Many.blocking(core, keys, null, core.codec(type), work);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param type the results' class
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, List<byte[]> payloads, Class<T> type, Work<? extends T> work)
            throws InterruptedException {
        return Many.blocking(core, keys, payloads, core.codec(type), work);
    }

    /**
     * @param keys the keys
     * @param type the results' generic type
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, TypeRef<T> type, Work<? extends T> work) throws InterruptedException {
        return Many.blocking(core, keys, null, core.codec(type), work);
    }

    /**
     * @param keys the keys
     * @param codec how the results are stored and replayed
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, Codec<T> codec, Work<? extends T> work) throws InterruptedException {
        return Many.blocking(core, keys, null, codec, work);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param type the results' generic type
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, List<byte[]> payloads, TypeRef<T> type, Work<? extends T> work)
            throws InterruptedException {
        return Many.blocking(core, keys, payloads, core.codec(type), work);
    }

    /**
     * @param keys the keys
     * @param payloads one per key, or null
     * @param codec how the results are stored and replayed
     * @param work the work
     * @param <T> the results' type
     * @return one item per key, in order
     * @throws InterruptedException while a pause between resends
     */
    public <T> List<BatchItem<T>> processMany(List<String> keys, List<byte[]> payloads, Codec<T> codec, Work<? extends T> work)
            throws InterruptedException {
        return Many.blocking(core, keys, payloads, codec, work);
    }

    /**
     * Claims many keys with the instance's settings (MAXTRIES, BLOOM, OWNER,
     * durable): on the module one IDEM.MCLAIM per slot and 10,000 keys, on
     * the Functions edition one claim per key, pipelined.
     *
     * @param keys the keys
     * @param lease whole seconds
     * @return one answer per key, in order; a key's error is its element's
     */
    public List<Reply<Claim>> claimMany(List<String> keys, Duration lease) {
        return Helpers.claimMany(core, keys, lease, null);
    }

    /**
     * @param keys the keys
     * @param lease whole seconds
     * @param payloads one per key (each stored as its key's fingerprint), or null
     * @return one answer per key, in order; with {@code durable} a key granted but not acknowledged is released and its error
     *     NotDurable at CLAIM, a key answered DONE whose WAIT fell short is NotDurable at DONE with the stored bytes as its
     *     {@code result()} (nothing released)
     */
    public List<Reply<Claim>> claimMany(List<String> keys, Duration lease, List<byte[]> payloads) {
        return Helpers.claimMany(core, keys, lease, payloads);
    }

    /**
     * Completes many claims with the instance's retention, split as {@link #claimMany(List, Duration)}.
     *
     * @param items the items (a null result: none stored)
     * @return one answer per item, in order
     */
    public List<Reply<Done>> doneMany(List<DoneItem> items) {
        return Helpers.doneMany(core, items, core.options.retain());
    }

    /**
     * @param items the items
     * @param retain how long the done records are kept (whole seconds), or null for the server's
     * @return one answer per item, in order; a completion not acknowledged ({@code durable}) has the error NotDurable
     */
    public List<Reply<Done>> doneMany(List<DoneItem> items, Duration retain) {
        return Helpers.doneMany(core, items, retain);
    }

    /**
     * Gives many claims back, split as {@link #claimMany(List, Duration)}.
     *
     * @param items the items
     * @return one answer per item (true: released), in order
     */
    public List<Reply<Boolean>> releaseMany(List<ReleaseItem> items) {
        return Helpers.releaseMany(core, items);
    }

    /** Stops the heartbeat's timer; the transport is the caller's to close. */
    @Override
    public void close() {
        core.close();
    }
}
