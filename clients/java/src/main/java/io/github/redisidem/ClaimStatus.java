package io.github.redisidem;

/** The first element of IDEM.CLAIM's reply. */
public enum ClaimStatus {
    /** No record: granted, attempt 1. */
    NEW,
    /** No record, but the BLOOM filter may have seen the key: granted. */
    SEEN,
    /** The record holds another payload's fingerprint. */
    MISMATCH,
    /** The record is done: its stored result. */
    DONE,
    /** Another claim's lease is live. */
    BUSY,
    /** MAXTRIES reached. */
    EXHAUSTED,
    /** Released or expired: granted with attempt + 1. */
    RETRY;

    /** @return whether this status grants the claim (NEW, SEEN, RETRY) */
    public boolean granted() {
        return this == NEW || this == SEEN || this == RETRY;
    }
}
