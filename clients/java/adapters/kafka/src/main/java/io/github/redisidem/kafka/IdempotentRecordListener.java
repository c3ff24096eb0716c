package io.github.redisidem.kafka;

import io.github.redisidem.Job;
import java.time.Duration;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.TopicPartition;
import org.springframework.kafka.listener.AcknowledgingConsumerAwareMessageListener;
import org.springframework.kafka.listener.DelegatingMessageListener;
import org.springframework.kafka.listener.MessageListener;
import org.springframework.kafka.support.Acknowledgment;

/**
 * A record listener run inside {@code Idem.process} (IdempotentKafkaListeners.wrap): the delegate
 * runs once per key; a replay returns without it; what the Idem refuses is thrown to the
 * container's error handler.
 */
final class IdempotentRecordListener<K, V>
        implements AcknowledgingConsumerAwareMessageListener<K, V>, DelegatingMessageListener<MessageListener<K, V>> {
    private final MessageListener<K, V> delegate;
    private final IdempotentKafkaListeners listeners;

    IdempotentRecordListener(MessageListener<K, V> delegate, IdempotentKafkaListeners listeners) {
        this.delegate = delegate;
        this.listeners = listeners;
    }

    @Override
    public MessageListener<K, V> getDelegate() {
        return delegate;
    }

    @Override
    public void onMessage(ConsumerRecord<K, V> record, Acknowledgment ack, Consumer<?, ?> consumer) {
        IdempotentKafkaListeners.heldBack(null);
        String key = listeners.keyOf(record); // MissingKeyException: not retryable, to the recoverer
        boolean[] returned = {false};
        try {
            listeners.idem().process(key, job -> {
                Job before = IdempotentKafkaListeners.enter(job);
                try {
                    delegate.onMessage(record, ack, consumer);
                    returned[0] = true;
                    return null;
                } finally {
                    IdempotentKafkaListeners.leave(before);
                }
            });
            listeners.count(Decision.Verdict.ACK);
        } catch (Exception e) {
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            Decision d = Decision.of(e, returned[0], Duration.ZERO, Duration.ZERO);
            listeners.count(d.verdict());
            if (d.verdict() == Decision.Verdict.ACK) {
                return; // the record is done (a hook or the result's storing failed after the work)
            }
            if (d.verdict() == Decision.Verdict.HOLD) {
                IdempotentKafkaListeners.heldBack(new TopicPartition(record.topic(), record.partition()));
            }
            throw e instanceof RuntimeException re ? re : new IllegalStateException(e.getMessage(), e);
        }
    }
}
