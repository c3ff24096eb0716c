package io.github.redisidem;

import java.time.Duration;

/**
 * The options of the typed {@link IdemCommands#claim(String, Duration, ClaimOptions)}
 * and {@link IdemCommands#mclaim}: {@code ClaimOptions.none().owner("worker-7").maxTries(3)}.
 *
 * @param payload PAYLOAD (its fingerprint is stored), or null
 * @param maxTries MAXTRIES, or null
 * @param waitFor WAIT (module only, single claims only: blocks up to this long), or null
 * @param owner OWNER (who holds the claim, 1 to 64 bytes), or null: none
 */
public record ClaimOptions(byte[] payload, Integer maxTries, Duration waitFor, String owner) {
    /** @return no option: the bare command */
    public static ClaimOptions none() {
        return new ClaimOptions(null, null, null, null);
    }

    /** @param v PAYLOAD @return a copy with it */
    public ClaimOptions payload(byte[] v) {
        return new ClaimOptions(v, maxTries, waitFor, owner);
    }

    /** @param v MAXTRIES @return a copy with it */
    public ClaimOptions maxTries(Integer v) {
        return new ClaimOptions(payload, v, waitFor, owner);
    }

    /** @param v WAIT: block up to this long where the answer would be BUSY @return a copy with it */
    public ClaimOptions waitFor(Duration v) {
        return new ClaimOptions(payload, maxTries, v, owner);
    }

    /** @param v OWNER @return a copy with it */
    public ClaimOptions owner(String v) {
        return new ClaimOptions(payload, maxTries, waitFor, v);
    }
}
