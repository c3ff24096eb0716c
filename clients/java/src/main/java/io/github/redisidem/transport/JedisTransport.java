package io.github.redisidem.transport;

import io.github.redisidem.exceptions.ServerException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.function.Function;
import java.util.function.Supplier;
import redis.clients.jedis.AbstractPipeline;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.ConnectionPool;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.RedisClusterClient;
import redis.clients.jedis.RedisSentinelClient;
import redis.clients.jedis.Response;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.JedisClusterCRC16;
import redis.clients.jedis.util.KeyValue;
import redis.clients.jedis.util.Pool;

/**
 * A {@link Transport} over Jedis 8: {@code RedisClient} for a server,
 * {@code RedisSentinelClient} for a primary found by Sentinel,
 * {@code RedisClusterClient} (or {@code JedisCluster}) for a cluster. A
 * command takes a connection of Jedis's pool; a blocking claim (WAIT) is
 * sent as Jedis's blocking command, with no socket timeout while it waits.
 * A command with a deadline, and commands sent together (a write and its
 * {@code WAIT}), go on one connection taken from the pool of the key's node
 * with the socket timeout set for them: never through the cluster
 * executor, which retries a command whose connection failed.
 */
public final class JedisTransport implements Transport {
    private enum Kind { SERVER, SENTINEL, CLUSTER, OTHER }

    private static final Duration BLOCK_MARGIN = Duration.ofSeconds(2);
    private final UnifiedJedis jedis;
    private final Kind kind;

    private JedisTransport(UnifiedJedis jedis, Kind kind) {
        this.jedis = jedis;
        this.kind = kind;
    }

    /**
     * @param jedis a {@code RedisClient}, a {@code RedisSentinelClient}, a {@code RedisClusterClient} or a
     *     {@code JedisCluster} (another {@code UnifiedJedis} works, with the client's own timeouts for DONE)
     * @return its transport
     */
    @SuppressWarnings("deprecation") // JedisCluster: deprecated in Jedis 8, still what many applications hold
    public static JedisTransport of(UnifiedJedis jedis) {
        Kind kind = jedis instanceof RedisClient ? Kind.SERVER
                : jedis instanceof RedisSentinelClient ? Kind.SENTINEL
                : jedis instanceof JedisCluster || jedis instanceof RedisClusterClient ? Kind.CLUSTER
                : Kind.OTHER;
        return new JedisTransport(jedis, kind);
    }

    static CommandArguments arguments(RedisCommand command) {
        byte[] nameBytes = command.name().getBytes(StandardCharsets.UTF_8);
        ProtocolCommand name = () -> nameBytes;
        CommandArguments args = new CommandArguments(name);
        for (byte[] arg : command.args()) {
            // The routing key is the very array among the arguments (identity, not equality).
            if (command.key() != null && arg == command.key()) args.key(arg);
            else args.add(arg);
        }
        if (command.block() != null) args.blocking();
        return args;
    }

    @Override
    public CompletableFuture<Object> send(RedisCommand command) {
        if (command.deadline() == null || kind == Kind.OTHER || command.key() == null) {
            return reply(() -> jedis.executeCommand(arguments(command)));
        }
        return reply(() -> onConnection(command.key(), c -> timed(c, Timeout.of(List.of(command)), () -> c.executeCommand(arguments(command)))));
    }

