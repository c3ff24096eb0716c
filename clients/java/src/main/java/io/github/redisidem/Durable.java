package io.github.redisidem;

import java.time.Duration;
import java.util.Objects;

/**
 * Durability (docs/clients.md, "Durability"): each claim that grants work,
 * and each {@code DONE}, is followed on its connection, in the same round
 * trip, by {@code WAIT replicas timeout} ({@code WAITAOF 1 replicas timeout}
 * with {@link #fsync}); the work starts only once the claim is
 * acknowledged. {@code Durable.replicas(1).timeout(Duration.ofMillis(500))}.
 */
public final class Durable {
    private final int replicas;
    private final Duration timeout;
    private final boolean fsync;

    private Durable(int replicas, Duration timeout, boolean fsync) {
        if (replicas < 0) throw new IllegalArgumentException("replicas must be zero or more: " + replicas);
        Objects.requireNonNull(timeout, "timeout");
        if (timeout.isNegative() || timeout.isZero() || timeout.toMillis() == 0) {
            throw new IllegalArgumentException("the durable timeout must be at least 1 ms: " + timeout);
        }
        this.replicas = replicas;
        this.timeout = timeout;
        this.fsync = fsync;
    }

    /**
     * @param n how many replicas must acknowledge each write (every replica: a crash loses nothing a worker acted on)
     * @return the setting, with a timeout of 1 s and no fsync
     */
    public static Durable replicas(int n) {
        return new Durable(n, Duration.ofSeconds(1), false);
    }

    /**
     * @param timeout how long one {@code WAIT} may block (whole milliseconds)
     * @return a copy with it
     */
    public Durable timeout(Duration timeout) {
        return new Durable(replicas, timeout, fsync);
    }

    /**
     * @param fsync {@code WAITAOF} instead of {@code WAIT}: the write fsynced to the primary's AOF and to {@code replicas}
     *     replicas' (Redis 7.2+, Valkey 8+, {@code appendonly yes})
     * @return a copy with it
     */
    public Durable fsync(boolean fsync) {
        return new Durable(replicas, timeout, fsync);
    }

    /** @return how many replicas must acknowledge */
    public int replicas() {
        return replicas;
    }

    /** @return how long one WAIT may block */
    public Duration timeout() {
        return timeout;
    }

    /** @return whether WAITAOF is sent */
    public boolean fsync() {
        return fsync;
    }

    @Override
    public String toString() {
        return "Durable[replicas=" + replicas + ", timeout=" + timeout + ", fsync=" + fsync + "]";
    }
}
