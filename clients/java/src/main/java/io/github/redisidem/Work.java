package io.github.redisidem;

/**
 * The work for one claimed key.
 *
 * @param <T> its result
 */
@FunctionalInterface
public interface Work<T> {
    /**
     * @param job the claim: its attempt (the fencing number) and lost flag
     * @return the result, stored with the codec
     * @throws Exception a failure: the claim is released and the failure rethrown
     */
    T run(Job job) throws Exception;
}
