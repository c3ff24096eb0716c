package io.github.redisidem.transport;

import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * The one thing the library needs of a Redis client: send a command, or a
 * few on one connection in one round trip. A reply is {@code null}, a
 * {@code Long}, a {@code byte[]}, a {@code List<Object>} of replies (a RESP3
 * map as its flat key-value list), or, inside an array, a
 * {@link io.github.redisidem.exceptions.ServerException} for an error
 * element. A top-level error reply completes the future with
 * {@code ServerException.of(text)}; anything else it completes with is taken
 * for a connection failure (the command may or may not have run).
 * {@link JedisTransport} and {@link LettuceTransport} are the two shipped.
 *
 * <p>A command with a {@link RedisCommand#deadline()} must never be sent
 * twice by the transport or the client below it (no resend after a
 * reconnect, no retry): the loop resends it itself and counts the sends.
 */
public interface Transport extends AutoCloseable {
    /**
     * @param command the command
     * @return its reply
     */
    CompletableFuture<Object> send(RedisCommand command);

    /**
     * Commands on one connection, pipelined in this order (one round trip),
     * routed by the first one's key: a write and the {@code WAIT} that must
     * follow it on its connection, or a batch of single commands of one slot.
     *
     * @param commands the commands (the first has the routing key)
     * @return one reply per command, in order; an error reply is its ServerException
     */
    CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands);

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
