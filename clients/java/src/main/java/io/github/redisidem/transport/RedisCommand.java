package io.github.redisidem.transport;

import java.time.Duration;
import java.util.List;

/**
 * One command as a {@link Transport} sends it.
 *
 * @param name the command's name ({@code IDEM.CLAIM}, {@code FCALL}, {@code WAIT})
 * @param key the key it is routed by in a cluster, or null for any node
 * @param args every argument after the name, the key included where it goes
 * @param block for a command that may block on the server ({@code IDEM.CLAIM ... WAIT}, {@code WAIT}): how long; else null
 * @param deadline for a write the loop resends itself ({@code IDEM.DONE}, {@code IDEM.RELEASE}): how long its
 *     reply may take; past it, or when its connection drops, the transport fails it (as a connection error) and
 *     never sends it again on its own. Null: the client's own timeouts and resends.
 */
public record RedisCommand(String name, byte[] key, List<byte[]> args, Duration block, Duration deadline) {
    /**
     * A command that neither blocks nor has a deadline.
     *
     * @param name the name
     * @param key the routing key, or null
     * @param args the arguments
     */
    public RedisCommand(String name, byte[] key, List<byte[]> args) {
        this(name, key, args, null, null);
    }
}
