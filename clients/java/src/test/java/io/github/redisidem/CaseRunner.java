package io.github.redisidem;

import static io.github.redisidem.CaseChecks.JSON;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import io.github.redisidem.CaseChecks.CallState;
import io.github.redisidem.CaseChecks.Charge;
import io.github.redisidem.exceptions.IdemException;
import io.github.redisidem.servlet.IdempotencyFilter;
import io.github.redisidem.transport.Transport;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.args.UnblockType;

/** Runs clients/conformance/cases.json's cases against one server topology through one client library. */
final class CaseRunner {
    enum Client { JEDIS, LETTUCE }

    private static final AtomicLong CASES = new AtomicLong();
    private final Servers.Server server;
    private final Client client;
    private final Transport transport;
    private HttpHarness http;
    private volatile Run currentRun;
    private final Map<String, Future<HttpHarness.Result>> httpCalls = new ConcurrentHashMap<>();
    private final ExecutorService background = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "case-call");
        t.setDaemon(true);
        return t;
    });

    CaseRunner(Servers.Server server, Client client) {
        this.server = server;
        this.client = client;
        this.transport = Clients.transport(server, client, server.topology == Servers.Topology.SENTINEL ? 0 : server.port());
    }

    static boolean applies(JsonNode c, Edition edition, Servers.Topology topology) {
        boolean editionOk = false;
        for (JsonNode e : c.get("editions")) editionOk |= e.asText().equals(edition == Edition.MODULE ? "module" : "functions");
        return editionOk && Servers.Topology.of(c.get("topology").asText()) == topology;
    }

    /** A case's state: its instance, the tokens kept, the gates, the calls started. */
    private final class Run {
        final String prefix = "t" + CASES.incrementAndGet() + ":";
        final Idem idem;
        final Map<String, String> tokens = new HashMap<>();
        final Map<String, CountDownLatch> gates = new ConcurrentHashMap<>();
        final Map<String, CallState> states = new HashMap<>();
        final Map<String, Future<Outcome<?>>> calls = new HashMap<>();
        long waitings; // the waiting steps so far
        final Map<String, AtomicInteger> hooksCalled = new ConcurrentHashMap<>();
        final Map<String, Long> baseline;
        final List<IdempotencyFilter> filters = new ArrayList<>();
        final Proxy proxy;
        final Transport own;

        Run(JsonNode c) throws Exception {
            boolean proxied = has(c.get("needs"), "proxy");
            proxy = proxied ? new Proxy(server.port()) : null;
            own = proxied ? Clients.transport(server, client, proxy.port()) : null;
            idem = new Idem(proxied ? own : transport, options(c.get("options")));
            baseline = commandStats();
        }

        void called(String hook) {
            hooksCalled.computeIfAbsent(hook, h -> new AtomicInteger()).incrementAndGet();
        }

        IdemOptions options(JsonNode o) {
            IdemOptions.Builder b = IdemOptions.builder().prefix(prefix).batch(true);
            if (o.has("lease_ms")) b.lease(Duration.ofMillis(o.get("lease_ms").asLong()));
            if (o.has("wait_ms")) b.waitFor(Duration.ofMillis(o.get("wait_ms").asLong()));
            if (o.has("heartbeat_ms")) b.heartbeat(Duration.ofMillis(o.get("heartbeat_ms").asLong()));
            if (o.has("max_tries")) b.maxTries(o.get("max_tries").asInt());
            if (o.has("oversize")) b.oversize(Oversize.valueOf(o.get("oversize").asText().toUpperCase()));
            if (o.has("owner")) b.owner(o.get("owner").asText());
            if (o.has("durable")) {
                JsonNode d = o.get("durable");
                b.durable(Durable.replicas(d.get("replicas").asInt()).timeout(Duration.ofMillis(d.path("timeout_ms").asLong(1000)))
                        .fsync(d.path("fsync").asBoolean(false)));
            }
            JsonNode hooks = o.path("hooks");
            boolean runRaises = hooks.has("on_run");
            boolean doneRaises = hooks.has("on_done");
            return b.hooks(new Hooks() {
                @Override
                public void onRun(Job job) {
                    called("on_run");
                    if (runRaises) throw new IllegalStateException("hook failed");
                }

                @Override
                public void onReplay(String key, long attempt) {
                    called("on_replay");
                }

                @Override
                public void onBusy(String key, Duration leaseLeft) {
                    called("on_busy");
                }

                @Override
                public void onDone(Job job, boolean resultStored) {
                    called("on_done");
                    if (doneRaises) throw new IllegalStateException("hook failed");
                }

                @Override
                public void onRelease(Job job, Throwable error) {
                    called("on_release");
                }

                @Override
                public void onLeaseLost(Job job) {
                    called("on_lease_lost");
                }

                @Override
                public void onResultDropped(Job job, String reason) {
                    called("on_result_dropped");
                }
            }).build();
        }

        CountDownLatch gate(String name) {
            return gates.computeIfAbsent(name, n -> new CountDownLatch(1));
        }

        Work<Object> work(JsonNode w, CallState st) {
            return job -> {
                st.runs.incrementAndGet();
                st.attempt = job.attempt();
                st.jobKey = job.key();
                st.started.countDown();
                if (w.has("gate")) {
                    assertTrue(gate(w.get("gate").asText()).await(30, TimeUnit.SECONDS), "gate opened");
                    st.lostSeen = job.lost();
                }
                if (w.has("sleep_ms")) Thread.sleep(w.get("sleep_ms").asLong());
                if (w.has("raise")) throw new CaseChecks.WorkFailure(w.get("raise").asText());
                if (w.has("return_unserializable")) return new Object();
                if (w.has("return_bytes")) return "x".repeat(w.get("return_bytes").asInt());
                if (st.typed) return JSON.convertValue(w.get("return"), Charge.class);
                return JSON.convertValue(w.get("return"), Object.class);
            };
        }

        /** process, or its typed form: a Charge both times. */
        Outcome<?> call(JsonNode step, CallState st) throws Exception {
            st.typed = step.path("typed").asBoolean(false);
            String key = step.get("key").asText();
            byte[] payload = bytes(step.get("payload"));
            Work<Object> work = work(step.get("work"), st);
            if (st.typed) return idem.process(key, payload, Charge.class, job -> (Charge) work.run(job));
            return idem.process(key, payload, work);
        }
    }

    private static boolean has(JsonNode list, String name) {
        for (JsonNode n : list) if (n.asText().equals(name)) return true;
        return false;
    }

    void run(JsonNode c) throws Exception {
        if (server.topology == Servers.Topology.SENTINEL) Topologies.ready(server);
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
            CaseChecks.checkStats(run.idem.stats(), c.get("stats"));
            CaseChecks.checkHooks(run.hooksCalled, c.get("hooks_called"));
        } finally {
            run.gates.values().forEach(CountDownLatch::countDown);
            for (Future<?> f : run.calls.values()) f.cancel(true);
            run.idem.close();
            run.filters.forEach(IdempotencyFilter::destroy);
            if (run.own != null) run.own.close();
            if (run.proxy != null) run.proxy.close();
            if (server.topology == Servers.Topology.REPLICATED && Topologies.detached(server)) Topologies.attach(server);
        }
    }

    private static byte[] bytes(JsonNode text) {
        return text == null || text.isNull() ? null : text.asText().getBytes(StandardCharsets.UTF_8);
    }

    private Jedis admin() {
        return new Jedis("127.0.0.1", server.port());
    }

    private void step(Run run, JsonNode step) throws Exception {
        String op = step.get("op").asText();
        JsonNode expect = step.get("expect");
        Idem idem = run.idem;
        IdemCommands cmd = idem.commands();
        switch (op) {
            case "process" -> {
                CallState st = new CallState();
                Outcome<?> out = null;
                Throwable err = null;
                try {
                    out = run.call(step, st);
                } catch (Exception e) {
                    err = e;
                }
                CaseChecks.checkCall(expect, st, out, err);
            }
            case "start" -> {
                CallState st = new CallState();
                String id = step.get("id").asText();
                run.states.put(id, st);
                run.calls.put(id, background.submit(() -> run.call(step, st)));
            }
            case "running" -> assertTrue(run.states.get(step.get("id").asText()).started.await(10, TimeUnit.SECONDS), "the work started");
            case "waiting" -> {
                if (server.edition == Edition.FUNCTIONS) {
                    // No blocked client to see: a call counts its wait at its first BUSY answer.
                    long waitings = ++run.waitings;
                    waitUntil(() -> run.idem.stats().waits() >= waitings, "a call that counted a wait");
                } else {
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
                Outcome<?> out = null;
                Throwable err = null;
                try {
                    out = run.calls.get(id).get(60, TimeUnit.SECONDS);
                } catch (ExecutionException e) {
                    err = e.getCause();
                }
                CaseChecks.checkCall(expect, run.states.get(id), out, err);
            }
            case "open" -> run.gate(step.get("gate").asText()).countDown();
            case "sleep" -> Thread.sleep(step.get("ms").asLong());
            case "set" -> Clients.onKey(server, run.prefix + step.get("key").asText(), j -> j.set(run.prefix + step.get("key").asText(), step.get("value").asText()));
            case "del" -> Clients.onKey(server, run.prefix + step.get("key").asText(), j -> j.del(run.prefix + step.get("key").asText()));
            case "claim" -> {
                Claim claim = null;
                Throwable err = null;
                try {
                    ClaimOptions options = step.has("owner") ? ClaimOptions.none().owner(step.get("owner").asText()) : ClaimOptions.none();
                    claim = cmd.claim(step.get("key").asText(), Duration.ofMillis(step.get("lease_ms").asLong()), options);
                    if (step.has("as") && claim.token() != null) run.tokens.put(step.get("as").asText(), claim.token());
                } catch (IdemException e) {
                    err = e;
                }
                if (expect != null) CaseChecks.checkClaim(expect, claim, err);
            }
            case "done" -> {
                Done done = null;
                Throwable err = null;
                try {
                    done = cmd.done(step.get("key").asText(), run.tokens.get(step.get("token").asText()), bytes(step.get("result")), null);
                } catch (IdemException e) {
                    err = e;
                }
                if (expect != null) CaseChecks.checkDone(expect, done, err);
            }
            case "release" -> {
                boolean released = cmd.release(step.get("key").asText(), run.tokens.get(step.get("token").asText()));
                if (expect != null) assertEquals(expect.get("released").asBoolean(), released, "released");
            }
            case "get" -> get(run, step, expect);
            case "claim_many" -> {
                List<String> keys = strings(step.get("keys"));
                List<Reply<Claim>> replies = idem.claimMany(keys, Duration.ofMillis(step.get("lease_ms").asLong()));
                assertEquals(keys.size(), replies.size());
                for (int i = 0; i < keys.size(); i++) {
                    JsonNode as = step.path("as").path(i);
                    if (as.isTextual() && replies.get(i).ok()) run.tokens.put(as.asText(), replies.get(i).value().token());
                    if (expect != null) CaseChecks.checkClaim(expect.get(i), replies.get(i).value(), replies.get(i).error());
                }
            }
            case "done_many", "release_many" -> {
                List<DoneItem> items = new ArrayList<>();
                for (JsonNode item : step.get("items")) {
                    items.add(new DoneItem(item.get(0).asText(), run.tokens.get(item.get(1).asText()), bytes(item.get(2))));
                }
                if (op.equals("done_many")) {
                    List<Reply<Done>> replies = idem.doneMany(items);
                    for (int i = 0; i < items.size(); i++) if (expect != null) CaseChecks.checkDone(expect.get(i), replies.get(i).value(), replies.get(i).error());
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
                for (int i = 0; i < keys.size(); i++) CaseChecks.checkItem(expect.get(i), items.get(i));
            }
            case "cut_reply", "cut_request" -> {
                JsonNode times = step.path("times");
                run.proxy.arm(step.get("command").asText(), op.equals("cut_reply"), times.isTextual() ? -1 : times.asInt(1));
            }
            case "command_calls" -> {
                String name = step.get("command").asText();
                long calls = commandStats().getOrDefault(name, 0L) - run.baseline.getOrDefault(name, 0L);
                if (step.has("expect")) assertEquals(expect.asLong(), calls, "calls of " + name);
                if (step.has("expect_max")) assertTrue(calls <= step.get("expect_max").asLong(), "calls of " + name + ": " + calls);
            }
            case "replica" -> {
                if (step.get("action").asText().equals("detach")) Topologies.detach(server);
                else Topologies.attach(server);
            }
            case "failover" -> Topologies.failover(server);
            case "fingerprint" -> assertEquals(expect.asText(), IdempotencyFilter.fingerprint(step.get("method").asText(),
                    step.get("target").asText(), step.get("body").asText().getBytes(StandardCharsets.UTF_8)));
            case "http", "http_start", "http_finish", "handler_finished" -> http(run, op, step, expect);
            default -> fail("unknown op " + op);
        }
    }

    private void get(Run run, JsonNode step, JsonNode expect) throws Exception {
        String key = step.get("key").asText();
        Record r;
        if (step.path("on").asText("").equals("replica")) {
            try (Transport t = Clients.transport(server, Client.JEDIS, server.replicaPort());
                 Idem replica = new Idem(t, IdemOptions.builder().prefix(run.prefix).edition(server.edition).build())) {
                r = replica.commands().get(key);
            }
        } else {
            r = run.idem.commands().get(key);
        }
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
        if (expect.has("owner")) {
            JsonNode want = expect.get("owner");
            String owner = want.isNull() ? null : want.asText().equals("$default") ? Clients.defaultOwner() : want.asText();
            assertEquals(owner, r.owner(), "owner");
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

    private IdempotencyFilter filter(Run run, JsonNode step) {
        IdempotencyFilter.Builder b = IdempotencyFilter.builder(run.idem);
        if (step.path("options").has("wait_ms")) b.waitFor(Duration.ofMillis(step.get("options").get("wait_ms").asLong()));
        IdempotencyFilter filter = b.build();
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

    /** INFO commandstats' calls, summed over the primaries. */
    private Map<String, Long> commandStats() {
        Map<String, Long> out = new HashMap<>();
        for (int port : server.primaries()) try (Jedis j = new Jedis("127.0.0.1", port)) {
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
