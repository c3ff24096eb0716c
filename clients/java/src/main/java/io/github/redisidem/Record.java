package io.github.redisidem;

import java.time.Duration;
import java.util.OptionalLong;

/**
 * IDEM.GET's answer.
 *
 * @param state the state
 * @param attempt the fencing number
 * @param leaseLeft the lease left (zero unless processing)
 * @param pttl the key's PTTL in ms
 * @param claimedAt Unix ms of the latest claim (0: never)
 * @param doneAt Unix ms of the completion (0 unless done)
 * @param result the stored result, or null
 * @param fingerprint the payload's fingerprint (32 hex digits), or null
 * @param tries the claims since the latest requeue (what maxTries counts);
 *     empty from a module older than IDEM.REQUEUE
 * @param owner the latest claim's OWNER (kept while processing, released or expired), or null
 */
public record Record(RecordState state, long attempt, Duration leaseLeft, long pttl, long claimedAt, long doneAt,
                     byte[] result, String fingerprint, OptionalLong tries, String owner) {}
