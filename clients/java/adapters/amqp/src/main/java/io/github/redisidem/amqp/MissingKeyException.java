package io.github.redisidem.amqp;

import io.github.redisidem.exceptions.IdemException;

/** A message the key function found no key in: dead-lettered, never run unclaimed. */
public class MissingKeyException extends IdemException {
    private static final long serialVersionUID = 1L;

    /** @param message what is missing */
    public MissingKeyException(String message) {
        super(message);
    }
}
