package io.github.redisidem.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.Edition;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.RedisClient;

/**
 * What the scenario cannot show, on a real RocketMQ (brokers/launch.py,
 * started once for the class): a message without KEYS never runs its work
 * and is never acknowledged as done; it is given back until the consumer's
 * maxReconsumeTimes, which the listener set from maxTries, and then is in
 * RocketMQ's own %DLQ%&lt;group&gt;. The key is missing, so Redis is never
 * asked (the Idem points at a closed port).
 */
class MissingKeyBrokerTest {
    static final File REPO = new File(System.getProperty("redis.idem.repo", "../../../.."));
    static final File DIR = new File(REPO, "target/t/java-rocketmq-test");
    static String namesrv;
    static String brokerAddress;

    @BeforeAll
    static void start() throws Exception {
        // A fresh directory: launch.py appends to broker.log, and an old "boot success" would pass its wait.
        if (DIR.exists()) {
            try (var files = java.nio.file.Files.walk(DIR.toPath())) {
                files.sorted(java.util.Comparator.reverseOrder()).map(java.nio.file.Path::toFile).forEach(File::delete);
            }
        }
        Process p = new ProcessBuilder("python3", "brokers/launch.py", "start", "rocketmq", "--dir", DIR.getAbsolutePath())
                .directory(REPO).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
        assertEquals(0, p.waitFor(), out);
        String last = out.substring(out.lastIndexOf('\n') + 1);
        Map<?, ?> info = new ObjectMapper().readValue(last, Map.class);
        namesrv = (String) info.get("namesrv");
        brokerAddress = (String) info.get("broker_address");
    }

    @AfterAll
    static void stop() throws Exception {
        new ProcessBuilder("python3", "brokers/launch.py", "stop", "--dir", DIR.getAbsolutePath())
                .directory(REPO).inheritIO().start().waitFor();
    }

    @Test
    void aMessageWithoutKeysEndsInTheDlqWithoutItsWorkRunning() throws Exception {
        String topic = "nokey-" + System.currentTimeMillis();
        String group = topic + "-group";
        DefaultMQAdminExt admin = ScenarioTools.admin(namesrv);
        admin.createAndUpdateTopicConfig(brokerAddress, new TopicConfig(topic, 1, 1, 6));
        DefaultMQProducer producer = new DefaultMQProducer("producer-" + topic);
        producer.setNamesrvAddr(namesrv);
        producer.start();
        for (long until = System.currentTimeMillis() + 30_000; ; ) {   // until the name server has the new topic's route
            try {
                producer.send(new Message(topic, "no key".getBytes(StandardCharsets.UTF_8)));
                break;
            } catch (MQClientException e) {
                if (System.currentTimeMillis() > until) {
                    throw e;
                }
                Thread.sleep(300);
            }
        }
        producer.shutdown();

        RedisClient nowhere = RedisClient.create("127.0.0.1", 1);
        Idem idem = new Idem(JedisTransport.of(nowhere), IdemOptions.builder().edition(Edition.MODULE).maxTries(1).build());
        AtomicInteger ran = new AtomicInteger();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        IdemConcurrentlyListener listener = IdemConcurrentlyListener.register(consumer, idem,
                RocketMQOptions.builder().delayLevels(ScenarioConsumer.LAUNCHER_DELAY_LEVELS).spareRedeliveries(1).build(),
                (message, job) -> ran.incrementAndGet());
        assertEquals(2, consumer.getMaxReconsumeTimes());
        consumer.start();
        List<Map<String, Object>> dead = List.of();
        try {
            long deadline = System.currentTimeMillis() + 60_000;
            while (dead.isEmpty() && System.currentTimeMillis() < deadline) {
                Thread.sleep(500);
                dead = ScenarioTools.deadLetters(admin, topic, MixAll.getDLQTopic(group));
            }
        } finally {
            admin.shutdown();
            consumer.shutdown();
            idem.close();
            nowhere.close();
        }
        assertEquals(1, dead.size(), "the message in %DLQ%" + group + ": " + listener.stats());
        assertEquals("no key", dead.get(0).get("body"));
        assertEquals(true, dead.get(0).get("origin"), "RETRY_TOPIC and ORIGIN_MESSAGE_ID say where it came from");
        assertEquals(0, ran.get(), "the work never ran");
        assertEquals(0, listener.stats().acknowledged());
        assertEquals(0, listener.stats().deadLettered());
        assertTrue(listener.stats().heldBack() >= 3, "given back on each delivery: " + listener.stats());
    }
}
