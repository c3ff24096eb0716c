package io.github.redisidem;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * Every case of clients/conformance/cases.json that applies to a server
 * configuration, through Jedis and through Lettuce. One subclass per
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
        JsonNode cases = CaseRunner.JSON.readTree(Files.readString(Servers.REPO.resolve("clients/conformance/cases.json"))).get("cases");
        List<DynamicTest> tests = new ArrayList<>();
        for (CaseRunner.Client client : CaseRunner.Client.values()) {
            CaseRunner[] runner = new CaseRunner[1];
            for (JsonNode c : cases) {
                if (!CaseRunner.applies(c, edition(), cluster())) continue;
                tests.add(DynamicTest.dynamicTest(client + " " + c.get("id").asText(), () -> {
                    if (runner[0] == null) runner[0] = new CaseRunner(Servers.shared(binary(), edition(), cluster()), client);
                    runner[0].run(c);
                }));
            }
        }
        return tests.stream();
    }
}
