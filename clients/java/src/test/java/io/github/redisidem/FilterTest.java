package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.RedisClient;

/** The filter's stored format (read and written as every language's middleware does), `required`, and `maxTries`. */
class FilterTest {
    private static JsonNode request(String key, String target, String body, int status, String reply) throws Exception {
        return CaseRunner.JSON.readTree("{\"method\":\"POST\",\"target\":\"" + target + "\",\"body\":" + CaseRunner.JSON.writeValueAsString(body)
                + ",\"headers\":" + (key == null ? "{}" : "{\"Idempotency-Key\":\"" + key + "\"}")
                + ",\"handler\":{\"status\":" + status + ",\"body\":" + CaseRunner.JSON.writeValueAsString(reply) + "}}");
    }

    @Test
    void storesReplaysAndRefuses() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        String prefix = "filter" + System.nanoTime() + ":";
        try (RedisClient jedis = RedisClient.create("127.0.0.1", server.port());
             Idem reader = new Idem(JedisTransport.of(jedis), IdemOptions.defaults().withPrefix(prefix));
             HttpHarness http = new HttpHarness(name -> new CountDownLatch(0))) {
            IdemOptions options = IdemOptions.defaults().withPrefix(prefix).withWait(Duration.ZERO);
            http.filter = new IdempotencyFilter(JedisTransport.of(jedis), options, "shop", 2, Set.of("POST"), true);

            assertEquals(201, http.request(request("a", "/orders?x=1", "{\"n\":1}", 201, "{\"id\":1}")).status());
            Record record = reader.commands().get("http:shop:a");
            JsonNode stored = CaseRunner.JSON.readTree(record.result());
            assertEquals(1, stored.get("v").asInt());
            assertEquals(201, stored.get("status").asInt());
            assertEquals("{\"id\":1}", new String(Base64.getDecoder().decode(stored.get("body").asText()), StandardCharsets.UTF_8));
            assertTrue(stored.get("headers").toString().contains("[\"Content-Type\",\"application/json"), stored.toString());
            assertTrue(!stored.toString().contains("Content-Length") && !stored.toString().contains("Date"), stored.toString());

            // A response stored by another language's middleware replays here.
            Claim claim = reader.commands().claim("http:shop:b", Duration.ofSeconds(30),
                    IdempotencyFilter.fingerprint("POST", "/orders", new byte[0]).getBytes(StandardCharsets.US_ASCII), null, null);
            String foreign = "{\"v\":1,\"status\":202,\"headers\":[[\"X-Made-By\",\"py\\\"thon\"]],\"body\":\""
                    + Base64.getEncoder().encodeToString("stored".getBytes(StandardCharsets.UTF_8)) + "\"}";
            reader.commands().done("http:shop:b", claim.token(), foreign.getBytes(StandardCharsets.UTF_8), null);
            HttpHarness.Result replay = http.request(request("b", "/orders", "", 201, "fresh"));
            assertEquals(202, replay.status());
            assertEquals("stored", replay.body());
            assertTrue(replay.replayed());

            assertEquals(400, http.request(request(null, "/orders", "", 201, "{}")).status(), "required");
            // maxTries 2: two 5xx answers, then 500 without running the handler.
            int runs = http.runs.get();
            assertEquals(503, http.request(request("c", "/orders", "", 503, "{}")).status());
            assertEquals(503, http.request(request("c", "/orders", "", 503, "{}")).status());
            assertEquals(500, http.request(request("c", "/orders", "", 201, "{}")).status());
            assertEquals(runs + 2, http.runs.get());
        }
    }
}
