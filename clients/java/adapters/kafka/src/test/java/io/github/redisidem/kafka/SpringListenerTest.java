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
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;

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
        ConcurrentKafkaListenerContainerFactory<String, String> kafkaListenerContainerFactory(KafkaTemplate<String, String> template) {
            ConcurrentKafkaListenerContainerFactory<String, String> factory = new ConcurrentKafkaListenerContainerFactory<>();
            factory.setConsumerFactory(new DefaultKafkaConsumerFactory<>(Map.of(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
                    ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest"), new StringDeserializer(), new StringDeserializer()));
            factory.setContainerCustomizer(idempotent.customizer());
            factory.setCommonErrorHandler(idempotent.errorHandler(new DeadLetterPublishingRecoverer(template)));
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
                .lease(Duration.ofSeconds(2)).maxTries(2).build());
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
            IdempotentConsumerTest.eventually("the committed offsets", () ->
                    IdempotentConsumerTest.committed(bootstrap, topic + "-group", new TopicPartition(topic, 0)) == 3
                            && IdempotentConsumerTest.committed(bootstrap, topic + "-group", new TopicPartition(topic, 1)) == 2);
        }
        assertEquals(List.of("a@1", "p@1", "p@2"), WORKED.stream().filter(w -> !w.startsWith("b@")).toList());
        assertTrue(WORKED.contains("b@1"), WORKED.toString());
        KafkaStats stats = idempotent.stats();
        assertEquals(3, stats.acknowledged(), stats.toString()); // a, its replay, b
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
