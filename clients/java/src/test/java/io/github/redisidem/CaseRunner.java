package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;

import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.args.UnblockType;

/** Runs clients/conformance/cases.json's cases against one server configuration through one client library. */
final class CaseRunner {
    enum Client { JEDIS, LETTUCE }

    static final ObjectMapper JSON = new ObjectMapper();
    private static final AtomicLong CASES = new AtomicLong();
    private final Servers.Server server;
    private final Client client;
    private final Transport transport;
    private final UnifiedJedis admin;
    private HttpHarness http;
    private final ExecutorService background = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "case-call");
        t.setDaemon(true);
        return t;
    });

    CaseRunner(Servers.Server server, Client client) {
        this.server = server;
        this.client = client;
        this.transport = transport(server.port());
        this.admin = server.cluster ? redis.clients.jedis.RedisClusterClient.create(new HostAndPort("127.0.0.1", server.port())) : redis.clients.jedis.RedisClient.create("127.0.0.1", server.port());
    }

    Transport transport(int port) {
        return transport(server, client, port);
    }

    /** A transport of `client` to `port` of `server` (its cluster when it is one), closing what it made. */
    static Transport transport(Servers.Server server, Client client, int port) {
        if (client == Client.JEDIS) {
            return JedisTransport.of(server.cluster ? redis.clients.jedis.RedisClusterClient.create(new HostAndPort("127.0.0.1", port)) : redis.clients.jedis.RedisClient.create("127.0.0.1", port));
        }
        if (server.cluster) {
            RedisClusterClient cluster = RedisClusterClient.create(RedisURI.create("127.0.0.1", port));
            return closing(LettuceTransport.of(cluster), cluster::shutdown);
        }
        RedisClient lettuce = RedisClient.create();
        return closing(LettuceTransport.of(lettuce, RedisURI.create("127.0.0.1", port)), lettuce::shutdown);
    }

    /** The transport, shutting its own Lettuce client down when it is closed. */
    private static Transport closing(Transport transport, Runnable shutdown) {
        return new Transport() {
            @Override
            public java.util.concurrent.CompletableFuture<Object> send(RedisCommand command) {
                return transport.send(command);
            }

            @Override
            public java.util.concurrent.CompletableFuture<List<Object>> sendAll(List<RedisCommand> commands) {
                return transport.sendAll(commands);
            }

            @Override
            public boolean cluster() {
                return transport.cluster();
            }

            @Override
            public List<Transport> primaries() {
                return transport.primaries();
            }

            @Override
            public void close() {
                transport.close();
                shutdown.run();
            }
        };
    }

    static boolean applies(JsonNode c, Edition edition, boolean cluster) {
        boolean editionOk = false;
        for (JsonNode e : c.get("editions")) editionOk |= e.asText().equals(edition == Edition.MODULE ? "module" : "functions");
        return editionOk && c.get("topology").asText().equals(cluster ? "cluster" : "standalone");
    }

    /** One call's traces: how often its work ran, whether it started, what it saw. */
    static final class CallState {
        final AtomicInteger runs = new AtomicInteger();
        final CountDownLatch started = new CountDownLatch(1);
        volatile Boolean lostSeen;
        volatile long attempt;
    }

    /** A case's state: its instance, the tokens kept, the gates, the calls started. */
    private final class Run {
        final String prefix = "t" + CASES.incrementAndGet() + ":";
        final Idem idem;
        final Map<String, String> tokens = new HashMap<>();
        final Map<String, CountDownLatch> gates = new ConcurrentHashMap<>();
        final Map<String, CallState> states = new HashMap<>();
        final Map<String, Future<?>> calls = new HashMap<>();
        final Map<String, Long> baseline;
        final List<IdempotencyFilter> filters = new ArrayList<>();
        final Proxy proxy;
        final Transport own;

        Run(JsonNode c) throws Exception {
            boolean proxied = has(c.get("needs"), "proxy");
            proxy = proxied ? new Proxy(server.port()) : null;
            own = proxied ? transport(proxy.port()) : null;
            idem = new Idem(proxied ? own : transport, options(c.get("options")));
            baseline = commandStats();
        }

        IdemOptions options(JsonNode o) {
            IdemOptions opts = IdemOptions.defaults().withPrefix(prefix);
            if (o.has("lease_ms")) opts = opts.withLease(Duration.ofMillis(o.get("lease_ms").asLong()));
            if (o.has("wait_ms")) opts = opts.withWait(Duration.ofMillis(o.get("wait_ms").asLong()));
            if (o.has("heartbeat_ms")) opts = opts.withHeartbeat(Duration.ofMillis(o.get("heartbeat_ms").asLong()));
            if (o.has("max_tries")) opts = opts.withMaxTries(o.get("max_tries").asInt());
            if (o.has("oversize")) opts = opts.withOversize(Oversize.valueOf(o.get("oversize").asText().toUpperCase()));
            JsonNode hooks = o.path("hooks");
            boolean runRaises = hooks.has("on_run");
            boolean doneRaises = hooks.has("on_done");
            return opts.withHooks(new Hooks() {
                @Override
                public void onRun(Job job) {
                    if (runRaises) throw new IllegalStateException("hook failed");
                }

                @Override
                public void onDone(Job job, boolean resultStored) {
                    if (doneRaises) throw new IllegalStateException("hook failed");
                }
            });
        }

        CountDownLatch gate(String name) {
            return gates.computeIfAbsent(name, n -> new CountDownLatch(1));
        }

        Work<Object> work(JsonNode w, CallState st) {
            return job -> {
                st.runs.incrementAndGet();
                st.attempt = job.attempt();
                st.started.countDown();
                if (w.has("gate")) {
                    assertTrue(gate(w.get("gate").asText()).await(30, TimeUnit.SECONDS), "gate opened");
                    st.lostSeen = job.lost();
                }
                if (w.has("sleep_ms")) Thread.sleep(w.get("sleep_ms").asLong());
                if (w.has("raise")) throw new WorkFailure(w.get("raise").asText());
                if (w.has("return_unserializable")) return new Object();
                if (w.has("return_bytes")) return "x".repeat(w.get("return_bytes").asInt());
                return JSON.convertValue(w.get("return"), Object.class);
            };
        }
    }

    /** The work's own failure in the cases ("Work"). */
    static final class WorkFailure extends Exception {
        private static final long serialVersionUID = 1L;

        WorkFailure(String message) {
            super(message);
        }
    }

    private static boolean has(JsonNode list, String name) {
        for (JsonNode n : list) if (n.asText().equals(name)) return true;
        return false;
    }

    static String errorName(Throwable e) {
        if (e instanceof WorkFailure) return "Work";
        String n = e.getClass().getSimpleName();
        return n.endsWith("Exception") ? n.substring(0, n.length() - "Exception".length()) : n;
    }

    void run(JsonNode c) throws Exception {
        Run run = new Run(c);
        try {
            int i = 0;
            for (JsonNode step : c.get("steps")) {
                try {
                    step(run, step);
                } catch (AssertionError e) {
                    throw new AssertionError("step " + i + " " + step + ": " + e.getMessage(), e);
                }
                i++;
            }
            checkStats(run.idem.stats(), c.get("stats"));
        } finally {
            run.gates.values().forEach(CountDownLatch::countDown);
            for (Future<?> f : run.calls.values()) f.cancel(true);
            run.idem.close();
            run.filters.forEach(IdempotencyFilter::destroy);
            if (run.own != null) run.own.close();
            if (run.proxy != null) run.proxy.close();
        }
    }

    private byte[] bytes(JsonNode text) {
        return text == null || text.isNull() ? null : text.asText().getBytes(StandardCharsets.UTF_8);
    }

    private void step(Run run, JsonNode step) throws Exception {
        String op = step.get("op").asText();
        JsonNode expect = step.get("expect");
        Idem idem = run.idem;
        IdemCommands cmd = idem.commands();
        switch (op) {
            case "process" -> {
                CallState st = new CallState();
                Outcome<Object> out = null;
                Throwable err = null;
                try {
                    out = idem.process(step.get("key").asText(), bytes(step.get("payload")), run.work(step.get("work"), st));
                } catch (Exception e) {
                    err = e;
                }
                checkCall(expect, st, out, err);
            }
            case "start" -> {
                CallState st = new CallState();
                String id = step.get("id").asText();
                run.states.put(id, st);
                run.calls.put(id, background.submit(() -> idem.process(step.get("key").asText(), bytes(step.get("payload")), run.work(step.get("work"), st))));
            }
            case "running" -> assertTrue(run.states.get(step.get("id").asText()).started.await(10, TimeUnit.SECONDS), "the work started");
            case "waiting" -> {
                if (server.edition == Edition.FUNCTIONS) Thread.sleep(300);
                else {
                    Future<?> call = run.calls.get(step.get("id").asText());
                    waitUntil(() -> !blockedClaims().isEmpty() || call.isDone(), "a client blocked in idem.claim");
                    if (call.isDone()) fail("the call ended instead of waiting: " + outcome(call));
                }
            }
            case "unblock" -> {
                for (long[] c : blockedClaims()) try (Jedis j = new Jedis("127.0.0.1", (int) c[0])) {
                    j.clientUnblock(c[1], UnblockType.ERROR);
                }
                // CLIENT UNBLOCK answers after the waiter is unblocked: the next waiting step sees only its new wait.
            }
            case "finish" -> {
                String id = step.get("id").asText();
                Outcome<Object> out = null;
                Throwable err = null;
                try {
                    @SuppressWarnings("unchecked")
                    Outcome<Object> o = (Outcome<Object>) run.calls.get(id).get(30, TimeUnit.SECONDS);
                    out = o;
                } catch (ExecutionException e) {
                    err = e.getCause();
                }
                checkCall(expect, run.states.get(id), out, err);
            }
            case "open" -> run.gate(step.get("gate").asText()).countDown();
            case "sleep" -> Thread.sleep(step.get("ms").asLong());
            case "set" -> admin.set(run.prefix + step.get("key").asText(), step.get("value").asText());
            case "del" -> admin.del(run.prefix + step.get("key").asText());
            case "claim" -> {
                Claim claim = null;
                Throwable err = null;
                try {
                    claim = cmd.claim(step.get("key").asText(), Duration.ofMillis(step.get("lease_ms").asLong()));
                    if (step.has("as") && claim.token() != null) run.tokens.put(step.get("as").asText(), claim.token());
                } catch (IdemException e) {
                    err = e;
                }
                if (expect != null) checkClaim(expect, claim, err);
            }
            case "done" -> {
                Done done = null;
                Throwable err = null;
                try {
                    done = cmd.done(step.get("key").asText(), run.tokens.get(step.get("token").asText()), bytes(step.get("result")), null);
                } catch (IdemException e) {
                    err = e;
                }
                if (expect != null) checkDone(expect, done, err);
            }
            case "release" -> {
                boolean released = cmd.release(step.get("key").asText(), run.tokens.get(step.get("token").asText()));
                if (expect != null) assertEquals(expect.get("released").asBoolean(), released, "released");
            }
            case "get" -> {
                Record r = cmd.get(step.get("key").asText());
                if (expect == null || expect.isNull()) {
                    assertNull(r, "no record");
                    return;
                }
                assertNotNull(r, "a record");
                if (expect.has("state")) assertEquals(expect.get("state").asText(), r.state().name().toLowerCase(), "state");
                if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), r.attempt(), "attempt");
                if (expect.has("result")) {
                    JsonNode want = expect.get("result");
                    assertEquals(want.isNull() ? null : want.asText(), r.result() == null ? null : new String(r.result(), StandardCharsets.UTF_8), "result");
                }
            }
            case "claim_many" -> {
                List<String> keys = strings(step.get("keys"));
                List<Reply<Claim>> replies = idem.claimMany(keys, Duration.ofMillis(step.get("lease_ms").asLong()));
                assertEquals(keys.size(), replies.size());
                for (int i = 0; i < keys.size(); i++) {
                    JsonNode as = step.path("as").path(i);
                    if (as.isTextual() && replies.get(i).ok()) run.tokens.put(as.asText(), replies.get(i).value().token());
                    if (expect != null) checkClaim(expect.get(i), replies.get(i).value(), replies.get(i).error());
                }
            }
            case "done_many", "release_many" -> {
                List<DoneItem> items = new ArrayList<>();
                for (JsonNode item : step.get("items")) {
                    items.add(new DoneItem(item.get(0).asText(), run.tokens.get(item.get(1).asText()), bytes(item.get(2))));
                }
                if (op.equals("done_many")) {
                    List<Reply<Done>> replies = idem.doneMany(items);
                    for (int i = 0; i < items.size(); i++) if (expect != null) checkDone(expect.get(i), replies.get(i).value(), replies.get(i).error());
                } else {
                    List<Reply<Boolean>> replies = idem.releaseMany(items.stream().map(d -> new ReleaseItem(d.key(), d.token())).toList());
                    for (int i = 0; i < items.size(); i++) if (expect != null) assertEquals(expect.get(i).get("released").asBoolean(), replies.get(i).value());
                }
            }
            case "process_many" -> {
                List<String> keys = strings(step.get("keys"));
                Map<String, CallState> states = new HashMap<>();
                keys.forEach(k -> states.put(k, new CallState()));
                List<BatchItem<Object>> items = idem.processMany(keys, job -> run.work(step.get("work").get(job.key()), states.get(job.key())).run(job));
                assertEquals(keys.size(), items.size());
                for (int i = 0; i < keys.size(); i++) checkItem(expect.get(i), items.get(i));
            }
            case "cut_reply" -> run.proxy.arm();
            case "command_calls" -> {
                String name = step.get("command").asText();
                long calls = commandStats().getOrDefault(name, 0L) - run.baseline.getOrDefault(name, 0L);
                assertEquals(expect.asLong(), calls, "calls of " + name);
            }
            case "fingerprint" -> assertEquals(expect.asText(), IdempotencyFilter.fingerprint(step.get("method").asText(),
                    step.get("target").asText(), step.get("body").asText().getBytes(StandardCharsets.UTF_8)));
            case "http", "http_start", "http_finish", "handler_finished" -> http(run, op, step, expect);
            default -> fail("unknown op " + op);
        }
    }

    private static String outcome(Future<?> call) {
        try {
            return String.valueOf(call.get());
        } catch (ExecutionException e) {
            java.io.StringWriter trace = new java.io.StringWriter();
            e.getCause().printStackTrace(new java.io.PrintWriter(trace));
            return trace.toString();
        } catch (InterruptedException e) {
            return "interrupted";
        }
    }

    private final Map<String, Future<HttpHarness.Result>> httpCalls = new ConcurrentHashMap<>();

    private void http(Run run, String op, JsonNode step, JsonNode expect) throws Exception {
        if (http == null) http = new HttpHarness(name -> currentRun.gate(name));
        if (currentRun != run) {
            currentRun = run;
            http.runs.set(0);
            http.finished.set(0);
        }
        switch (op) {
            case "http_start" -> {
                http.filter = filter(run, step);
                httpCalls.put(step.get("id").asText(), background.submit(() -> http.request(step)));
                Thread.sleep(50);
            }
            case "http_finish" -> checkHttp(expect, httpCalls.get(step.get("id").asText()).get(30, TimeUnit.SECONDS));
            case "handler_finished" -> waitUntil(() -> http.finished.get() >= step.get("count").asInt(), "the handler finished");
            default -> {
                http.filter = filter(run, step);
                checkHttp(expect, http.request(step));
            }
        }
    }

    private volatile Run currentRun;

    private IdempotencyFilter filter(Run run, JsonNode step) {
        IdemOptions options = run.idem.options();
        if (step.path("options").has("wait_ms")) options = options.withWait(Duration.ofMillis(step.get("options").get("wait_ms").asLong()));
        IdempotencyFilter filter = new IdempotencyFilter(run.own != null ? run.own : transport, options, "default", 3, Set.of("POST", "PATCH"), false);
        run.filters.add(filter);
        return filter;
    }

    private void checkHttp(JsonNode expect, HttpHarness.Result r) {
        if (expect == null) return;
        if (expect.has("client_timeout")) assertEquals(expect.get("client_timeout").asBoolean(), r.clientTimeout(), "client_timeout");
        if (expect.has("status")) assertEquals(expect.get("status").asInt(), r.status(), "status");
        if (expect.has("replayed")) assertEquals(expect.get("replayed").asBoolean(), r.replayed(), "replayed");
        if (expect.has("body")) assertEquals(expect.get("body").asText(), r.body(), "body");
        if (expect.has("retry_after")) assertEquals(expect.get("retry_after").asBoolean(), r.retryAfter(), "retry_after");
        if (expect.has("handler_runs")) assertEquals(expect.get("handler_runs").asInt(), http.runs.get(), "handler_runs");
    }

    private static List<String> strings(JsonNode list) {
        List<String> out = new ArrayList<>();
        list.forEach(n -> out.add(n.asText()));
        return out;
    }

    private static void sameJson(JsonNode want, Object actual, String what) {
        assertEquals(want, JSON.valueToTree(actual), what);
    }

    private void checkCall(JsonNode expect, CallState st, Outcome<Object> out, Throwable err) {
        if (expect.has("ran")) assertEquals(expect.get("ran").asBoolean(), st.runs.get() > 0, "ran");
        if (expect.has("lost_seen")) assertEquals(expect.get("lost_seen").asBoolean(), st.lostSeen, "lost_seen");
        if (expect.has("error")) {
            assertNotNull(err, "an error " + expect.get("error") + ", got " + out);
            assertEquals(expect.get("error").asText(), errorName(err), "error (" + err + ")");
            if (expect.has("message")) assertEquals(expect.get("message").asText(), err.getMessage());
            if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), st.attempt, "attempt");
            if (expect.has("error_result")) {
                Object result = err instanceof HookException h ? h.result() : err instanceof ResultNotStoredException r ? r.result() : null;
                sameJson(expect.get("error_result"), result, "error_result");
            }
            if (expect.has("lease_left_ms_min")) {
                assertTrue(((BusyException) err).leaseLeft().toMillis() >= expect.get("lease_left_ms_min").asLong(), "lease_left");
            }
            return;
        }
        if (err != null) throw new AssertionError("unexpected error " + err, err);
        if (expect.has("value")) sameJson(expect.get("value"), out.value(), "value");
        if (expect.has("replayed")) assertEquals(expect.get("replayed").asBoolean(), out.replayed(), "replayed");
        if (expect.has("status")) assertEquals(expect.get("status").asText(), out.status().name(), "status");
        if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), out.attempt(), "attempt");
        if (expect.has("result_stored")) assertEquals(expect.get("result_stored").asBoolean(), out.resultStored(), "result_stored");
    }

    /** A command step's error: true when the step expected one (and it matched). */
    private static boolean expectedError(JsonNode expect, Throwable err) {
        if (expect.has("error")) {
            assertNotNull(err, "an error");
            assertEquals(expect.get("error").asText(), errorName(err));
            return true;
        }
        if (err != null) throw new AssertionError("unexpected error " + err, err);
        return false;
    }

    private static void checkClaim(JsonNode expect, Claim claim, Throwable err) {
        if (expectedError(expect, err)) return;
        if (expect.has("status")) assertEquals(expect.get("status").asText(), claim.status().name(), "status");
        if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), claim.attempt(), "attempt");
    }

    private static void checkDone(JsonNode expect, Done done, Throwable err) {
        if (expectedError(expect, err)) return;
        assertEquals(expect.get("completed").asBoolean(), done.completed(), "completed");
    }

    private static void checkItem(JsonNode expect, BatchItem<Object> item) {
        String at = " of " + item;
        assertEquals(expect.get("key").asText(), item.key());
        assertEquals(expect.get("status").asText(), item.status().name().toLowerCase(), "status" + at);
        if (expect.has("value")) sameJson(expect.get("value"), item.value(), "value" + at);
        if (expect.has("error")) {
            assertNotNull(item.error(), "error" + at);
            assertEquals(expect.get("error").asText(), errorName(item.error()), "error" + at);
        }
        if (expect.has("message")) assertEquals(expect.get("message").asText(), item.error().getMessage());
        if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), item.attempt(), "attempt" + at);
        if (expect.has("result_stored")) assertEquals(expect.get("result_stored").asBoolean(), item.resultStored(), "result_stored" + at);
    }

    private static final String[][] COUNTERS = {{"first_runs"}, {"retries"}, {"replays"}, {"waits"}, {"busy"}, {"completed"},
        {"released"}, {"leases_lost"}, {"results_dropped"}, {"mismatches"}, {"exhausted"}};

    static void checkStats(Stats s, JsonNode want) {
        long[] got = {s.firstRuns(), s.retries(), s.replays(), s.waits(), s.busy(), s.completed(), s.released(), s.leasesLost(),
            s.resultsDropped(), s.mismatches(), s.exhausted()};
        for (int i = 0; i < COUNTERS.length; i++) assertEquals(want.path(COUNTERS[i][0]).asLong(0), got[i], "stats." + COUNTERS[i][0] + " in " + s);
        if (want.has("extends_min")) assertTrue(s.extensions() >= want.get("extends_min").asLong(), "extends " + s.extensions());
    }

    /** Clients blocked in idem.claim: {port, id}. */
    private List<long[]> blockedClaims() {
        List<long[]> out = new ArrayList<>();
        for (int port : server.ports) try (Jedis j = new Jedis("127.0.0.1", port)) {
            for (String line : j.clientList().split("\n")) {
                Map<String, String> f = new HashMap<>();
                for (String kv : line.trim().split(" ")) {
                    int eq = kv.indexOf('=');
                    if (eq > 0) f.put(kv.substring(0, eq), kv.substring(eq + 1));
                }
                if (f.getOrDefault("flags", "").contains("b") && "idem.claim".equalsIgnoreCase(f.get("cmd"))) {
                    out.add(new long[] {port, Long.parseLong(f.get("id"))});
                }
            }
        }
        return out;
    }

    private Map<String, Long> commandStats() {
        Map<String, Long> out = new HashMap<>();
        for (int port : server.ports) try (Jedis j = new Jedis("127.0.0.1", port)) {
            for (String line : j.info("commandstats").split("\n")) {
                if (!line.startsWith("cmdstat_")) continue;
                String name = line.substring(8, line.indexOf(":")).toLowerCase();
                String calls = line.substring(line.indexOf("calls=") + 6).split(",")[0];
                out.merge(name, Long.parseLong(calls.trim()), Long::sum);
            }
        }
        return out;
    }

    static void waitUntil(java.util.function.BooleanSupplier ok, String what) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 10_000;
        while (!ok.getAsBoolean()) {
            if (System.currentTimeMillis() > deadline) fail("timed out waiting: " + what);
            Thread.sleep(10);
        }
    }
}
