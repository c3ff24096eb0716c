package io.github.redisidem;

/** Which redis-idem a server runs. */
public enum Edition {
    /** The module's IDEM.* commands. */
    MODULE,
    /** functions/idem.lua: FCALL idem_*, no module. */
    FUNCTIONS
}
