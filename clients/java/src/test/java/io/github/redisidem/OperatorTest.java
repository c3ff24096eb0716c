package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.LiveLeaseException;
import io.github.redisidem.transport.Transport;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.OptionalLong;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;
import redis.clients.jedis.Jedis;

/**
 * scan() and requeue() through Jedis and Lettuce, on the module (Redis 7.0,
 * 8.2, Valkey 9.1) and the Functions edition (Redis 7.0, Valkey 9.1): a dead
 * letter (maxTries 2, two failed works) is listed by scan, requeued, and
 * completes on its next process with attempt 3; and in a cluster, scan
 * finds the records of every primary.
 */
class OperatorTest {
    static Stream<Arguments> configs() {
        List<Arguments> out = new ArrayList<>();
        for (CaseRunner.Client client : CaseRunner.Client.values()) {
            out.add(Arguments.of("REDIS7_SERVER", Edition.MODULE, client));
            out.add(Arguments.of("REDIS8_SERVER", Edition.MODULE, client));
            out.add(Arguments.of("VALKEY_SERVER", Edition.MODULE, client));
            out.add(Arguments.of("REDIS7_SERVER", Edition.FUNCTIONS, client));
            out.add(Arguments.of("VALKEY_SERVER", Edition.FUNCTIONS, client));
        }
        return out.stream();
    }

    private static Set<String> keys(IdemCommands commands, ScanOptions options) {
        return new TreeSet<>(commands.scan(options).toList());
    }

    @ParameterizedTest(name = "{0} {1} {2}")
    @MethodSource("configs")
    void aDeadLetterIsListedRequeuedAndCompletedWithAHigherAttempt(String binary, Edition edition, CaseRunner.Client client) throws Exception {
        Servers.Server server = Servers.forLibraryTests(binary, edition, false);
        String prefix = "op[" + client + "]*" + System.nanoTime() + ":"; // glob characters: matched as they are
        try (Transport transport = Clients.transport(server, client, server.port());
             Idem idem = new Idem(transport, IdemOptions.builder().prefix(prefix).maxTries(2).build())) {
            assertEquals(edition, idem.edition());
            IdemCommands commands = idem.commands();
            for (int n = 1; n <= 2; n++) {
                String message = "try " + n;
                Exception e = assertThrows(IllegalStateException.class, () -> idem.process("dead", job -> {
                    throw new IllegalStateException(message);
                }));
                assertEquals(message, e.getMessage());
            }
            assertThrows(ExhaustedException.class, () -> idem.process("dead", job -> "never"));
            Claim live = commands.claim("live", Duration.ofMinutes(1));
            Claim done = commands.claim("done", Duration.ofMinutes(1));
            commands.done("done", done.token(), "\"r\"".getBytes(), null);
            try (Jedis raw = new Jedis("127.0.0.1", server.port())) {
                raw.set(prefix + "plain", "x");
                raw.set("op-outside", "x"); // outside the prefix: never listed
            }

            assertEquals(Set.of("dead", "done", "live"), keys(commands, ScanOptions.all().count(5)));
            assertEquals(Set.of("dead"), keys(commands, ScanOptions.all().state(RecordState.RELEASED).minTries(2)));
            assertEquals(Set.of(), keys(commands, ScanOptions.all().state(RecordState.RELEASED).minTries(3)));
            assertEquals(Set.of("live"), keys(commands, ScanOptions.all().state(RecordState.PROCESSING)));
            assertEquals(Set.of("done"), keys(commands, ScanOptions.all().match("d*").state(RecordState.DONE)));
            assertEquals(Set.of(), keys(commands, ScanOptions.all().idle(Duration.ofHours(1))));
            assertThrows(IllegalArgumentException.class, () -> commands.scan(ScanOptions.all().idle(Duration.ofMillis(1500))));
            Record before = commands.get("dead");
            assertEquals(RecordState.RELEASED, before.state());
            assertEquals(2, before.attempt());
            assertEquals(OptionalLong.of(2), before.tries());

            assertTrue(commands.requeue("dead"));
            Record requeued = commands.get("dead");
            assertEquals(RecordState.RELEASED, requeued.state());
            assertEquals(2, requeued.attempt());
            assertEquals(OptionalLong.of(0), requeued.tries());
            assertFalse(commands.requeue("absent"));
            LiveLeaseException refused = assertThrows(LiveLeaseException.class, () -> commands.requeue("live"));
            assertTrue(refused.getMessage().contains("live lease"), refused.getMessage());
            assertEquals(RecordState.PROCESSING, commands.get("live").state());
            assertTrue(commands.release("live", live.token()));

            Outcome<Object> next = idem.process("dead", job -> job.attempt());
            assertEquals(3L, ((Number) next.value()).longValue());
            assertEquals(ClaimStatus.RETRY, next.status());
            Record completed = commands.get("dead");
            assertEquals(RecordState.DONE, completed.state());
            assertEquals(3, completed.attempt());
            assertEquals(OptionalLong.of(1), completed.tries());
        }
    }

    @Test
    void inAClusterScanFindsTheRecordsOfEveryPrimary() throws Exception {
        Servers.Server server = Servers.forLibraryTests("REDIS7_SERVER", Edition.MODULE, true);
        for (CaseRunner.Client client : CaseRunner.Client.values()) {
            String prefix = "opc" + client + System.nanoTime() + ":";
            try (Transport transport = Clients.transport(server, client, server.port());
                 Idem idem = new Idem(transport, IdemOptions.builder().prefix(prefix).build())) {
                IdemCommands commands = idem.commands();
                Set<String> keys = new TreeSet<>();
                Set<Integer> owners = new TreeSet<>();
                for (int n = 0; n < 30; n++) {
                    String key = "k" + n;
                    keys.add(key);
                    commands.claim(key, Duration.ofMinutes(1));
                    int slot = Slots.slot(prefix + key);
                    owners.add(slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2);
                }
                assertEquals(3, owners.size(), "the keys span every primary");
                assertEquals(3, transport.primaries().size(), client + ": the primaries");
                assertEquals(keys, keys(commands, ScanOptions.all().state(RecordState.PROCESSING)), client + ": scan");
                assertTrue(commands.once("marked", Duration.ofMinutes(1)));
                assertTrue(commands.requeue("marked"), client + ": requeue goes to the key's node");
            }
        }
    }
}
