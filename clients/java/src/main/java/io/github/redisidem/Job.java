package io.github.redisidem;

import java.util.concurrent.atomic.AtomicBoolean;

/** One claimed key, given to the work. */
public final class Job {
    private final String key;
    private final ClaimStatus status;
    private final long attempt;
    final String recordKey;
    final String token;
    private final AtomicBoolean lost = new AtomicBoolean();
    /** The heartbeat's: when the next EXTEND is due (System.nanoTime), and whether the work still runs (guarded by this). */
    volatile long beatDue;
    boolean beating;

    Job(String key, String recordKey, ClaimStatus status, String token, long attempt) {
        this.key = key;
        this.recordKey = recordKey;
        this.status = status;
        this.token = token;
        this.attempt = attempt;
    }

    /** @return the key as the caller gave it (without the instance's prefix) */
    public String key() {
        return key;
    }

    /** @return how the claim was granted: NEW, SEEN or RETRY */
    public ClaimStatus status() {
        return status;
    }

    /** @return the fencing number: pass it to the systems the work writes to */
    public long attempt() {
        return attempt;
    }

    /** @return whether the heartbeat found the lease lost (another worker may hold the key: stop early) */
    public boolean lost() {
        return lost.get();
    }

    boolean markLost() {
        return lost.compareAndSet(false, true);
    }

    @Override
    public String toString() {
        return "Job[key=" + key + ", status=" + status + ", attempt=" + attempt + (lost() ? ", lost" : "") + "]";
    }
}
