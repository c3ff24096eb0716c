package io.github.redisidem.amqp;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Function;
import org.springframework.amqp.core.AcknowledgeMode;
import org.springframework.amqp.core.Message;
import org.springframework.amqp.core.MessageProperties;
import org.springframework.amqp.rabbit.listener.api.ChannelAwareMessageListener;
import org.springframework.amqp.rabbit.support.DefaultMessagePropertiesConverter;
import org.springframework.amqp.rabbit.support.MessagePropertiesConverter;

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
 */
public final class IdempotentListener implements ChannelAwareMessageListener {
    /** The longest delay a failure is given back with. */
    public static final Duration MAX_RETRY_DELAY = Duration.ofSeconds(30);
    private static final Duration MIN_DELAY = Duration.ofMillis(100);

    private final Idem idem;
    private final AmqpHandler<?> handler;
    private final Function<Message, String> key;
    private final Function<Message, byte[]> payload;
    private final Duration retryDelay;
    private final List<Duration> retryQueues;
    private final String queue;
    private final Consumer<Throwable> onError;
    private final MessagePropertiesConverter converter = new DefaultMessagePropertiesConverter();
    private final Set<Channel> confirming = Collections.synchronizedSet(Collections.newSetFromMap(new WeakHashMap<>()));
    private final AtomicLong acknowledged = new AtomicLong();
    private final AtomicLong heldBack = new AtomicLong();
    private final AtomicLong deadLettered = new AtomicLong();

