package io.github.redisidem.exceptions;

/**
 * IDEM.DONE could not be confirmed after doneRetries: do not acknowledge
 * the message; its redelivery replays or, if the lease lapsed first, retries.
 */
public class DoneUnconfirmedException extends IdemException {
    private static final long serialVersionUID = 1L;
    private final transient Object result;

    /**
     * @param result the work's result
     * @param cause the last connection error
     */
    public DoneUnconfirmedException(Object result, Throwable cause) {
        super("IDEM.DONE could not be confirmed: " + cause, cause);
        this.result = result;
    }

    /** @return the work's result */
    public Object result() {
        return result;
    }
}
