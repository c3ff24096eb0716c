package io.github.redisidem.scenario;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.Edition;
import io.github.redisidem.IdemOptions;
import io.github.redisidem.Job;
import java.net.URI;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import redis.clients.jedis.RedisClient;

/**
 * What a scenario program needs of brokers/scenario.py's environment
 * (brokers/README.md, "Writing a consumer program"), and the work: shared
 * by the adapter modules' programs (each compiles this directory with its
 * tests, build-helper-maven-plugin).
 */
public final class Scenario {
    private static final ObjectMapper JSON = new ObjectMapper();
    public final String adapter = System.getenv("IDEM_ADAPTER");
    public final String source = System.getenv("IDEM_SOURCE");
    public final String group = System.getenv("IDEM_GROUP");
    public final String member = System.getenv("IDEM_MEMBER");
    public final JsonNode broker;
    private final RedisClient side;
    private final String startSha = System.getenv("SIDE_START_SHA");
    private final String effectSha = System.getenv("SIDE_EFFECT_SHA");
    private final long workMs = Long.parseLong(System.getenv("IDEM_WORK_MS"));
    private final long slowMs = Long.parseLong(System.getenv("IDEM_SLOW_WORK_MS"));

    public Scenario() throws Exception {
        broker = JSON.readTree(System.getenv("BROKER"));
        side = client(System.getenv("SIDE_REDIS_URL"));
    }

    /** A Jedis client for redis://host:port. */
    public static RedisClient client(String url) {
        URI u = URI.create(url);
        return RedisClient.create(u.getHost(), u.getPort());
    }

    /** The records' server. */
    public RedisClient records() {
        return client(System.getenv("IDEM_REDIS_URL"));
    }

    /** IDEM_LEASE_S and IDEM_MAX_TRIES, the edition the scenario says, the rest at their defaults. */
    public IdemOptions idemOptions() {
        return IdemOptions.builder()
                .lease(Duration.ofSeconds(Long.parseLong(System.getenv("IDEM_LEASE_S"))))
                .maxTries(Integer.parseInt(System.getenv("IDEM_MAX_TRIES")))
                .edition("functions".equals(System.getenv("IDEM_EDITION")) ? Edition.FUNCTIONS : Edition.MODULE)
                .build();
    }

    /** The work for a message's JSON body, for a job: start, the work's time, the effect fenced by the attempt. */
    public Map<String, Object> work(String body, Job job) throws Exception {
        JsonNode m = JSON.readTree(body);
        String key = m.get("key").asText();
        String kind = m.get("kind").asText();
        Object start = side.evalsha(startSha, List.of(key), List.of(kind, member));
        if ("fail".equals(start)) throw new IllegalStateException(key + ": the work failed");
        Thread.sleep("slow".equals(kind) ? slowMs : workMs);
        side.evalsha(effectSha, List.of(key), List.of(Long.toString(job.attempt()), m.get("account").asText(), m.get("seq").asText(), member));
        return Map.of("n", m.get("seq").asLong());
    }
}