    @Override
    public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
        try {
            if (kind == Kind.OTHER) {
                try (AbstractPipeline pipeline = jedis.pipelined()) {
                    List<Response<Object>> responses = new ArrayList<>();
                    for (RedisCommand command : commands) responses.add(pipeline.sendCommand(arguments(command)));
                    pipeline.sync();
                    return CompletableFuture.completedFuture(replies(responses));
                }
            }
            List<Object> out = onConnection(commands.get(0).key(), c -> timed(c, Timeout.of(commands), () -> pipelined(c, commands)));
            return CompletableFuture.completedFuture(out);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /** Commands pipelined on one connection; an error reply is its element. */
    static List<Object> pipelined(Connection c, List<RedisCommand> commands) {
        Pipeline pipeline = new Pipeline(c, false);
        List<Response<Object>> responses = new ArrayList<>();
        for (RedisCommand command : commands) responses.add(pipeline.sendCommand(arguments(command)));
        pipeline.sync();
        return replies(responses);
    }

    private static List<Object> replies(List<Response<Object>> responses) {
        List<Object> out = new ArrayList<>(responses.size());
        for (Response<Object> response : responses) {
            try {
                out.add(normalise(response.get()));
            } catch (JedisDataException e) {
                out.add(ServerException.of(e.getMessage()));
            }
        }
        return out;
    }

    /**
     * The socket timeout commands on one connection need: at least their
     * block and a margin when one blocks (a WAIT), else at most their
     * deadline; 0 when neither (the client's own).
     */
    private record Timeout(int ms, boolean atLeast) {
        static Timeout of(List<RedisCommand> commands) {
            long block = 0;
            long deadline = 0;
            for (RedisCommand command : commands) {
                if (command.deadline() != null) deadline = Math.max(deadline, command.deadline().toMillis());
                if (command.block() != null) block = Math.max(block, command.block().plus(BLOCK_MARGIN).toMillis());
            }
            long ms = Math.max(block, deadline);
            return new Timeout((int) Math.min(Integer.MAX_VALUE, ms), block > 0);
        }

        /** Whether the connection's timeout {@code current} (0: none) must change. */
        boolean changes(int current) {
            if (ms == 0 || current == ms) return false;
            if (atLeast) return current != 0 && current < ms;
            // A shorter client timeout is kept: the command counts as lost sooner, and two syscalls are spared.
            return current == 0 || current > ms;
        }
    }

    /** Runs with the connection's socket timeout as {@code t} needs, then puts it back. */
    private static <T> T timed(Connection c, Timeout t, Supplier<T> call) {
        int before = c.getSoTimeout();
        if (!t.changes(before)) return call.get();
        c.setSoTimeout(t.ms());
        try {
            return call.get();
        } finally {
            if (!c.isBroken()) c.setSoTimeout(before);
        }
    }

    /** A connection of the pool of the node that holds {@code key} (the primary), returned to its pool after. */
    @SuppressWarnings("deprecation")
    private <T> T onConnection(byte[] key, Function<Connection, T> call) {
        Connection c = switch (kind) {
            case SERVER -> ((RedisClient) jedis).getPool().getResource();
            case SENTINEL -> {
                Map<?, Pool<Connection>> primary = ((RedisSentinelClient) jedis).getPrimaryNodesConnectionMap();
                if (primary.isEmpty()) throw new JedisConnectionException("Sentinel names no primary yet");
                yield primary.values().iterator().next().getResource();
            }
            default -> {
                int slot = JedisClusterCRC16.getSlot(key);
                yield jedis instanceof JedisCluster jc ? jc.getConnectionFromSlot(slot) : ((RedisClusterClient) jedis).getConnectionFromSlot(slot);
            }
        };
        try (c) {
            T out = call.apply(c);
            if (kind == Kind.CLUSTER && redirected(out)) renewSlots(key);
            return out;
        } catch (JedisDataException e) {
            if (kind == Kind.CLUSTER && redirects(e.getMessage())) renewSlots(key);
            throw e;
        }
    }

    private static boolean redirects(String message) {
        return message != null && (message.startsWith("MOVED") || message.startsWith("ASK"));
    }

    private static boolean redirected(Object reply) {
        if (!(reply instanceof List<?> list)) return false;
        for (Object o : list) if (o instanceof ServerException e && redirects(e.getMessage())) return true;
        return false;
    }

    /**
     * The slot moved (a resharding): a read of the key through Jedis's own
     * executor, which follows the redirect and renews its slot cache, so
     * that the loop's next try reaches the new node.
     */
    private void renewSlots(byte[] key) {
        try {
            jedis.executeCommand(new CommandArguments(() -> "TYPE".getBytes(StandardCharsets.UTF_8)).key(key));
        } catch (RuntimeException ignored) {
            // The loop's next try meets the redirect again, or the new node.
        }
    }

    /** A call's reply as the Transport's types, an error reply as a ServerException. */
    private static CompletableFuture<Object> reply(Supplier<Object> call) {
        try {
            return CompletableFuture.completedFuture(normalise(call.get()));
        } catch (JedisDataException e) {
            return CompletableFuture.failedFuture(ServerException.of(e.getMessage()));
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /** Jedis's raw reply as the Transport's types: error elements and RESP3 maps. */
    static Object normalise(Object reply) {
        if (reply instanceof JedisDataException e) return ServerException.of(e.getMessage());
        if (reply instanceof List<?> list) {
            List<Object> out = new ArrayList<>(list.size());
            for (Object o : list) {
                if (o instanceof KeyValue<?, ?> kv) {
                    out.add(normalise(kv.getKey()));
                    out.add(normalise(kv.getValue()));
                } else {
                    out.add(normalise(o));
                }
            }
            return out;
        }
        return reply;
    }

    /** A cluster's nodes that answer ROLE as a primary, each reached through its own pool. */
    @Override
    @SuppressWarnings("deprecation")
    public List<Transport> primaries() {
        if (kind != Kind.CLUSTER) return List.of(this);
        Map<String, ConnectionPool> nodes = jedis instanceof JedisCluster c ? c.getClusterNodes() : ((RedisClusterClient) jedis).getClusterNodes();
        List<Transport> out = new ArrayList<>();
        for (ConnectionPool pool : new TreeMap<>(nodes).values()) {
            try (Connection c = pool.getResource()) {
                List<?> role = (List<?>) c.executeCommand(new CommandArguments(() -> "ROLE".getBytes(StandardCharsets.UTF_8)));
                if (!"master".equals(new String((byte[]) role.get(0), StandardCharsets.UTF_8))) continue;
            }
            out.add(new Node(pool));
        }
        return out;
    }

    /** One node of a cluster: commands on a connection of its pool. */
    private record Node(ConnectionPool pool) implements Transport {
        @Override
        public CompletableFuture<Object> send(RedisCommand command) {
            return reply(() -> {
                try (Connection c = pool.getResource()) {
                    return c.executeCommand(arguments(command));
                }
            });
        }

        @Override
        public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
            try (Connection c = pool.getResource()) {
                return CompletableFuture.completedFuture(pipelined(c, commands));
            } catch (RuntimeException e) {
                return CompletableFuture.failedFuture(e);
            }
        }

        @Override
        public boolean cluster() {
            return false;
        }

        /** Nothing to close: the pool is the cluster client's. */
        @Override
        public void close() {}
    }

    @Override
    public boolean cluster() {
        return kind == Kind.CLUSTER;
    }

    /** Nothing to close: the UnifiedJedis is the caller's. */
    @Override
    public void close() {}
}
