package io.github.redisidem.amqp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import java.net.ServerSocket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.amqp.core.AcknowledgeMode;
import org.springframework.amqp.core.BindingBuilder;
import org.springframework.amqp.core.FanoutExchange;
import org.springframework.amqp.core.Message;
import org.springframework.amqp.core.MessageBuilder;
import org.springframework.amqp.core.Queue;
import org.springframework.amqp.core.QueueBuilder;
import org.springframework.amqp.rabbit.connection.CachingConnectionFactory;
import org.springframework.amqp.rabbit.core.RabbitAdmin;
import org.springframework.amqp.rabbit.core.RabbitTemplate;
import org.springframework.amqp.rabbit.listener.SimpleMessageListenerContainer;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.RedisClient;

/**
 * The listener on a real RabbitMQ (brokers/launch.py) and Redis 7.0 with
 * the module: a Busy message given back through the retry queue of the
 * holder's lease left (never acknowledged, never spun on) and done once
 * the lease has run out; a message without a message_id rejected to the
 * queue's dead-letter exchange with its x-death; the quorum queue declared
 * with quorumQueueArguments.
 */
class IdempotentListenerTest {
    private static final Path REPO = Path.of("../../../..").toAbsolutePath().normalize();
    private static Path brokerDir;
    private static Process redisServer;
    private static CachingConnectionFactory rabbit;
    private static RedisClient redis;

    @BeforeAll
    static void start() throws Exception {
        brokerDir = Files.createTempDirectory(Files.createDirectories(Path.of("target")), "rabbitmq-"); // under target/: make clean removes it
        Process launch = new ProcessBuilder("python3", REPO.resolve("brokers/launch.py").toString(), "start", "rabbitmq", "--dir", brokerDir.toString())
                .redirectError(ProcessBuilder.Redirect.INHERIT).start();
        JsonNode info = new ObjectMapper().readTree(launch.getInputStream().readAllBytes());
        assertEquals(0, launch.waitFor());
        rabbit = new CachingConnectionFactory(URI.create(info.get("url").asText()));
        rabbit.setVirtualHost("/");
        String module = System.getenv().getOrDefault("REDIS_IDEM_MODULE", REPO.resolve("target/release/libredis_idem.so").toString());
        String server = System.getenv().getOrDefault("REDIS_SERVER", "redis-server");
        Started started = startRedis(List.of(server, "--save", "", "--loadmodule", module), brokerDir.resolve("redis.log"));
        redisServer = started.process();
        redis = RedisClient.create("127.0.0.1", started.port());
    }

    @AfterAll
    static void stop() throws Exception {
        if (rabbit != null) rabbit.destroy();
        if (redis != null) redis.close();
        if (redisServer != null) redisServer.destroyForcibly().waitFor();
        if (brokerDir != null) new ProcessBuilder("python3", REPO.resolve("brokers/launch.py").toString(), "stop", "--dir", brokerDir.toString())
                .inheritIO().start().waitFor();
    }

    @Test
    void busyComesBackThroughTheRetryQueueAndKeylessIsDeadLettered() throws Exception {
        IdemOptions options = IdemOptions.builder().lease(Duration.ofSeconds(2)).maxTries(3).waitFor(Duration.ZERO).build();
        Map<String, Object> arguments = IdempotentListener.quorumQueueArguments(options, "t.dlx");
        assertEquals(20, arguments.get("x-delivery-limit"));
        assertEquals(40, IdempotentListener.quorumQueueArguments(IdemOptions.builder().maxTries(20).build(), "t.dlx").get("x-delivery-limit"));
        RabbitAdmin admin = declare("t", options);

        try (Idem idem = new Idem(JedisTransport.of(redis), options)) {
            Map<String, AtomicInteger> runs = new ConcurrentHashMap<>();
            IdempotentListener listener = IdempotentListener.builder(idem, (message, job) -> {
                runs.computeIfAbsent(message.getMessageProperties().getMessageId(), k -> new AtomicInteger()).incrementAndGet();
                return "ok";
            }).build();
            SimpleMessageListenerContainer container = new SimpleMessageListenerContainer(rabbit);
            container.setQueueNames("t");
            container.setAcknowledgeMode(AcknowledgeMode.MANUAL);
            container.setMessageListener(listener);
            RabbitTemplate template = new RabbitTemplate(rabbit);
            // The container started before the holder's claim: its lease left is then measured
            // against one publish and one delivery, not the container's start on a loaded JVM.
            container.start();
            try {
                idem.commands().claim("held", Duration.ofSeconds(2)); // another worker's, for 2 s
                template.send("", "t", MessageBuilder.withBody("busy".getBytes(StandardCharsets.UTF_8)).setMessageId("held").build());
                template.send("", "t", MessageBuilder.withBody("no key".getBytes(StandardCharsets.UTF_8)).build());
                await(() -> listener.stats().heldBack() >= 1 && listener.stats().deadLettered() == 1);
                assertFalse(runs.containsKey("held"), "Busy: the work did not run");
                // Given back to the retry queue of the holder's lease left (under 2 s: the 1,600 or 3,200 ms one),
                // not to the 100 ms one a failure takes first.
                assertTrue(admin.getQueueInfo("t.retry.1600") != null || admin.getQueueInfo("t.retry.3200") != null,
                        "the retry queue of the lease left");
                assertEquals(null, admin.getQueueInfo("t.retry.100"));
                await(() -> runs.containsKey("held") && listener.stats().acknowledged() == 1);
            } finally {
                container.stop();
            }
            assertEquals(1, runs.get("held").get());
            assertTrue(listener.stats().heldBack() <= 2, "given back once per lease left, not spun on: " + listener.stats());
            assertEquals(0, admin.getQueueInfo("t").getMessageCount());
            Message letter = template.receive("t.dlq", 5_000);
            assertNotNull(letter, "the keyless message in the dead letter");
            assertEquals("no key", new String(letter.getBody(), StandardCharsets.UTF_8));
            List<Map<String, ?>> deaths = letter.getMessageProperties().getXDeathHeader();
            assertNotNull(deaths, "x-death says where it came from");
            assertEquals("t", deaths.get(0).get("queue"));
            assertEquals("rejected", deaths.get(0).get("reason"));
        }
    }

