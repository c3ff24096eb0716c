package io.github.redisidem.rocketmq;

import java.io.BufferedReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.admin.ConsumeStats;
import org.apache.rocketmq.remoting.protocol.admin.OffsetWrapper;
import org.apache.rocketmq.remoting.protocol.admin.TopicOffset;
import org.apache.rocketmq.remoting.protocol.admin.TopicStatsTable;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The scenario's `produce` and `inspect` for RocketMQ (brokers/README.md):
 * the broker has no Python client here.
 */
final class ScenarioTools {
    /** Queues of the scenario's topic: more than the members, so that each has several. */
    static final int QUEUES = 8;

    private ScenarioTools() {}

    static DefaultMQAdminExt admin() throws Exception {
        return admin(ScenarioConsumer.namesrv());
    }

    static DefaultMQAdminExt admin(String namesrv) throws Exception {
        for (int attempt = 1; ; attempt++) {
            DefaultMQAdminExt admin = new DefaultMQAdminExt(10_000);
            admin.setNamesrvAddr(namesrv);
            admin.setInstanceName("inspect-" + ProcessHandle.current().pid() + "-" + attempt);
            try {
                admin.start();
                return admin;
            } catch (Exception e) {
                admin.shutdown();
                if (attempt == 3) {
                    throw e;
                }
                Thread.sleep(500);
            }
        }
    }

    /**
     * Messages as JSON lines on stdin, each sent once with its key in KEYS (a copy is a new message: a new msgId);
     * the orderly adapter's messages to the queue of their account. Prints {} when all are stored.
     */
    static void produce(BufferedReader in) throws Exception {
        String topic = ScenarioConsumer.env("IDEM_SOURCE");
        Map<?, ?> broker = ScenarioConsumer.JSON.readValue(ScenarioConsumer.env("BROKER"), Map.class);
        DefaultMQAdminExt admin = admin();
        TopicConfig config = new TopicConfig(topic, QUEUES, QUEUES, 6);
        admin.createAndUpdateTopicConfig((String) broker.get("broker_address"), config);
        DefaultMQProducer producer = new DefaultMQProducer("producer-" + topic);
        producer.setNamesrvAddr(ScenarioConsumer.namesrv());
        producer.setInstanceName("producer-" + ProcessHandle.current().pid());
        producer.setRetryTimesWhenSendFailed(5);
        producer.start();
        waitForRoute(producer, topic);
        boolean orderly = ScenarioConsumer.orderly();
        List<MessageQueue> queues = new ArrayList<>(producer.fetchPublishMessageQueues(topic));
        queues.sort(null);
        List<Map<?, ?>> chunk = new ArrayList<>();
        String line;
        while ((line = in.readLine()) != null) {
            if (!line.isBlank()) {
                chunk.add(ScenarioConsumer.JSON.readValue(line, Map.class));
            }
            if (chunk.size() == BATCH) {
                send(producer, topic, queues, orderly, chunk);
                chunk.clear();
            }
        }
        send(producer, topic, queues, orderly, chunk);
        System.out.println("{}");
    }

    /** Messages per batch send: a batch goes to one queue, in order. */
    static final int BATCH = 64;

    /**
     * Sends consecutive messages in batches: as they come (each batch to one queue, round robin), or for the
     * orderly adapter grouped by their account's queue, each group in publish order.
     */
    private static void send(DefaultMQProducer producer, String topic, List<MessageQueue> queues, boolean orderly,
                             List<Map<?, ?>> chunk) throws Exception {
        Map<MessageQueue, List<Message>> byQueue = new LinkedHashMap<>();
        List<Message> all = new ArrayList<>();
        for (Map<?, ?> m : chunk) {
            Map<String, Object> body = new LinkedHashMap<>();
            for (String k : List.of("key", "account", "seq", "kind")) {
                body.put(k, m.get(k));
            }
            Message message = new Message(topic, ScenarioConsumer.JSON.writeValueAsBytes(body));
            message.setKeys((String) m.get("key"));
            int account = ((Number) m.get("account")).intValue();
            byQueue.computeIfAbsent(queues.get(account % queues.size()), q -> new ArrayList<>()).add(message);
            all.add(message);
        }
        if (orderly) {
            for (Map.Entry<MessageQueue, List<Message>> e : byQueue.entrySet()) {
                check(producer.send(e.getValue(), e.getKey()));
            }
        } else if (!all.isEmpty()) {
            check(producer.send(all));
        }
    }

    private static void check(SendResult r) {
        if (r.getSendStatus() != SendStatus.SEND_OK) {
            throw new IllegalStateException("send: " + r.getSendStatus());
        }
    }

