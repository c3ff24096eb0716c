package io.github.redisidem;

/**
 * IDEM.DONE's answer: {@code 0} (already done), or 1/3/5/7 decoded.
 *
 * @param code the server's integer reply
 */
public record Done(long code) {
    /** @return whether this call completed the record (an odd reply) */
    public boolean completed() {
        return (code & 1) == 1;
    }

    /** @return whether the RESULT was stored (false for 3 and 7: over maxmemory) */
    public boolean resultStored() {
        return completed() && (code & 2) == 0;
    }

    /** @return whether the BLOOM add was made (false for 5 and 7) */
    public boolean bloomAdded() {
        return completed() && (code & 4) == 0;
    }
}
