package io.github.redisidem.kafka;

import io.github.redisidem.Job;
import org.apache.kafka.clients.consumer.ConsumerRecord;

/**
 * The work for one record. Pass {@code job.attempt()} to the systems it
 * writes to (the fence of a late write); what it returns is the stored
 * result (the instance codec's), replayed to a duplicate.
 *
 * @param <K> the records' key type
 * @param <V> the records' value type
 */
@FunctionalInterface
public interface RecordHandler<K, V> {
    /**
     * @param record the record
     * @param job the claim it runs under
     * @return the result to store
     * @throws Exception the work failed: released, the record comes again
     */
    Object handle(ConsumerRecord<K, V> record, Job job) throws Exception;
}
