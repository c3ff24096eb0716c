package io.github.redisidem;

/**
 * A call's end, as {@code process} returns (or throws) it and
 * {@code processMany} lists it.
 *
 * @param status what became of the key
 * @param value the work's value or the replay's decoded result
 * @param error the error (thrown by {@code process}), or null
 * @param attempt the fencing number
 * @param stored whether the result is stored
 * @param granted how the claim was granted (null for a replay)
 */
record Result(BatchStatus status, Object value, Throwable error, long attempt, boolean stored, ClaimStatus granted) {
    <T> BatchItem<T> item(String key) {
        @SuppressWarnings("unchecked")
        T v = (T) value;
        return new BatchItem<>(key, status, v, error, attempt, stored);
    }

    @SuppressWarnings("unchecked")
    <T> Outcome<T> outcome() {
        return new Outcome<>((T) value, status == BatchStatus.REPLAYED, granted, attempt, stored);
    }
}
