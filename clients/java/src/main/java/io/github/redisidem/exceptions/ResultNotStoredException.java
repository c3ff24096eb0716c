package io.github.redisidem.exceptions;

/**
 * The record was completed without its result: the codec could not encode
 * it, or it was over idem.max-result with {@code Oversize.ERROR}. The work
 * is done (it never runs again for this key); the result is carried here.
 */
public class ResultNotStoredException extends IdemException {
    private static final long serialVersionUID = 1L;
    private final transient Object result;

    /**
     * @param result the work's result
     * @param cause why it was not stored
     */
    public ResultNotStoredException(Object result, Throwable cause) {
        super("the record was completed without its result: " + cause.getMessage(), cause);
        this.result = result;
    }

    /** @return the work's result */
    public Object result() {
        return result;
    }
}