    private static void waitForRoute(DefaultMQProducer producer, String topic) throws Exception {
        long deadline = System.currentTimeMillis() + 30_000;
        while (true) {
            try {
                if (producer.fetchPublishMessageQueues(topic).size() == QUEUES) {
                    return;
                }
            } catch (Exception e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
            }
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("topic " + topic + " has not its " + QUEUES + " queues");
            }
            Thread.sleep(200);
        }
    }

    /**
     * Prints {"dead_letters": [{"key", "origin"}], "unacked": n}: what %DLQ%&lt;group&gt; holds (origin: it says
     * which topic and message it came from), and the records of the topic and of %RETRY%&lt;group&gt; past the
     * group's consumer offsets.
     */
    static void inspect() throws Exception {
        String topic = ScenarioConsumer.env("IDEM_SOURCE");
        String group = ScenarioConsumer.env("IDEM_GROUP");
        DefaultMQAdminExt admin = admin();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("dead_letters", deadLetters(admin, topic, MixAll.getDLQTopic(group)));
        ConsumeStats consumed = stats(() -> admin.examineConsumeStats(group));
        long left = 0;
        for (String t : List.of(topic, MixAll.getRetryTopic(group))) {
            TopicStatsTable stored = stats(() -> admin.examineTopicStats(t));
            if (stored == null) {
                continue;
            }
            for (Map.Entry<MessageQueue, TopicOffset> e : stored.getOffsetTable().entrySet()) {
                OffsetWrapper w = consumed == null ? null : consumed.getOffsetTable().get(e.getKey());
                long min = e.getValue().getMinOffset();
                long at = w == null ? min : Math.max(w.getConsumerOffset(), min);
                left += Math.max(0, e.getValue().getMaxOffset() - at);
            }
        }
        out.put("unacked", left);
        System.out.println(ScenarioConsumer.JSON.writeValueAsString(out));
    }

    interface Call<T> {
        T call() throws Exception;
    }

    /** An admin call on a topic or group that may not exist yet: null then. */
    private static <T> T stats(Call<T> call) {
        try {
        return call.call();
        } catch (Exception e) {
        return null;
        }
    }

    /**
     * What the dead-letter topic holds, read to its end. An admin call or a read that comes back short under load
     * is tried again (3 rounds): a final check once answered [] after the scenario had seen all three letters.
     */
    static List<Map<String, Object>> deadLetters(DefaultMQAdminExt admin, String topic, String dlq) throws Exception {
        List<Map<String, Object>> out = new ArrayList<>();
        for (int round = 1; round <= 3; round++) {
            if (round > 1) {
                Thread.sleep(1_000);
            }
            TopicStatsTable stored = stats(() -> admin.examineTopicStats(dlq));
            if (stored == null) {
                continue; // no such topic yet, or the call failed
            }
            long total = 0;
            for (TopicOffset o : stored.getOffsetTable().values()) {
                total += o.getMaxOffset() - o.getMinOffset();
            }
            if (total == 0) {
                return out;
            }
            out = read(admin, topic, stored, total);
            if (out.size() >= total) {
                return out;
            }
        }
        return out;
    }

    /** The `total` messages of `stored`'s queues from their first offsets, within 20 s. */
    private static List<Map<String, Object>> read(DefaultMQAdminExt admin, String topic, TopicStatsTable stored,
            long total) throws Exception {
        List<Map<String, Object>> out = new ArrayList<>();
        DefaultLitePullConsumer reader = new DefaultLitePullConsumer("inspect-" + UUID.randomUUID());
        reader.setNamesrvAddr(admin.getNamesrvAddr());
        reader.setInstanceName("inspect-reader-" + ProcessHandle.current().pid() + "-" + UUID.randomUUID());
        reader.setAutoCommit(false);
        reader.start();
        try {
            reader.assign(new ArrayList<>(stored.getOffsetTable().keySet()));
            for (Map.Entry<MessageQueue, TopicOffset> e : stored.getOffsetTable().entrySet()) {
                reader.seek(e.getKey(), e.getValue().getMinOffset());
            }
            long deadline = System.currentTimeMillis() + 20_000;
            while (out.size() < total && System.currentTimeMillis() < deadline) {
                for (MessageExt m : reader.poll(1_000)) {
                    Map<String, Object> letter = new LinkedHashMap<>();
                    letter.put("key", RocketMQOptions.firstKey(m));
                    letter.put("origin", topic.equals(m.getProperty(MessageConst.PROPERTY_RETRY_TOPIC))
                            && m.getProperty(MessageConst.PROPERTY_ORIGIN_MESSAGE_ID) != null);
                    letter.put("body", new String(m.getBody(), StandardCharsets.UTF_8));
                    out.add(letter);
                }
            }
        } finally {
            reader.shutdown();
        }
        return out;
    }
}
