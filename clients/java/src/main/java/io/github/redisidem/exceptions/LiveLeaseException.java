package io.github.redisidem.exceptions;

/**
 * IDEM.REQUEUE was refused: the record is processing with a live lease (its
 * holder is still at work); nothing changed. Requeue it when the lease ends.
 */
public class LiveLeaseException extends ServerException {
    private static final long serialVersionUID = 1L;

    /** @param message the server's text */
    public LiveLeaseException(String message) {
        super(message);
    }
}
