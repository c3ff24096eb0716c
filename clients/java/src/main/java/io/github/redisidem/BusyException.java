package io.github.redisidem;

import java.time.Duration;

/** The key was still held by another worker when the wait ended. */
public class BusyException extends IdemException {
    private static final long serialVersionUID = 1L;
    private final Duration leaseLeft;

    /**
     * @param key the key
     * @param leaseLeft the holder's lease left
     */
    public BusyException(String key, Duration leaseLeft) {
        super("busy: " + key + " is held by another worker for " + leaseLeft.toMillis() + " ms more");
        this.leaseLeft = leaseLeft;
    }

    /** @return how long the holder's lease had left */
    public Duration leaseLeft() {
        return leaseLeft;
    }
}
