package io.github.redisidem.rocketmq;

import io.github.redisidem.exceptions.IdemException;

/**
 * The key function found no key in a message (by default: no {@code KEYS}).
 * Handled as a failure: the message is given back, never passed through
 * unclaimed, and reaches {@code %DLQ%<group>} after the consumer's
 * {@code maxReconsumeTimes}.
 */
public class MissingKeyException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param msgId the message's id, to find it */
    public MissingKeyException(String msgId) {
        super("message " + msgId + " has no key (KEYS) to claim");
    }
}
