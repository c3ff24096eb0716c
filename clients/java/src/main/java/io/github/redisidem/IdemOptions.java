package io.github.redisidem;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Objects;

/**
 * The settings of an {@link Idem} (docs/clients.md, "Defaults"), built with
 * {@link #builder()}: {@code IdemOptions.builder().prefix("shop:").lease(Duration.ofSeconds(60)).build()}.
 * Every setting has a default; a setting added later is one more builder
 * method, so code written today keeps compiling.
 */
public final class IdemOptions {
    private final String prefix;
    private final Duration lease;
    private final Duration waitFor;
    private final Duration heartbeat;
    private final Integer maxTries;
    private final Duration retain;
    private final int doneRetries;
    private final Duration doneTimeout;
    private final Oversize oversize;
    private final Codec<Object> codec;
    private final Hooks hooks;
    private final Edition edition;
    private final String bloom;
    private final String owner;
    private final Durable durable;
    private final boolean batch;

    private IdemOptions(Builder b) {
        this.prefix = b.prefix;
        this.lease = b.lease;
        this.waitFor = b.waitFor;
        this.heartbeat = b.heartbeat;
        this.maxTries = b.maxTries;
        this.retain = b.retain;
        this.doneRetries = b.doneRetries;
        this.doneTimeout = b.doneTimeout;
        this.oversize = b.oversize;
        this.codec = b.codec != null ? b.codec : Codec.defaultCodec();
        this.hooks = b.hooks;
        this.edition = b.edition;
        this.bloom = b.bloom;
        this.owner = b.owner != null ? b.owner : Owner.DEFAULT;
        this.durable = b.durable;
        this.batch = b.batch;
        if (heartbeat != null && heartbeat.compareTo(lease) >= 0) {
            throw new IllegalArgumentException("heartbeat (" + heartbeat + ") must be shorter than the lease (" + lease + ")");
        }
    }

    /** @return the defaults */
    public static IdemOptions defaults() {
        return builder().build();
    }

    /** @return a builder holding the defaults */
    public static Builder builder() {
        return new Builder();
    }

    /** @return a builder holding these settings */
    public Builder toBuilder() {
        Builder b = new Builder();
        b.prefix = prefix;
        b.lease = lease;
        b.waitFor = waitFor;
        b.heartbeat = heartbeat;
        b.maxTries = maxTries;
        b.retain = retain;
        b.doneRetries = doneRetries;
        b.doneTimeout = doneTimeout;
        b.oversize = oversize;
        b.codec = codec;
        b.hooks = hooks;
        b.edition = edition;
        b.bloom = bloom;
        b.owner = owner;
        b.durable = durable;
        b.batch = batch;
        return b;
    }

    /** @return put before every key ({@code ""}: none) */
    public String prefix() {
        return prefix;
    }

    /** @return how long a claim is held between heartbeats (default 30 s) */
    public Duration lease() {
        return lease;
    }

    /** @return how long a duplicate waits for the copy in flight (default 10 s; zero: not at all); {@code wait()} is Object's */
    public Duration waitFor() {
        return waitFor;
    }

    /** @return the time between heartbeats: the one set, else lease / 3 (zero: none) */
    public Duration heartbeat() {
        return heartbeat != null ? heartbeat : lease.dividedBy(3);
    }

    /** @return MAXTRIES, or null for none */
    public Integer maxTries() {
        return maxTries;
    }

    /** @return how long a done record is kept, or null for the server's idem.retain */
    public Duration retain() {
        return retain;
    }

    /** @return how many times DONE is sent again after a connection error (default 5) */
    public int doneRetries() {
        return doneRetries;
    }

    /** @return how long one DONE (and its WAIT) may take before it counts as lost (default 5 s) */
    public Duration doneTimeout() {
        return doneTimeout;
    }

    /** @return what a result over idem.max-result does (default {@link Oversize#COMPLETE}) */
    public Oversize oversize() {
        return oversize;
    }

    /** @return how results are stored (default {@link Codec#defaultCodec()}) */
    public Codec<Object> codec() {
        return codec;
    }

    /** @return the hooks (default: none) */
    public Hooks hooks() {
        return hooks;
    }

    /** @return the edition to use, or null: asked of the server */
    public Edition edition() {
        return edition;
    }

    /** @return the BLOOM filter key for claims and DONEs (module only), or null */
    public String bloom() {
        return bloom;
    }

    /** @return the OWNER sent with every claim (default host:pid) */
    public String owner() {
        return owner;
    }

    /** @return the durability, or null: off */
    public Durable durable() {
        return durable;
    }

    /** @return whether concurrent calls share one batch command per tick */
    public boolean batch() {
        return batch;
    }

