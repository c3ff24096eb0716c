package io.github.redisidem;

import io.lettuce.core.AbstractRedisClient;
import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulConnection;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;

/**
 * A {@link Transport} over Lettuce, a server ({@code RedisClient}) or a
 * cluster ({@code RedisClusterClient}). Commands share one multiplexed
 * connection; a blocking claim (WAIT) takes a connection of its own (kept
 * for the next one), so that it holds up nothing else.
 */
public final class LettuceTransport implements Transport {
    private final Supplier<StatefulConnection<byte[], byte[]>> connect;
    private final StatefulConnection<byte[], byte[]> shared;
    private final ConcurrentLinkedQueue<StatefulConnection<byte[], byte[]>> blockers = new ConcurrentLinkedQueue<>();
    private final List<StatefulConnection<byte[], byte[]>> opened = new java.util.concurrent.CopyOnWriteArrayList<>();
    private final boolean cluster;
    private final AtomicLong disconnects = new AtomicLong();

    private LettuceTransport(AbstractRedisClient client, Supplier<StatefulConnection<byte[], byte[]>> connect, boolean cluster) {
        this.connect = connect;
        this.cluster = cluster;
        // Lettuce sends a command again after a reconnect when its reply was
        // lost: a resent DONE would answer 0 and look like another worker's
        // completion. A DONE in flight across a disconnect (of any of the
        // client's connections: a cluster's node connections are not ours to
        // see) is failed instead, so that the loop sends it again knowingly
        // and confirms a 0 with IDEM.GET (docs/clients.md, step 5).
        client.addListener(new RedisConnectionStateListener() {
            @Override
            public void onRedisDisconnected(RedisChannelHandler<?, ?> connection) {
                disconnects.incrementAndGet();
            }
        });
        this.shared = open();
    }

    /**
     * @param client the client
     * @param uri the server
     * @return a transport with connections of its own (closed by {@link #close})
     */
    public static LettuceTransport of(RedisClient client, RedisURI uri) {
        return new LettuceTransport(client, () -> client.connect(ByteArrayCodec.INSTANCE, uri), false);
    }

    /**
     * @param client the cluster client
     * @return a transport with connections of its own (closed by {@link #close})
     */
    public static LettuceTransport of(RedisClusterClient client) {
        return new LettuceTransport(client, () -> client.connect(ByteArrayCodec.INSTANCE), true);
    }

    private StatefulConnection<byte[], byte[]> open() {
        StatefulConnection<byte[], byte[]> c = connect.get();
        opened.add(c);
        return c;
    }

    @SuppressWarnings("unchecked")
    private static RedisFuture<Object> dispatch(StatefulConnection<byte[], byte[]> c, RedisCommand command) {
        ProtocolKeyword name = new ProtocolKeyword() {
            private final byte[] bytes = command.name().getBytes(StandardCharsets.UTF_8);

            @Override
            public byte[] getBytes() {
                return bytes;
            }

            @Override
            public String toString() {
                return command.name();
            }
        };
        CommandArgs<byte[], byte[]> args = new CommandArgs<>(ByteArrayCodec.INSTANCE);
        for (byte[] arg : command.args()) {
            if (command.key() != null && arg == command.key()) args.addKey(arg);
            else args.add(arg);
        }
        if (c instanceof StatefulRedisClusterConnection<byte[], byte[]> cc) return cc.async().dispatch(name, new ReplyOutput(), args);
        return ((StatefulRedisConnection<byte[], byte[]>) c).async().dispatch(name, new ReplyOutput(), args);
    }

    /** The single DONE, which the loop confirms itself when it knows it was sent twice. */
    private static boolean resendable(RedisCommand command) {
        return command.name().equals("IDEM.DONE")
                || command.name().equals("FCALL") && new String(command.args().get(0), StandardCharsets.UTF_8).equals("idem_done");
    }

