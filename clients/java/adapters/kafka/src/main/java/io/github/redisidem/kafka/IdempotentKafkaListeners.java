package io.github.redisidem.kafka;

import io.github.redisidem.Idem;
import io.github.redisidem.Job;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.MismatchException;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;
import org.springframework.kafka.config.ContainerCustomizer;
import org.springframework.kafka.listener.AbstractMessageListenerContainer;
import org.springframework.kafka.listener.BackOffHandler;
import org.springframework.kafka.listener.ConsumerRecordRecoverer;
import org.springframework.kafka.listener.DefaultBackOffHandler;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.ListenerContainerPauseService;
import org.springframework.kafka.listener.MessageListenerContainer;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.util.backoff.FixedBackOff;

/**
 * Spring Kafka's listeners through an {@link Idem}, by configuration: a {@code @KafkaListener}
 * (or any record listener of a container) runs inside {@code Idem.process}, keyed by the record's
 * key, and Spring's own error handling does the rest.
 *
 * <pre>{@code
 * IdempotentKafkaListeners idempotent = new IdempotentKafkaListeners(idem);
 * factory.setContainerCustomizer(idempotent.customizer());
 * factory.setCommonErrorHandler(idempotent.errorHandler(new DeadLetterPublishingRecoverer(template)));
 * }</pre>
 *
 * <ul>
 * <li>Done or a replay: the listener returns (a replay without running the method); the container
 * commits as its {@code AckMode} says.</li>
 * <li>Busy, a failed work (released), DONE unconfirmed, a lost lease, not durable: the exception
 * goes to the error handler, which seeks the partition back to the record and backs off (Busy: the
 * holder's lease left); with {@link #pausingPartitions} only that partition waits.</li>
 * <li>Exhausted, Mismatch, a record without a key: not retryable, so the recoverer (Spring's
 * {@code DeadLetterPublishingRecoverer}: {@code <topic>-dlt}, same partition, {@code kafka_dlt-*}
 * headers) publishes it, and the container commits it.</li>
 * </ul>
 */
public final class IdempotentKafkaListeners {
    private static final ThreadLocal<Job> CURRENT = new ThreadLocal<>();
    /** The partition of the record a listener just held back, for the back-off on the same thread. */
    private static final ThreadLocal<TopicPartition> HELD = new ThreadLocal<>();

    private final Idem idem;
    private final Function<ConsumerRecord<?, ?>, String> key;
    private final Duration retryDelay;
    private final AtomicLong acknowledged = new AtomicLong();
    private final AtomicLong heldBack = new AtomicLong();
    private final AtomicLong deadLettered = new AtomicLong();

    /**
     * Keyed by the record's key ({@link IdempotentConsumerOptions#recordKey}); failures back off
     * 100 ms at a time.
     *
     * @param idem the Idem the records run through
     */
    public IdempotentKafkaListeners(Idem idem) {
        this(idem, IdempotentConsumerOptions::recordKey, Duration.ofMillis(100));
    }

    /**
     * @param idem the Idem the records run through
     * @param key the record's key in the Idem; throwing, or answering null or "", is a
     *     {@link MissingKeyException} (dead-lettered)
     * @param retryDelay the error handler's back-off between failed deliveries of a record
     */
    public IdempotentKafkaListeners(Idem idem, Function<ConsumerRecord<?, ?>, String> key, Duration retryDelay) {
        this.idem = idem;
        this.key = key;
        this.retryDelay = retryDelay;
    }

    /**
     * The job of the record whose listener runs on this thread (its {@code attempt()} is the fence
     * for the listener's writes), or null outside one.
     *
     * @return the current job
     */
    public static Job currentJob() {
        return CURRENT.get();
    }

    /** @return the Idem's counters and the listeners' */
    public KafkaStats stats() {
        return new KafkaStats(idem.stats(), acknowledged.get(), heldBack.get(), deadLettered.get());
    }

    /**
     * For {@code factory.setContainerCustomizer(...)}: wraps each container's record listener
     * (a {@code @KafkaListener} method's adapter too).
     *
     * @param <K> the records' key type
     * @param <V> the records' value type
     * @param <C> the container type
     * @return the customizer
     */
    public <K, V, C extends AbstractMessageListenerContainer<K, V>> ContainerCustomizer<K, V, C> customizer() {
        return container -> container.setupMessageListener(wrap(container.getContainerProperties().getMessageListener()));
    }

    /**
     * @param <K> the records' key type
     * @param <V> the records' value type
     * @param listener a record listener
     * @return it, run through the Idem
     */
    @SuppressWarnings("unchecked")
    public <K, V> MessageListener<K, V> wrap(Object listener) {
        if (listener instanceof IdempotentRecordListener<?, ?> already) {
            return (MessageListener<K, V>) already;
        }
        if (!(listener instanceof MessageListener<?, ?> record)) {
            throw new IllegalArgumentException("redis-idem runs record listeners, not " + listener.getClass().getName()
                    + " (a batch listener: give its records one at a time)");
        }
        return new IdempotentRecordListener<>((MessageListener<K, V>) record, this);
    }

