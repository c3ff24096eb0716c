package io.github.redisidem.transport;

import io.github.redisidem.exceptions.ServerException;
import io.lettuce.core.AbstractRedisClient;
import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisCommandTimeoutException;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulConnection;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.SlotHash;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * A {@link Transport} over Lettuce: a server ({@code RedisClient}, with a
 * plain or a Sentinel {@code RedisURI}) or a cluster
 * ({@code RedisClusterClient}). Commands share one multiplexed connection;
 * a command that blocks on the server (a claim's WAIT, a write with its
 * {@code WAIT}) takes a connection of its own, kept for the next one, so
 * that it holds up nothing else.
 *
 * <p>Lettuce sends a command again after a reconnect when its reply was
 * lost. A command with a deadline ({@code DONE}, {@code RELEASE}) must
 * reach the server at most once per send, so the transport cancels it
 * (Lettuce never writes a cancelled command) and fails it as a connection
 * error when any connection of the client drops while it is in flight, or
 * when its deadline passes: the loop then sends it again itself, counts
 * it, and confirms a {@code 0} with {@code IDEM.GET}.
 */
public final class LettuceTransport implements Transport {
    private final AbstractRedisClient client;
    private final Supplier<StatefulConnection<byte[], byte[]>> connect;
    private final StatefulConnection<byte[], byte[]> shared;
    private final ConcurrentLinkedQueue<StatefulConnection<byte[], byte[]>> spare = new ConcurrentLinkedQueue<>();
    private final List<StatefulConnection<byte[], byte[]>> opened = new CopyOnWriteArrayList<>();
    private final boolean cluster;
    private final Set<Guard> guarded = ConcurrentHashMap.newKeySet();
    private final RedisConnectionStateListener onDrop = new RedisConnectionStateListener() {
        @Override
        public void onRedisDisconnected(RedisChannelHandler<?, ?> connection) {
            // Called on the I/O thread as the channel goes inactive, before
            // the reconnect could write the buffered commands again.
            for (Guard g : guarded) g.fail(new RedisConnectionException("the connection dropped while the command was in flight"));
        }
    };

    private LettuceTransport(AbstractRedisClient client, Supplier<StatefulConnection<byte[], byte[]>> connect, boolean cluster) {
        this.client = client;
        this.connect = connect;
        this.cluster = cluster;
        client.addListener(onDrop);
        this.shared = open();
    }

    /**
     * @param client the client
     * @param uri the server, or a Sentinel URI ({@code RedisURI.Builder.sentinel(host, port, masterId)}): the primary it names
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
        byte[] bytes = command.name().getBytes(StandardCharsets.UTF_8);
        ProtocolKeyword name = new ProtocolKeyword() {
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

    private static boolean blocks(List<RedisCommand> commands) {
        for (RedisCommand c : commands) if (c.block() != null) return true;
        return false;
    }

    private static Duration deadline(List<RedisCommand> commands) {
        Duration d = null;
        for (RedisCommand c : commands) if (c.deadline() != null && (d == null || c.deadline().compareTo(d) > 0)) d = c.deadline();
        return d;
    }

    @Override
    public CompletableFuture<Object> send(RedisCommand command) {
        return on(List.of(command), false).thenApply(replies -> {
            Object reply = replies.get(0);
            if (reply instanceof ServerException e) throw new CompletionException(e);
            return reply;
        });
    }

    @Override
    public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
        return on(commands, true);
    }

    /**
     * The commands on one connection: the shared one, or one of our own when
     * one of them blocks; in a cluster, the connection to the node of the
     * first key's slot when they must go together.
     */
    private CompletableFuture<List<Object>> on(List<RedisCommand> commands, boolean together) {
        StatefulConnection<byte[], byte[]> own = null;
        try {
            if (blocks(commands)) {
                own = spare.poll();
                if (own == null) own = open();
            }
            StatefulConnection<byte[], byte[]> base = own != null ? own : shared;
            StatefulConnection<byte[], byte[]> c = together && cluster ? node(base, commands.get(0).key()) : base;
            StatefulConnection<byte[], byte[]> borrowed = own;
            CompletableFuture<List<Object>> out = guard(c, commands, deadline(commands));
            if (borrowed == null) return out;
            return out.whenComplete((r, e) -> {
                if (borrowed.isOpen()) spare.add(borrowed);
            });
        } catch (RuntimeException e) {
            if (own != null && own.isOpen()) spare.add(own);
            return CompletableFuture.failedFuture(e);
        }
    }

    /** The connection of a cluster connection to the primary of the key's slot. */
    @SuppressWarnings("unchecked")
    private StatefulConnection<byte[], byte[]> node(StatefulConnection<byte[], byte[]> base, byte[] key) {
        StatefulRedisClusterConnection<byte[], byte[]> cc = (StatefulRedisClusterConnection<byte[], byte[]>) base;
        RedisClusterNode node = cc.getPartitions().getMasterBySlot(SlotHash.getSlot(key));
        if (node == null) throw new RedisConnectionException("no primary known for the slot of the key");
        return cc.getConnection(node.getNodeId());
    }

