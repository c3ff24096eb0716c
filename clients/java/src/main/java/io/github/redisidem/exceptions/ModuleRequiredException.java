package io.github.redisidem.exceptions;

/** The Functions edition cannot do this (WAIT, BLOOM, the filters, the raw batch commands). */
public class ModuleRequiredException extends ServerException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public ModuleRequiredException(String message) {
        super(message);
    }
}
