package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** What the conformance table does not cover: a killed JVM, the async front end, the slot hash, argument checks. */
class LibraryTest {
    private static Servers.Server module() {
        return Servers.forLibraryTests(Edition.MODULE);
    }

    @Test
    void aKilledWorkerJvmIsRetriedByTheNext() throws Exception {
        Servers.Server server = module();
        String key = "killed:" + System.nanoTime();
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        Process worker = new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"), KilledWorkerMain.class.getName(),
                "" + server.port(), key).redirectErrorStream(true).start();
        try (BufferedReader out = new BufferedReader(new InputStreamReader(worker.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            do line = out.readLine(); while (line != null && !line.startsWith("RUNNING"));
            assertEquals("RUNNING 1", line, "the worker JVM claimed the key");
            worker.destroyForcibly();
            assertTrue(worker.waitFor(10, TimeUnit.SECONDS));
        }
        RedisClient client = RedisClient.create();
        try (Transport transport = LettuceTransport.of(client, RedisURI.create("127.0.0.1", server.port()));
             Idem idem = new Idem(transport)) {
            AtomicInteger runs = new AtomicInteger();
            // The dead worker's lease (1 s, no heartbeat any more) lapses while this call waits on it.
            Outcome<Object> out = idem.process(key, job -> runs.incrementAndGet());
            assertEquals(ClaimStatus.RETRY, out.status());
            assertEquals(2, out.attempt());
            assertEquals(1, runs.get());
            assertEquals(1, idem.stats().waits());
        } finally {
            client.shutdown();
        }
    }

    @Test
    void asyncFrontEndRunsOnceAndReplays() throws Exception {
        Servers.Server server = module();
        RedisClient client = RedisClient.create();
        try (Transport transport = LettuceTransport.of(client, RedisURI.create("127.0.0.1", server.port()));
             AsyncIdem idem = new AsyncIdem(transport, IdemOptions.defaults().withPrefix("async" + System.nanoTime() + ":"))) {
            Outcome<?> first = idem.process("k", job -> CompletableFuture.supplyAsync(() -> List.of(job.attempt()))).get(10, TimeUnit.SECONDS);
            assertFalse(first.replayed());
            Outcome<?> again = idem.process("k", job -> CompletableFuture.completedFuture("no")).get(10, TimeUnit.SECONDS);
            assertTrue(again.replayed());
            assertEquals(List.of(1), again.value());
            ExecutionException failed = assertThrows(ExecutionException.class,
                    () -> idem.process("f", job -> CompletableFuture.failedFuture(new IllegalStateException("boom"))).get(10, TimeUnit.SECONDS));
            assertInstanceOf(IllegalStateException.class, failed.getCause());
            assertEquals(new Stats(2, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0), idem.stats());
        } finally {
            client.shutdown();
        }
    }

    @Test
    void theConsumerExampleProcessesEachMessageOnce() throws Exception {
        Servers.Server server = module();
        java.io.ByteArrayOutputStream printed = new java.io.ByteArrayOutputStream();
        java.io.PrintStream stdout = System.out;
        // The example is in the default package: reached by name.
        java.lang.reflect.Method main = Class.forName("JavaConsumer").getMethod("main", String[].class);
        synchronized (System.class) {
            System.setOut(new java.io.PrintStream(printed, true, StandardCharsets.UTF_8));
            try {
                main.invoke(null, (Object) new String[] {"redis://127.0.0.1:" + server.port(), "25"});
            } finally {
                System.setOut(stdout);
            }
        }
        assertTrue(printed.toString(StandardCharsets.UTF_8).startsWith("java: processed=25 duplicates=25 waited="), printed.toString(StandardCharsets.UTF_8));
    }

    @Test
    void withoutJacksonTheDefaultCodecIsBytes() throws Exception {
        assertInstanceOf(JsonCodec.class, Codec.defaultCodec());
        String classPath = java.util.Arrays.stream(System.getProperty("java.class.path").split(java.io.File.pathSeparator))
                .filter(entry -> !entry.contains("jackson")).collect(java.util.stream.Collectors.joining(java.io.File.pathSeparator));
        Process jvm = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp", classPath,
                NoJacksonMain.class.getName()).redirectErrorStream(true).start();
        String out = new String(jvm.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
        assertTrue(jvm.waitFor(30, TimeUnit.SECONDS));
        assertEquals("BytesCodec ok", out);
    }

    @Test
    void slotsFollowTheClusterSpec() {
        assertEquals(0x31C3, Slots.crc16("123456789".getBytes(StandardCharsets.US_ASCII), 0, 9));
        assertEquals(12182, Slots.slot("foo"));
        assertEquals(Slots.slot("{user1000}.following"), Slots.slot("{user1000}.followers"));
        assertEquals(Slots.slot("{}x"), Slots.crc16("{}x".getBytes(StandardCharsets.US_ASCII), 0, 3) & 16383);
        List<String> keys = new java.util.ArrayList<>();
        for (int i = 0; i < 25_001; i++) keys.add("{t}" + i);
        keys.add("other");
        List<List<Integer>> batches = Slots.batches(keys, true);
        assertEquals(List.of(10_000, 10_000, 5_001, 1), batches.stream().map(List::size).toList());
        assertEquals(List.of(25_001), batches.get(3));
    }

    @Test
    void durationsForTheServerAreWholeSeconds() {
        assertThrows(IllegalArgumentException.class, () -> IdemOptions.defaults().withLease(Duration.ofMillis(1500)));
        assertThrows(IllegalArgumentException.class, () -> IdemOptions.defaults().withLease(Duration.ZERO));
        assertEquals(Duration.ofSeconds(10), IdemOptions.defaults().withLease(Duration.ofSeconds(30)).heartbeatInterval());
    }

    @Test
    void theFunctionsEditionRefusesWhatNeedsTheModule() {
        Servers.Server server = Servers.forLibraryTests(Edition.FUNCTIONS);
        try (Idem idem = new Idem(JedisTransport.of(redis.clients.jedis.RedisClient.create("127.0.0.1", server.port())))) {
            assertEquals(Edition.FUNCTIONS, idem.edition());
            assertThrows(ModuleRequiredException.class, () -> idem.commands().claim("k", Duration.ofSeconds(1), null, null, Duration.ofSeconds(1)));
            assertThrows(ModuleRequiredException.class, () -> idem.commands().mclaim(List.of("k"), Duration.ofSeconds(1), null, null));
        }
    }
}
