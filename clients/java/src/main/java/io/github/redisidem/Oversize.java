package io.github.redisidem;

/** What process does with a result over idem.max-result (the record is completed either way). */
public enum Oversize {
    /** Complete without the result and return it ({@code resultStored} false). */
    COMPLETE,
    /** Complete without the result, then raise {@link ResultNotStoredException}. */
    ERROR
}
