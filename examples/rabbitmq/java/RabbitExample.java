/*
 * A RabbitMQ consumer with redis-idem's Java adapter (redis-idem-amqp, on
 * Spring AMQP).
 *
 * Usage (from the checkout, after `make brokers-consumers-java`):
 *   java -cp "clients/java/adapters/amqp/target/classes:$(cat target/brokers/java/amqp.classpath)" \
 *       examples/rabbitmq/java/RabbitExample.java 127.0.0.1:6379 127.0.0.1:5672
 *
 * It declares the quorum queue "orders" (its dead letters through the
 * exchange "orders.dlx" into "orders.dlq"), publishes five orders each
 * twice (a publisher's retry: the same message_id), then consumes until
 * Ctrl-C: each order is charged once; a Busy or failed one comes back
 * through a retry queue "orders.retry.<ms>".
 */
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.amqp.IdempotentListener;
import io.github.redisidem.transport.JedisTransport;
import java.nio.charset.StandardCharsets;
import org.springframework.amqp.core.AcknowledgeMode;
import org.springframework.amqp.core.BindingBuilder;
import org.springframework.amqp.core.FanoutExchange;
import org.springframework.amqp.core.MessageBuilder;
import org.springframework.amqp.core.Queue;
import org.springframework.amqp.core.QueueBuilder;
import org.springframework.amqp.rabbit.connection.CachingConnectionFactory;
import org.springframework.amqp.rabbit.core.RabbitAdmin;
import org.springframework.amqp.rabbit.core.RabbitTemplate;
import org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer;
import redis.clients.jedis.RedisClient;

public final class RabbitExample {
    private RabbitExample() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: RabbitExample <redis host:port> <rabbitmq host:port>");
            System.exit(2);
        }
        String[] redisAt = args[0].split(":");
        String[] rabbitAt = args[1].split(":");
        IdemOptions options = IdemOptions.builder().prefix("example:").maxTries(5).build();
        Idem idem = new Idem(JedisTransport.of(RedisClient.create(redisAt[0], Integer.parseInt(redisAt[1]))), options);
        CachingConnectionFactory rabbit = new CachingConnectionFactory(rabbitAt[0], Integer.parseInt(rabbitAt[1]));

        RabbitAdmin admin = new RabbitAdmin(rabbit);
        FanoutExchange dlx = new FanoutExchange("orders.dlx");
        Queue dlq = QueueBuilder.durable("orders.dlq").build();
        admin.declareExchange(dlx);
        admin.declareQueue(dlq);
        admin.declareBinding(BindingBuilder.bind(dlq).to(dlx));
        admin.declareQueue(QueueBuilder.durable("orders").withArguments(IdempotentListener.quorumQueueArguments(options, "orders.dlx")).build());
        RabbitTemplate template = new RabbitTemplate(rabbit);
        for (int n = 0; n < 10; n++) {
            template.send("", "orders", MessageBuilder.withBody("{\"cents\":1250}".getBytes(StandardCharsets.UTF_8))
                    .setMessageId("order-" + n % 5).build());
        }

        IdempotentListener listener = IdempotentListener.builder(idem, (message, job) -> {
            System.out.printf("charged %s (%s), attempt %d%n", message.getMessageProperties().getMessageId(),
                    new String(message.getBody(), StandardCharsets.UTF_8), job.attempt());
            return "charged";
        }).build();
        SimpleMessageListenerContainer container = new SimpleMessageListenerContainer(rabbit);
        container.setQueueNames("orders");
        container.setAcknowledgeMode(AcknowledgeMode.MANUAL);
        container.setMessageListener(listener);
        container.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> { // Ctrl-C: the message in hand finishes
            container.stop();
            System.out.println(listener.stats());
            rabbit.destroy();
            idem.close();
        }));
        Thread.currentThread().join();
    }
}
