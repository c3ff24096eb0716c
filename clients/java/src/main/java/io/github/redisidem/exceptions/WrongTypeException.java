package io.github.redisidem.exceptions;

/** The key holds another type (or the other edition's record). */
public class WrongTypeException extends ServerException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public WrongTypeException(String message) {
        super(message);
    }
}
