package io.github.redisidem.amqp;

import io.github.redisidem.Idem;
import io.github.redisidem.scenario.Scenario;
import io.github.redisidem.transport.JedisTransport;
import java.net.URI;
import java.util.concurrent.CountDownLatch;
import org.springframework.amqp.core.AcknowledgeMode;
import org.springframework.amqp.rabbit.connection.CachingConnectionFactory;
import org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer;

/** The java-amqp consumer of brokers/scenario.py: an IdempotentListener in a SimpleMessageListenerContainer. */
public final class AmqpConsumerMain {
    private AmqpConsumerMain() {}

    public static void main(String[] args) throws Exception {
        Scenario env = new Scenario();
        Idem idem = new Idem(JedisTransport.of(env.records()), env.idemOptions());
        URI url = URI.create(env.broker.get("url").asText());
        CachingConnectionFactory rabbit = new CachingConnectionFactory(url);
        // amqp://host:port/ names the vhost "" by the AMQP URI spec; pika and the scenario mean the default one.
        if (url.getPath() == null || url.getPath().equals("/") || url.getPath().isEmpty()) rabbit.setVirtualHost("/");
        IdempotentListener listener = IdempotentListener.builder(idem, (message, job) -> env.work(new String(message.getBody()), job))
                .onError(e -> System.err.println("member " + env.member + ": " + e))
                .build();
        SimpleMessageListenerContainer container = new SimpleMessageListenerContainer(rabbit);
        container.setQueueNames(env.source);
        container.setAcknowledgeMode(AcknowledgeMode.MANUAL);
        container.setPrefetchCount(1); // one message at a time: the scenario watches what each member is at work on
        container.setMessageListener(listener);
        container.start();

        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM: the message in hand finishes
            container.stop();
            System.err.println("member " + env.member + ": " + listener.stats());
            rabbit.destroy();
            idem.close();
            stopped.countDown();
        }));
        stopped.await();
    }
}
