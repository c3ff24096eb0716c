package io.github.redisidem.exceptions;

/** The key was claimed with another payload: nothing ran. */
public class MismatchException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public MismatchException(String message) {
        super(message);
    }
}
