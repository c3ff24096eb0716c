package io.github.redisidem;

import io.github.redisidem.transport.JedisTransport;
import io.github.redisidem.transport.LettuceTransport;
import io.github.redisidem.transport.RedisCommand;
import io.github.redisidem.transport.Transport;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.RedisSentinelClient;
import redis.clients.jedis.UnifiedJedis;

/** The tests' clients: a transport of either library for any topology, and plain commands on a key's node. */
final class Clients {
    private Clients() {}

    /**
     * A transport of {@code client} to {@code port} of {@code server} (its
     * cluster, or its Sentinel's primary for a Sentinel topology), closing
     * the client it made when it is closed.
     */
    static Transport transport(Servers.Server server, CaseRunner.Client client, int port) {
        boolean sentinel = server.topology == Servers.Topology.SENTINEL && port == 0;
        if (client == CaseRunner.Client.JEDIS) {
            UnifiedJedis jedis = server.cluster ? redis.clients.jedis.RedisClusterClient.create(new HostAndPort("127.0.0.1", port))
                    : sentinel ? RedisSentinelClient.builder().masterName("mymaster").sentinels(Set.of(new HostAndPort("127.0.0.1", server.sentinelPort))).build()
                    : redis.clients.jedis.RedisClient.create("127.0.0.1", port);
            return closing(JedisTransport.of(jedis), jedis::close);
        }
        if (server.cluster) {
            RedisClusterClient cluster = RedisClusterClient.create(RedisURI.create("127.0.0.1", port));
            return closing(LettuceTransport.of(cluster), cluster::shutdown);
        }
        RedisClient lettuce = RedisClient.create();
        RedisURI uri = sentinel ? RedisURI.Builder.sentinel("127.0.0.1", server.sentinelPort, "mymaster").build() : RedisURI.create("127.0.0.1", port);
        return closing(LettuceTransport.of(lettuce, uri), lettuce::shutdown);
    }

    /** The transport, shutting its own client down when it is closed. */
    private static Transport closing(Transport transport, Runnable shutdown) {
        return new Transport() {
            @Override
            public CompletableFuture<Object> send(RedisCommand command) {
                return transport.send(command);
            }

            @Override
            public CompletableFuture<List<Object>> sendTogether(List<RedisCommand> commands) {
                return transport.sendTogether(commands);
            }

            @Override
            public boolean cluster() {
                return transport.cluster();
            }

            @Override
            public List<Transport> primaries() {
                return transport.primaries();
            }

            @Override
            public void close() {
                transport.close();
                shutdown.run();
            }
        };
    }

    /** A plain command on the node that holds {@code key} (the primary, or the key's cluster node). */
    static void onKey(Servers.Server server, String key, Consumer<UnifiedJedis> call) {
        try (UnifiedJedis j = server.cluster ? redis.clients.jedis.RedisClusterClient.create(new HostAndPort("127.0.0.1", server.ports.get(0)))
                : redis.clients.jedis.RedisClient.create("127.0.0.1", server.port())) {
            call.accept(j);
        }
    }

    /** host:pid as docs/clients.md defines it, found here without the library: hostname(1) and this JVM's pid. */
    static String defaultOwner() {
        try {
            Process p = new ProcessBuilder("hostname").start();
            String host = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
            p.waitFor();
            return host + ":" + ProcessHandle.current().pid();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
