package io.github.redisidem.rocketmq;

import io.github.redisidem.Job;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The work for one message, run at most once per key while its record
 * lives (the library's {@code Work} with the message).
 *
 * @param <T> the result, stored with the instance's codec and replayed to redeliveries
 */
@FunctionalInterface
public interface MessageWork<T> {
    /**
     * @param message the message as RocketMQ delivered it
     * @param job the claim: {@code job.attempt()} is the fencing number to pass to what the work writes
     * @return the result
     * @throws Exception a failure: the claim is released and the message redelivered
     */
    T run(MessageExt message, Job job) throws Exception;
}
