package io.github.redisidem.rocketmq;

import io.github.redisidem.Idem;
import java.util.List;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * A {@link MessageListenerConcurrently} that runs each message's work at
 * most once per key through {@link Idem#process}: {@code CONSUME_SUCCESS}
 * only once the record is done (or the message was a replay);
 * {@code RECONSUME_LATER} otherwise, a Busy message at the delay level of
 * the holder's lease left, a failure at RocketMQ's own retry delay; an
 * Exhausted message into {@code %DLQ%<group>} and then acknowledged.
 *
 * <pre>{@code
 * IdemConcurrentlyListener listener = IdemConcurrentlyListener.register(consumer, idem, (message, job) -> work(message));
 * }</pre>
 */
public final class IdemConcurrentlyListener implements MessageListenerConcurrently {
    private final Handler handler;

    /**
     * @param consumer the consumer it is registered with (its {@code maxReconsumeTimes} is checked, or set when unset,
     *                 against the Idem's {@code maxTries}; Exhausted messages go back through it to the DLQ)
     * @param idem the loop; it needs {@code maxTries}
     * @param options the key function and the broker's delay levels
     * @param work the work per message
     */
    public IdemConcurrentlyListener(DefaultMQPushConsumer consumer, Idem idem, RocketMQOptions options, MessageWork<?> work) {
        this.handler = new Handler(consumer, idem, work, options);
    }

    /**
     * Makes a listener with the default options and registers it with the consumer (before {@code start()}).
     *
     * @param consumer the consumer
     * @param idem the loop, with {@code maxTries}
     * @param work the work per message
     * @return the listener (for its {@link #stats()})
     */
    public static IdemConcurrentlyListener register(DefaultMQPushConsumer consumer, Idem idem, MessageWork<?> work) {
        return register(consumer, idem, RocketMQOptions.defaults(), work);
    }

    /**
     * @param consumer the consumer
     * @param idem the loop, with {@code maxTries}
     * @param options the key function and the broker's delay levels
     * @param work the work per message
     * @return the listener, registered with the consumer
     */
    public static IdemConcurrentlyListener register(DefaultMQPushConsumer consumer, Idem idem, RocketMQOptions options,
                                                    MessageWork<?> work) {
        IdemConcurrentlyListener listener = new IdemConcurrentlyListener(consumer, idem, options, work);
        consumer.registerMessageListener(listener);
        return listener;
    }

    /**
     * Messages in order; at the first one not acknowledged the rest of the batch is given back with it (ackIndex),
     * never acknowledged unprocessed. With the default batch of one that is the message itself.
     */
    @Override
    public ConsumeConcurrentlyStatus consumeMessage(List<MessageExt> messages, ConsumeConcurrentlyContext context) {
        String broker = context.getMessageQueue().getBrokerName();
        for (int i = 0; i < messages.size(); i++) {
            Handler.Verdict v = handler.handle(messages.get(i), broker);
            if (v.kind() != Handler.Kind.HOLD) {
                continue;
            }
            // 0: the broker's retry schedule (3 + reconsumeTimes); a Busy message waits out the holder's lease.
            context.setDelayLevelWhenNextConsume(v.delay() == null ? 0 : handler.levelFor(v.delay()));
            if (i == 0) {
                return ConsumeConcurrentlyStatus.RECONSUME_LATER;
            }
            context.setAckIndex(i - 1);
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        }
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
    }

    /** @return the counters: the library's, acknowledged, held back, dead-lettered */
    public ListenerStats stats() {
        return handler.stats();
    }
}
