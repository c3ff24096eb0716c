package io.github.redisidem.rocketmq;

import io.github.redisidem.Idem;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import java.lang.System.Logger.Level;
import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * One message through the library's loop, and what the listener answers
 * for it; shared by both listeners. Every decision about the record is the
 * library's ({@code Idem.process}); this only maps its outcome to RocketMQ.
 */
final class Handler {
    private static final System.Logger LOG = System.getLogger("io.github.redisidem.rocketmq");
    /** The record of an Exhausted message's move to the DLQ: {@code <key>:%DLQ%}. */
    static final String DEAD_LETTER_SUFFIX = ":%DLQ%";

    enum Kind {
        /** done or replayed: acknowledge */
        ACK,
        /** give back: after {@link Verdict#delay} when Busy, else the consumer's own retry delay */
        HOLD,
        /** moved to %DLQ%&lt;group&gt;: acknowledge */
        DEAD_LETTERED
    }

    record Verdict(Kind kind, Duration delay) {}

    private final DefaultMQPushConsumer consumer;
    private final Idem idem;
    private final MessageWork<?> work;
    private final RocketMQOptions options;
    private final AtomicLong acknowledged = new AtomicLong();
    private final AtomicLong heldBack = new AtomicLong();
    private final AtomicLong deadLettered = new AtomicLong();

    Handler(DefaultMQPushConsumer consumer, Idem idem, MessageWork<?> work, RocketMQOptions options) {
        this.consumer = Objects.requireNonNull(consumer, "consumer");
        this.idem = Objects.requireNonNull(idem, "idem");
        this.work = Objects.requireNonNull(work, "work");
        this.options = Objects.requireNonNull(options, "options");
        Integer maxTries = idem.options().maxTries();
        if (maxTries == null) {
            throw new IllegalArgumentException("the Idem needs maxTries (IdemOptions.builder().maxTries(n)): an exhausted "
                    + "message goes to %DLQ%<group> after that many tries");
        }
        // RocketMQ counts every redelivery (Busy rounds too) against maxReconsumeTimes and dead-letters by itself
        // past it: it must leave the library's maxTries room to answer Exhausted first.
        int max = consumer.getMaxReconsumeTimes();
        if (max == -1) {
            consumer.setMaxReconsumeTimes(maxTries + options.spareRedeliveries());
        } else if (max < maxTries) {
            throw new IllegalArgumentException("the consumer's maxReconsumeTimes (" + max + ") is below maxTries (" + maxTries
                    + "): RocketMQ would dead-letter a message before its tries are used; leave it unset or raise it");
        }
    }

    /**
     * @param message the message
     * @param brokerName the broker of the queue it came from (its dead letter goes through that broker)
     */
    Verdict handle(MessageExt message, String brokerName) {
        String key;
        try {
            key = options.key().apply(message);
        } catch (RuntimeException e) {
            return failed(message, e);
        }
        if (key == null || key.isEmpty()) {
            return failed(message, new MissingKeyException(message.getMsgId()));
        }
        try {
            idem.process(key, job -> work.run(message, job));
            return acknowledge();
        } catch (ResultNotStoredException e) {
            // The record is done, without its result: the work ran once and will not run again.
            return acknowledge();
        } catch (BusyException e) {
            heldBack.incrementAndGet();
            return new Verdict(Kind.HOLD, e.leaseLeft());
        } catch (ExhaustedException e) {
            return deadLetter(message, key, brokerName);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return failed(message, e);
        } catch (Exception | Error e) {
            // The work's failure (released by the loop), DoneUnconfirmed, LeaseLost, NotDurable, a hook, the
            // connection: not acknowledged; the redelivery runs, replays or is fenced.
            return failed(message, e);
        }
    }

    private Verdict acknowledge() {
        acknowledged.incrementAndGet();
        return new Verdict(Kind.ACK, null);
    }

    private Verdict failed(MessageExt message, Throwable error) {
        heldBack.incrementAndGet();
        LOG.log(Level.DEBUG, () -> "message " + message.getMsgId() + " given back: " + error);
        return new Verdict(Kind.HOLD, null);
    }

    /**
     * Delay level -1 is RocketMQ's "no retry, into the DLQ directly": the broker copies the stored message into
     * %DLQ%&lt;group&gt; with its origin (RETRY_TOPIC, ORIGIN_MESSAGE_ID); the message is acknowledged only once
     * that answered. The move is itself a work of the loop, under the key {@code <key>:%DLQ%}: a poison message
     * redelivered twice (its retry sent back again after a rebalance) reaches the DLQ once, the second copy a replay.
     */
    private Verdict deadLetter(MessageExt message, String key, String brokerName) {
        boolean[] sent = {false};
        try {
            idem.process(key + DEAD_LETTER_SUFFIX, job -> {
                consumer.sendMessageBack(message, -1, brokerName);
                sent[0] = true;
                return null;
            });
        } catch (BusyException e) {
            heldBack.incrementAndGet();
            return new Verdict(Kind.HOLD, e.leaseLeft());
        } catch (Exception e) {
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            return failed(message, e);
        }
        if (!sent[0]) {
            return acknowledge();   // another delivery of it moved it already
        }
        deadLettered.incrementAndGet();
        LOG.log(Level.WARNING, () -> "key " + key + " (message " + message.getMsgId() + ", " + message.getTopic() + " queue "
                + message.getQueueId() + " offset " + message.getQueueOffset() + ") used its " + idem.options().maxTries()
                + " tries: moved to %DLQ%" + consumer.getConsumerGroup());
        return new Verdict(Kind.DEAD_LETTERED, null);
    }

    int levelFor(Duration wait) {
        return options.levelFor(wait);
    }

    ListenerStats stats() {
        return new ListenerStats(idem.stats(), acknowledged.get(), heldBack.get(), deadLettered.get());
    }
}
