package io.github.redisidem;

import java.time.Duration;

/**
 * Callbacks on the loop's events; every method does nothing by default.
 * {@link #onRun} and {@link #onDone} raising is {@link HookException}; what
 * the others raise is ignored (they run after the outcome is settled).
 */
public interface Hooks {
    /** @param job the claim granted, before the work runs */
    default void onRun(Job job) {}

    /**
     * @param key the key
     * @param attempt the stored completion's attempt
     */
    default void onReplay(String key, long attempt) {}

    /**
     * Once per call that meets a busy key.
     *
     * @param key the key
     * @param leaseLeft the holder's lease left
     */
    default void onBusy(String key, Duration leaseLeft) {}

    /**
     * @param job the job
     * @param resultStored whether its result was stored
     */
    default void onDone(Job job, boolean resultStored) {}

    /**
     * @param job the job
     * @param error the work's (or onRun's) failure
     */
    default void onRelease(Job job, Throwable error) {}

    /** @param job the job whose lease was found lost */
    default void onLeaseLost(Job job) {}

    /**
     * @param job the job
     * @param reason {@code oversize}, {@code unserializable} or {@code memory}
     */
    default void onResultDropped(Job job, String reason) {}
}
