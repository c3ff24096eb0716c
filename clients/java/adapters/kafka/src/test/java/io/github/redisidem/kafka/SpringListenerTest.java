package io.github.redisidem.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.stream.Collectors;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.junit.jupiter.api.Test;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.kafka.annotation.EnableKafka;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.config.KafkaListenerEndpointRegistry;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.ListenerContainerPauseService;
import org.springframework.scheduling.concurrent.ThreadPoolTaskScheduler;

/**
 * A {@code @KafkaListener} made idempotent by its container factory's configuration alone, on the
 * real broker: a producer's retry (same key, new offset) runs the method once, a poison record is
 * dead-lettered by Spring's recoverer once the Idem's maxTries is used, a record without a key at
 * once; every offset committed.
 */
class SpringListenerTest {
    static final List<String> WORKED = new CopyOnWriteArrayList<>();
    static Idem idem;
    static IdempotentKafkaListeners idempotent;
    static String bootstrap;

    @Configuration
    @EnableKafka
    static class Config {
        @Bean
        KafkaTemplate<String, String> template() {
            return new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(Map.of(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap),
                    new StringSerializer(), new StringSerializer()));
        }

        @Bean
        ThreadPoolTaskScheduler scheduler() {
            return new ThreadPoolTaskScheduler();
        }

        @Bean
        ConcurrentKafkaListenerContainerFactory<String, String> kafkaListenerContainerFactory(KafkaTemplate<String, String> template,
                KafkaListenerEndpointRegistry registry, ThreadPoolTaskScheduler scheduler) {
            ConcurrentKafkaListenerContainerFactory<String, String> factory = new ConcurrentKafkaListenerContainerFactory<>();
            factory.setConsumerFactory(new DefaultKafkaConsumerFactory<>(Map.of(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
                    ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest"), new StringDeserializer(), new StringDeserializer()));
            factory.setContainerCustomizer(idempotent.customizer());
            // A partition held back is paused; the container's other partitions go on.
            factory.setCommonErrorHandler(idempotent.errorHandler(new DeadLetterPublishingRecoverer(template),
                    IdempotentKafkaListeners.pausingPartitions(new ListenerContainerPauseService(registry, scheduler))));
            return factory;
        }

        @Bean
        Listener listener() {
            return new Listener();
        }
    }

    static class Listener {
        @KafkaListener(topics = "${idem.test.topic}", groupId = "${idem.test.topic}-group")
        void on(ConsumerRecord<String, String> record) {
            WORKED.add(record.key() + "@" + IdempotentKafkaListeners.currentJob().attempt());
            if ("poison".equals(record.value())) {
                throw new IllegalStateException("poison " + record.key());
            }
        }
    }

    @Test
    void listenerRunsOncePerKeyAndDeadLettersThroughSpring() throws Exception {
        bootstrap = Servers.kafka();
        String topic = "java-kafka-spring-" + UUID.randomUUID();
        System.setProperty("idem.test.topic", topic);
        idem = new Idem(JedisTransport.of(Servers.redis()), IdemOptions.builder().prefix(topic + ":")
                .lease(Duration.ofSeconds(2)).waitFor(Duration.ofMillis(200)).maxTries(2).build());
        idempotent = new IdempotentKafkaListeners(idem);
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            producer.send(new ProducerRecord<>(topic, 0, "a", "ok")).get();
            producer.send(new ProducerRecord<>(topic, 0, "p", "poison")).get();
            producer.send(new ProducerRecord<>(topic, 0, "a", "ok")).get(); // a producer's retry
            producer.send(new ProducerRecord<>(topic, 1, null, "keyless")).get();
            producer.send(new ProducerRecord<>(topic, 1, "b", "ok")).get();
        }
        try (AnnotationConfigApplicationContext context = new AnnotationConfigApplicationContext(Config.class)) {
            IdempotentConsumerTest.eventually("the listeners' end", () -> idempotent.stats().acknowledged() >= 3
                    && idempotent.stats().deadLettered() >= 2);
            // Then a key another worker holds, on partition 2, and a record of partition 1 after it.
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
                // The producer has the topic's metadata before the holder's 3 s lease starts.
                producer.partitionsFor(topic);
                idem.commands().claim("held", Duration.ofSeconds(3));
                producer.send(new ProducerRecord<>(topic, 2, "held", "ok")).get();
                producer.send(new ProducerRecord<>(topic, 2, "after", "ok")).get();
                producer.send(new ProducerRecord<>(topic, 1, "c", "ok")).get();
            }
            IdempotentConsumerTest.eventually("the held key's end", () -> idempotent.stats().acknowledged() >= 6);
            IdempotentConsumerTest.eventually("the committed offsets", () ->
                    IdempotentConsumerTest.committed(bootstrap, topic + "-group", new TopicPartition(topic, 0)) == 3
                            && IdempotentConsumerTest.committed(bootstrap, topic + "-group", new TopicPartition(topic, 1)) == 3
                            && IdempotentConsumerTest.committed(bootstrap, topic + "-group", new TopicPartition(topic, 2)) == 2);
        }
        assertEquals(List.of("a@1", "p@1", "p@2"), WORKED.stream().filter(w -> w.startsWith("a@") || w.startsWith("p@")).toList());
        assertEquals(List.of("held@2", "after@1"), WORKED.stream().filter(w -> w.startsWith("held@") || w.startsWith("after@")).toList(),
                "the Busy record waited for the holder's lease, its partition in order");
        assertTrue(WORKED.indexOf("c@1") < WORKED.indexOf("held@2"), "partition 1 went on while partition 2 was held: " + WORKED);
        KafkaStats stats = idempotent.stats();
        assertEquals(6, stats.acknowledged(), stats.toString()); // a, its replay, b, held, after, c
        assertTrue(stats.heldBack() >= 3 && stats.idem().busy() >= 1, stats.toString()); // p twice, held
        assertEquals(1, stats.idem().replays(), stats.toString());
        assertEquals(2, stats.deadLettered(), stats.toString());
        List<ConsumerRecord<String, String>> letters = IdempotentConsumerTest.read(bootstrap, topic + "-dlt", 2);
        Map<String, ConsumerRecord<String, String>> byValue = letters.stream()
                .collect(Collectors.toMap(ConsumerRecord::value, r -> r));
        assertEquals(Set.of("poison", "keyless"), byValue.keySet());
        ConsumerRecord<String, String> poison = byValue.get("poison");
        assertEquals(0, poison.partition());
        assertEquals(1L, ByteBuffer.wrap(poison.headers().lastHeader("kafka_dlt-original-offset").value()).getLong());
        assertTrue(new String(poison.headers().lastHeader("kafka_dlt-exception-fqcn").value(), StandardCharsets.UTF_8)
                .endsWith("ListenerExecutionFailedException"));
        assertTrue(new String(poison.headers().lastHeader("kafka_dlt-exception-message").value(), StandardCharsets.UTF_8)
                .contains("xhausted"), "the Idem's verdict in the dead letter");
        assertEquals(1, byValue.get("keyless").partition());
        idem.close();
    }
}
