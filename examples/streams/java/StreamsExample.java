/*
 * A Redis Streams consumer with redis-idem's Java adapter (redis-idem-streams).
 *
 * Usage (from the checkout, after `make brokers-consumers-java`):
 *   java -cp "clients/java/adapters/streams/target/classes:$(cat target/brokers/java/streams.classpath)" \
 *       examples/streams/java/StreamsExample.java 127.0.0.1:6379 [worker name]
 *
 * It adds five orders to the stream "orders", each twice (a producer's
 * retry: the same idem-key, a new entry id), then consumes them in the
 * group "billing" until Ctrl-C: each order is charged once, its XACK sent
 * with its DONE. Start a second worker with another name beside it: the
 * entries one leaves pending (a crash, a stop) the other takes over.
 */
import io.github.redisidem.IdemOptions;
import io.github.redisidem.streams.StreamConsumer;
import io.github.redisidem.transport.JedisTransport;
import java.util.Map;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.params.XAddParams;

public final class StreamsExample {
    private StreamsExample() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: StreamsExample <redis host:port> [worker name]");
            System.exit(2);
        }
        String[] hostPort = args[0].split(":");
        RedisClient redis = RedisClient.create(hostPort[0], Integer.parseInt(hostPort[1]));
        StreamConsumer consumer = StreamConsumer.builder(JedisTransport.of(redis), "orders", "billing")
                .idemOptions(IdemOptions.builder().prefix("example:").maxTries(5).build())
                .consumer(args.length > 1 ? args[1] : "worker-1")
                .build(); // makes the group when it is missing
        for (int n = 0; n < 10; n++) {
            redis.xadd("orders", XAddParams.xAddParams(), Map.of(StreamConsumer.KEY_FIELD, "order-" + n % 5, "body", "{\"cents\":1250}"));
        }
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            consumer.stop();
            try {
                main.join(10_000); // the entry in hand finishes
            } catch (InterruptedException ignored) {
                Thread.currentThread().interrupt();
            }
        }));
        consumer.run((entry, job) -> {
            System.out.printf("charged %s (%s), attempt %d%n", entry.field(StreamConsumer.KEY_FIELD), entry.field("body"), job.attempt());
            return "charged";
        });
        System.out.println(consumer.stats());
        consumer.close();
        redis.close();
    }
}
