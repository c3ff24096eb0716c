package io.github.redisidem.exceptions;

import java.time.Duration;

/**
 * The key was still held by another worker when the wait ended: neither
 * acknowledge nor skip the message; give it back with a delay of
 * {@link #leaseLeft()}.
 */
public class BusyException extends IdemException {
    private static final long serialVersionUID = 1L;
    private final Duration leaseLeft;
    private final String owner;

    /**
     * @param key the key
     * @param leaseLeft the holder's lease left
     * @param owner the holder's {@code OWNER} as IDEM.GET showed it, or null (none, or the read failed)
     */
    public BusyException(String key, Duration leaseLeft, String owner) {
        super("busy: " + key + " is held by " + (owner == null ? "another worker" : owner) + " for " + leaseLeft.toMillis() + " ms more");
        this.leaseLeft = leaseLeft;
        this.owner = owner;
    }

    /** @return how long the holder's lease had left */
    public Duration leaseLeft() {
        return leaseLeft;
    }

    /** @return who holds the key (its claim's {@code OWNER}), or null when the record has none or could not be read */
    public String owner() {
        return owner;
    }
}
