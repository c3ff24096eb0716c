package io.github.redisidem;

import java.time.Duration;

/**
 * The filters of {@link IdemCommands#scan}: a record is listed when it
 * matches every one given (null: no filter). Start from {@link #all()}:
 * {@code ScanOptions.all().state(RecordState.RELEASED).minTries(3)}.
 *
 * @param state its state now
 * @param minTries its tries (claims since the latest requeue) are at least
 *     this: with RELEASED or EXPIRED, a consumer's dead letters for that maxTries
 * @param idle its latest change (claim, extension, release, completion) is
 *     at least this old: whole seconds, at least 1
 * @param match a SCAN glob on the key, under the instance's prefix
 * @param count SCAN's hint of work per call
 */
public record ScanOptions(RecordState state, Integer minTries, Duration idle, String match, Integer count) {
    /** @return no filter: every record */
    public static ScanOptions all() {
        return new ScanOptions(null, null, null, null, null);
    }

    /**
     * @param state its state now
     * @return these options with that state
     */
    public ScanOptions state(RecordState state) {
        return new ScanOptions(state, minTries, idle, match, count);
    }

    /**
     * @param minTries at least this many tries since the latest requeue
     * @return these options with that filter
     */
    public ScanOptions minTries(int minTries) {
        return new ScanOptions(state, minTries, idle, match, count);
    }

    /**
     * @param idle unchanged at least this long (whole seconds)
     * @return these options with that filter
     */
    public ScanOptions idle(Duration idle) {
        return new ScanOptions(state, minTries, idle, match, count);
    }

    /**
     * @param match a SCAN glob on the key (without the prefix)
     * @return these options with that filter
     */
    public ScanOptions match(String match) {
        return new ScanOptions(state, minTries, idle, match, count);
    }

    /**
     * @param count SCAN's hint of work per call
     * @return these options with that hint
     */
    public ScanOptions count(int count) {
        return new ScanOptions(state, minTries, idle, match, count);
    }
}
