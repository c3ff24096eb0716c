package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.transport.Transport;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * Work in flight through a real Sentinel failover (SENTINEL FAILOVER: the
 * old primary keeps taking writes until the Sentinel turns it into a
 * replica, some seconds later), through each client's Sentinel support,
 * with durability on: 8 workers, 450 keys delivered 600 times (duplicates
 * later), every failure given back and delivered again. No attempt number
 * is ever granted twice for a key, no key's work ever runs twice at once,
 * and every key ends done on the new primary.
 */
class SentinelFailoverTest {
    @Test
    void workInFlightThroughAFailover() throws Exception {
        Servers.Server server = Servers.ownTopology("REDIS7_SERVER", Edition.MODULE, Servers.Topology.SENTINEL);
        try {
            for (CaseRunner.Client client : CaseRunner.Client.values()) run(server, client);
        } finally {
            server.stop();
        }
    }

    private static void run(Servers.Server server, CaseRunner.Client client) throws Exception {
        Topologies.ready(server);
        String prefix = "failover" + client + ":";
        Map<String, Set<Long>> attempts = new ConcurrentHashMap<>();
        Map<String, AtomicInteger> active = new ConcurrentHashMap<>();
        AtomicInteger overlaps = new AtomicInteger();
        AtomicInteger runs = new AtomicInteger();
        AtomicInteger redelivered = new AtomicInteger();
        AtomicInteger grantedTwice = new AtomicInteger();
        Map<String, String> outcomes = new ConcurrentHashMap<>();
        List<String> deliveries = new ArrayList<>();
        for (int i = 0; i < 450; i++) deliveries.add("k" + i);
        for (int i = 0; i < 150; i++) deliveries.add("k" + (i * 3));
        IdemOptions options = IdemOptions.builder().prefix(prefix).lease(Duration.ofSeconds(5)).waitFor(Duration.ofSeconds(2))
                .durable(Durable.replicas(1).timeout(Duration.ofMillis(500))).build();
        try (Transport transport = Clients.transport(server, client, 0); Idem idem = new Idem(transport, options)) {
            ExecutorService pool = Executors.newFixedThreadPool(8);
            AtomicInteger done = new AtomicInteger();
            List<Future<?>> calls = new ArrayList<>();
            for (String key : deliveries) {
                calls.add(pool.submit(() -> {
                    while (true) {
                        try {
                            Outcome<Object> out = idem.process(key, job -> {
                                if (!attempts.computeIfAbsent(key, k -> Collections.synchronizedSet(new java.util.HashSet<>())).add(job.attempt())) {
                                    grantedTwice.incrementAndGet();
                                }
                                if (active.computeIfAbsent(key, k -> new AtomicInteger()).incrementAndGet() > 1) overlaps.incrementAndGet();
                                runs.incrementAndGet();
                                Thread.sleep(5);
                                active.get(key).decrementAndGet();
                                return job.attempt();
                            });
                            done.incrementAndGet();
                            outcomes.put(key, out.toString());
                            return null;
                        } catch (BusyException | NotDurableException | DoneUnconfirmedException e) {
                            redelivered.incrementAndGet(); // not acknowledged: delivered again
                        } catch (RuntimeException e) {
                            redelivered.incrementAndGet(); // a connection lost in the switch
                        }
                        Thread.sleep(20);
                    }
                }));
            }
            while (done.get() < deliveries.size() / 3) Thread.sleep(5);
            Topologies.failover(server);
            for (Future<?> f : calls) f.get(120, TimeUnit.SECONDS);
            pool.shutdown();
            System.out.println("failover under load (" + client + "): " + runs.get() + " runs for " + attempts.size() + " keys, "
                    + redelivered.get() + " deliveries given back, " + grantedTwice.get() + " attempts granted twice, " + overlaps.get() + " overlapping runs");
            assertEquals(0, grantedTwice.get(), "an attempt number granted twice");
            assertEquals(0, overlaps.get(), "a key's work running twice at once");
            assertEquals(450, attempts.size());
            for (int i = 0; i < 450; i++) {
                Record r = idem.commands().get("k" + i);
                assertEquals(RecordState.DONE, r.state(), "k" + i + " " + outcomes.get("k" + i) + " " + r);
                assertTrue(attempts.get("k" + i).contains(r.attempt()), "k" + i + " done by one of its runs");
            }
        }
    }
}
