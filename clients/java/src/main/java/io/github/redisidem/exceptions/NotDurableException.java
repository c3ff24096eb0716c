package io.github.redisidem.exceptions;

/**
 * {@code durable}: the {@code WAIT} (or {@code WAITAOF}) after a write
 * answered fewer replicas than asked. At {@link Stage#CLAIM} the claim was
 * released and the work never ran; at {@link Stage#DONE} the record is done
 * on the primary, but a failover could lose it (a replay's too: the stored
 * completion it read may not have reached the replicas yet). Either way: do
 * not acknowledge the message.
 */
public class NotDurableException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** Which write was not acknowledged. */
    public enum Stage {
        /** The claim: released at once, the work did not run. */
        CLAIM,
        /** The completion: the record is done on the primary; {@link #result()} is the work's value, or a replay's stored result. */
        DONE
    }

    private final Stage stage;
    private final long acknowledged;
    private final transient Object result;

    /**
     * @param stage the write not acknowledged
     * @param acknowledged how many replicas acknowledged it (fsyncs with {@code WAITAOF}; 0 when WAIT failed)
     * @param result the work's value (or a replay's stored result) at {@link Stage#DONE}, else null
     */
    public NotDurableException(Stage stage, long acknowledged, Object result) {
        super("not durable: the " + stage.name().toLowerCase(java.util.Locale.ROOT) + " was acknowledged by " + acknowledged
                + (stage == Stage.CLAIM ? " replicas only (released, the work did not run)" : " replicas only (done on the primary)"));
        this.stage = stage;
        this.acknowledged = acknowledged;
        this.result = result;
    }

    /** @return which write was not acknowledged */
    public Stage stage() {
        return stage;
    }

    /** @return how many replicas (or fsyncs) acknowledged it */
    public long acknowledged() {
        return acknowledged;
    }

    /** @return the work's value or a replay's stored, decoded result ({@link Stage#DONE}; {@code claimMany}: the stored bytes), or null */
    public Object result() {
        return result;
    }
}
