package io.github.redisidem;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.HookException;
import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;

/** The conformance table's expectations, checked against what the library returned. */
final class CaseChecks {
    private CaseChecks() {}

    static final ObjectMapper JSON = new ObjectMapper();

    /** The typed step's value: the record every runner declares for it. */
    record Charge(long amount, String currency) {}

    /** The work's own failure in the cases ("Work"). */
    static final class WorkFailure extends Exception {
        private static final long serialVersionUID = 1L;

        WorkFailure(String message) {
            super(message);
        }
    }

    /** One call's traces: how often its work ran, whether it started, what it saw. */
    static final class CallState {
        final AtomicInteger runs = new AtomicInteger();
        final CountDownLatch started = new CountDownLatch(1);
        volatile Boolean lostSeen;
        volatile long attempt;
        volatile String jobKey;
        boolean typed;
    }

    static String errorName(Throwable e) {
        if (e instanceof WorkFailure) return "Work";
        String n = e.getClass().getSimpleName();
        return n.endsWith("Exception") ? n.substring(0, n.length() - "Exception".length()) : n;
    }

    static void sameJson(JsonNode want, Object actual, String what) {
        assertEquals(want, JSON.valueToTree(actual), what);
    }

    private static Object carried(Throwable err) {
        if (err instanceof HookException h) return h.result();
        if (err instanceof ResultNotStoredException r) return r.result();
        if (err instanceof DoneUnconfirmedException d) return d.result();
        if (err instanceof NotDurableException n) return n.result();
        return null;
    }

    static void checkCall(JsonNode expect, CallState st, Outcome<?> out, Throwable err) {
        if (expect.has("ran")) assertEquals(expect.get("ran").asBoolean(), st.runs.get() > 0, "ran (" + (err != null ? err : out) + ")");
        if (expect.has("lost_seen")) assertEquals(expect.get("lost_seen").asBoolean(), st.lostSeen, "lost_seen");
        if (expect.has("job_key")) assertEquals(expect.get("job_key").asText(), st.jobKey, "job_key");
        if (expect.has("error")) {
            assertNotNull(err, "an error " + expect.get("error") + ", got " + out);
            assertEquals(expect.get("error").asText(), errorName(err), "error (" + err + ")");
            if (expect.has("message")) assertEquals(expect.get("message").asText(), err.getMessage());
            if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), st.attempt, "attempt");
            if (expect.has("error_result")) sameJson(expect.get("error_result"), carried(err), "error_result");
            if (expect.has("lease_left_ms_min")) {
                assertTrue(((BusyException) err).leaseLeft().toMillis() >= expect.get("lease_left_ms_min").asLong(), "lease_left");
            }
            if (expect.has("owner")) {
                JsonNode want = expect.get("owner");
                assertEquals(want.isNull() ? null : want.asText(), ((BusyException) err).owner(), "owner");
            }
            if (expect.has("stage")) assertEquals(expect.get("stage").asText(), ((NotDurableException) err).stage().name().toLowerCase(), "stage");
            return;
        }
        if (err != null) throw new AssertionError("unexpected error " + err, err);
        if (expect.has("value")) {
            if (st.typed) {
                assertInstanceOf(Charge.class, out.value(), "a typed replay is the caller's type");
                assertEquals(JSON.convertValue(expect.get("value"), Charge.class), out.value(), "value");
            } else {
                sameJson(expect.get("value"), out.value(), "value");
            }
        }
        if (expect.has("replayed")) assertEquals(expect.get("replayed").asBoolean(), out.replayed(), "replayed");
        if (expect.has("status")) assertEquals(expect.get("status").asText(), out.status().name(), "status");
        if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), out.attempt(), "attempt");
        if (expect.has("result_stored")) assertEquals(expect.get("result_stored").asBoolean(), out.resultStored(), "result_stored");
    }

    /** A command step's error: true when the step expected one (and it matched). */
    static boolean expectedError(JsonNode expect, Throwable err) {
        if (expect.has("error")) {
            assertNotNull(err, "an error");
            assertEquals(expect.get("error").asText(), errorName(err));
            return true;
        }
        if (err != null) throw new AssertionError("unexpected error " + err, err);
        return false;
    }

    static void checkClaim(JsonNode expect, Claim claim, Throwable err) {
        if (expectedError(expect, err)) return;
        if (expect.has("status")) assertEquals(expect.get("status").asText(), claim.status().name(), "status");
        if (expect.has("attempt")) assertEquals(expect.get("attempt").asLong(), claim.attempt(), "attempt");
    }

    static void checkDone(JsonNode expect, Done done, Throwable err) {
        if (expectedError(expect, err)) return;
        assertEquals(expect.get("completed").asBoolean(), done.completed(), "completed");
    }

    static void checkItem(JsonNode expect, BatchItem<Object> item) {
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

    private static final String[] COUNTERS = {"first_runs", "retries", "replays", "waits", "busy", "completed", "released", "leases_lost",
        "results_dropped", "mismatches", "exhausted", "not_durable"};

    static void checkStats(Stats s, JsonNode want) {
        long[] got = {s.firstRuns(), s.retries(), s.replays(), s.waits(), s.busy(), s.completed(), s.released(), s.leasesLost(),
            s.resultsDropped(), s.mismatches(), s.exhausted(), s.notDurable()};
        for (int i = 0; i < COUNTERS.length; i++) assertEquals(want.path(COUNTERS[i]).asLong(0), got[i], "stats." + COUNTERS[i] + " in " + s);
        if (want.has("extends_min")) assertTrue(s.extensions() >= want.get("extends_min").asLong(), "extends " + s.extensions());
    }

    static void checkHooks(Map<String, AtomicInteger> called, JsonNode want) {
        if (want == null) return;
        want.fields().forEachRemaining(e -> assertEquals(e.getValue().asInt(), called.getOrDefault(e.getKey(), new AtomicInteger()).get(),
                "hook " + e.getKey() + " called"));
    }
}
