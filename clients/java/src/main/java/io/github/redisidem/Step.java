package io.github.redisidem;

import java.time.Duration;

/**
 * What the I/O-free {@link ProcessFlow} asks its driver to do next. The
 * four commands are sent one by one (a call alone), or batched with other
 * flows' ({@code processMany}, and concurrent calls with {@code batch}):
 * their answers are the same either way.
 */
sealed interface Step {
    /** IDEM.CLAIM, with WAIT for {@code waitFor} (module only) when not null; {@code lease} the same in one batch. */
    record Claim(String recordKey, byte[] payload, Duration waitFor, Duration lease) implements Step {}

    /** IDEM.DONE, with RESULT when {@code result} is not null, RETAIN when {@code retain} is (the same in one batch). */
    record Done(String recordKey, String token, byte[] result, Duration retain) implements Step {}

    /** IDEM.RELEASE, sent once. */
    record Release(String recordKey, String token) implements Step {}

    /** IDEM.GET: a resent DONE's confirmation, or a busy holder's owner. */
    record Get(String recordKey) implements Step {}

    /** Sleep, then {@link ProcessFlow#afterSleep}. */
    record Sleep(Duration pause) implements Step {}

    /** Run the work with this job (its heartbeat on); then onWorkReturned or onWorkFailed. */
    record Run(Job job) implements Step {}

    /** The call's end. */
    record Finish(Result result) implements Step {}
}
