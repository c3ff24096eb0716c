package io.github.redisidem.kafka;

import io.github.redisidem.exceptions.IdemException;

/**
 * A record without a key (or whose key function failed): handled as a
 * failure that no redelivery can mend, so it goes to the dead-letter topic;
 * never passed through unclaimed.
 */
public class MissingKeyException extends IdemException {
    private static final long serialVersionUID = 1L;

    /**
     * @param message where the key was looked for
     * @param cause what the key function threw, or null
     */
    public MissingKeyException(String message, Throwable cause) {
        super(message, cause);
    }
}
