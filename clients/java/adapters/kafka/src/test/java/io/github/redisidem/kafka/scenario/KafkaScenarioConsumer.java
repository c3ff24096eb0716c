package io.github.redisidem.kafka.scenario;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.Job;
import io.github.redisidem.kafka.IdempotentConsumer;
import io.github.redisidem.kafka.IdempotentConsumerOptions;
import io.github.redisidem.transport.JedisTransport;
import java.net.URI;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import redis.clients.jedis.RedisClient;
import sun.misc.Signal;

/**
 * The java-kafka consumer of brokers/scenario.py (brokers/README.md, "Writing a consumer program"):
 * IdempotentConsumer's poll loop as the README shows it, configured from the environment.
 */
public final class KafkaScenarioConsumer {
    private static final Map<String, String> ENV = System.getenv();
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String MEMBER = ENV.get("IDEM_MEMBER");
    private static final RedisClient SIDE = redis(ENV.get("SIDE_REDIS_URL"));

    private KafkaScenarioConsumer() {}

    public static void main(String[] args) throws Exception {
        int lease = Integer.parseInt(ENV.get("IDEM_LEASE_S"));
        String bootstrap = JSON.readTree(ENV.get("BROKER")).get("bootstrap").asText();
        Idem idem = new Idem(JedisTransport.of(redis(ENV.get("IDEM_REDIS_URL"))), IdemOptions.builder()
                .lease(Duration.ofSeconds(lease)).maxTries(Integer.parseInt(ENV.get("IDEM_MAX_TRIES"))).build());

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, ENV.get("IDEM_GROUP"));
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        // The session no longer than the lease: a member that stops loses its partitions when it
        // loses its leases, and their new owner is done with a record before it can write late.
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, lease * 1000);
        props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, lease * 250);
        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.ACKS_CONFIG, "all");

        try (KafkaConsumer<String, String> kafka = new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer());
             KafkaProducer<String, String> deadLetters = new KafkaProducer<>(producerProps, new StringSerializer(), new StringSerializer())) {
            IdempotentConsumer<String, String> consumer = new IdempotentConsumer<>(idem, kafka, deadLetters,
                    IdempotentConsumerOptions.<String, String>builder()
                            .onError(e -> System.err.println("member " + MEMBER + ": " + e)).build());
            Signal.handle(new Signal("TERM"), s -> consumer.stop());
            consumer.run(List.of(ENV.get("IDEM_SOURCE")), (record, job) -> work(JSON.readTree(record.value()), job));
            System.err.println("member " + MEMBER + ": " + consumer.stats());
        }
        idem.close();
    }

    /** The work: its start and its effect, fenced by the attempt, in the side store. */
    static Map<String, Long> work(JsonNode body, Job job) throws InterruptedException {
        String key = body.get("key").asText();
        String kind = body.get("kind").asText();
        Object started = SIDE.evalsha(ENV.get("SIDE_START_SHA"), List.of(key), List.of(kind, MEMBER));
        if ("fail".equals(started)) {
            throw new IllegalStateException(key + ": the work failed");
        }
        Thread.sleep(Long.parseLong(ENV.get("slow".equals(kind) ? "IDEM_SLOW_WORK_MS" : "IDEM_WORK_MS")));
        SIDE.evalsha(ENV.get("SIDE_EFFECT_SHA"), List.of(key), List.of(String.valueOf(job.attempt()),
                body.get("account").asText(), body.get("seq").asText(), MEMBER));
        return Map.of("n", body.get("seq").asLong());
    }

    private static RedisClient redis(String url) {
        URI uri = URI.create(url);
        return RedisClient.create(uri.getHost(), uri.getPort());
    }
}
