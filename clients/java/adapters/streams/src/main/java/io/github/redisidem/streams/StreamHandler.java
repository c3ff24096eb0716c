package io.github.redisidem.streams;

import io.github.redisidem.Job;

/**
 * The work for one entry, run at most once per key while its record lives.
 *
 * @param <T> its result, stored with the Idem's codec (what a replay returns)
 */
@FunctionalInterface
public interface StreamHandler<T> {
    /**
     * @param entry the entry
     * @param job the claim: pass {@link Job#attempt()} to the systems the work writes to
     * @return the result
     * @throws Exception a failure: the claim is released and the entry comes again after the retry delay
     */
    T handle(StreamEntry entry, Job job) throws Exception;
}
