package io.github.redisidem;

import java.time.Duration;
import java.util.Objects;

/**
 * An {@link Idem}'s settings; what is not set is the contract's default
 * (docs/clients.md, "Defaults"). Immutable: each {@code with...} returns a copy.
 *
 * @param prefix put before every key (one namespace per app or tenant); default ""
 * @param lease how long a claim is held between heartbeats; default 30 s
 * @param waitFor how long a duplicate waits for the copy in flight; default 10 s (zero: do not wait)
 * @param heartbeat time between EXTENDs while the work runs; null: lease / 3; zero: none
 * @param maxTries MAXTRIES (a dead letter after that many tries); null: none
 * @param retain how long a done record is kept; null: the server's idem.retain
 * @param doneRetries DONE sent again after a connection error (50 ms doubling); default 5
 * @param oversize what a result over idem.max-result does; default {@link Oversize#COMPLETE}
 * @param codec how results are stored; default {@link Codec#defaultCodec()}
 * @param hooks the callbacks; default none
 * @param edition the edition to use; null: asked of the server
 * @param bloom a BLOOM filter key for claims and DONEs (module only); null: none
 */
public record IdemOptions(String prefix, Duration lease, Duration waitFor, Duration heartbeat, Integer maxTries,
                          Duration retain, int doneRetries, Oversize oversize, Codec codec, Hooks hooks,
                          Edition edition, String bloom) {
    /** Checks what can be checked before anything is sent. */
    public IdemOptions {
        Objects.requireNonNull(prefix, "prefix");
        Wire.seconds("lease", lease);
        if (retain != null) Wire.seconds("retain", retain);
        if (waitFor == null || waitFor.isNegative()) throw new IllegalArgumentException("wait must be zero or more: " + waitFor);
        if (heartbeat != null && heartbeat.isNegative()) throw new IllegalArgumentException("heartbeat must be zero or more");
        if (maxTries != null && maxTries < 1) throw new IllegalArgumentException("maxTries must be at least 1");
        if (doneRetries < 0) throw new IllegalArgumentException("doneRetries must be zero or more");
        Objects.requireNonNull(oversize, "oversize");
        Objects.requireNonNull(codec, "codec");
        Objects.requireNonNull(hooks, "hooks");
    }

    /** @return the defaults */
    public static IdemOptions defaults() {
        return new IdemOptions("", Duration.ofSeconds(30), Duration.ofSeconds(10), null, null, null, 5,
                Oversize.COMPLETE, Codec.defaultCodec(), new Hooks() {}, null, null);
    }

    /** @return the time between heartbeats (zero: none) */
    public Duration heartbeatInterval() {
        return heartbeat != null ? heartbeat : lease.dividedBy(3);
    }

    /** @param v the prefix @return a copy with it */
    public IdemOptions withPrefix(String v) {
        return new IdemOptions(v, lease, waitFor, heartbeat, maxTries, retain, doneRetries, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the lease @return a copy with it */
    public IdemOptions withLease(Duration v) {
        return new IdemOptions(prefix, v, waitFor, heartbeat, maxTries, retain, doneRetries, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the wait @return a copy with it */
    public IdemOptions withWait(Duration v) {
        return new IdemOptions(prefix, lease, v, heartbeat, maxTries, retain, doneRetries, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the heartbeat interval (zero: none) @return a copy with it */
    public IdemOptions withHeartbeat(Duration v) {
        return new IdemOptions(prefix, lease, waitFor, v, maxTries, retain, doneRetries, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the tries before EXHAUSTED (null: none) @return a copy with it */
    public IdemOptions withMaxTries(Integer v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, v, retain, doneRetries, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the retention (null: the server's) @return a copy with it */
    public IdemOptions withRetain(Duration v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, v, doneRetries, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the DONE retries @return a copy with it */
    public IdemOptions withDoneRetries(int v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, retain, v, oversize, codec, hooks, edition, bloom);
    }

    /** @param v the oversize policy @return a copy with it */
    public IdemOptions withOversize(Oversize v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, retain, doneRetries, v, codec, hooks, edition, bloom);
    }

    /** @param v the codec @return a copy with it */
    public IdemOptions withCodec(Codec v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, retain, doneRetries, oversize, v, hooks, edition, bloom);
    }

    /** @param v the hooks @return a copy with them */
    public IdemOptions withHooks(Hooks v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, retain, doneRetries, oversize, codec, v, edition, bloom);
    }

    /** @param v the edition (null: ask the server) @return a copy with it */
    public IdemOptions withEdition(Edition v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, retain, doneRetries, oversize, codec, hooks, v, bloom);
    }

    /** @param v the BLOOM filter key (null: none) @return a copy with it */
    public IdemOptions withBloom(String v) {
        return new IdemOptions(prefix, lease, waitFor, heartbeat, maxTries, retain, doneRetries, oversize, codec, hooks, edition, v);
    }
}
