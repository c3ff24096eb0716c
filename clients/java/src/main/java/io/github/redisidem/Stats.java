package io.github.redisidem;

/**
 * The loop's counters (docs/clients.md, "Counters").
 *
 * @param firstRuns claims granted NEW
 * @param retries claims granted RETRY or SEEN
 * @param replays calls answered with a stored completion
 * @param waits calls that met a busy key and waited (once per call)
 * @param busy calls (or batch keys) that ended Busy
 * @param completed this worker's completions recorded by DONE
 * @param released claims given back after a failed work or hook (a RELEASE answered 1)
 * @param leasesLost leases found lost, once per job
 * @param resultsDropped completions recorded without their result
 * @param mismatches Mismatch answers
 * @param exhausted Exhausted answers
 * @param extensions (the contract's {@code extends}, a Java keyword) heartbeat extensions that succeeded
 * @param notDurable calls (or batch keys) that ended NotDurable
 */
public record Stats(long firstRuns, long retries, long replays, long waits, long busy, long completed, long released,
                    long leasesLost, long resultsDropped, long mismatches, long exhausted, long extensions, long notDurable) {}
