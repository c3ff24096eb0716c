package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.transport.Transport;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.params.provider.MethodSource;
import redis.clients.jedis.Jedis;

/** durable beyond the table: a server that refuses WAITAOF, the WAIT on the cluster node that ran the command, a replay not acknowledged. */
class DurableTest {
    private static long waits(int port) {
        try (Jedis j = new Jedis("127.0.0.1", port)) {
            for (String line : j.info("commandstats").split("\n")) {
                if (line.startsWith("cmdstat_wait:")) return Long.parseLong(line.substring(line.indexOf("calls=") + 6).split(",")[0].trim());
            }
            return 0;
        }
    }

    /** WAITAOF refused (Redis 7.0 has none; 8.2 refuses it without appendonly): every call ends NotDurable before its work ran. */
    @ParameterizedTest
    @EnumSource(CaseRunner.Client.class)
    void aServerThatRefusesWaitaofRunsNothing(CaseRunner.Client client) throws Exception {
        for (String binary : List.of("REDIS7_SERVER", "REDIS8_SERVER")) {
            Servers.Server server = Servers.forLibraryTests(binary, Edition.MODULE, false);
            try (Transport transport = Clients.transport(server, client, server.port());
                 Idem idem = new Idem(transport, IdemOptions.builder().prefix("aof" + client + System.nanoTime() + ":")
                         .durable(Durable.replicas(0).fsync(true)).build())) {
                AtomicInteger runs = new AtomicInteger();
                NotDurableException e = assertThrows(NotDurableException.class, () -> idem.process("k", job -> runs.incrementAndGet()));
                assertEquals(NotDurableException.Stage.CLAIM, e.stage());
                assertEquals(0, runs.get(), binary + ": the work never ran");
                assertEquals(RecordState.RELEASED, idem.commands().get("k").state(), binary + ": the claim was given back");
                assertEquals(1, idem.stats().notDurable());
                assertEquals(0, idem.stats().firstRuns());
            }
        }
    }

    /** In a cluster the WAIT goes to the node that ran the command: one per claim and DONE there, none elsewhere. */
    @ParameterizedTest
    @EnumSource(CaseRunner.Client.class)
    void theWaitFollowsTheKey(CaseRunner.Client client) throws Exception {
        Servers.Server server = Servers.forLibraryTests("REDIS7_SERVER", Edition.MODULE, true);
        String prefix = "{d" + client + System.nanoTime() + "}:";
        int owner = Slots.slot(prefix) <= 5460 ? 0 : Slots.slot(prefix) <= 10922 ? 1 : 2;
        try (Transport transport = Clients.transport(server, client, server.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix(prefix).durable(Durable.replicas(0)).build())) {
            Map<Integer, Long> before = new HashMap<>();
            for (int port : server.ports) before.put(port, waits(port));
            assertEquals(7, idem.process("k", Integer.class, job -> 7).value());
            List<String> keys = new ArrayList<>(List.of("a", "b", "c"));
            assertEquals(List.of(BatchStatus.PROCESSED, BatchStatus.PROCESSED, BatchStatus.PROCESSED),
                    idem.processMany(keys, job -> 1).stream().map(BatchItem::status).toList());
            for (int n = 0; n < 3; n++) {
                int port = server.ports.get(n);
                assertEquals(n == owner ? 4 : 0, waits(port) - before.get(port), "node " + n + " (the key's: " + owner + ")");
            }
        }
    }

    static List<Arguments> clientsAndEditions() {
        List<Arguments> out = new ArrayList<>();
        for (CaseRunner.Client client : CaseRunner.Client.values()) {
            for (Edition edition : Edition.values()) out.add(Arguments.of(client, edition));
        }
        return out;
    }

    private static NotDurableException notDurable(Throwable t) {
        return assertInstanceOf(NotDurableException.class, t instanceof ExecutionException ? t.getCause() : t);
    }

