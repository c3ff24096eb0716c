package io.github.redisidem;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.function.Supplier;
import redis.clients.jedis.AbstractPipeline;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.ConnectionPool;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.RedisClusterClient;
import redis.clients.jedis.Response;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.KeyValue;

/**
 * A {@link Transport} over Jedis's {@code UnifiedJedis}: {@code RedisClient}
 * for a server, {@code RedisClusterClient} (or {@code JedisCluster}) for a cluster. Each call takes a
 * connection of Jedis's pool; a blocking claim (WAIT) is sent as Jedis's
 * blocking command, with no socket timeout while it waits.
 */
public final class JedisTransport implements Transport {
    private final UnifiedJedis jedis;
    private final boolean cluster;

    private JedisTransport(UnifiedJedis jedis, boolean cluster) {
        this.jedis = jedis;
        this.cluster = cluster;
    }

    /**
     * @param jedis a {@code RedisClient}, a {@code RedisClusterClient} or a {@code JedisCluster}
     * @return its transport
     */
    @SuppressWarnings("deprecation") // JedisCluster: deprecated in Jedis 8, still what many applications hold
    public static JedisTransport of(UnifiedJedis jedis) {
        return new JedisTransport(jedis, jedis instanceof JedisCluster || jedis instanceof RedisClusterClient);
    }

    private static CommandArguments arguments(RedisCommand command) {
        ProtocolCommand name = () -> command.name().getBytes(StandardCharsets.UTF_8);
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
        return reply(() -> jedis.executeCommand(arguments(command)));
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

    @Override
    public CompletableFuture<List<Object>> sendAll(List<RedisCommand> commands) {
        try (AbstractPipeline pipeline = jedis.pipelined()) {
            List<Response<Object>> responses = new ArrayList<>();
            for (RedisCommand command : commands) responses.add(pipeline.sendCommand(arguments(command)));
            pipeline.sync();
            List<Object> out = new ArrayList<>();
            for (Response<Object> response : responses) {
                try {
                    out.add(normalise(response.get()));
                } catch (JedisDataException e) {
                    out.add(ServerException.of(e.getMessage()));
                }
            }
            return CompletableFuture.completedFuture(out);
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
        if (!cluster) return List.of(this);
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

    /** One node of a cluster: a command sent on a connection of its pool. */
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
        public CompletableFuture<List<Object>> sendAll(List<RedisCommand> commands) {
            List<Object> out = new ArrayList<>();
            for (RedisCommand command : commands) {
                try {
                    out.add(Core.join(send(command)));
                } catch (ServerException e) {
                    out.add(e);
                }
            }
            return CompletableFuture.completedFuture(out);
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
        return cluster;
    }

    /** Nothing to close: the UnifiedJedis is the caller's. */
    @Override
    public void close() {}
}
