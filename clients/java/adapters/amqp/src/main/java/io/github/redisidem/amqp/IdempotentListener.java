package io.github.redisidem.amqp;

import com.rabbitmq.client.Channel;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import java.util.Map;
import java.util.Objects;
import org.springframework.amqp.core.AcknowledgeMode;
import org.springframework.amqp.core.Message;
import org.springframework.amqp.rabbit.listener.api.ChannelAwareMessageListener;

/**
 * A Spring AMQP listener that runs each message through an {@link Idem}
 * (docs/clients.md, "Consumers of brokers"), for a listener container with
 * {@link AcknowledgeMode#MANUAL}:
 *
 * <pre>{@code
 * SimpleMessageListenerContainer container = new SimpleMessageListenerContainer(connectionFactory);
 * container.setQueueNames("orders");
 * container.setAcknowledgeMode(AcknowledgeMode.MANUAL);
 * container.setMessageListener(IdempotentListener.builder(idem, (message, job) -> charge(message.getBody(), job.attempt())).build());
 * container.start();
 * }</pre>
 *
 * <ul>
 * <li>Acknowledged once the record is done (or a replay), never before.</li>
 * <li>Busy and failures (and DoneUnconfirmed, LeaseLost, NotDurable) are given back without spinning: a copy goes
 *     to a retry queue {@code <queue>.retry.<ms>} (declared on first use, its TTL dead-lettering back to the
 *     queue), confirmed by the broker, and then the delivery is acknowledged. Busy waits for the holder's lease
 *     left; a failure 100 ms, doubling each time the message came back from a retry queue, at most 30 s.</li>
 * <li>Exhausted, Mismatch and a message without a key are rejected without requeue: to the queue's dead-letter
 *     exchange, which adds where it came from ({@code x-death}).</li>
 * <li>Quorum queues: {@link #quorumQueueArguments} sets {@code x-delivery-limit} above {@code maxTries}, so that
 *     the broker never dead-letters a message the Idem would still try.</li>
 * </ul>
 * A {@code @RabbitListener} gets the same through {@link IdempotentAdvice}.
 */
public final class IdempotentListener implements ChannelAwareMessageListener {
    private final Settler settler;
    private final AmqpHandler<?> handler;

    private IdempotentListener(Builder b) {
        this.settler = new Settler(b);
        this.handler = b.handler;
    }

    /**
     * @param idem the Idem (the caller closes it)
     * @param handler the work for one message
     * @return a builder
     */
    public static Builder builder(Idem idem, AmqpHandler<?> handler) {
        return new Builder(idem, handler);
    }

    /**
     * A quorum queue's arguments for these consumers: the dead-letter exchange, and an {@code x-delivery-limit}
     * of twice {@code maxTries}, at least 20 (20 without maxTries): each try is a delivery, a crashed consumer's
     * one more.
     *
     * @param options the Idem's settings
     * @param deadLetterExchange the queue's dead-letter exchange
     * @return the arguments for {@code QueueBuilder.durable(name).withArguments(...)}
     */
    public static Map<String, Object> quorumQueueArguments(IdemOptions options, String deadLetterExchange) {
        // No maxTries: no limit of the Idem's, 20 for the broker's own redeliveries (a consumer lost each time).
        int limit = options.maxTries() == null ? 20 : Math.max(20, 2 * options.maxTries());
        return Map.of("x-queue-type", "quorum", "x-dead-letter-exchange", deadLetterExchange, "x-delivery-limit", limit);
    }

    /** @return the counters so far */
    public AmqpStats stats() {
        return settler.stats();
    }

    @Override
    public void onMessage(Message message, Channel channel) throws Exception {
        settler.settle(message, channel, job -> handler.handle(message, job));
    }

    /** An IdempotentListener's settings. */
    public static final class Builder extends AmqpOptions<Builder> {
        private final AmqpHandler<?> handler;

        private Builder(Idem idem, AmqpHandler<?> handler) {
            super(idem);
            this.handler = Objects.requireNonNull(handler, "handler");
        }

        /** @return the listener (set the container's acknowledge mode to MANUAL) */
        public IdempotentListener build() {
            return new IdempotentListener(this);
        }
    }
}
