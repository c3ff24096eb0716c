package io.github.redisidem.streams;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.Edition;
import io.github.redisidem.Idem;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.transport.JedisTransport;
import io.github.redisidem.transport.LettuceTransport;
import io.github.redisidem.transport.RedisCommand;
import io.github.redisidem.transport.Transport;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.params.ParameterizedTest;
import java.util.stream.Stream;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.StreamEntryID;
import redis.clients.jedis.params.XAddParams;
import redis.clients.jedis.resps.StreamEntry;

/**
 * One consumer on a real server (Redis 7.0, REDIS_SERVER to change it) of
 * each edition, over Jedis and over Lettuce: a done entry's XACK rides in its DONE's script on the
 * module (never sent alone), a replay's XACK follows; a Busy entry is left
 * pending and done once the holder's lease has run out; an Exhausted entry
 * and one without a key go to the dead-letter stream with where they came
 * from, acknowledged; nothing is left pending.
 */
class StreamConsumerTest {
    private static final Path REPO = Path.of("../../../..").toAbsolutePath().normalize();

    /** Counts the XACKs sent alone (not inside a MULTI, not in DONE's script). */
    static final class Counting implements Transport {
        final Transport inner;
        final AtomicInteger lonelyAcks = new AtomicInteger();

        Counting(Transport inner) {
            this.inner = inner;
        }

        @Override
        public CompletableFuture<Object> send(RedisCommand c) {
            if (c.name().equals("XACK")) lonelyAcks.incrementAndGet();
            return inner.send(c);
        }

        @Override
        public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
            return inner.sendTogether(commands);
        }

        @Override
        public boolean cluster() {
            return false;
        }

        @Override
        public void close() {}
    }

    static Stream<Arguments> editionsAndClients() {
        return Stream.of(Arguments.of(Edition.MODULE, "jedis"), Arguments.of(Edition.FUNCTIONS, "jedis"),
                Arguments.of(Edition.MODULE, "lettuce"), Arguments.of(Edition.FUNCTIONS, "lettuce"));
    }

    @ParameterizedTest
    @MethodSource("editionsAndClients")
    void settlesEachEntryAsTheContractSays(Edition edition, String client) throws Exception {
        Path dir = Files.createTempDirectory(Files.createDirectories(Path.of("target")), "redis-");
        List<String> args = new ArrayList<>(List.of(server(), "--save", "", "--dir", dir.toString()));
        if (edition == Edition.MODULE) args.addAll(List.of("--loadmodule", module()));
        Started started = startRedis(args, dir.resolve("log"));
        Process server = started.process();
        try (RedisClient jedis = RedisClient.create("127.0.0.1", started.port())) {
            if (edition == Edition.FUNCTIONS) jedis.functionLoadReplace(Files.readString(REPO.resolve("functions/idem.lua")));
            IdemOptions options = IdemOptions.builder().lease(Duration.ofSeconds(2)).maxTries(2).waitFor(Duration.ZERO).edition(edition).build();
            try (Idem holder = new Idem(JedisTransport.of(jedis), options)) {
                // Busy for the consumer until it lapses: long enough that the consumer meets it held, whatever its
                // client's start-up takes (c comes again every claimIdle, 2 s, while held).
                holder.commands().claim("c", Duration.ofSeconds(5));
            }
            jedis.xgroupCreate("orders", "billing", StreamEntryID.XGROUP_LAST_ENTRY, true);
            for (String key : List.of("a", "a", "b", "", "c")) {
                jedis.xadd("orders", XAddParams.xAddParams(),
                        key.isEmpty() ? Map.of("body", "no key") : Map.of(StreamConsumer.KEY_FIELD, key, "body", "order " + key));
            }
            io.lettuce.core.RedisClient lettuce = io.lettuce.core.RedisClient.create();
            Transport inner = client.equals("jedis") ? JedisTransport.of(jedis)
                    : LettuceTransport.of(lettuce, io.lettuce.core.RedisURI.create("127.0.0.1", started.port()));
            Counting transport = new Counting(inner);
            StreamConsumer consumer = StreamConsumer.builder(transport, "orders", "billing").idemOptions(options).consumer("w1").concurrency(1)
                    .onError(e -> e.printStackTrace()).build();
            Map<String, AtomicInteger> runs = new ConcurrentHashMap<>();
            Thread loop = new Thread(() -> {
                try {
                    consumer.run((entry, job) -> {
                        runs.computeIfAbsent(entry.field(StreamConsumer.KEY_FIELD), k -> new AtomicInteger()).incrementAndGet();
                        if ("b".equals(entry.field(StreamConsumer.KEY_FIELD))) throw new IllegalStateException("b always fails");
                        return entry.field("body");
                    });
                } catch (InterruptedException ignored) {
                    Thread.currentThread().interrupt();
                }
            });
            loop.start();
            await(() -> consumer.stats().acknowledged() + consumer.stats().deadLettered() == 5);
            consumer.stop();
            loop.join(10_000);
            consumer.close();
            inner.close();
            lettuce.shutdown();

            StreamStats stats = consumer.stats();
            assertEquals(3, stats.acknowledged(), stats.toString());
            assertEquals(2, stats.deadLettered(), stats.toString());
            assertTrue(stats.heldBack() >= 2, "b's failure and c's Busy are held back: " + stats);
            assertTrue(stats.idem().busy() >= 1, stats.toString());
            assertEquals(1, runs.get("a").get(), "a's duplicate is a replay");
            assertEquals(1, runs.get("c").get(), "c runs once its holder's lease has run out");
            assertEquals(2, runs.get("b").get(), "b runs max_tries times");
            // Module: a's and c's XACK rode in their DONE's script; only the replay's went alone.
            assertEquals(edition == Edition.MODULE ? 1 : 3, transport.lonelyAcks.get());
            assertEquals(0L, jedis.xpending("orders", "billing").getTotal(), "nothing pending");
            List<StreamEntry> letters = jedis.xrange("orders:dlq", (StreamEntryID) null, null);
            assertEquals(2, letters.size());
            for (StreamEntry letter : letters) {
                assertEquals("orders", letter.getFields().get("original-stream"));
                assertTrue(letter.getFields().get("original-id").contains("-"), letter.toString());
                String error = letter.getFields().get("error");
                if ("b".equals(letter.getFields().get(StreamConsumer.KEY_FIELD))) assertTrue(error.startsWith("exhausted"), error);
                else assertTrue(error.contains("no key"), error);
            }
        } finally {
            server.destroyForcibly().waitFor();
        }
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

    private static String server() {
        String s = System.getenv("REDIS_SERVER");
        return s != null && !s.isBlank() ? s : "redis-server";
    }

    private static String module() {
        String m = System.getenv("REDIS_IDEM_MODULE");
        return m != null && !m.isBlank() ? m : REPO.resolve("target/release/libredis_idem.so").toString();
    }
}
