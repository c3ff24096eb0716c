package io.github.redisidem.kafka;

import io.github.redisidem.exceptions.BusyException;
import io.github.redisidem.exceptions.DoneUnconfirmedException;
import io.github.redisidem.exceptions.ExhaustedException;
import io.github.redisidem.exceptions.HookException;
import io.github.redisidem.exceptions.LeaseLostException;
import io.github.redisidem.exceptions.MismatchException;
import io.github.redisidem.exceptions.NotDurableException;
import io.github.redisidem.exceptions.ResultNotStoredException;
import java.time.Duration;

/**
 * What Idem.process's answer means for a record (docs/clients.md,
 * "Consumers of brokers"): acknowledge it, hold it back for a delay, or
 * dead-letter it.
 */
record Decision(Verdict verdict, Duration delay, Throwable error) {
    enum Verdict { ACK, HOLD, DEAD }

    /** The least a record is held back: a holder's lease about to end is not spun on. */
    static final Duration MIN_DELAY = Duration.ofMillis(100);

    static final Decision ACKED = new Decision(Verdict.ACK, Duration.ZERO, null);

    /**
     * @param error what process threw
     * @param workReturned whether the user's work returned (a hook failing after it: the record is done)
     * @param failureDelay the delay of a failed work (the back-off of its attempt)
     * @param retryDelay the delay of an outcome the redelivery settles (DONE unconfirmed, lease lost, not durable)
     */
    static Decision of(Throwable error, boolean workReturned, Duration failureDelay, Duration retryDelay) {
        if (error instanceof ResultNotStoredException || (error instanceof HookException && workReturned)) {
            return new Decision(Verdict.ACK, Duration.ZERO, error); // completed: the work must not run again
        }
        if (error instanceof ExhaustedException || error instanceof MismatchException || error instanceof MissingKeyException) {
            return new Decision(Verdict.DEAD, Duration.ZERO, error); // no redelivery can change it
        }
        if (error instanceof BusyException busy) {
            return new Decision(Verdict.HOLD, atLeastMin(busy.leaseLeft()), error);
        }
        if (error instanceof LeaseLostException || error instanceof DoneUnconfirmedException || error instanceof NotDurableException) {
            return new Decision(Verdict.HOLD, atLeastMin(retryDelay), error); // the redelivery replays, or fences
        }
        return new Decision(Verdict.HOLD, atLeastMin(failureDelay), error);
    }

    /** The back-off of a failed work: base doubling with each try, at most max. */
    static Duration backoff(Duration base, Duration max, long attempt) {
        long tries = Math.max(1, attempt);
        Duration d = base;
        for (long n = 1; n < tries && d.compareTo(max) < 0; n++) {
            d = d.multipliedBy(2);
        }
        return d.compareTo(max) > 0 ? max : d;
    }

    private static Duration atLeastMin(Duration d) {
        return d.compareTo(MIN_DELAY) < 0 ? MIN_DELAY : d;
    }
}
