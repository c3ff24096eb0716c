package io.github.redisidem.exceptions;

/** The key's tries (maxTries) are used up: dead-letter the message. */
public class ExhaustedException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public ExhaustedException(String message) {
        super(message);
    }
}
