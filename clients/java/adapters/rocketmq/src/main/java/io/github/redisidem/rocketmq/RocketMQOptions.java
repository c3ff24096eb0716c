package io.github.redisidem.rocketmq;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Objects;
import java.util.function.Function;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The listeners' settings: {@code RocketMQOptions.builder().key(...).build()}.
 */
public final class RocketMQOptions {
    /** RocketMQ's default {@code messageDelayLevel} (the broker's setting). */
    public static final String DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

    private final Function<MessageExt, String> key;
    private final List<Duration> delayLevels;
    private final String delayLevelsText;
    private final int spareRedeliveries;

    private RocketMQOptions(Builder b) {
        this.key = b.key;
        this.delayLevelsText = b.delayLevels;
        this.delayLevels = parseLevels(b.delayLevels);
        this.spareRedeliveries = b.spareRedeliveries;
    }

    /** @return the defaults: the first of {@code KEYS}, RocketMQ's default delay levels, 16 spare redeliveries */
    public static RocketMQOptions defaults() {
        return builder().build();
    }

    /** @return a builder at the defaults */
    public static Builder builder() {
        return new Builder();
    }

    /**
     * The default key: the first of the message's {@code KEYS} (the business
     * key the producer set with {@code setKeys}), never its msgId, which a
     * producer's retry changes.
     *
     * @param message the message
     * @return its first key, or null when it has none
     */
    public static String firstKey(MessageExt message) {
        String keys = message.getKeys();
        if (keys == null) {
            return null;
        }
        for (String k : keys.split(" ")) {
            if (!k.isEmpty()) {
                return k;
            }
        }
        return null;
    }

    /** @return the key function */
    public Function<MessageExt, String> key() {
        return key;
    }

    /** @return the broker's delay levels, level 1 first */
    public List<Duration> delayLevels() {
        return delayLevels;
    }

    /** @return redeliveries allowed beyond {@code maxTries} when the consumer's {@code maxReconsumeTimes} is unset */
    public int spareRedeliveries() {
        return spareRedeliveries;
    }

    /**
     * @param wait a delay wanted
     * @return the smallest delay level at least that long (the last level when none is)
     */
    int levelFor(Duration wait) {
        for (int i = 0; i < delayLevels.size(); i++) {
            if (delayLevels.get(i).compareTo(wait) >= 0) {
                return i + 1;
            }
        }
        return delayLevels.size();
    }

    static List<Duration> parseLevels(String text) {
        List<Duration> out = new ArrayList<>();
        for (String level : text.trim().split("\\s+")) {
            if (level.length() < 2) {
                throw new IllegalArgumentException("delay level '" + level + "' is not a number and a unit (s, m, h, d)");
            }
            long n;
            try {
                n = Long.parseLong(level.substring(0, level.length() - 1));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("delay level '" + level + "' is not a number and a unit (s, m, h, d)");
            }
            Duration d = switch (level.substring(level.length() - 1).toLowerCase(Locale.ROOT)) {
                case "s" -> Duration.ofSeconds(n);
                case "m" -> Duration.ofMinutes(n);
                case "h" -> Duration.ofHours(n);
                case "d" -> Duration.ofDays(n);
                default -> throw new IllegalArgumentException("delay level '" + level + "' has no unit (s, m, h, d)");
            };
            out.add(d);
        }
        return List.copyOf(out);
    }

    @Override
    public String toString() {
        return "RocketMQOptions[delayLevels=" + delayLevelsText + ", spareRedeliveries=" + spareRedeliveries + "]";
    }

    /** Builds {@link RocketMQOptions}. */
    public static final class Builder {
        private Function<MessageExt, String> key = RocketMQOptions::firstKey;
        private String delayLevels = DEFAULT_DELAY_LEVELS;
        private int spareRedeliveries = 16;

        private Builder() {}

        /**
         * @param v the key of a message (null or empty: {@link MissingKeyException}, a failure); default {@link #firstKey}
         * @return this
         */
        public Builder key(Function<MessageExt, String> v) {
            this.key = Objects.requireNonNull(v, "key");
            return this;
        }

        /**
         * @param v the broker's {@code messageDelayLevel} ("1s 5s 10s ..."): a Busy message is given back at the
         *          smallest level at least the holder's lease left
         * @return this
         */
        public Builder delayLevels(String v) {
            parseLevels(Objects.requireNonNull(v, "delayLevels"));
            this.delayLevels = v;
            return this;
        }

        /**
         * @param v redeliveries beyond {@code maxTries} (Busy rounds, unconfirmed completions) before RocketMQ's own
         *          {@code maxReconsumeTimes} would dead-letter; used when the consumer's is unset (-1)
         * @return this
         */
        public Builder spareRedeliveries(int v) {
            if (v < 0) {
                throw new IllegalArgumentException("spareRedeliveries must be at least 0");
            }
            this.spareRedeliveries = v;
            return this;
        }

        /** @return the options */
        public RocketMQOptions build() {
            return new RocketMQOptions(this);
        }
    }
}
