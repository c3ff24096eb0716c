package io.github.redisidem.kafka;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.HookException;
import io.github.redisidem.exceptions.LeaseLostException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import io.github.redisidem.kafka.Decision.Verdict;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** Each outcome of Idem.process to what the consumer does with the record (docs/clients.md). */
class DecisionTest {
    private static final Duration FAIL = Duration.ofSeconds(2);
    private static final Duration RETRY = Duration.ofMillis(300);

    private static void check(Throwable e, boolean returned, Verdict verdict, Duration delay) {
        Decision d = Decision.of(e, returned, FAIL, RETRY);
        assertEquals(verdict, d.verdict(), String.valueOf(e));
        assertEquals(delay, d.delay(), String.valueOf(e));
        assertEquals(e, d.error());
    }

    @Test
    void outcomes() {
        check(new ResultNotStoredException("r", new RuntimeException("codec")), true, Verdict.ACK, Duration.ZERO);
        check(new HookException(new RuntimeException("onDone"), "r"), true, Verdict.ACK, Duration.ZERO);
        check(new HookException(new RuntimeException("onRun"), null), false, Verdict.HOLD, FAIL);
        check(new ExhaustedException("k"), false, Verdict.DEAD, Duration.ZERO);
        check(new MismatchException("k"), false, Verdict.DEAD, Duration.ZERO);
        check(new MissingKeyException("no key", null), false, Verdict.DEAD, Duration.ZERO);
        check(new BusyException("k", Duration.ofMillis(1500), "w"), false, Verdict.HOLD, Duration.ofMillis(1500));
        check(new BusyException("k", Duration.ofMillis(3), null), false, Verdict.HOLD, Decision.MIN_DELAY);
        check(new IllegalStateException("boom"), false, Verdict.HOLD, FAIL);
        check(new LeaseLostException("k"), true, Verdict.HOLD, RETRY);
        check(new DoneUnconfirmedException("r", new RuntimeException("lost")), true, Verdict.HOLD, RETRY);
        check(new NotDurableException(NotDurableException.Stage.DONE, 0, "r"), true, Verdict.HOLD, RETRY);
    }

    @Test
    void backoff() {
        Duration base = Duration.ofMillis(100);
        Duration max = Duration.ofSeconds(30);
        assertEquals(base, Decision.backoff(base, max, 0));
        assertEquals(base, Decision.backoff(base, max, 1));
        assertEquals(Duration.ofMillis(200), Decision.backoff(base, max, 2));
        assertEquals(Duration.ofMillis(1600), Decision.backoff(base, max, 5));
        assertEquals(max, Decision.backoff(base, max, 40));
    }
}
