package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.exceptions.ModuleRequiredException;
import io.github.redisidem.transport.JedisTransport;
import io.github.redisidem.transport.LettuceTransport;
import io.github.redisidem.transport.Transport;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.module.ModuleDescriptor;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** What the conformance table does not cover: a killed JVM, the async front end, typed replays, the API's shape. */
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
            Outcome<Integer> out = idem.process(key, Integer.class, job -> runs.incrementAndGet());
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
             AsyncIdem idem = new AsyncIdem(transport, IdemOptions.builder().prefix("async" + System.nanoTime() + ":").build())) {
            Outcome<?> first = idem.process("k", job -> CompletableFuture.supplyAsync(() -> List.of(job.attempt()))).get(10, TimeUnit.SECONDS);
            assertFalse(first.replayed());
            Outcome<?> again = idem.process("k", job -> CompletableFuture.completedFuture("no")).get(10, TimeUnit.SECONDS);
            assertTrue(again.replayed());
            assertEquals(List.of(1), again.value());
            ExecutionException failed = assertThrows(ExecutionException.class,
                    () -> idem.process("f", job -> CompletableFuture.failedFuture(new IllegalStateException("boom"))).get(10, TimeUnit.SECONDS));
            assertInstanceOf(IllegalStateException.class, failed.getCause());
            assertEquals(new Stats(2, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0), idem.stats());

            // processMany: the same per-key promises, the works side by side.
            List<BatchItem<Long>> items = idem.processMany(List.of("k", "m1", "m2", "bad"), Long.class, job -> job.key().equals("bad")
                    ? CompletableFuture.failedFuture(new IllegalStateException("bad")) : CompletableFuture.completedFuture(job.attempt() * 10))
                    .get(10, TimeUnit.SECONDS);
            assertEquals(List.of(BatchStatus.ERROR, BatchStatus.PROCESSED, BatchStatus.PROCESSED, BatchStatus.FAILED),
                    items.stream().map(BatchItem::status).toList(), "k holds a list, not a Long: " + items);
            assertEquals(10L, items.get(1).value());
            assertEquals("bad", items.get(3).error().getMessage());
        } finally {
            client.shutdown();
        }
    }

    /** A typed replay is the caller's type: a record, a long, a generic list; the untyped one is JSON's plain shape. */
    @Test
    void replaysAreTheCallersType() throws Exception {
        Servers.Server server = module();
        record Receipt(long amount, String currency) {}
        for (CaseRunner.Client client : CaseRunner.Client.values()) {
            try (Transport transport = Clients.transport(server, client, server.port());
                 Idem idem = new Idem(transport, IdemOptions.builder().prefix("typed" + client + System.nanoTime() + ":").build())) {
                for (int round = 0; round < 2; round++) {
                    Outcome<Long> big = idem.process("long", long.class, job -> 5L);
                    assertEquals(Long.valueOf(5), big.value(), "a long stays a long");
                    Outcome<Receipt> receipt = idem.process("receipt", Receipt.class, job -> new Receipt(1250, "EUR"));
                    assertEquals(new Receipt(1250, "EUR"), receipt.value());
                    Outcome<List<Receipt>> list = idem.process("list", new TypeRef<List<Receipt>>() {}, job -> List.of(new Receipt(1, "USD")));
                    assertEquals(List.of(new Receipt(1, "USD")), list.value());
                    Outcome<String> text = idem.process("codec", new BytesCodec().as(String.class), job -> "raw text");
                    assertEquals("raw text", text.value());
                    assertEquals(round == 1, big.replayed() && receipt.replayed() && list.replayed() && text.replayed());
                }
                Outcome<Object> plain = idem.process("receipt", job -> "not run");
                assertEquals(Map.of("amount", 1250, "currency", "EUR"), plain.value(), "untyped: JSON's plain types");
                // A stored result that is not the type asked for is an error, never a ClassCastException at the caller.
                Exception wrong = assertThrows(Exception.class, () -> idem.process("list", new BytesCodec().as(Long.class), job -> 1L));
                assertTrue(wrong.getMessage().contains("could not be decoded"), wrong.getMessage());
            }
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
                .filter(entry -> !entry.contains("jackson")).collect(Collectors.joining(java.io.File.pathSeparator));
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
    }

    @Test
    void optionsAreBuiltAndChecked() {
        assertThrows(IllegalArgumentException.class, () -> IdemOptions.builder().lease(Duration.ofMillis(1500)));
        assertThrows(IllegalArgumentException.class, () -> IdemOptions.builder().lease(Duration.ZERO));
        assertThrows(IllegalArgumentException.class, () -> IdemOptions.builder().owner("x".repeat(65)));
        assertThrows(IllegalArgumentException.class, () -> Durable.replicas(-1));
        IdemOptions defaults = IdemOptions.defaults();
        assertEquals(Duration.ofSeconds(10), defaults.heartbeat());
        assertEquals(Duration.ofSeconds(10), defaults.waitFor());
        assertEquals(5, defaults.doneRetries());
        assertEquals(Duration.ofSeconds(5), defaults.doneTimeout());
        assertEquals(Clients.defaultOwner(), defaults.owner(), "host:pid");
        IdemOptions changed = defaults.toBuilder().prefix("p:").durable(Durable.replicas(1).timeout(Duration.ofMillis(200))).build();
        assertEquals("p:", changed.prefix());
        assertEquals(1, changed.durable().replicas());
        assertEquals(defaults.lease(), changed.lease(), "the rest kept");
        assertEquals(Owner.of("h".repeat(80), 12345).length(), 64, "a long host name is cut to fit OWNER");
    }

    @Test
    void theFunctionsEditionRefusesWhatNeedsTheModule() {
        Servers.Server server = Servers.forLibraryTests(Edition.FUNCTIONS);
        try (Idem idem = new Idem(JedisTransport.of(redis.clients.jedis.RedisClient.create("127.0.0.1", server.port())))) {
            assertEquals(Edition.FUNCTIONS, idem.edition());
            assertThrows(ModuleRequiredException.class,
                    () -> idem.commands().claim("k", Duration.ofSeconds(1), ClaimOptions.none().waitFor(Duration.ofSeconds(1))));
            assertThrows(ModuleRequiredException.class, () -> idem.commands().mclaim(List.of("k"), Duration.ofSeconds(1), null, ClaimOptions.none()));
        }
    }

    /** The module descriptor exports the API's four packages and nothing else. */
    @Test
    void onlyTheApiIsExported() throws Exception {
        Path descriptor = Path.of(Idem.class.getProtectionDomain().getCodeSource().getLocation().toURI()).resolve("module-info.class");
        ModuleDescriptor module = ModuleDescriptor.read(Files.newInputStream(descriptor));
        assertEquals("io.github.redisidem", module.name());
        assertEquals(Set.of("io.github.redisidem", "io.github.redisidem.exceptions", "io.github.redisidem.transport", "io.github.redisidem.servlet"),
                module.exports().stream().map(ModuleDescriptor.Exports::source).collect(Collectors.toSet()));
        assertTrue(module.exports().stream().noneMatch(ModuleDescriptor.Exports::isQualified));
        for (ModuleDescriptor.Requires r : module.requires()) {
            if (!r.name().equals("java.base")) assertTrue(r.modifiers().contains(ModuleDescriptor.Requires.Modifier.STATIC), r + ": optional");
        }
    }

    /** One heartbeat thread per instance, however many messages; none while no work has run long. */
    @Test
    void noThreadPerMessage() throws Exception {
        Servers.Server server = module();
        try (Transport transport = Clients.transport(server, CaseRunner.Client.JEDIS, server.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix("threads" + System.nanoTime() + ":").build())) {
            for (int i = 0; i < 500; i++) idem.process("k" + i, job -> 1);
            assertTrue(idem.core.heartbeat.threads() <= 1, "heartbeat threads: " + idem.core.heartbeat.threads());
            assertEquals(1, idem.core.heartbeat.timersScheduled(), "one timer for 500 messages, not one each");
            assertEquals(0, idem.stats().extensions(), "short work: no EXTEND");
        }
    }
}
