package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.WrongTypeException;
import io.github.redisidem.transport.Transport;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import redis.clients.jedis.Jedis;

/** processMany's promises beyond the table (an Error, 10,000 keys, a DONE never answered) and concurrent calls sharing batches. */
class BatchTest {
    private static Map<String, Long> commandStats(int port) {
        Map<String, Long> out = new HashMap<>();
        try (Jedis j = new Jedis("127.0.0.1", port)) {
            for (String line : j.info("commandstats").split("\n")) {
                if (!line.startsWith("cmdstat_")) continue;
                out.put(line.substring(8, line.indexOf(":")).toLowerCase(), Long.parseLong(line.substring(line.indexOf("calls=") + 6).split(",")[0].trim()));
            }
        }
        return out;
    }

    /** A work that fails with an Error (not an Exception) releases its claim, and only its claim. */
    @ParameterizedTest
    @EnumSource(CaseRunner.Client.class)
    void anErrorReleasesItsClaim(CaseRunner.Client client) throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        try (Transport transport = Clients.transport(server, client, server.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix("error" + client + System.nanoTime() + ":").build())) {
            List<BatchItem<String>> items = idem.processMany(List.of("{e}1", "{e}2", "{e}3"), String.class, job -> {
                if (job.key().equals("{e}2")) throw new StackOverflowError("deep");
                return "ok " + job.key();
            });
            assertEquals(List.of(BatchStatus.PROCESSED, BatchStatus.FAILED, BatchStatus.PROCESSED), items.stream().map(BatchItem::status).toList());
            assertInstanceOf(StackOverflowError.class, items.get(1).error());
            assertEquals(RecordState.RELEASED, idem.commands().get("{e}2").state(), "the Error released the claim at once");
            assertEquals(RecordState.DONE, idem.commands().get("{e}3").state());
            assertEquals(1, idem.stats().released());

            // The single call too: the Error reaches the caller after the release.
            assertInstanceOf(OutOfMemoryError.class, org.junit.jupiter.api.Assertions.assertThrows(Throwable.class,
                    () -> idem.process("single", job -> {
                        throw new OutOfMemoryError("pretend");
                    })));
            assertEquals(RecordState.RELEASED, idem.commands().get("single").state());
        }
    }

    /** 10,000 keys of one tag: one MCLAIM and one MDONE, each key its own item. */
    @Test
    void tenThousandKeysInOneBatch() throws Exception {
        // A server of its own: the server's command counts are asserted.
        Servers.Server server = Servers.ownTopology("REDIS7_SERVER", Edition.MODULE, Servers.Topology.STANDALONE);
        try (AutoCloseable stop = server::stop;
             Transport transport = Clients.transport(server, CaseRunner.Client.JEDIS, server.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix("many" + System.nanoTime() + ":").build())) {
            List<String> keys = new ArrayList<>();
            for (int i = 0; i < 10_000; i++) keys.add("{m}" + i);
            Map<String, Long> before = commandStats(server.port());
            List<BatchItem<Integer>> items = idem.processMany(keys, Integer.class, job -> Integer.parseInt(job.key().substring(3)));
            Map<String, Long> after = commandStats(server.port());
            for (int i = 0; i < keys.size(); i++) {
                assertEquals(BatchStatus.PROCESSED, items.get(i).status());
                assertEquals(i, items.get(i).value());
            }
            assertEquals(1, after.get("idem.mclaim") - before.getOrDefault("idem.mclaim", 0L));
            assertEquals(1, after.get("idem.mdone") - before.getOrDefault("idem.mdone", 0L));
            List<BatchItem<Integer>> again = idem.processMany(keys.subList(0, 3), Integer.class, job -> -1);
            assertEquals(List.of(0, 1, 2), again.stream().map(BatchItem::value).toList(), "replays, as Integers");
        }
    }

    /**
     * 64 threads on one instance with batch on: each gets exactly its own
     * answer, and the server sees batch commands, far fewer claims than
     * calls. With batch off: one IDEM.CLAIM per call.
     */
    @ParameterizedTest
    @EnumSource(CaseRunner.Client.class)
    void concurrentCallsShareBatches(CaseRunner.Client client) throws Exception {
        // A server of its own: the counts below are the server's, and other
        // classes' tests on the shared one send MCLAIM too.
        Servers.Server server = Servers.ownTopology("REDIS7_SERVER", Edition.MODULE, Servers.Topology.STANDALONE);
        try {
            runConcurrentCalls(server, client);
        } finally {
            server.stop();
        }
    }

    private void runConcurrentCalls(Servers.Server server, CaseRunner.Client client) throws Exception {
        for (boolean batch : new boolean[] {true, false}) {
            try (Transport transport = Clients.transport(server, client, server.port());
                 Idem idem = new Idem(transport, IdemOptions.builder().prefix("lane" + client + batch + System.nanoTime() + ":").batch(batch).build())) {
                idem.commands().claim("held", Duration.ofMinutes(1));
                Map<String, Long> before = commandStats(server.port());
                ExecutorService pool = Executors.newFixedThreadPool(64);
                Map<Integer, Object> got = new ConcurrentHashMap<>();
                AtomicInteger busy = new AtomicInteger();
                List<Future<?>> calls = new ArrayList<>();
                int n = 2000;
                for (int i = 0; i < n; i++) {
                    int id = i;
                    calls.add(pool.submit(() -> {
                        try {
                            if (id % 500 == 0) {
                                idem.process("held", job -> "never");
                            } else {
                                got.put(id, idem.process("k" + id, Integer.class, job -> id).value());
                            }
                        } catch (BusyException e) {
                            busy.incrementAndGet();
                        }
                        return null;
                    }));
                }
                for (Future<?> f : calls) f.get(60, TimeUnit.SECONDS);
                pool.shutdown();
                Map<String, Long> after = commandStats(server.port());
                for (Map.Entry<Integer, Object> e : got.entrySet()) assertEquals(e.getKey(), e.getValue(), "each caller its own answer");
                assertEquals(n - 4, got.size());
                assertEquals(4, busy.get());
                long claims = after.getOrDefault("idem.claim", 0L) - before.getOrDefault("idem.claim", 0L);
                long mclaims = after.getOrDefault("idem.mclaim", 0L) - before.getOrDefault("idem.mclaim", 0L);
                if (batch) {
                    assertTrue(mclaims > 0, "batched claims: " + mclaims);
                    assertTrue(claims + mclaims < n / 2, claims + " claims and " + mclaims + " batches for " + n + " calls");
                } else {
                    assertEquals(0, mclaims);
                    assertTrue(claims >= n, claims + " claims for " + n + " calls");
                }
                assertEquals(n - 4, idem.stats().firstRuns());
                assertEquals(n - 4, idem.stats().completed());
                assertEquals(4, idem.stats().busy());
            }
        }
    }

    /**
     * The server unreachable once DONE is sent (every byte dropped, no
     * connection closed): each DONE times out at doneTimeout, is sent again
     * at most doneRetries times, then DoneUnconfirmed — on Lettuce too,
     * which would otherwise wait 60 s per command and resend it itself.
     */
    @ParameterizedTest
    @EnumSource(CaseRunner.Client.class)
    void anUnansweredDoneIsBounded(CaseRunner.Client client) throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        try (Proxy proxy = new Proxy(server.port());
             Transport transport = Clients.transport(server, client, proxy.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix("dark" + client + System.nanoTime() + ":")
                     .doneTimeout(Duration.ofMillis(300)).build())) {
            proxy.blackholeFrom("done");
            Throwable e = org.junit.jupiter.api.Assertions.assertThrows(DoneUnconfirmedException.class, () -> idem.process("k", job -> "v"));
            assertEquals("v", ((DoneUnconfirmedException) e).result());
            int dones = proxy.seen("done");
            assertTrue(dones >= 1 && dones <= 6, "DONEs sent: " + dones);
            if (client == CaseRunner.Client.LETTUCE) assertEquals(6, dones, "one connection, never closed: each send is the loop's own");
            assertEquals(0, idem.stats().completed());
        }
    }

    /** A send that throws an Error (a fault of the client below) fails its callers and leaves the lane free for the next. */
    @Test
    void anErrorInASendFreesTheLane() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        java.util.concurrent.atomic.AtomicBoolean fail = new java.util.concurrent.atomic.AtomicBoolean(true);
        try (Transport real = Clients.transport(server, CaseRunner.Client.JEDIS, server.port())) {
            Transport faulty = new Transport() {
                @Override
                public java.util.concurrent.CompletableFuture<Object> send(io.github.redisidem.transport.RedisCommand command) {
                    if (command.name().equals("IDEM.CLAIM") && fail.getAndSet(false)) throw new LinkageError("the client broke");
                    return real.send(command);
                }

                @Override
                public java.util.concurrent.CompletableFuture<List<Object>> sendTogether(List<io.github.redisidem.transport.RedisCommand> commands) {
                    return real.sendTogether(commands);
                }

                @Override
                public boolean cluster() {
                    return false;
                }

                @Override
                public void close() {}
            };
            try (Idem idem = new Idem(faulty, IdemOptions.builder().prefix("lanefault" + System.nanoTime() + ":").edition(Edition.MODULE).build())) {
                ExecutorService one = Executors.newSingleThreadExecutor();
                Future<?> first = one.submit(() -> idem.process("a", job -> 1));
                Throwable e = org.junit.jupiter.api.Assertions.assertThrows(java.util.concurrent.ExecutionException.class, () -> first.get(10, TimeUnit.SECONDS));
                assertInstanceOf(LinkageError.class, e.getCause());
                Future<Object> second = one.submit(() -> idem.process("b", job -> 2).value());
                assertEquals(2, second.get(10, TimeUnit.SECONDS), "the next call is not stuck behind the failed batch");
                one.shutdown();
            }
        }
    }

    /** A key of another type fails its own item only, through the batch helpers and processMany. */
    @Test
    void aKeysErrorIsItsOwn() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.FUNCTIONS);
        String prefix = "own" + System.nanoTime() + ":";
        try (Transport transport = Clients.transport(server, CaseRunner.Client.LETTUCE, server.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix(prefix).build())) {
            try (Jedis j = new Jedis("127.0.0.1", server.port())) {
                j.set(prefix + "plain", "x");
            }
            List<BatchItem<Object>> items = idem.processMany(List.of("a", "plain", "b"), job -> job.key());
            assertEquals(List.of(BatchStatus.PROCESSED, BatchStatus.ERROR, BatchStatus.PROCESSED), items.stream().map(BatchItem::status).toList());
            assertInstanceOf(WrongTypeException.class, items.get(1).error());
            assertNull(items.get(1).value());
        }
    }
}
