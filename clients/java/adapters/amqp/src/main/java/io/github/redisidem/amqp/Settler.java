package io.github.redisidem.amqp;

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import io.github.redisidem.Idem;
import io.github.redisidem.Work;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.WeakHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.Function;
import org.springframework.amqp.core.Message;
import org.springframework.amqp.core.MessageProperties;
import org.springframework.amqp.rabbit.support.DefaultMessagePropertiesConverter;
import org.springframework.amqp.rabbit.support.MessagePropertiesConverter;

/** Runs one delivery through the Idem and settles it with the broker: what the listener and the advice share. */
final class Settler {
    private final Idem idem;
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

    Settler(AmqpOptions<?> o) {
        this.idem = o.idem;
        this.key = o.key;
        this.payload = o.payload;
        this.retryDelay = o.retryDelay;
        this.retryQueues = List.copyOf(o.retryQueues);
        this.queue = o.queue;
        this.onError = o.onError;
    }

    AmqpStats stats() {
        return new AmqpStats(acknowledged.get(), heldBack.get(), deadLettered.get(), idem.stats());
    }

    /**
     * Acknowledged once the record is done (or a replay); Busy and failures given back through a retry queue;
     * Exhausted, Mismatch and no key rejected to the queue's dead-letter exchange.
     */
    void settle(Message message, Channel channel, Work<?> work) throws Exception {
        MessageProperties props = message.getMessageProperties();
        long tag = props.getDeliveryTag();
        Throwable error = null;
        try {
            String k = key.apply(message);
            if (k == null || k.isEmpty()) throw new MissingKeyException("the message has no message_id");
            idem.process(k, payload == null ? null : payload.apply(message), work);
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
            giveBack(message, channel, delay.compareTo(AmqpOptions.MIN_DELAY) < 0 ? AmqpOptions.MIN_DELAY : delay);
            heldBack.incrementAndGet();
        }
    }

    private Duration backoff(long comeBacks) {
        Duration d = retryDelay;
        for (long n = comeBacks; n > 0 && d.compareTo(AmqpOptions.MAX_RETRY_DELAY) < 0; n--) d = d.multipliedBy(2);
        return d.compareTo(AmqpOptions.MAX_RETRY_DELAY) > 0 ? AmqpOptions.MAX_RETRY_DELAY : d;
    }

    private String queueOf(MessageProperties props) {
        String q = props.getConsumerQueue();
        if (q == null) q = queue;
        if (q == null) throw new IllegalStateException("the message's queue is unknown: set queue()");
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
        Map<String, Object> headers = p.getHeaders() == null ? new HashMap<>() : new HashMap<>(p.getHeaders());
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
                // the consumer goes on either way
            }
        }
    }
}
