package io.github.redisidem;

import java.util.concurrent.atomic.LongAdder;

/** The live counters behind {@link Stats}. */
final class Counters {
    final LongAdder firstRuns = new LongAdder();
    final LongAdder retries = new LongAdder();
    final LongAdder replays = new LongAdder();
    final LongAdder waits = new LongAdder();
    final LongAdder busy = new LongAdder();
    final LongAdder completed = new LongAdder();
    final LongAdder released = new LongAdder();
    final LongAdder leasesLost = new LongAdder();
    final LongAdder resultsDropped = new LongAdder();
    final LongAdder mismatches = new LongAdder();
    final LongAdder exhausted = new LongAdder();
    final LongAdder extensions = new LongAdder();
    final LongAdder notDurable = new LongAdder();

    Stats snapshot() {
        return new Stats(firstRuns.sum(), retries.sum(), replays.sum(), waits.sum(), busy.sum(), completed.sum(), released.sum(),
                leasesLost.sum(), resultsDropped.sum(), mismatches.sum(), exhausted.sum(), extensions.sum(), notDurable.sum());
    }
}
