package io.github.redisidem;

/** What became of one key of {@link Idem#processMany}. */
public enum BatchStatus {
    /** The work ran and its completion was recorded. */
    PROCESSED,
    /** A stored completion: the work did not run. */
    REPLAYED,
    /** Another worker holds the key (not waited for). */
    BUSY,
    /** The work failed: the claim was released. */
    FAILED,
    /** The lease was lost: another worker's outcome is kept. */
    LOST,
    /** Another payload under the key. */
    MISMATCH,
    /** The tries are used up. */
    EXHAUSTED,
    /** {@code durable}: the claim was not acknowledged (released, not run), or the completion was not (done on the primary, the value carried). */
    NOT_DURABLE,
    /** The key's command failed (WRONGTYPE, a connection error, DONE unconfirmed with the value carried, ...). */
    ERROR
}
