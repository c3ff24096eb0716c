package io.github.redisidem;

import java.time.Duration;

/**
 * IDEM.CLAIM's answer.
 *
 * @param status the status
 * @param token the claim's token (granted statuses), else null
 * @param result the stored result (DONE; null when none), else null
 * @param leaseLeft the holder's lease left (BUSY), else null
 * @param attempt the fencing number
 */
public record Claim(ClaimStatus status, String token, byte[] result, Duration leaseLeft, long attempt) {}
