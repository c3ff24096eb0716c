package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.transport.Transport;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import redis.clients.jedis.Jedis;

/** durable beyond the table: a server that refuses WAITAOF, and the WAIT on the cluster node that ran the command. */
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
}
