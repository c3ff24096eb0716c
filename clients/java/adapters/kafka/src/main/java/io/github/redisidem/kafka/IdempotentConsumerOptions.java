package io.github.redisidem.kafka;

import io.github.redisidem.Idem;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Objects;
import java.util.function.Function;
import java.util.function.UnaryOperator;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The options of an {@link IdempotentConsumer}: {@code IdempotentConsumerOptions.<K, V>builder()...build()}
 * or {@link #defaults()}.
 *
 * @param <K> the records' key type
 * @param <V> the records' value type
 */
public final class IdempotentConsumerOptions<K, V> {
    private final Function<ConsumerRecord<K, V>, String> key;
    private final Function<ConsumerRecord<K, V>, byte[]> payload;
    private final int workers;
    private final int maxBuffered;
    private final Duration commitInterval;
    private final Duration revokeWait;
    private final Duration retryDelay;
    private final Duration maxRetryDelay;
    private final UnaryOperator<String> deadLetterTopic;
    private final java.util.function.Consumer<Exception> onError;

    private IdempotentConsumerOptions(Builder<K, V> b) {
        key = b.key;
        payload = b.payload;
        workers = b.workers;
        maxBuffered = b.maxBuffered;
        commitInterval = b.commitInterval;
        revokeWait = b.revokeWait;
        retryDelay = b.retryDelay;
        maxRetryDelay = b.maxRetryDelay;
        deadLetterTopic = b.deadLetterTopic;
        onError = b.onError;
    }

    /**
     * @param <K> the records' key type
     * @param <V> the records' value type
     * @return every option at its default
     */
    public static <K, V> IdempotentConsumerOptions<K, V> defaults() {
        return new Builder<K, V>().build();
    }

    /**
     * @param <K> the records' key type
     * @param <V> the records' value type
     * @return a builder with every option at its default
     */
    public static <K, V> Builder<K, V> builder() {
        return new Builder<>();
    }

    /**
     * The default key: the record's key, a {@code String} or UTF-8 {@code byte[]} (a producer's
     * retry keeps it, unlike the offset).
     *
     * @param record the record
     * @return its key
     * @throws MissingKeyException the record has none, or one of another type
     */
    public static String recordKey(ConsumerRecord<?, ?> record) {
        Object k = record.key();
        String where = record.topic() + "-" + record.partition() + "@" + record.offset();
        if (k instanceof String s && !s.isEmpty()) {
            return s;
        }
        if (k instanceof byte[] b && b.length > 0) {
            try {
                return StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(b)).toString();
            } catch (CharacterCodingException e) {
                throw new MissingKeyException("the key of " + where + " is not UTF-8: give the consumer a key function", e);
            }
        }
        if (k == null || k instanceof String || k instanceof byte[]) {
            throw new MissingKeyException("the record " + where + " has no key", null);
        }
        throw new MissingKeyException("the key of " + where + " is a " + k.getClass().getName()
                + ": give the consumer a key function", null);
    }

    Function<ConsumerRecord<K, V>, String> key() {
        return key;
    }

    Function<ConsumerRecord<K, V>, byte[]> payload() {
        return payload;
    }

    int workers() {
        return workers;
    }

    int maxBuffered() {
        return maxBuffered;
    }

    Duration commitInterval() {
        return commitInterval;
    }

    Duration revokeWait(Idem idem) {
        return revokeWait != null ? revokeWait : idem.options().waitFor();
    }

    Duration retryDelay() {
        return retryDelay;
    }

    Duration maxRetryDelay() {
        return maxRetryDelay;
    }

    UnaryOperator<String> deadLetterTopic() {
        return deadLetterTopic;
    }

    java.util.function.Consumer<Exception> onError() {
        return onError;
    }

    /**
     * The builder.
     *
     * @param <K> the records' key type
     * @param <V> the records' value type
     */
    public static final class Builder<K, V> {
        private Function<ConsumerRecord<K, V>, String> key = IdempotentConsumerOptions::recordKey;
        private Function<ConsumerRecord<K, V>, byte[]> payload;
        private int workers = 1;
        private int maxBuffered = 500;
        private Duration commitInterval = Duration.ofSeconds(1);
        private Duration revokeWait;
        private Duration retryDelay = Duration.ofMillis(100);
        private Duration maxRetryDelay = Duration.ofSeconds(30);
        private UnaryOperator<String> deadLetterTopic = DeadLetters.DEFAULT_TOPIC;
        private java.util.function.Consumer<Exception> onError;

        private Builder() {}

        /**
         * @param key the record's key in the Idem (default {@link #recordKey}); throwing, or
         *     answering null or "", dead-letters the record with {@link MissingKeyException}
         * @return this
         */
        public Builder<K, V> key(Function<ConsumerRecord<K, V>, String> key) {
            this.key = Objects.requireNonNull(key, "key");
            return this;
        }

        /**
         * @param payload claims with it: a key seen again with another payload is dead-lettered
         *     ({@code MismatchException}); default none
         * @return this
         */
        public Builder<K, V> payload(Function<ConsumerRecord<K, V>, byte[]> payload) {
            this.payload = payload;
            return this;
        }

        /**
         * @param workers partitions at work at once, each on its own thread (default 1)
         * @return this
         */
        public Builder<K, V> workers(int workers) {
            if (workers < 1) {
                throw new IllegalArgumentException("workers: 1 or more");
            }
            this.workers = workers;
            return this;
        }

        /**
         * @param maxBuffered records fetched per partition before it is paused (default 500)
         * @return this
         */
        public Builder<K, V> maxBuffered(int maxBuffered) {
            if (maxBuffered < 1) {
                throw new IllegalArgumentException("maxBuffered: 1 or more");
            }
            this.maxBuffered = maxBuffered;
            return this;
        }

        /**
         * @param commitInterval between commits of what is done (default 1 s; a dead letter's
         *     partition and a revoked partition are committed at once)
         * @return this
         */
        public Builder<K, V> commitInterval(Duration commitInterval) {
            this.commitInterval = positive(commitInterval, "commitInterval");
            return this;
        }

        /**
         * @param revokeWait how long a rebalance waits for the record at work on a revoked
         *     partition before it commits (default the Idem's {@code waitFor})
         * @return this
         */
        public Builder<K, V> revokeWait(Duration revokeWait) {
            this.revokeWait = Objects.requireNonNull(revokeWait, "revokeWait");
            return this;
        }

        /**
         * @param retryDelay a failed record comes again after this, doubling with each attempt
         *     (default 100 ms); also the delay after DONE unconfirmed, a lost lease, not durable
         * @return this
         */
        public Builder<K, V> retryDelay(Duration retryDelay) {
            this.retryDelay = positive(retryDelay, "retryDelay");
            return this;
        }

        /**
         * @param maxRetryDelay the longest a failed record waits (default 30 s)
         * @return this
         */
        public Builder<K, V> maxRetryDelay(Duration maxRetryDelay) {
            this.maxRetryDelay = positive(maxRetryDelay, "maxRetryDelay");
            return this;
        }

        /**
         * @param deadLetterTopic a topic's dead-letter topic (default {@code topic + "-dlt"},
         *     Spring Kafka 4's); the record's own partition
         * @return this
         */
        public Builder<K, V> deadLetterTopic(UnaryOperator<String> deadLetterTopic) {
            this.deadLetterTopic = Objects.requireNonNull(deadLetterTopic, "deadLetterTopic");
            return this;
        }

        /**
         * @param onError told what the consumer could not do and will try again (a commit, a dead
         *     letter); default nothing
         * @return this
         */
        public Builder<K, V> onError(java.util.function.Consumer<Exception> onError) {
            this.onError = onError;
            return this;
        }

        /** @return the options */
        public IdempotentConsumerOptions<K, V> build() {
            return new IdempotentConsumerOptions<>(this);
        }

        private static Duration positive(Duration d, String name) {
            if (d == null || d.isNegative() || d.isZero()) {
                throw new IllegalArgumentException(name + ": a positive duration");
            }
            return d;
        }
    }
}
