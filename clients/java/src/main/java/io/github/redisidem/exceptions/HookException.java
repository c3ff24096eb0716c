package io.github.redisidem.exceptions;

/**
 * A hook raised: before the work (onRun) the claim was released; after it
 * (onDone) the record is completed and the result is carried here.
 */
public class HookException extends IdemException {
    private static final long serialVersionUID = 1L;
    private final transient Object result;

    /**
     * @param cause what the hook raised
     * @param result the work's result, or null before the work
     */
    public HookException(Throwable cause, Object result) {
        super("a hook failed: " + cause.getMessage(), cause);
        this.result = result;
    }

    /** @return the work's result (after the work), or null */
    public Object result() {
        return result;
    }
}
