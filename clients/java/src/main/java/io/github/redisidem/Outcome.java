package io.github.redisidem;

/**
 * What {@link Idem#process} returns.
 *
 * @param value the work's value, or a replay's decoded stored result (null when none was stored)
 * @param replayed whether it is a replay (the work did not run)
 * @param status how the claim was granted (null for a replay)
 * @param attempt the fencing number of the run (or of the stored completion)
 * @param resultStored whether the result is stored (a replay: whether one was)
 * @param <T> the value's type
 */
public record Outcome<T>(T value, boolean replayed, ClaimStatus status, long attempt, boolean resultStored) {}
