package io.github.redisidem.kafka;

import java.util.ArrayDeque;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;

/**
 * One assigned partition, on the poll thread only: the records fetched and
 * not started, the one at work, where its done records end, whether it is
 * held back or paused.
 */
final class PartitionState<K, V> {
    final TopicPartition tp;
    final ArrayDeque<ConsumerRecord<K, V>> queue = new ArrayDeque<>();
    ConsumerRecord<K, V> working; // the record at work
    Future<Decision> future;
    Long doneTo; // every record below this offset is done
    Long committed;
    long heldUntil; // System.nanoTime() the hold ends, when held
    boolean held;
    boolean paused;
    long expect = -1; // records below this offset are stale (fetched before a seek)

    PartitionState(TopicPartition tp) {
        this.tp = tp;
    }

    /** The lowest offset not yet done, as far as this member knows (null: nothing seen). */
    Long safeOffset() {
        if (working != null) {
            return working.offset();
        }
        if (!queue.isEmpty()) {
            return queue.peekFirst().offset();
        }
        return doneTo;
    }
}
