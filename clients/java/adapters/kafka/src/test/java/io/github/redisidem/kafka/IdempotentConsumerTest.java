package io.github.redisidem.kafka;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.Test;

/**
 * What brokers/scenario.py does not show, on the real broker: a record without a key is
 * dead-lettered (never passed through) and committed; a Busy record holds back its own partition,
 * in order, while another partition goes on.
 */
class IdempotentConsumerTest {
    static Properties consumerProps(String bootstrap, String group) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        return p;
    }

    static KafkaProducer<String, String> producer(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        return new KafkaProducer<>(p, new StringSerializer(), new StringSerializer());
    }

    static void eventually(String what, BooleanSupplier check) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (!check.getAsBoolean()) {
            assertTrue(System.nanoTime() < deadline, "timed out waiting for " + what);
            Thread.sleep(100);
        }
    }

    static List<ConsumerRecord<String, String>> read(String bootstrap, String topic, int n) throws InterruptedException {
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumerProps(bootstrap, "check-" + UUID.randomUUID()),
                new StringDeserializer(), new StringDeserializer())) {
            c.subscribe(List.of(topic));
            eventually(n + " records in " + topic, () -> {
                c.poll(Duration.ofMillis(200)).forEach(out::add);
                return out.size() >= n;
            });
        }
        return out;
    }

    static long committed(String bootstrap, String group, TopicPartition tp) {
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumerProps(bootstrap, group),
                new StringDeserializer(), new StringDeserializer())) {
            OffsetAndMetadata o = c.committed(Set.of(tp)).get(tp);
            return o == null ? -1 : o.offset();
        }
    }

    @Test
    void keylessRecordDeadLetteredAndBusyHoldsOnlyItsPartition() throws Exception {
        String bootstrap = Servers.kafka();
        String topic = "java-kafka-" + UUID.randomUUID();
        String group = topic + "-group";
        Idem idem = new Idem(JedisTransport.of(Servers.redis()), IdemOptions.builder().prefix(topic + ":")
                .lease(Duration.ofSeconds(2)).waitFor(Duration.ofMillis(200)).build());
        try (KafkaProducer<String, String> producer = producer(bootstrap)) {
            producer.send(new ProducerRecord<>(topic, 2, null, "keyless")).get();
        }
        List<String> worked = new CopyOnWriteArrayList<>();
        try (KafkaConsumer<String, String> kafka = new KafkaConsumer<>(consumerProps(bootstrap, group),
                new StringDeserializer(), new StringDeserializer());
             KafkaProducer<String, String> deadLetters = producer(bootstrap)) {
            IdempotentConsumer<String, String> consumer = new IdempotentConsumer<>(idem, kafka, deadLetters,
                    IdempotentConsumerOptions.defaults());
            Thread loop = new Thread(() -> consumer.run(List.of(topic), (record, job) -> {
                worked.add(record.key());
                return record.value();
            }));
            loop.start();
            eventually("the dead letter", () -> consumer.stats().deadLettered() == 1);
            // The member runs: a key another worker holds, then a record of another partition.
            try (KafkaProducer<String, String> producer = producer(bootstrap)) {
                // The producer has the topic's metadata before the holder's 3 s lease starts.
                producer.partitionsFor(topic);
                idem.commands().claim("held", Duration.ofSeconds(3));
                producer.send(new ProducerRecord<>(topic, 0, "held", "first")).get();
                producer.send(new ProducerRecord<>(topic, 0, "after", "second")).get();
                producer.send(new ProducerRecord<>(topic, 1, "free", "other")).get();
            }
            eventually("the three keyed records", () -> worked.size() >= 3);
            consumer.stop();
            loop.join();
            KafkaStats stats = consumer.stats();
            assertEquals(List.of("free", "held", "after"), worked, "partition 1 went on while partition 0 was held, in order");
            assertEquals(3, stats.acknowledged());
            assertTrue(stats.heldBack() >= 1, stats.toString());
            assertTrue(stats.idem().busy() >= 1, stats.toString());
        }
        ConsumerRecord<String, String> letter = read(bootstrap, topic + "-dlt", 1).get(0);
        assertEquals(2, letter.partition());
        assertEquals("keyless", letter.value());
        assertArrayEquals(topic.getBytes(StandardCharsets.UTF_8), letter.headers().lastHeader("kafka_dlt-original-topic").value());
        assertEquals(2, ByteBuffer.wrap(letter.headers().lastHeader("kafka_dlt-original-partition").value()).getInt());
        assertEquals(0L, ByteBuffer.wrap(letter.headers().lastHeader("kafka_dlt-original-offset").value()).getLong());
        assertEquals(MissingKeyException.class.getName(),
                new String(letter.headers().lastHeader("kafka_dlt-exception-fqcn").value(), StandardCharsets.UTF_8));
        for (Map.Entry<Integer, Long> end : Map.of(0, 2L, 1, 1L, 2, 1L).entrySet()) {
            assertEquals(end.getValue(), committed(bootstrap, group, new TopicPartition(topic, end.getKey())),
                    "partition " + end.getKey() + " committed to its end");
        }

        // A member whose commit after a dead letter failed (a rebalance): the partition's next owner
        // starts from the record again, and finds its dead letter done instead of sending it twice.
        try (KafkaConsumer<String, String> rewind = new KafkaConsumer<>(consumerProps(bootstrap, group),
                new StringDeserializer(), new StringDeserializer())) {
            rewind.commitSync(Map.of(new TopicPartition(topic, 2), new OffsetAndMetadata(0)));
        }
        try (KafkaConsumer<String, String> kafka = new KafkaConsumer<>(consumerProps(bootstrap, group),
                new StringDeserializer(), new StringDeserializer());
             KafkaProducer<String, String> deadLetters = producer(bootstrap)) {
            IdempotentConsumer<String, String> next = new IdempotentConsumer<>(idem, kafka, deadLetters,
                    IdempotentConsumerOptions.defaults());
            Thread loop = new Thread(() -> next.run(List.of(topic), (record, job) -> record.value()));
            loop.start();
            eventually("the record settled again", () -> next.stats().deadLettered() == 1);
            next.stop();
            loop.join();
            assertEquals(0, next.stats().heldBack(), next.stats().toString());
        }
        assertEquals(1L, committed(bootstrap, group, new TopicPartition(topic, 2)));
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumerProps(bootstrap, "check-" + UUID.randomUUID()),
                new StringDeserializer(), new StringDeserializer())) {
            List<TopicPartition> dlt = c.partitionsFor(topic + "-dlt").stream()
                    .map(p -> new TopicPartition(p.topic(), p.partition())).toList();
            assertEquals(1L, c.endOffsets(dlt).values().stream().mapToLong(Long::longValue).sum(), "one dead letter");
        }
        idem.close();
    }
}
