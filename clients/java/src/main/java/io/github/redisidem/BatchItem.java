package io.github.redisidem;

/**
 * One key's outcome in {@link Idem#processMany}, in key order.
 * The value is the work's, or the replayed result decoded as the call's type; a
 * {@code PROCESSED} item whose result was not stored may carry a
 * {@code ResultNotStoredException} in {@code error}.
 *
 * @param key the key
 * @param status what became of it
 * @param value the work's value or the replayed result
 * @param error the key's error (the work's failure, BusyException, ResultNotStoredException, DoneUnconfirmedException, ...), or null
 * @param attempt the fencing number (0 when not claimed)
 * @param resultStored whether the result is stored
 * @param <T> the value's type
 */
public record BatchItem<T>(String key, BatchStatus status, T value, Throwable error, long attempt, boolean resultStored) {}
