package io.github.redisidem;

import io.github.redisidem.exceptions.IdemException;

/**
 * One key's answer in a batch: a value, or that key's error.
 *
 * @param value the answer (null on error)
 * @param error the key's error, or null
 * @param <T> the answer's type
 */
public record Reply<T>(T value, IdemException error) {
    /** @return whether the key has an answer, not an error */
    public boolean ok() {
        return error == null;
    }

    /** @return the answer; throws the key's error */
    public T get() {
        if (error != null) throw error;
        return value;
    }
}