    /**
     * Spring's {@link DefaultErrorHandler} for these listeners: every failure retried (the Idem's
     * {@code maxTries} decides when a record is exhausted), Busy after the holder's lease left,
     * Exhausted / Mismatch / a missing key straight to the recoverer. The thread backs off
     * (Spring's default); see {@link #errorHandler(ConsumerRecordRecoverer, BackOffHandler)}.
     *
     * @param recoverer a {@code DeadLetterPublishingRecoverer} (Spring Kafka 4: {@code <topic>-dlt})
     * @return the error handler
     */
    public DefaultErrorHandler errorHandler(ConsumerRecordRecoverer recoverer) {
        return errorHandler(recoverer, null);
    }

    /**
     * @param recoverer a {@code DeadLetterPublishingRecoverer}
     * @param backOffHandler {@link #pausingPartitions}: a partition held back is paused while the
     *     container's other partitions go on (null: Spring's default, the thread sleeps)
     * @return the error handler
     */
    public DefaultErrorHandler errorHandler(ConsumerRecordRecoverer recoverer, BackOffHandler backOffHandler) {
        ConsumerRecordRecoverer counted = (record, e) -> {
            recoverer.accept(record, e);
            deadLettered.incrementAndGet();
        };
        FixedBackOff failures = new FixedBackOff(retryDelay.toMillis(), FixedBackOff.UNLIMITED_ATTEMPTS);
        DefaultErrorHandler handler = backOffHandler == null ? new DefaultErrorHandler(counted, failures)
                : new DefaultErrorHandler(counted, failures, backOffHandler);
        handler.addNotRetryableExceptions(ExhaustedException.class, MismatchException.class, MissingKeyException.class);
        handler.setResetStateOnExceptionChange(true);
        handler.setBackOffFunction((record, e) -> {
            BusyException busy = cause(e, BusyException.class);
            if (busy == null) {
                return null;
            }
            Duration wait = busy.leaseLeft().compareTo(Decision.MIN_DELAY) < 0 ? Decision.MIN_DELAY : busy.leaseLeft();
            return new FixedBackOff(wait.toMillis(), FixedBackOff.UNLIMITED_ATTEMPTS);
        });
        return handler;
    }

    /**
     * A back-off that pauses only the partition of the record held back, for the back-off's time,
     * while the container's other partitions go on (Spring's {@code ContainerPausingBackOffHandler}
     * pauses the whole container for a record listener); any other back-off sleeps, as Spring's
     * default does.
     *
     * @param pauser Spring's pause service ({@code new ListenerContainerPauseService(registry, scheduler)})
     * @return the back-off handler, for {@link #errorHandler(ConsumerRecordRecoverer, BackOffHandler)}
     */
    public static BackOffHandler pausingPartitions(ListenerContainerPauseService pauser) {
        DefaultBackOffHandler sleeping = new DefaultBackOffHandler();
        return new BackOffHandler() {
            @Override
            public void onNextBackOff(MessageListenerContainer container, Exception e, long millis) {
                TopicPartition tp = HELD.get();
                HELD.remove();
                if (tp == null) {
                    sleeping.onNextBackOff(container, e, millis);
                } else {
                    pauser.pausePartition(container, tp, Duration.ofMillis(millis));
                }
            }

            @Override
            public void onNextBackOff(MessageListenerContainer container, TopicPartition tp, long millis) {
                pauser.pausePartition(container, tp, Duration.ofMillis(millis));
            }
        };
    }

    static void heldBack(TopicPartition tp) {
        if (tp == null) {
            HELD.remove();
        } else {
            HELD.set(tp);
        }
    }

    // -- for IdempotentRecordListener ----------------------------------------------

    Idem idem() {
        return idem;
    }

    String keyOf(ConsumerRecord<?, ?> record) {
        String k;
        try {
            k = key.apply(record);
        } catch (MissingKeyException e) {
            throw e;
        } catch (RuntimeException e) {
            throw new MissingKeyException("the key function failed on " + record.topic() + "-" + record.partition()
                    + "@" + record.offset() + ": " + e, e);
        }
        if (k == null || k.isEmpty()) {
            throw new MissingKeyException("the key function answered no key for " + record.topic() + "-"
                    + record.partition() + "@" + record.offset(), null);
        }
        return k;
    }

    static Job enter(Job job) {
        Job before = CURRENT.get();
        CURRENT.set(job);
        return before;
    }

    static void leave(Job before) {
        if (before == null) {
            CURRENT.remove();
        } else {
            CURRENT.set(before);
        }
    }

    void count(Decision.Verdict verdict) {
        switch (verdict) {
            case ACK -> acknowledged.incrementAndGet();
            case HOLD -> heldBack.incrementAndGet();
            case DEAD -> { } // counted when the recoverer has published it
        }
    }

    static <T extends Throwable> T cause(Throwable e, Class<T> type) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (type.isInstance(t)) {
                return type.cast(t);
            }
        }
        return null;
    }
}
