package io.github.redisidem;

import java.time.Duration;

/** What the I/O-free {@link ProcessFlow} asks its driver to do next. */
sealed interface Step {
    /** Send this command; hand its reply (or failure) to {@link ProcessFlow#onReply}. */
    record Send(RedisCommand command) implements Step {}

    /** Sleep, then call {@link ProcessFlow#afterSleep}. */
    record Sleep(Duration pause) implements Step {}

    /** Start the heartbeat and run the work with this job; then onWorkReturned or onWorkFailed. */
    record RunWork(Job job) implements Step {}

    /** The call's outcome: a value, or the error to throw. */
    record Finish(Outcome<?> outcome, Throwable error) implements Step {}
}
