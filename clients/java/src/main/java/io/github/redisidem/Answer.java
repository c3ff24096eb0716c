package io.github.redisidem;

/**
 * A command's answer to a flow: its reply, or its failure (an error reply
 * as its ServerException, else a connection failure); with {@code durable},
 * whether the WAIT after it was met and how many replicas acknowledged.
 */
record Answer(Object reply, Throwable error, boolean durableOk, long acknowledged) {
    static Answer of(Object reply) {
        return new Answer(reply, null, true, -1);
    }

    static Answer failed(Throwable error) {
        return new Answer(null, error, true, -1);
    }
}