    private IdempotentListener(Builder b) {
        this.idem = b.idem;
        this.handler = b.handler;
        this.key = b.key;
        this.payload = b.payload;
        this.retryDelay = b.retryDelay;
        this.retryQueues = List.copyOf(b.retryQueues);
        this.queue = b.queue;
        this.onError = b.onError;
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
     * of twice {@code maxTries}, at least 20 (20 without maxTries) (each try is a delivery, a crashed consumer's one more).
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
        return new AmqpStats(acknowledged.get(), heldBack.get(), deadLettered.get(), idem.stats());
    }

    @Override
    public void onMessage(Message message, Channel channel) throws Exception {
        MessageProperties props = message.getMessageProperties();
        long tag = props.getDeliveryTag();
        Throwable error = null;
        try {
            String k = key.apply(message);
            if (k == null || k.isEmpty()) throw new MissingKeyException("the message has no message_id");
            idem.process(k, payload == null ? null : payload.apply(message), job -> handler.handle(message, job));
        } catch (Throwable e) {
            error = e;
        }
        if (error == null || error instanceof ResultNotStoredException) {
            channel.basicAck(tag, false);
            acknowledged.incrementAndGet();
        } else if (error instanceof ExhaustedException || error instanceof MismatchException || error instanceof MissingKeyException) {
            channel.basicReject(tag, false);
            deadLettered.incrementAndGet();
        } else {
            Duration delay = error instanceof BusyException busy ? busy.leaseLeft() : backoff(comeBacks(props));
            giveBack(message, channel, delay.compareTo(MIN_DELAY) < 0 ? MIN_DELAY : delay);
            heldBack.incrementAndGet();
        }
    }

    private Duration backoff(long comeBacks) {
        Duration d = retryDelay;
        for (long n = comeBacks; n > 0 && d.compareTo(MAX_RETRY_DELAY) < 0; n--) d = d.multipliedBy(2);
        return d.compareTo(MAX_RETRY_DELAY) > 0 ? MAX_RETRY_DELAY : d;
    }

    private String queueOf(MessageProperties props) {
        String q = props.getConsumerQueue();
        if (q == null) q = queue;
        if (q == null) throw new IllegalStateException("the message's queue is unknown: set the listener's queue()");
        return q;
    }

    /** How often the message came back from one of its queue's retry queues (x-death's counts). */
    private long comeBacks(MessageProperties props) {
        String prefix = queueOf(props) + ".retry.";
        long n = 0;
        for (Map<String, ?> death : deaths(props)) {
            if (String.valueOf(death.get("queue")).startsWith(prefix) && death.get("count") instanceof Number c) n += c.longValue();
        }
        return n;
    }

    @SuppressWarnings("unchecked")
    private static List<Map<String, ?>> deaths(MessageProperties props) {
        List<Map<String, ?>> x = props.getXDeathHeader();
        if (x != null) return x;
        Object h = props.getHeaders().get("x-death");
        return h instanceof List<?> l ? (List<Map<String, ?>>) l : List.of();
    }

    /**
     * Makes the message come again after {@code delay} without spinning: a copy to the retry queue of that delay
     * (confirmed by the broker), whose TTL dead-letters it back to the queue, then the delivery acknowledged.
     * Should the copy fail, the delivery is kept for the delay and then requeued.
     */
    private void giveBack(Message message, Channel channel, Duration delay) throws Exception {
        MessageProperties props = message.getMessageProperties();
        try {
            String q = queueOf(props);
            Duration ttl = retryQueue(delay);
            String name = q + ".retry." + ttl.toMillis();
            // Declared each time (one round trip, on the rare path): a copy sent to a queue deleted since is dropped.
            channel.queueDeclare(name, true, false, false,
                    Map.of("x-message-ttl", ttl.toMillis(), "x-dead-letter-exchange", "", "x-dead-letter-routing-key", q));
            if (confirming.add(channel)) channel.confirmSelect();
            channel.basicPublish("", name, false, copyOf(props), message.getBody());
            channel.waitForConfirmsOrDie(10_000);
        } catch (Exception e) {
            report(e);
            Thread.sleep(delay.toMillis());
            channel.basicNack(props.getDeliveryTag(), false, true);
            return;
        }
        channel.basicAck(props.getDeliveryTag(), false);
    }

    /** The message's properties and headers (x-death so far), without its user id, expiration and delivery count. */
    private AMQP.BasicProperties copyOf(MessageProperties props) {
        AMQP.BasicProperties p = converter.fromMessageProperties(props, "UTF-8");
        Map<String, Object> headers = p.getHeaders() == null ? new java.util.HashMap<>() : new java.util.HashMap<>(p.getHeaders());
        if (!headers.containsKey("x-death") && props.getXDeathHeader() != null) headers.put("x-death", props.getXDeathHeader());
        headers.remove("x-delivery-count"); // the quorum queue's count of this delivery: the copy is a new message
        return p.builder().userId(null).expiration(null).headers(headers).build();
    }

    /** The retry queue's delay for {@code delay}: the shortest at least as long, else the longest. */
    private Duration retryQueue(Duration delay) {
        Duration chosen = retryQueues.get(retryQueues.size() - 1);
        for (Duration d : retryQueues) if (d.compareTo(delay) >= 0 && d.compareTo(chosen) < 0) chosen = d;
        return chosen;
    }

    private void report(Throwable e) {
        if (onError != null) {
            try {
                onError.accept(e);
            } catch (RuntimeException ignored) {
                // the listener goes on either way
            }
        }
    }

    /** An IdempotentListener's settings. */
    public static final class Builder {
        private final Idem idem;
        private final AmqpHandler<?> handler;
        private Function<Message, String> key = m -> m.getMessageProperties().getMessageId();
        private Function<Message, byte[]> payload;
        private Duration retryDelay = MIN_DELAY;
        private List<Duration> retryQueues = defaultRetryQueues();
        private String queue;
        private Consumer<Throwable> onError;

        private Builder(Idem idem, AmqpHandler<?> handler) {
            this.idem = Objects.requireNonNull(idem, "idem");
            this.handler = Objects.requireNonNull(handler, "handler");
        }

        private static List<Duration> defaultRetryQueues() {
            List<Duration> out = new ArrayList<>();
            for (Duration d = MIN_DELAY; d.compareTo(MAX_RETRY_DELAY.multipliedBy(2)) <= 0; d = d.multipliedBy(2)) out.add(d);
            return out;
        }

        /** @param v the message's key; default its {@code message_id} (null or empty: a dead letter) @return this */
        public Builder key(Function<Message, String> v) {
            key = Objects.requireNonNull(v);
            return this;
        }

        /** @param v the message's PAYLOAD (a key seen again with another one is a dead letter, Mismatch); default none @return this */
        public Builder payload(Function<Message, byte[]> v) {
            payload = v;
            return this;
        }

        /** @param v how long a failed message first waits before it comes again (doubling, at most 30 s); default 100 ms @return this */
        public Builder retryDelay(Duration v) {
            if (v.toMillis() < 1) throw new IllegalArgumentException("retryDelay must be at least 1 ms");
            retryDelay = v;
            return this;
        }

        /** @param v the retry queues' delays (each queue {@code <queue>.retry.<ms>}); default 100 ms doubling to 51.2 s @return this */
        public Builder retryQueues(List<Duration> v) {
            if (v.isEmpty()) throw new IllegalArgumentException("at least one retry queue");
            for (Duration d : v) if (d.toMillis() < 1) throw new IllegalArgumentException("a retry queue's delay must be at least 1 ms: " + d);
            retryQueues = List.copyOf(v);
            return this;
        }

        /** @param v the queue, when the container does not tell it (it does: the consumer queue) @return this */
        public Builder queue(String v) {
            queue = v;
            return this;
        }

        /** @param v told what the listener could not do (a retry copy); default nothing @return this */
        public Builder onError(Consumer<Throwable> v) {
            onError = v;
            return this;
        }

        /** @return the listener (set the container's acknowledge mode to MANUAL) */
        public IdempotentListener build() {
            return new IdempotentListener(this);
        }
    }
}
