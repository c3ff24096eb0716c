package io.github.redisidem;

import java.util.concurrent.atomic.AtomicLong;

/** The live counters behind {@link Stats}. */
final class Counters {
    final AtomicLong firstRuns = new AtomicLong();
    final AtomicLong retries = new AtomicLong();
    final AtomicLong replays = new AtomicLong();
    final AtomicLong waits = new AtomicLong();
    final AtomicLong busy = new AtomicLong();
    final AtomicLong completed = new AtomicLong();
    final AtomicLong released = new AtomicLong();
    final AtomicLong leasesLost = new AtomicLong();
    final AtomicLong resultsDropped = new AtomicLong();
    final AtomicLong mismatches = new AtomicLong();
    final AtomicLong exhausted = new AtomicLong();
    final AtomicLong extendsOk = new AtomicLong();

    Stats snapshot() {
        return new Stats(firstRuns.get(), retries.get(), replays.get(), waits.get(), busy.get(), completed.get(),
                released.get(), leasesLost.get(), resultsDropped.get(), mismatches.get(), exhausted.get(), extendsOk.get());
    }
}
