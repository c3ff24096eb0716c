package io.github.redisidem.rocketmq;

import io.github.redisidem.Idem;
import java.util.List;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * A {@link MessageListenerOrderly} that runs each message's work at most
 * once per key through {@link Idem#process}, in its queue's order:
 * {@code SUCCESS} only once the record is done (or the message was a
 * replay); otherwise {@code SUSPEND_CURRENT_QUEUE_A_MOMENT}, so that no
 * later message of the queue runs first: a Busy message for the holder's
 * lease left, a failure for the consumer's {@code suspendCurrentQueueTimeMillis};
 * an Exhausted message into {@code %DLQ%<group>}, then the queue goes on
 * past it.
 *
 * <pre>{@code
 * IdemOrderlyListener listener = IdemOrderlyListener.register(consumer, idem, (message, job) -> work(message));
 * }</pre>
 */
public final class IdemOrderlyListener implements MessageListenerOrderly {
    private final Handler handler;

    /**
     * @param consumer the consumer it is registered with (its {@code maxReconsumeTimes} is checked, or set when unset,
     *                 against the Idem's {@code maxTries}; Exhausted messages go back through it to the DLQ)
     * @param idem the loop; it needs {@code maxTries}
     * @param options the key function
     * @param work the work per message
     */
    public IdemOrderlyListener(DefaultMQPushConsumer consumer, Idem idem, RocketMQOptions options, MessageWork<?> work) {
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
    public static IdemOrderlyListener register(DefaultMQPushConsumer consumer, Idem idem, MessageWork<?> work) {
        return register(consumer, idem, RocketMQOptions.defaults(), work);
    }

    /**
     * @param consumer the consumer
     * @param idem the loop, with {@code maxTries}
     * @param options the key function
     * @param work the work per message
     * @return the listener, registered with the consumer
     */
    public static IdemOrderlyListener register(DefaultMQPushConsumer consumer, Idem idem, RocketMQOptions options,
                                               MessageWork<?> work) {
        IdemOrderlyListener listener = new IdemOrderlyListener(consumer, idem, options, work);
        consumer.registerMessageListener(listener);
        return listener;
    }

    /**
     * Messages in queue order; at the first one not acknowledged the queue is suspended and the batch taken again
     * (those before it replay).
     */
    @Override
    public ConsumeOrderlyStatus consumeMessage(List<MessageExt> messages, ConsumeOrderlyContext context) {
        String broker = context.getMessageQueue().getBrokerName();
        for (MessageExt message : messages) {
            Handler.Verdict v = handler.handle(message, broker);
            if (v.kind() == Handler.Kind.HOLD) {
                if (v.delay() != null) {
                    context.setSuspendCurrentQueueTimeMillis(Math.max(10, v.delay().toMillis()));
                }
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
            }
        }
        return ConsumeOrderlyStatus.SUCCESS;
    }

    /** @return the counters: the library's, acknowledged, held back, dead-lettered */
    public ListenerStats stats() {
        return handler.stats();
    }
}
