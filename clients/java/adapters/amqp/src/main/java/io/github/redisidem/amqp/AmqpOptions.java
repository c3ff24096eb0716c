package io.github.redisidem.amqp;

import io.github.redisidem.Idem;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;
import java.util.function.Function;
import org.springframework.amqp.core.Message;

/**
 * The settings {@link IdempotentListener} and {@link IdempotentAdvice} share: how a message's key is found and
 * how it is given back.
 *
 * @param <B> the builder
 */
public abstract class AmqpOptions<B extends AmqpOptions<B>> {
    /** The longest delay a failure is given back with. */
    public static final Duration MAX_RETRY_DELAY = Duration.ofSeconds(30);
    static final Duration MIN_DELAY = Duration.ofMillis(100);

    final Idem idem;
    Function<Message, String> key = m -> m.getMessageProperties().getMessageId();
    Function<Message, byte[]> payload;
    Duration retryDelay = MIN_DELAY;
    List<Duration> retryQueues = defaultRetryQueues();
    String queue;
    Consumer<Throwable> onError;

    AmqpOptions(Idem idem) {
        this.idem = Objects.requireNonNull(idem, "idem");
    }

    @SuppressWarnings("unchecked")
    private B self() {
        return (B) this;
    }

    private static List<Duration> defaultRetryQueues() {
        List<Duration> out = new ArrayList<>();
        for (Duration d = MIN_DELAY; d.compareTo(MAX_RETRY_DELAY.multipliedBy(2)) <= 0; d = d.multipliedBy(2)) out.add(d);
        return out;
    }

    /** @param v the message's key; default its {@code message_id} (null or empty: a dead letter) @return this */
    public B key(Function<Message, String> v) {
        key = Objects.requireNonNull(v);
        return self();
    }

    /** @param v the message's PAYLOAD (a key seen again with another one is a dead letter, Mismatch); default none @return this */
    public B payload(Function<Message, byte[]> v) {
        payload = v;
        return self();
    }

    /** @param v how long a failed message first waits before it comes again (doubling, at most 30 s); default 100 ms @return this */
    public B retryDelay(Duration v) {
        if (v.toMillis() < 1) throw new IllegalArgumentException("retryDelay must be at least 1 ms");
        retryDelay = v;
        return self();
    }

    /** @param v the retry queues' delays (each queue {@code <queue>.retry.<ms>}); default 100 ms doubling to 51.2 s @return this */
    public B retryQueues(List<Duration> v) {
        if (v.isEmpty()) throw new IllegalArgumentException("at least one retry queue");
        for (Duration d : v) if (d.toMillis() < 1) throw new IllegalArgumentException("a retry queue's delay must be at least 1 ms: " + d);
        retryQueues = List.copyOf(v);
        return self();
    }

    /** @param v the queue, when the container does not tell it (it does: the consumer queue) @return this */
    public B queue(String v) {
        queue = v;
        return self();
    }

    /** @param v told what could not be done (a retry copy); default nothing @return this */
    public B onError(Consumer<Throwable> v) {
        onError = v;
        return self();
    }
}
