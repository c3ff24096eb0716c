package io.github.redisidem;

import java.util.concurrent.CompletionStage;

/**
 * The work for one claimed key, for {@link AsyncIdem}.
 *
 * @param <T> its result
 */
@FunctionalInterface
public interface AsyncWork<T> {
    /**
     * @param job the claim: its attempt (the fencing number) and lost flag
     * @return the result to come; a failed stage releases the claim
     * @throws Exception a failure before the stage: the claim is released
     */
    CompletionStage<T> run(Job job) throws Exception;
}
