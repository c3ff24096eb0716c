package io.github.redisidem.amqp;

import io.github.redisidem.Job;
import org.springframework.amqp.core.Message;

/**
 * The work for one message, run at most once per key while its record lives.
 *
 * @param <T> its result, stored with the Idem's codec (what a replay returns)
 */
@FunctionalInterface
public interface AmqpHandler<T> {
    /**
     * @param message the message as the container received it
     * @param job the claim: pass {@link Job#attempt()} to the systems the work writes to
     * @return the result
     * @throws Exception a failure: the claim is released and the message comes again after the retry delay
     */
    T handle(Message message, Job job) throws Exception;
}
