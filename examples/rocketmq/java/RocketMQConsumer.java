/*
 * A RocketMQ consumer with redis-idem's Java adapter (redis-idem-rocketmq).
 *
 * Usage, from a checkout after `make brokers-consumers-java`:
 *   clients/java/adapters/run rocketmq RocketMQConsumer redis://127.0.0.1:6379 127.0.0.1:9876
 *
 * It sends five orders to a new topic, each twice (a producer's retry: the
 * same KEYS, a new msgId), then consumes them with IdemConcurrentlyListener:
 * each order is charged once, its copy is a replay acknowledged without
 * running the work again. It prints how many charges ran and the counters.
 */
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.rocketmq.IdemConcurrentlyListener;
import io.github.redisidem.transport.JedisTransport;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import redis.clients.jedis.RedisClient;

public final class RocketMQConsumer {
    private RocketMQConsumer() {}

    public static void main(String[] args) throws Exception {
        String redisUrl = args.length > 0 ? args[0] : "redis://127.0.0.1:6379";
        String namesrv = args.length > 1 ? args[1] : "127.0.0.1:9876";
        String topic = "orders-" + System.currentTimeMillis();

        DefaultMQProducer producer = new DefaultMQProducer("example-producer");
        producer.setNamesrvAddr(namesrv);
        producer.start();
        for (int i = 1; i <= 5; i++) {
            for (int copy = 0; copy < 2; copy++) {
                Message m = new Message(topic, ("charge order " + i).getBytes(StandardCharsets.UTF_8));
                m.setKeys("order:" + i);            // the business key: the same on a retry
                producer.send(m);
            }
        }
        producer.shutdown();

        RedisClient redis = RedisClient.create(redisUrl);
        Idem idem = new Idem(JedisTransport.of(redis), IdemOptions.builder().prefix(topic + ":").maxTries(3).build());
        AtomicInteger charges = new AtomicInteger();
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("example-" + topic);
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        IdemConcurrentlyListener listener = IdemConcurrentlyListener.register(consumer, idem, (message, job) -> {
            charges.incrementAndGet();               // the side effect, once per order
            return new String(message.getBody(), StandardCharsets.UTF_8) + ": charged";
        });
        consumer.start();
        long deadline = System.currentTimeMillis() + 60_000;
        while (listener.stats().acknowledged() < 10 && System.currentTimeMillis() < deadline) {
            Thread.sleep(100);
        }
        consumer.shutdown();
        idem.close();
        redis.close();
        System.out.println(charges.get() + " charges for 10 deliveries; " + listener.stats());
        if (charges.get() != 5 || listener.stats().acknowledged() != 10) {
            System.exit(1);
        }
    }
}
