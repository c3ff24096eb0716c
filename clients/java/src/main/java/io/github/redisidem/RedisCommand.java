package io.github.redisidem;

import java.time.Duration;
import java.util.List;

/**
 * One command as a {@link Transport} sends it.
 *
 * @param name the command's name ({@code IDEM.CLAIM}, {@code FCALL})
 * @param key the key it is routed by in a cluster, or null for any node
 * @param args every argument after the name, the key included where it goes
 * @param block for a command that may block on the server (CLAIM ... WAIT): how long; else null
 */
public record RedisCommand(String name, byte[] key, List<byte[]> args, Duration block) {}