    /** Dispatches the commands, watched when they have a deadline; the replies with error elements. */
    private CompletableFuture<List<Object>> guard(StatefulConnection<byte[], byte[]> c, List<RedisCommand> commands, Duration deadline) {
        Guard g = deadline == null ? null : new Guard();
        if (g != null) guarded.add(g);
        List<RedisFuture<Object>> futures = new ArrayList<>(commands.size());
        for (RedisCommand command : commands) {
            RedisFuture<Object> f = dispatch(c, command);
            futures.add(f);
            if (g != null) g.attach(f);
        }
        CompletableFuture<List<Object>> replies = replies(futures);
        if (g == null) return replies.thenApply(r -> redirected(r));
        replies.whenComplete((r, e) -> {
            if (e == null) g.out.complete(redirected(r));
            else g.fail(e);
        });
        // The deadline fails the call as Lettuce's own command timeout does (a
        // RuntimeException, as Jedis's is): orTimeout on the call's own future
        // would hand the caller a checked TimeoutException.
        CompletableFuture<Void> timer = new CompletableFuture<>();
        timer.orTimeout(deadline.toMillis(), TimeUnit.MILLISECONDS).whenComplete((v, e) -> {
            if (e != null) g.fail(new RedisCommandTimeoutException("no reply in " + deadline.toMillis() + " ms"));
        });
        g.out.whenComplete((r, e) -> {
            guarded.remove(g);
            timer.complete(null); // its scheduled timeout is cancelled
        });
        return g.out;
    }

    /** A MOVED or ASK element (a resharding): the partitions are read again, so that the loop's next try finds the node. */
    private List<Object> redirected(List<Object> replies) {
        if (!cluster) return replies;
        for (Object o : replies) {
            if (o instanceof ServerException e && e.getMessage() != null && (e.getMessage().startsWith("MOVED") || e.getMessage().startsWith("ASK"))) {
                ((RedisClusterClient) client).refreshPartitionsAsync();
                break;
            }
        }
        return replies;
    }

    /** Every reply, an error reply as its ServerException element; a connection failure fails the whole. */
    private static CompletableFuture<List<Object>> replies(List<RedisFuture<Object>> futures) {
        List<CompletableFuture<Object>> each = new ArrayList<>(futures.size());
        for (RedisFuture<Object> f : futures) {
            each.add(f.toCompletableFuture().handle((r, e) -> {
                if (e == null) return r;
                Throwable cause = unwrap(e);
                if (cause instanceof RedisCommandExecutionException x) return ServerException.of(x.getMessage());
                throw new CompletionException(cause);
            }));
        }
        return CompletableFuture.allOf(each.toArray(new CompletableFuture<?>[0])).thenApply(v -> {
            List<Object> out = new ArrayList<>(each.size());
            for (CompletableFuture<Object> f : each) out.add(f.join());
            return out;
        });
    }

    private static Throwable unwrap(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) t = t.getCause();
        return t;
    }

    /** Commands in flight that Lettuce must not send again: cancelled and failed at a drop or at the deadline. */
    private static final class Guard {
        final CompletableFuture<List<Object>> out = new CompletableFuture<>();
        private final List<RedisFuture<Object>> commands = new ArrayList<>();
        private boolean failed;

        synchronized void attach(RedisFuture<Object> f) {
            if (failed) f.cancel(false);
            else commands.add(f);
        }

        void fail(Throwable why) {
            synchronized (this) {
                if (failed) return;
                failed = true;
                for (RedisFuture<Object> f : commands) f.cancel(false);
            }
            out.completeExceptionally(why);
        }
    }

    /** A cluster's primaries as its connection's partitions have them, each on the node connection Lettuce keeps. */
    @Override
    public List<Transport> primaries() {
        if (!(shared instanceof StatefulRedisClusterConnection<byte[], byte[]> cc)) return List.of(this);
        List<Transport> out = new ArrayList<>();
        List<RedisClusterNode> nodes = new ArrayList<>(cc.getPartitions().getPartitions());
        nodes.sort(Comparator.comparing(n -> n.getUri().toString()));
        for (RedisClusterNode node : nodes) {
            if (node.is(RedisClusterNode.NodeFlag.UPSTREAM)) out.add(new Node(this, cc.getConnection(node.getNodeId())));
        }
        return out;
    }

    /** One node of a cluster: commands on its connection. */
    private record Node(LettuceTransport owner, StatefulRedisConnection<byte[], byte[]> connection) implements Transport {
        @Override
        public CompletableFuture<Object> send(RedisCommand command) {
            return sendTogether(List.of(command)).thenApply(replies -> {
                if (replies.get(0) instanceof ServerException e) throw new CompletionException(e);
                return replies.get(0);
            });
        }

        @Override
        public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
            try {
                return owner.guard(connection, commands, deadline(commands));
            } catch (RuntimeException e) {
                return CompletableFuture.failedFuture(e);
            }
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
        client.removeListener(onDrop);
        for (StatefulConnection<byte[], byte[]> c : opened) c.close();
    }
}
