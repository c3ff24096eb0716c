package io.github.redisidem.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.github.redisidem.Edition;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.common.message.MessageExt;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.RedisClient;

/**
 * The listeners' settings and the decisions made before any Redis call
 * (the scenario, brokers/scenario.py, is the proof against the broker).
 * The Idem points at a closed port (its edition given): nothing here may
 * reach it.
 */
class ListenerSettingsTest {
    static RedisClient nowhere;

    @BeforeAll
    static void open() {
        nowhere = RedisClient.create("127.0.0.1", 1);
    }

    @AfterAll
    static void close() {
        nowhere.close();
    }

    static Idem idem(Integer maxTries) {
        return new Idem(JedisTransport.of(nowhere), IdemOptions.builder().edition(Edition.MODULE).maxTries(maxTries).build());
    }

    @Test
    void delayLevelsPickTheFirstAtLeastTheLeaseLeft() {
        RocketMQOptions o = RocketMQOptions.builder().delayLevels(ScenarioConsumer.LAUNCHER_DELAY_LEVELS).build();
        assertEquals(1, o.levelFor(Duration.ofMillis(100)));
        assertEquals(1, o.levelFor(Duration.ofSeconds(1)));
        assertEquals(3, o.levelFor(Duration.ofMillis(1500)));
        assertEquals(18, o.levelFor(Duration.ofSeconds(60)));
        RocketMQOptions d = RocketMQOptions.defaults();
        assertEquals(Duration.ofHours(2), d.delayLevels().get(17));
        assertEquals(4, d.levelFor(Duration.ofSeconds(29)));
        assertThrows(IllegalArgumentException.class, () -> RocketMQOptions.builder().delayLevels("1s 5x"));
        assertThrows(IllegalArgumentException.class, () -> RocketMQOptions.builder().delayLevels("s"));
    }

    @Test
    void theDefaultKeyIsTheFirstOfKeysNeverTheMsgId() {
        MessageExt m = new MessageExt();
        m.setMsgId("7F000001000000000000000000000001");
        assertNull(RocketMQOptions.firstKey(m));
        m.setKeys("order:1 customer:9");
        assertEquals("order:1", RocketMQOptions.firstKey(m));
        m.setKeys(" ");
        assertNull(RocketMQOptions.firstKey(m));
    }

    @Test
    void maxReconsumeTimesIsKeptConsistentWithMaxTries() {
        MessageWork<Object> work = (message, job) -> null;
        assertThrows(IllegalArgumentException.class,
                () -> new IdemConcurrentlyListener(new DefaultMQPushConsumer("g"), idem(null), RocketMQOptions.defaults(), work));
        DefaultMQPushConsumer unset = new DefaultMQPushConsumer("g");
        new IdemOrderlyListener(unset, idem(3), RocketMQOptions.builder().spareRedeliveries(5).build(), work);
        assertEquals(8, unset.getMaxReconsumeTimes());
        DefaultMQPushConsumer below = new DefaultMQPushConsumer("g");
        below.setMaxReconsumeTimes(2);
        assertThrows(IllegalArgumentException.class, () -> IdemConcurrentlyListener.register(below, idem(3), work));
        DefaultMQPushConsumer enough = new DefaultMQPushConsumer("g");
        enough.setMaxReconsumeTimes(3);
        IdemConcurrentlyListener.register(enough, idem(3), work);
        assertEquals(3, enough.getMaxReconsumeTimes());
    }

    @Test
    void aMessageWithoutAKeyIsAFailureNeverPassedThrough() {
        AtomicInteger ran = new AtomicInteger();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("g");
        Handler h = new Handler(consumer, idem(3), (message, job) -> ran.incrementAndGet(), RocketMQOptions.defaults());
        MessageExt m = new MessageExt();
        m.setMsgId("7F000001000000000000000000000002");
        assertEquals(Handler.Kind.HOLD, h.handle(m, "b").kind());
        Handler throwing = new Handler(consumer, idem(3), (message, job) -> ran.incrementAndGet(),
                RocketMQOptions.builder().key(message -> { throw new IllegalStateException("no header"); }).build());
        assertEquals(Handler.Kind.HOLD, throwing.handle(m, "b").kind());
        assertEquals(0, ran.get());
        assertEquals(1, h.stats().heldBack());
        assertEquals(0, h.stats().acknowledged());
    }
}