    @Test
    void theAdviceMakesAPlainListenerIdempotent() throws Exception {
        IdemOptions options = IdemOptions.builder().lease(Duration.ofSeconds(2)).maxTries(3).build();
        RabbitAdmin admin = declare("u", options);
        try (Idem idem = new Idem(JedisTransport.of(redis), options)) {
            IdempotentAdvice advice = IdempotentAdvice.builder(idem).build();
            Map<String, AtomicInteger> runs = new ConcurrentHashMap<>();
            Map<String, Long> attempts = new ConcurrentHashMap<>();
            SimpleMessageListenerContainer container = new SimpleMessageListenerContainer(rabbit);
            container.setQueueNames("u");
            container.setAcknowledgeMode(AcknowledgeMode.MANUAL);
            container.setAdviceChain(advice);
            container.setMessageListener(message -> { // a plain listener, as a @RabbitListener's adapter is
                String id = message.getMessageProperties().getMessageId();
                attempts.put(id, IdempotentAdvice.currentJob().attempt());
                if (runs.computeIfAbsent(id, k -> new AtomicInteger()).incrementAndGet() == 1 && id.equals("fails-once")) {
                    throw new IllegalStateException("the first try fails");
                }
            });
            RabbitTemplate template = new RabbitTemplate(rabbit);
            for (String id : List.of("once", "once", "fails-once")) {
                template.send("", "u", MessageBuilder.withBody(id.getBytes(StandardCharsets.UTF_8)).setMessageId(id).build());
            }
            container.start();
            try {
                await(() -> advice.stats().acknowledged() == 3);
            } finally {
                container.stop();
            }
            assertEquals(1, runs.get("once").get(), "the duplicate is a replay");
            assertEquals(2, runs.get("fails-once").get(), "the failure came back through the retry queue and ran again");
            assertEquals(2L, attempts.get("fails-once"), "currentJob() is the claim: the second attempt");
            assertEquals(1, advice.stats().heldBack());
            assertNotNull(admin.getQueueInfo("u.retry.100"), "a failure's first delay: 100 ms");
            assertEquals(0, admin.getQueueInfo("u").getMessageCount());
            assertEquals(null, IdempotentAdvice.currentJob());
        }
    }

    /** The quorum queue {@code name} as quorumQueueArguments makes it, its dead letters into {@code <name>.dlq}. */
    private static RabbitAdmin declare(String name, IdemOptions options) {
        RabbitAdmin admin = new RabbitAdmin(rabbit);
        FanoutExchange dlx = new FanoutExchange(name + ".dlx");
        Queue dlq = QueueBuilder.durable(name + ".dlq").build();
        admin.declareExchange(dlx);
        admin.declareQueue(dlq);
        admin.declareBinding(BindingBuilder.bind(dlq).to(dlx));
        admin.declareQueue(QueueBuilder.durable(name).withArguments(IdempotentListener.quorumQueueArguments(options, name + ".dlx")).build());
        return admin;
    }

    /**
     * A redis-server run with {@code args} on a port that was free a moment
     * ago, once it answers with its own pid: another suite's server can take
     * the port first, and ours exits while theirs answers a PING.
     */
    private static Started startRedis(List<String> args, Path log) throws Exception {
        for (int tries = 1; ; tries++) {
            int port;
            try (ServerSocket s = new ServerSocket(0)) {
                port = s.getLocalPort();
            }
            List<String> command = new ArrayList<>(args);
            command.addAll(List.of("--port", "" + port, "--bind", "127.0.0.1"));
            Process p = new ProcessBuilder(command).redirectErrorStream(true).redirectOutput(log.toFile()).start();
            long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
            String info = null;
            while (info == null && p.isAlive() && System.nanoTime() < deadline) {
                try (Jedis j = new Jedis("127.0.0.1", port)) {
                    info = j.info("server");
                } catch (RuntimeException e) {
                    Thread.sleep(20);
                }
            }
            if (info != null && info.contains("process_id:" + p.pid() + "\r\n")) return new Started(p, port);
            p.destroyForcibly().waitFor();
            if (tries == 5) throw new IllegalStateException("redis-server did not start: " + Files.readString(log));
        }
    }

    private record Started(Process process, int port) {}

    private static void await(BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) throw new AssertionError("not done within 30 s");
            Thread.sleep(20);
        }
    }
}
