package io.github.redisidem;

import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * The one thing the library needs of a Redis client: send a command, or many
 * pipelined. A reply is {@code null}, a {@code Long}, a {@code byte[]}, a
 * {@code List<Object>} of replies (a RESP3 map as its flat key-value list),
 * or, inside an array, a {@link ServerException} for an error element. A
 * top-level error reply completes the future with a {@link ServerException};
 * anything else it completes with is taken for a connection failure.
 * {@link JedisTransport} and {@link LettuceTransport} are the two shipped.
 */
public interface Transport extends AutoCloseable {
    /**
     * @param command the command
     * @return its reply
     */
    CompletableFuture<Object> send(RedisCommand command);

    /**
     * @param commands commands to pipeline (each routed by its own key)
     * @return one reply per command, in order; an error reply is its ServerException
     */
    CompletableFuture<List<Object>> sendAll(List<RedisCommand> commands);

    /**
     * A transport per primary, for a command that reads one node's keys
     * (IDEM.SCAN): a cluster's primaries as the client knows them now. A
     * transport that wraps another must pass this on, or a scan reads one node.
     *
     * @return the primaries' transports (closing them closes nothing); this one when not a cluster
     */
    default List<Transport> primaries() {
        return List.of(this);
    }

    /** @return whether the client is a cluster client (batches are then split by slot) */
    boolean cluster();

    /** Closes what the transport opened itself (not the client it was given). */
    @Override
    void close();
}
