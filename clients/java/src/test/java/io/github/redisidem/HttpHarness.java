package io.github.redisidem;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import jakarta.servlet.DispatcherType;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.EnumSet;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;
import org.eclipse.jetty.ee10.servlet.FilterHolder;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

/**
 * An embedded Jetty 12 with the {@link IdempotencyFilter} in front of a test
 * handler, and a real HTTP client. The handler a request gets travels in a
 * header the fingerprint does not cover.
 */
final class HttpHarness implements AutoCloseable {
    private static final ObjectMapper JSON = new ObjectMapper();
    private final Server jetty = new Server();
    private final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    private final Function<String, java.util.concurrent.CountDownLatch> gates;
    volatile Filter filter;
    final AtomicInteger runs = new AtomicInteger();
    final AtomicInteger finished = new AtomicInteger();
    private final int port;

    record Result(int status, boolean replayed, String body, boolean retryAfter, boolean clientTimeout, java.net.http.HttpHeaders headers) {}

    HttpHarness(Function<String, java.util.concurrent.CountDownLatch> gates) throws Exception {
        this.gates = gates;
        ServerConnector connector = new ServerConnector(jetty);
        connector.setHost("127.0.0.1");
        jetty.addConnector(connector);
        ServletContextHandler context = new ServletContextHandler();
        Filter delegate = (req, res, chain) -> filter.doFilter(req, res, chain);
        context.addFilter(new FilterHolder(delegate), "/*", EnumSet.of(DispatcherType.REQUEST));
        context.addServlet(new ServletHolder(new Handler()), "/*");
        jetty.setHandler(context);
        jetty.start();
        port = connector.getLocalPort();
        // Class loading, JIT and the first connection outside the cases' timings: a step whose client gives up
        // after 150 ms must see its request reach the handler.
        JsonNode warm = JSON.readTree("{\"method\":\"GET\",\"target\":\"/warm\",\"body\":\"\",\"headers\":{},"
                + "\"handler\":{\"status\":200,\"body\":\"{}\"}}");
        for (int i = 0; i < 3; i++) request(warm);
        runs.set(0);
        finished.set(0);
    }

    private final class Handler extends HttpServlet {
        private static final long serialVersionUID = 1L;

        @Override
        protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
            JsonNode spec = JSON.readTree(req.getHeader("X-Test-Handler"));
            req.getInputStream().readAllBytes();
            runs.incrementAndGet();
            try {
                if (spec.has("gate")) gates.apply(spec.get("gate").asText()).await(30, java.util.concurrent.TimeUnit.SECONDS);
                if (spec.has("sleep_ms")) Thread.sleep(spec.get("sleep_ms").asLong());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            if (spec.has("send_redirect")) {
                res.sendRedirect(spec.get("send_redirect").asText());
                finished.incrementAndGet();
                return;
            }
            res.setStatus(spec.get("status").asInt());
            res.setContentType("application/json");
            if (spec.has("location")) res.setHeader("Location", spec.get("location").asText());
            if (spec.has("cookie")) {
                jakarta.servlet.http.Cookie cookie = new jakarta.servlet.http.Cookie(spec.get("cookie").asText(), "v1");
                cookie.setPath("/");
                cookie.setHttpOnly(true);
                cookie.setMaxAge(3600);
                res.addCookie(cookie);
            }
            if (spec.has("last_modified")) res.setDateHeader("Last-Modified", spec.get("last_modified").asLong());
            res.getOutputStream().write(spec.get("body").asText().getBytes(StandardCharsets.UTF_8));
            finished.incrementAndGet();
        }
    }

    Result request(JsonNode step) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + step.get("target").asText()))
                .method(step.get("method").asText(), HttpRequest.BodyPublishers.ofString(step.get("body").asText()))
                .header("X-Test-Handler", JSON.writeValueAsString(step.get("handler")));
        for (Map.Entry<String, JsonNode> h : step.get("headers").properties()) b.header(h.getKey(), h.getValue().asText());
        b.timeout(step.has("client_timeout_ms") ? Duration.ofMillis(step.get("client_timeout_ms").asLong()) : Duration.ofSeconds(30));
        try {
            HttpResponse<String> r = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
            return new Result(r.statusCode(), r.headers().firstValue("Idempotent-Replayed").map("true"::equals).orElse(false), r.body(),
                    r.headers().firstValue("Retry-After").isPresent(), false, r.headers());
        } catch (HttpTimeoutException e) {
            return new Result(0, false, null, false, true, null);
        }
    }

    @Override
    public void close() {
        try {
            jetty.stop();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
