package io.github.redisidem.exceptions;

/** The server answered STALE to EXTEND or DONE: the token no longer holds the claim. */
public class StaleException extends ServerException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public StaleException(String message) {
        super(message);
    }
}
