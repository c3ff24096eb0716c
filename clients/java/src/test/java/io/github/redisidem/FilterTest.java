package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.github.redisidem.servlet.IdempotencyFilter;
import io.github.redisidem.transport.JedisTransport;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.concurrent.CountDownLatch;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.RedisClient;

/**
 * The filter's stored format (read and written as every language's
 * middleware does), the whole response kept (redirects, cookies, date
 * headers), the Idem's settings taken, {@code required} and {@code maxTries}.
 */
class FilterTest {
    private static JsonNode request(String key, String target, String body, String handler) throws Exception {
        return CaseChecks.JSON.readTree("{\"method\":\"POST\",\"target\":\"" + target + "\",\"body\":" + CaseChecks.JSON.writeValueAsString(body)
                + ",\"headers\":" + (key == null ? "{}" : "{\"Idempotency-Key\":\"" + key + "\"}") + ",\"handler\":" + handler + "}");
    }

    private static JsonNode request(String key, String target, String body, int status, String reply) throws Exception {
        return request(key, target, body, "{\"status\":" + status + ",\"body\":" + CaseChecks.JSON.writeValueAsString(reply) + "}");
    }

    private static JsonNode stored(Idem reader, String key) throws Exception {
        return CaseChecks.JSON.readTree(reader.commands().get(key).result());
    }

