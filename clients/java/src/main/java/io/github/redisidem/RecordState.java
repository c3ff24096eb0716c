package io.github.redisidem;

/** A record's state in IDEM.GET. */
public enum RecordState {
    /** A live claim. */
    PROCESSING,
    /** The lease lapsed. */
    EXPIRED,
    /** Given back. */
    RELEASED,
    /** Completed. */
    DONE
}
