// A Kafka consumer with redis-idem's Java adapter (redis-idem-kafka's IdempotentConsumer).
//
// Usage (after `make client-java-installed brokers-consumers-java`):
//   clients/java/adapters/run kafka KafkaExample 127.0.0.1:6379 127.0.0.1:9092
//
// It sends five orders to the topic "orders", each twice (a producer's retry: the same key, a new
// offset), then consumes them in the group "billing" until Ctrl-C: each order is charged once, and
// its offsets are committed once they are done. A topic's dead letters go to "orders-dlt".
// (Compiled with the kafka module's tests.)

import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.kafka.IdempotentConsumer;
import io.github.redisidem.kafka.IdempotentConsumerOptions;
import io.github.redisidem.transport.JedisTransport;
import java.util.List;
import java.util.Map;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.RedisClient;

public final class KafkaExample {
    private KafkaExample() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: KafkaExample <redis host:port> <kafka host:port>");
            System.exit(2);
        }
        HostAndPort redis = HostAndPort.from(args[0]);
        Idem idem = new Idem(JedisTransport.of(RedisClient.create(redis.getHost(), redis.getPort())),
                IdemOptions.builder().prefix("example:").maxTries(5).build());
        Map<String, Object> producerConfig = Map.of("bootstrap.servers", args[1], "acks", "all");
        Map<String, Object> config = Map.of("bootstrap.servers", args[1], "group.id", "billing",
                "enable.auto.commit", false, "auto.offset.reset", "earliest");
        try (var producer = new KafkaProducer<>(producerConfig, new StringSerializer(), new StringSerializer());
             var kafka = new KafkaConsumer<>(config, new StringDeserializer(), new StringDeserializer())) {
            for (int copy = 0; copy < 2; copy++) {
                for (int order = 1; order <= 5; order++) {
                    producer.send(new ProducerRecord<>("orders", "order:" + order, "{\"cents\": " + order * 100 + "}")).get();
                }
            }
            var consumer = new IdempotentConsumer<>(idem, kafka, producer, IdempotentConsumerOptions.<String, String>defaults());
            Thread loop = Thread.currentThread();
            Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                consumer.stop();
                try {
                    loop.join(30_000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }));
            consumer.run(List.of("orders"), (record, job) -> {
                System.out.printf("charging %s %s (attempt %d)%n", record.key(), record.value(), job.attempt());
                return Map.of("charged", record.key());
            });
            System.out.println(consumer.stats());
        }
        idem.close();
    }
}
