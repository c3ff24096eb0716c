package io.github.redisidem.exceptions;

/** The server refused a RESULT as larger than idem.max-result (or proto-max-bulk-len). */
public class ResultTooLargeException extends ServerException {
    private static final long serialVersionUID = 1L;

    /** @param message what happened */
    public ResultTooLargeException(String message) {
        super(message);
    }
}
