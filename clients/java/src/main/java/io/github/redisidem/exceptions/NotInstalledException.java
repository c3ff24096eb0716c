package io.github.redisidem.exceptions;

/** The server has neither the module nor the Functions edition loaded. */
public class NotInstalledException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public NotInstalledException(String message) {
        super(message);
    }
}