    private CompletableFuture<Object> typed(RedisCommand command, CompletableFuture<Object> future, long before) {
        return future.handle((reply, error) -> {
            if (resendable(command) && disconnects.get() != before && (error == null || !(Core.unwrap(error) instanceof RedisConnectionException))) {
                return CompletableFuture.<Object>failedFuture(new RedisConnectionException(
                        "the connection dropped while the command was in flight: it may have been sent twice"));
            }
            if (error == null) return CompletableFuture.completedFuture(reply);
            Throwable cause = Core.unwrap(error);
            if (cause instanceof io.lettuce.core.RedisCommandExecutionException e) return CompletableFuture.<Object>failedFuture(ServerException.of(e.getMessage()));
            return CompletableFuture.<Object>failedFuture(cause);
        }).thenCompose(f -> f);
    }

    @Override
    public CompletableFuture<Object> send(RedisCommand command) {
        if (command.block() == null) {
            try {
                long before = disconnects.get();
                return typed(command, dispatch(shared, command).toCompletableFuture(), before);
            } catch (RuntimeException e) {
                return CompletableFuture.failedFuture(e);
            }
        }
        StatefulConnection<byte[], byte[]> c = blockers.poll();
        StatefulConnection<byte[], byte[]> own;
        try {
            own = c != null ? c : open();
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        long before = disconnects.get();
        return typed(command, dispatch(own, command).toCompletableFuture(), before).whenComplete((r, e) -> {
            if (e == null || e instanceof ServerException) blockers.add(own);
            else {
                opened.remove(own);
                own.closeAsync();
            }
        });
    }

    @Override
    public CompletableFuture<List<Object>> sendAll(List<RedisCommand> commands) {
        return each(this, commands);
    }

    /** Every command sent at once (Lettuce pipelines them), an error reply as its element. */
    private static CompletableFuture<List<Object>> each(Transport transport, List<RedisCommand> commands) {
        List<CompletableFuture<Object>> futures = new ArrayList<>();
        for (RedisCommand command : commands) {
            futures.add(transport.send(command).handle((r, e) -> Core.unwrap(e) instanceof ServerException s ? s : e != null ? rethrow(e) : r));
        }
        return CompletableFuture.allOf(futures.toArray(new CompletableFuture<?>[0]))
                .thenApply(v -> futures.stream().map(CompletableFuture::join).toList());
    }

    private static Object rethrow(Throwable e) {
        throw Core.rethrow(e);
    }

    /** A cluster's primaries as its connection's partitions have them, each on the node connection Lettuce keeps. */
    @Override
    public List<Transport> primaries() {
        if (!(shared instanceof StatefulRedisClusterConnection<byte[], byte[]> cc)) return List.of(this);
        List<Transport> out = new ArrayList<>();
        List<RedisClusterNode> nodes = new ArrayList<>(cc.getPartitions().getPartitions());
        nodes.sort(java.util.Comparator.comparing(n -> n.getUri().toString()));
        for (RedisClusterNode node : nodes) {
            if (node.is(RedisClusterNode.NodeFlag.UPSTREAM)) out.add(new Node(this, cc.getConnection(node.getNodeId())));
        }
        return out;
    }

    /** One node of a cluster: commands on its connection, errors typed as the cluster's. */
    private record Node(LettuceTransport owner, StatefulRedisConnection<byte[], byte[]> connection) implements Transport {
        @Override
        public CompletableFuture<Object> send(RedisCommand command) {
            try {
                return owner.typed(command, dispatch(connection, command).toCompletableFuture(), owner.disconnects.get());
            } catch (RuntimeException e) {
                return CompletableFuture.failedFuture(e);
            }
        }

        @Override
        public CompletableFuture<List<Object>> sendAll(List<RedisCommand> commands) {
            return each(this, commands);
        }

        @Override
        public boolean cluster() {
            return false;
        }

        /** Nothing to close: the node connection is the cluster connection's. */
        @Override
        public void close() {}
    }

    @Override
    public boolean cluster() {
        return cluster;
    }

    /** Closes the connections this transport opened (not the client). */
    @Override
    public void close() {
        for (StatefulConnection<byte[], byte[]> c : opened) c.close();
    }
}
