package io.github.redisidem.exceptions;

/** The root of the library's errors; every one in docs/clients.md's table extends it. */
public class IdemException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public IdemException(String message) {
        super(message);
    }

    /**
     * @param message what happened
     * @param cause why
     */
    public IdemException(String message, Throwable cause) {
        super(message, cause);
    }
}