    @Test
    void storesReplaysAndRefuses() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        String prefix = "filter" + System.nanoTime() + ":";
        try (RedisClient jedis = RedisClient.create("127.0.0.1", server.port());
             Idem reader = new Idem(JedisTransport.of(jedis), IdemOptions.builder().prefix(prefix).build());
             HttpHarness http = new HttpHarness(name -> new CountDownLatch(0))) {
            Idem idem = new Idem(JedisTransport.of(jedis), IdemOptions.builder().prefix(prefix).waitFor(Duration.ZERO).build());
            IdempotencyFilter filter = IdempotencyFilter.builder(idem).scope("shop").maxTries(2).methods("POST").required(true).build();
            http.filter = filter;

            assertEquals(201, http.request(request("a", "/orders?x=1", "{\"n\":1}", 201, "{\"id\":1}")).status());
            JsonNode stored = stored(reader, "http:shop:a");
            assertEquals(1, stored.get("v").asInt());
            assertEquals(201, stored.get("status").asInt());
            assertEquals("{\"id\":1}", new String(Base64.getDecoder().decode(stored.get("body").asText()), StandardCharsets.UTF_8));
            assertTrue(stored.get("headers").toString().contains("[\"Content-Type\",\"application/json"), stored.toString());
            assertTrue(!stored.toString().contains("Content-Length") && !stored.toString().contains("\"Date\""), stored.toString());

            // A response stored by another language's middleware replays here.
            Claim claim = reader.commands().claim("http:shop:b", Duration.ofSeconds(30),
                    ClaimOptions.none().payload(IdempotencyFilter.fingerprint("POST", "/orders", new byte[0]).getBytes(StandardCharsets.US_ASCII)));
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
            Stats stats = filter.stats();
            assertEquals(2, stats.firstRuns(), "the filter's own counters: " + stats);
            assertEquals(1, stats.retries());
            assertEquals(1, stats.replays());
            assertEquals(1, stats.exhausted());
            assertEquals(0, idem.stats().firstRuns(), "the Idem's counters are its own");
            filter.destroy();
            idem.close();
        }
    }

    @Test
    void redirectsCookiesAndDateHeadersAreStoredAndReplayed() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        String prefix = "filterkeep" + System.nanoTime() + ":";
        try (RedisClient jedis = RedisClient.create("127.0.0.1", server.port());
             Idem idem = new Idem(JedisTransport.of(jedis), IdemOptions.builder().prefix(prefix).build());
             HttpHarness http = new HttpHarness(name -> new CountDownLatch(0))) {
            IdempotencyFilter filter = IdempotencyFilter.builder(idem).build();
            http.filter = filter;

            // A 303 with its Location (setStatus and setHeader), a cookie, a date header.
            String handler = "{\"status\":303,\"body\":\"\",\"location\":\"/orders/9\",\"cookie\":\"session\",\"last_modified\":784111777000}";
            HttpHarness.Result first = http.request(request("r1", "/orders", "{}", handler));
            HttpHarness.Result again = http.request(request("r1", "/orders", "{}", handler));
            for (HttpHarness.Result r : new HttpHarness.Result[] {first, again}) {
                assertEquals(303, r.status());
                assertEquals("/orders/9", r.headers().firstValue("Location").orElse(null));
                String cookie = r.headers().firstValue("Set-Cookie").orElse("");
                assertTrue(cookie.startsWith("session=v1") && cookie.contains("Path=/") && cookie.contains("HttpOnly") && cookie.contains("Max-Age=3600"), cookie);
                assertEquals("Sun, 06 Nov 1994 08:49:37 GMT", r.headers().firstValue("Last-Modified").orElse(null));
            }
            assertTrue(again.replayed());
            JsonNode stored = stored(idem, "http:r1");
            assertEquals(303, stored.get("status").asInt(), stored.toString());

            // sendRedirect: a 302 with its Location, stored as such.
            HttpHarness.Result redirect = http.request(request("r2", "/orders", "{}", "{\"send_redirect\":\"/next\"}"));
            HttpHarness.Result replayed = http.request(request("r2", "/orders", "{}", "{\"send_redirect\":\"/elsewhere\"}"));
            assertEquals(302, redirect.status());
            assertEquals(302, replayed.status());
            assertTrue(replayed.replayed());
            assertTrue(replayed.headers().firstValue("Location").orElse("").endsWith("/next"), replayed.headers().toString());
            assertEquals(302, stored(idem, "http:r2").get("status").asInt());
            filter.destroy();
        }
    }

    @Test
    void theFilterTakesTheIdemsSettings() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        String prefix = "filtersettings" + System.nanoTime() + ":";
        try (RedisClient jedis = RedisClient.create("127.0.0.1", server.port());
             Idem idem = new Idem(JedisTransport.of(jedis), IdemOptions.builder().prefix(prefix).waitFor(Duration.ZERO).maxTries(5).build());
             HttpHarness http = new HttpHarness(name -> new CountDownLatch(0))) {
            IdempotencyFilter filter = IdempotencyFilter.builder(idem).build();
            http.filter = filter;
            // A request in flight (claimed by another holder): the Idem's wait 0 answers 409 at once.
            Claim holder = idem.commands().claim("http:k", Duration.ofSeconds(30),
                    ClaimOptions.none().payload(IdempotencyFilter.fingerprint("POST", "/orders", "{}".getBytes(StandardCharsets.UTF_8)).getBytes(StandardCharsets.US_ASCII)));
            HttpHarness.Result busy = http.request(request("k", "/orders", "{}", 201, "{}"));
            assertEquals(409, busy.status());
            assertEquals(0, filter.stats().waits(), "wait 0: not waited");
            idem.commands().release("http:k", holder.token());
            // maxTries 5 from the Idem (not the filter's default 3): five 5xx answers run the handler, the sixth is 500.
            int runs = http.runs.get();
            for (int i = 0; i < 5; i++) assertEquals(503, http.request(request("m", "/orders", "", 503, "{}")).status());
            assertEquals(500, http.request(request("m", "/orders", "", 201, "{}")).status());
            assertEquals(runs + 5, http.runs.get());
            filter.destroy();
        }
    }

    /**
     * durable on a primary without replicas: a replay not acknowledged serves its stored response, with
     * {@code Idempotent-Replayed: true} as any replay; one with none kept answers 503.
     */
    @Test
    void aReplayNotDurable() throws Exception {
        Servers.Server server = Servers.forLibraryTests(Edition.MODULE);
        String prefix = "filterdurable" + System.nanoTime() + ":";
        try (RedisClient jedis = RedisClient.create("127.0.0.1", server.port());
             Idem idem = new Idem(JedisTransport.of(jedis), IdemOptions.builder().prefix(prefix)
                     .durable(Durable.replicas(1).timeout(Duration.ofMillis(50))).build());
             HttpHarness http = new HttpHarness(name -> new CountDownLatch(0))) {
            IdempotencyFilter filter = IdempotencyFilter.builder(idem).scope("shop").methods("POST").build();
            http.filter = filter;
            byte[] fingerprint = IdempotencyFilter.fingerprint("POST", "/orders", new byte[0]).getBytes(StandardCharsets.US_ASCII);
            String kept = "{\"v\":1,\"status\":202,\"headers\":[],\"body\":\"" + Base64.getEncoder().encodeToString("stored".getBytes(StandardCharsets.UTF_8)) + "\"}";
            Claim a = idem.commands().claim("http:shop:a", Duration.ofSeconds(30), ClaimOptions.none().payload(fingerprint));
            idem.commands().done("http:shop:a", a.token(), kept.getBytes(StandardCharsets.UTF_8), null);
            Claim b = idem.commands().claim("http:shop:b", Duration.ofSeconds(30), ClaimOptions.none().payload(fingerprint));
            idem.commands().done("http:shop:b", b.token(), null, null);
            int runs = http.runs.get();
            HttpHarness.Result replay = http.request(request("a", "/orders", "", 201, "fresh"));
            assertEquals(202, replay.status());
            assertEquals("stored", replay.body());
            assertTrue(replay.replayed(), "a replay, acknowledged or not, says so");
            assertEquals(503, http.request(request("b", "/orders", "", 201, "fresh")).status(), "no response kept: send again");
            assertEquals(runs, http.runs.get(), "the handler never ran");
            assertEquals(2, filter.stats().notDurable());
            filter.destroy();
        }
    }
}