    @Override
    public String toString() {
        return "IdemOptions[prefix=" + prefix + ", lease=" + lease + ", waitFor=" + waitFor + ", heartbeat=" + heartbeat()
                + ", maxTries=" + maxTries + ", retain=" + retain + ", doneRetries=" + doneRetries + ", doneTimeout=" + doneTimeout
                + ", oversize=" + oversize + ", codec=" + codec.getClass().getSimpleName() + ", edition=" + edition + ", bloom=" + bloom
                + ", owner=" + owner + ", durable=" + durable + ", batch=" + batch + "]";
    }

    /** Builds {@link IdemOptions}; each method checks its value at once (IllegalArgumentException). */
    public static final class Builder {
        private String prefix = "";
        private Duration lease = Duration.ofSeconds(30);
        private Duration waitFor = Duration.ofSeconds(10);
        private Duration heartbeat;
        private Integer maxTries;
        private Duration retain;
        private int doneRetries = 5;
        private Duration doneTimeout = Duration.ofSeconds(5);
        private Oversize oversize = Oversize.COMPLETE;
        private Codec<Object> codec;
        private Hooks hooks = new Hooks() {};
        private Edition edition;
        private String bloom;
        private String owner;
        private Durable durable;
        private boolean batch = true;

        private Builder() {}

        /** @param v put before every key @return this builder */
        public Builder prefix(String v) {
            prefix = Objects.requireNonNull(v, "prefix");
            return this;
        }

        /** @param v how long a claim is held: whole seconds, at least 1 @return this builder */
        public Builder lease(Duration v) {
            lease = Wire.checkSeconds("lease", v);
            return this;
        }

        /** @param v how long a duplicate waits for the copy in flight (zero: not at all) @return this builder */
        public Builder waitFor(Duration v) {
            if (v == null || v.isNegative()) throw new IllegalArgumentException("wait must be zero or more: " + v);
            waitFor = v;
            return this;
        }

        /** @param v the time between heartbeats (zero: none; null: lease / 3) @return this builder */
        public Builder heartbeat(Duration v) {
            if (v != null && v.isNegative()) throw new IllegalArgumentException("heartbeat must be zero or more: " + v);
            heartbeat = v;
            return this;
        }

        /** @param v MAXTRIES, at least 1 (null: none) @return this builder */
        public Builder maxTries(Integer v) {
            if (v != null && v < 1) throw new IllegalArgumentException("maxTries must be at least 1: " + v);
            maxTries = v;
            return this;
        }

        /** @param v how long a done record is kept: whole seconds (null: the server's idem.retain) @return this builder */
        public Builder retain(Duration v) {
            retain = v == null ? null : Wire.checkSeconds("retain", v);
            return this;
        }

        /** @param v how many times DONE is sent again after a connection error (50 ms doubling) @return this builder */
        public Builder doneRetries(int v) {
            if (v < 0) throw new IllegalArgumentException("doneRetries must be zero or more: " + v);
            doneRetries = v;
            return this;
        }

        /** @param v how long one DONE (and its WAIT) may take before it counts as lost @return this builder */
        public Builder doneTimeout(Duration v) {
            if (v == null || v.toMillis() < 1) throw new IllegalArgumentException("doneTimeout must be at least 1 ms: " + v);
            doneTimeout = v;
            return this;
        }

        /** @param v what a result over idem.max-result does @return this builder */
        public Builder oversize(Oversize v) {
            oversize = Objects.requireNonNull(v, "oversize");
            return this;
        }

        /** @param v how results are stored (a call given a type uses {@code v.as(type)}) @return this builder */
        public Builder codec(Codec<Object> v) {
            codec = Objects.requireNonNull(v, "codec");
            return this;
        }

        /** @param v the hooks @return this builder */
        public Builder hooks(Hooks v) {
            hooks = Objects.requireNonNull(v, "hooks");
            return this;
        }

        /** @param v the edition (null: ask the server) @return this builder */
        public Builder edition(Edition v) {
            edition = v;
            return this;
        }

        /** @param v a BLOOM filter key for claims and DONEs (module only; null: none) @return this builder */
        public Builder bloom(String v) {
            bloom = v;
            return this;
        }

        /** @param v the OWNER sent with every claim, 1 to 64 bytes (null: host:pid) @return this builder */
        public Builder owner(String v) {
            if (v != null) {
                int n = v.getBytes(StandardCharsets.UTF_8).length;
                if (n < 1 || n > 64) throw new IllegalArgumentException("owner must be 1 to 64 bytes: " + v);
            }
            owner = v;
            return this;
        }

        /** @param v durability (null: off) @return this builder */
        public Builder durable(Durable v) {
            durable = v;
            return this;
        }

        /** @param v whether concurrent calls share one batch command per tick @return this builder */
        public Builder batch(boolean v) {
            batch = v;
            return this;
        }

        /** @return the settings */
        public IdemOptions build() {
            return new IdemOptions(this);
        }
    }
}