    /**
     * A replay waits for its replicas too (docs/clients.md, Durability): on a primary with none, keys done by the
     * typed commands (which send no WAIT) replay as NotDurable at the done stage with the stored result, the work
     * not run, nothing released; sync and async, process and processMany.
     */
    @ParameterizedTest
    @MethodSource("clientsAndEditions")
    void aReplayNotAcknowledgedIsNotDurable(CaseRunner.Client client, Edition edition) throws Exception {
        Servers.Server server = Servers.forLibraryTests("REDIS7_SERVER", edition, false);
        IdemOptions options = IdemOptions.builder().prefix("replay" + client + System.nanoTime() + ":")
                .durable(Durable.replicas(1).timeout(Duration.ofMillis(50))).build();
        try (Transport transport = Clients.transport(server, client, server.port());
             Idem idem = new Idem(transport, options);
             AsyncIdem async = new AsyncIdem(transport, options)) {
            for (String key : List.of("k", "ka", "m", "ma")) {
                Claim c = idem.commands().claim(key, Duration.ofMinutes(1));
                assertTrue(idem.commands().done(key, c.token(), "\"stored\"".getBytes(java.nio.charset.StandardCharsets.UTF_8), null).completed());
            }
            AtomicInteger runs = new AtomicInteger();

            NotDurableException e = assertThrows(NotDurableException.class, () -> idem.process("k", String.class, job -> {
                runs.incrementAndGet();
                return "again";
            }));
            assertEquals(NotDurableException.Stage.DONE, e.stage());
            assertEquals("stored", e.result());
            assertEquals(0, e.acknowledged());

            CompletableFuture<Outcome<String>> pending = async.process("ka", String.class, job -> {
                runs.incrementAndGet();
                return CompletableFuture.completedFuture("again");
            });
            e = notDurable(assertThrows(ExecutionException.class, pending::get));
            assertEquals(NotDurableException.Stage.DONE, e.stage());
            assertEquals("stored", e.result());

            BatchItem<String> item = idem.processMany(List.of("m"), String.class, job -> {
                runs.incrementAndGet();
                return "again";
            }).get(0);
            assertEquals(BatchStatus.NOT_DURABLE, item.status());
            assertEquals("stored", item.value());
            assertTrue(item.resultStored());
            assertEquals(NotDurableException.Stage.DONE, notDurable(item.error()).stage());

            item = async.processMany(List.of("ma"), String.class, job -> {
                runs.incrementAndGet();
                return CompletableFuture.completedFuture("again");
            }).get().get(0);
            assertEquals(BatchStatus.NOT_DURABLE, item.status());
            assertEquals("stored", item.value());
            assertEquals(NotDurableException.Stage.DONE, notDurable(item.error()).stage());

            assertEquals(0, runs.get(), "the work never ran");
            for (String key : List.of("k", "ka", "m", "ma")) {
                Record r = idem.commands().get(key);
                assertEquals(RecordState.DONE, r.state(), key + " stays done: nothing released");
                assertEquals(1, r.attempt());
            }
            for (Stats s : List.of(idem.stats(), async.stats())) {
                assertEquals(2, s.notDurable());
                assertEquals(0, s.replays());
                assertEquals(0, s.released());
            }
            assertFalse(idem.stats().firstRuns() + async.stats().firstRuns() > 0);
        }
    }

    /**
     * claimMany reads its WAIT as process reads a claim's (docs/clients.md, Durability): on a primary with one
     * replica, a key answered DONE is a replay while the replica acknowledges it, and NotDurable at the done stage
     * with the stored bytes when two replicas are asked for, nothing released; a key granted in that batch is
     * NotDurable at the claim stage and released. Both counted.
     */
    @ParameterizedTest
    @MethodSource("clientsAndEditions")
    void claimManyReadsAReplaysWait(CaseRunner.Client client, Edition edition) throws Exception {
        Servers.Server server = Servers.forLibraryTests("REDIS7_SERVER", edition, Servers.Topology.REPLICATED);
        String prefix = "many" + client + System.nanoTime() + ":";
        byte[] stored = "\"stored\"".getBytes(java.nio.charset.StandardCharsets.UTF_8);
        try (Transport transport = Clients.transport(server, client, server.port());
             Idem one = new Idem(transport, IdemOptions.builder().prefix(prefix).durable(Durable.replicas(1).timeout(Duration.ofSeconds(2))).build());
             Idem two = new Idem(transport, IdemOptions.builder().prefix(prefix).durable(Durable.replicas(2).timeout(Duration.ofMillis(200))).build())) {
            Claim c = one.commands().claim("d", Duration.ofMinutes(1));
            assertTrue(one.commands().done("d", c.token(), stored, null).completed());

            List<Reply<Claim>> claims = one.claimMany(List.of("d", "n1"), Duration.ofMinutes(1));
            assertTrue(claims.get(0).ok(), "acknowledged: " + claims.get(0));
            assertEquals(ClaimStatus.DONE, claims.get(0).value().status());
            assertArrayEquals(stored, claims.get(0).value().result());
            assertEquals(ClaimStatus.NEW, claims.get(1).get().status());
            assertEquals(0, one.stats().notDurable());

            claims = two.claimMany(List.of("d", "n2"), Duration.ofMinutes(1));
            NotDurableException replay = notDurable(claims.get(0).error());
            assertEquals(NotDurableException.Stage.DONE, replay.stage());
            assertEquals(1, replay.acknowledged());
            assertArrayEquals(stored, (byte[]) replay.result());
            NotDurableException granted = notDurable(claims.get(1).error());
            assertEquals(NotDurableException.Stage.CLAIM, granted.stage());
            assertEquals(1, granted.acknowledged());
            assertEquals(2, two.stats().notDurable());
            assertEquals(0, two.stats().replays());

            Record d = one.commands().get("d");
            assertEquals(RecordState.DONE, d.state(), "d stays done: nothing released");
            assertEquals(1, d.attempt());
            assertEquals(RecordState.RELEASED, one.commands().get("n2").state(), "n2 given back");
        }
    }
}
