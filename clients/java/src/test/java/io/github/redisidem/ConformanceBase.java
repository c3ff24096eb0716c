package io.github.redisidem;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * Every case of clients/conformance/cases.json that applies to a server
 * configuration (its standalone, replicated and Sentinel topologies, or a
 * cluster), through Jedis and through Lettuce. One subclass per
 * configuration: JUnit runs the configurations side by side.
 */
abstract class ConformanceBase {
    abstract String binary();

    abstract Edition edition();

    boolean cluster() {
        return false;
    }

    @TestFactory
    Stream<DynamicTest> conformance() throws Exception {
        JsonNode cases = CaseChecks.JSON.readTree(Files.readString(Servers.REPO.resolve("clients/conformance/cases.json"))).get("cases");
        List<Servers.Topology> topologies = cluster() ? List.of(Servers.Topology.CLUSTER)
                : List.of(Servers.Topology.STANDALONE, Servers.Topology.REPLICATED, Servers.Topology.SENTINEL);
        List<DynamicTest> tests = new ArrayList<>();
        for (CaseRunner.Client client : CaseRunner.Client.values()) {
            Map<Servers.Topology, CaseRunner> runners = new EnumMap<>(Servers.Topology.class);
            for (Servers.Topology topology : topologies) {
                for (JsonNode c : cases) {
                    if (!CaseRunner.applies(c, edition(), topology)) continue;
                    tests.add(DynamicTest.dynamicTest(client + " " + c.get("id").asText(), () -> runners
                            .computeIfAbsent(topology, t -> new CaseRunner(Servers.shared(binary(), edition(), t), client)).run(c)));
                }
            }
        }
        return tests.stream();
    }
}
