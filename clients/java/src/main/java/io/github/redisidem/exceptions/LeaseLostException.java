package io.github.redisidem.exceptions;

/** This worker's lease lapsed and another worker claimed the key: this worker's result is not the one kept. */
public class LeaseLostException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public LeaseLostException(String message) {
        super(message);
    }
}
